#!/usr/bin/perl
# Headless Chromium loads the playground page (served by nginx next to the
# API, as conf.example does), streams a completion, and the page shows the
# same text as `nalar generate` and the usage; the screenshot is kept in
# t/artifacts/playground.png.
use strict;
use warnings;
use lib 't/lib';
use File::Path qw(make_path);
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('node')
                     ->has_program('chromium');
my $root = NalarTest::root();
NalarTest::missing('t/node_modules/playwright-core missing (cd t && npm install)',
                   optional => 1)
    unless -d "$root/t/node_modules/playwright-core";

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    types { text/html html; }

    server {
        listen 127.0.0.1:%%PORT%%;
        location / { root %%ROOT%%/html; index playground.html; }
        # the reads-in-pieces check below is about the page reading a
        # stream as it comes: nginx's own rate limit spaces the events
        # out, since the whole answer now takes a few milliseconds and
        # may otherwise reach the page in one read
        location /v1/ { nalar_api; limit_rate 512; }
    }
}
CONF

my $N = 160;
my $prompt = 'A wise man';
my $want = $t->reference_text($prompt, $N);

make_path("$root/t/artifacts");
my $shot = "$root/t/artifacts/playground.png";
unlink $shot;

my $url = 'http://127.0.0.1:' . $t->port . '/';
my $json = `node $root/t/js/playground.mjs $url '$prompt' $N $shot 2>&1`;
is($?, 0, 'chromium ran the playground') or diag($json);
my $o = eval { NalarTest::json()->decode($json) } || {};

is($o->{text}, $want, 'the page shows the completion of nalar generate');
like($o->{usage}, qr/^prompt 4 tokens \(\d+ cached\), completion \d+, total \d+$/,
     'the page shows the usage') or diag($o->{usage});
like($o->{status}, qr/^finished: (length|stop), done in [\d.]+ s$/,
     'the stream ended with [DONE], its finish_reason still shown')
    or diag($o->{status});
ok(($o->{reads} // 0) > 1,
   "the response body arrived in pieces ($o->{reads} reads)");

# what the page showed while streaming: each sample extends the one before
# and the last is the whole text, with at least one partial text between
# the empty start and the end
my @samples = grep { $_ ne '' } @{ $o->{samples} || [] };
my $grows = 1;
for my $i (1 .. $#samples) {
    $grows = 0 unless length $samples[$i] > length $samples[$i - 1]
                   && substr($samples[$i], 0, length $samples[$i - 1])
                      eq $samples[$i - 1];
}
ok($grows, 'each text shown extends the one before')
    or diag(explain(\@samples));
is($samples[-1], $want, 'the last text shown is the completion');
my @partial = grep { length $_ < length $want } @samples;
ok(@partial >= 1, scalar(@partial) . ' partial texts shown before the end');
ok(-s $shot, 'screenshot kept in t/artifacts/playground.png');
my @errors = grep { /^(error|pageerror)/ } @{ $o->{console} || [] };
is_deeply(\@errors, [], 'no errors in the page console');

$t->check_log;
done_testing;

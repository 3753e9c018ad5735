#!/usr/bin/perl
# A reload adds and removes LoRA adapters while streams run under one that
# goes: every stream accepted before the reload finishes with all its
# tokens and [DONE], under its adapter; new requests see the new set (the
# removed adapter is an unknown model, the added one serves); /v1/models
# lists the new set.
#
# As in 60-reload.t, the clients send their requests but read nothing
# until the test has signalled, and the signal comes once /metrics shows
# streams both running and waiting.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Time::HiRes;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;
my $dir = $t->dir;
my $cli = $t->root . '/build/nalar';

for my $a (['psalms', 1], ['proverbs', 2]) {
    my $out = `$cli mkmodel --lora-of $NalarTest::MODEL --rank 8 --seed $a->[1] -o $dir/$a->[0].gguf 2>&1`;
    $? == 0 or BAIL_OUT("nalar mkmodel --lora-of failed: $out");
}

my $conf = <<'CONF';
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_max_running 2;    # 2 run, 6 wait: the signal finds both kinds
    send_timeout 600s;      # the clients read only after the signal
    ADAPTERS

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_lora_allow all; nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

(my $c1 = $conf) =~ s/ADAPTERS/nalar_lora psalms psalms.gguf;/;
(my $c2 = $conf) =~ s/ADAPTERS/nalar_lora proverbs proverbs.gguf;/;
$t->write_conf($c1)->run;

is($t->post_json('/v1/completions', { model => 'psalms', prompt => 'A',
                                      max_tokens => 1 })->{status},
   200, 'before the reload: psalms serves');

my $N = 450;

# Streams under psalms that record (status, completion tokens, [DONE],
# the models their chunks named) once the file go exists.
my @pids;
my $body = NalarTest::json()->encode({
    model => 'psalms', prompt => 'And it came to pass', max_tokens => $N,
    ignore_eos => JSON::PP::true, temperature => 0,
    stream => JSON::PP::true,
    stream_options => { include_usage => JSON::PP::true } });
for my $k (1 .. 8) {
    push @pids, NalarTest::fork_client(sub {
        my $s = $t->post_socket('/v1/completions', $body);
        Time::HiRes::sleep(0.02) until -e "$dir/go";
        my $raw = '';
        while ($s->sysread(my $buf, 65536)) { $raw .= $buf; }
        close $s;
        my $r = NalarTest::parse_response($raw);
        my @ev = eval { NalarTest::sse_events($r->{body}) };
        my ($usage) = map { $_->{usage} } grep { ref && $_->{usage} } @ev;
        my %models = map { $_->{model} => 1 } grep { ref } @ev;
        open my $fh, '>', "$dir/s$k" or die;
        print $fh join(' ', $r->{status},
                       $usage ? $usage->{completion_tokens} : -1,
                       (@ev && $ev[-1] eq '[DONE]') ? 'done' : 'cut',
                       join(',', sort keys %models));
        close $fh;
    });
}

my $deadline = Time::HiRes::time() + 120 * $NalarTest::SLOW;
my $ready = 0;
while (Time::HiRes::time() < $deadline) {
    my $m = $t->metrics;
    my ($run) = map { $m->{$_} } grep { /^nalar_requests_running/ } keys %$m;
    my ($wait) = map { $m->{$_} } grep { /^nalar_requests_waiting/ } keys %$m;
    if (($run // 0) >= 2 && ($wait // 0) >= 1) { $ready = 1; last }
    select(undef, undef, undef, 0.025);
}
ok($ready, 'streams running (and waiting) under psalms before the reload');

$t->write_conf($c2);
$t->signal('HUP');

# new connections are the new worker's once the old one has stopped
# accepting (it logs that it is shutting down) and the new one answers
my $deadline2 = Time::HiRes::time() + 60 * $NalarTest::SLOW;
select(undef, undef, undef, 0.05)
    until $t->read_file('error.log') =~ /gracefully shutting down/
          || Time::HiRes::time() > $deadline2;

sub ids {
    my $r = $t->get('/v1/models');
    return '' unless $r->{status} == 200;
    return join ' ', map { $_->{id} }
                     @{ NalarTest::json()->decode($r->{body})->{data} };
}
my $ids = '';
$deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
do { $ids = ids(); select(undef, undef, undef, 0.05) if $ids !~ /proverbs/ }
    while $ids !~ /proverbs/ && Time::HiRes::time() < $deadline;
is($ids, 'kjv proverbs', 'after the reload /v1/models lists the new set');

my $r;
$deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
do { $r = $t->get('/v1/health') }
    while $r->{status} != 200 && Time::HiRes::time() < $deadline;

$r = $t->post_json('/v1/completions', { model => 'proverbs', prompt => 'A',
                                         max_tokens => 2 });
is($r->{status}, 200, 'the added adapter serves new requests');
is($r->{json}{model}, 'proverbs', '... and names itself');
$r = $t->post_json('/v1/completions', { model => 'psalms', prompt => 'A',
                                         max_tokens => 2 });
is($r->{status}, 404, 'the removed adapter is an unknown model');

$t->write_file('go', '');
waitpid $_, 0 for @pids;

my @all = map { $t->read_file("s$_") } 1 .. 8;
my @accepted = grep { /^200 / } @all;
ok(@accepted >= 3 && !grep({ !/^200 $N done psalms$/ } @accepted),
   'every stream accepted before the reload got all its tokens and [DONE] '
   . 'under psalms') or diag(join "\n", @all);

$t->check_log;
done_testing;

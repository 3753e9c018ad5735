#!/usr/bin/perl
# HTTP/2 + TLS: one connection carries two streaming completions; the
# client resets one of them (RST_STREAM, CANCEL) after its first token and
# keeps the connection.  The other stream must finish normally (every
# token, [DONE], the text of `nalar generate`), the cancelled sequence must
# stop at once (running drops to 1 while the other still streams; the
# engine generates far fewer than 2 x max_tokens), every KV block must come
# back, and the connection must still serve a request.  A model slow
# enough (random weights, 6 layers of 384) that the reset lands long
# before max_tokens.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Encode ();
use Time::HiRes qw(sleep);
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('node')
                     ->has_tls_cert;
my $dir = $t->dir;
my $root = NalarTest::root();

my $model = "$dir/slow.gguf";
system("$root/build/nalar", 'mkmodel', '--vocab-from', $NalarTest::MODEL,
       '--dim', '384', '--layers', '6', '--heads', '6', '--kv-heads', '6',
       '--ffn', '1024', '--ctx', '1024', '--seed', '3', '-o', $model) == 0
    or $t->fail_file('nalar mkmodel failed');

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model slow %%PREFIX%%/slow.gguf;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT2%% ssl http2;
        # the client polls /metrics every 10 ms on the one HTTP/2
        # connection while B streams: on a slow machine that passes
        # nginx's default of 1000 requests a connection, and its GOAWAY
        # would end the connection the test is about
        keepalive_requests 1000000;
        ssl_certificate %%PREFIX%%/cert.pem;
        ssl_certificate_key %%PREFIX%%/key.pem;

        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 300;
my $prompt = 'In the beginning';
# `nalar generate` on one thread: the machine may be busy, and threads
# that wait for each other then lose whole time slices
my $want = do {
    open my $fh, '-|', "$root/build/nalar", 'generate', '-m', $model,
        '-p', $prompt, '-n', $N, '--temp', '0', '--ignore-eos', '-t', '1'
        or die "nalar generate: $!";
    local $/;
    my $out = <$fh>;
    close $fh;
    $out =~ s/\n\z//;
    $out;
};

sub metric {
    my ($m, $name) = @_;
    return $m->{"$name\{model=\"slow\"}"};
}

my $m0 = $t->metrics;
my $gen0 = metric($m0, 'nalar_generation_tokens_total') // 0;

my $origin = 'https://127.0.0.1:' . $t->port(1);
# a backstop against a server that never answers, not a speed limit
my $limit = 600 * $NalarTest::SLOW;
my $json = `node $root/t/js/h2-cancel.mjs $origin slow $N '$prompt' $limit 2>&1`;
is($?, 0, 'the node client ran') or diag($json);
my $o = eval { NalarTest::json()->decode($json) } || {};
diag("session error: $o->{session_error}") if $o->{session_error};

# the cancelled stream

is($o->{a_status}, 200, 'A: 200');
ok($o->{a_cancelled}, "A: reset after its first event ($o->{a_tokens} "
   . 'token events)');
is($o->{a_rst}, 8, 'A: closed with RST_STREAM CANCEL (8)');
ok(!$o->{a_done}, 'A: no [DONE]');
like($t->read_file('error.log'), qr/client canceled stream/,
     'nginx saw the stream cancelled');

# the other stream, untouched

is($o->{b_status}, 200, 'B: 200');
ok($o->{b_done}, 'B: ends with data: [DONE]');
is($o->{b_usage}{completion_tokens}, $N, "B: usage.completion_tokens $N");
is($o->{b_finish}, 'length', 'B: finish_reason length');
is(Encode::encode('UTF-8', $o->{b_text} // ''), $want,
   'B: the text of nalar generate');

# A stopped at once, not at max_tokens

my @s = @{ $o->{samples} || [] };
my @one = grep { defined $_->{running} && $_->{running} == 1 } @s;
ok(@one > 0, 'nalar_requests_running 1 while B still streams ('
   . scalar(@one) . ' of ' . scalar(@s) . ' samples)')
    or diag(NalarTest::json()->encode(\@s));
# (the engine sees the cancel at its next step: the first sample may still
# count A)
my ($first) = grep { ($s[$_]{running} // 0) == 1 } 0 .. $#s;
ok(defined $first && !(grep { ($_->{running} // 0) > 1 } @s[$first .. $#s]),
   'and never 2 again once it was 1')
    or diag(NalarTest::json()->encode(\@s));

# all released, and the engine did B's tokens and only a few of A's

my ($ok, $m) = (0, undef);
for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
    $m = $t->metrics;
    my ($run, $free, $total) = map { metric($m, $_) }
        qw(nalar_requests_running nalar_kv_blocks_free nalar_kv_blocks_capacity);
    if (defined $run && $run == 0 && defined $free && $free == $total) {
        $ok = 1;
        last;
    }
    sleep 0.05;
}
ok($ok, 'then nothing running and nalar_kv_blocks_free equals '
   . 'nalar_kv_blocks_capacity')
    or diag(join ', ', map { "$_ " . (metric($m, $_) // 'none') }
            qw(nalar_requests_running nalar_kv_blocks_free
               nalar_kv_blocks_capacity));

# C (4 tokens) ran on the same connection after B
my $c = eval { NalarTest::json()->decode($o->{c_body}) } || {};
my $gen = (metric($m, 'nalar_generation_tokens_total') // 0) - $gen0
          - ($c->{usage}{completion_tokens} // 0);
ok($gen >= $N && $gen < $N + $N / 4,
   "the engine generated $gen tokens for A and B: B's $N and a few of A's "
   . "(not 2 x $N)");

# the connection outlived the reset

ok($o->{session_open}, 'the HTTP/2 connection is still open after B');
is($o->{c_status}, 200, 'and serves another request');
is($c->{usage}{completion_tokens}, 4, 'with its completion');

$t->check_log;
done_testing;

#!/usr/bin/perl
# Clients that disconnect mid-stream (32 of them, at random moments) cancel
# their sequences at once: afterwards no request runs or waits and every KV
# block is free again, as /metrics reports.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use IO::Socket::INET;
use NalarTest;

my $t = NalarTest->new->has_model;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    nalar_max_batch_tokens 64;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $M = 'model="kjv"';
my $before = $t->metrics;
ok($before->{"nalar_kv_blocks_capacity{$M}"} > 0, 'the pool has blocks');

my $MAX = 400;
srand(12345);

my @pids;
for my $k (0 .. 31) {
    my $stop_after = 1 + int rand 12;     # SSE events before hanging up
    my $stream = $k % 4 != 3;             # every fourth waits without SSE
    my $delay = rand 0.3;
    push @pids, NalarTest::fork_client(sub {
        my $events = 0;
        my $r = $t->request('POST', '/v1/completions',
            json => { prompt => $k % 2 ? 'In the beginning' : 'A wise man',
                      max_tokens => $MAX, ignore_eos => JSON::PP::true,
                      temperature => 0.8, seed => $k,
                      stream => $stream ? JSON::PP::true : JSON::PP::false },
            timeout => $stream ? 60 : $delay,
            on_data => sub {
                my $n = () = $_[0] =~ /^data: /mg;
                return $n < $stop_after;
            });
        die "stream $k finished before the disconnect\n"
            if $stream && !$r->{aborted};
    });
}
my $finished = 0;
for (@pids) { waitpid $_, 0; $finished++ if $?; }
is($finished, 0, 'every streaming client hung up mid-stream');

# the cancellations land at the next step boundary: poll briefly

my $m;
for (1 .. 100 * $NalarTest::SLOW) {
    $m = $t->metrics;
    last if $m->{"nalar_requests_running{$M}"} == 0
         && $m->{"nalar_requests_waiting{$M}"} == 0
         && $m->{"nalar_kv_blocks_free{$M}"} == $m->{"nalar_kv_blocks_capacity{$M}"};
    select(undef, undef, undef, 0.05);
}

if ($m->{"nalar_requests_running{$M}"} != 0) {
    # tell a stale metric from a sequence really left running
    $t->post_json('/v1/completions', { prompt => 'A', max_tokens => 1 });
    my $again = $t->metrics;
    diag('after one more request: running '
         . $again->{"nalar_requests_running{$M}"} . ', free '
         . $again->{"nalar_kv_blocks_free{$M}"} . ' of '
         . $again->{"nalar_kv_blocks_capacity{$M}"});
}
is($m->{"nalar_requests_running{$M}"}, 0, 'no request running');
is($m->{"nalar_requests_waiting{$M}"}, 0, 'no request waiting');
is($m->{"nalar_kv_blocks_free{$M}"}, $m->{"nalar_kv_blocks_capacity{$M}"},
   'nalar_kv_blocks_free is back at nalar_kv_blocks_capacity');

my $generated = $m->{"nalar_generation_tokens_total{$M}"}
              - $before->{"nalar_generation_tokens_total{$M}"};
ok($generated < 32 * $MAX / 2,
   "cancelled sequences stopped generating ($generated of " . 32 * $MAX
   . ' tokens)');

# a client that sends its request and hangs up at once, before nginx has
# even read it: the EOF comes before the request is submitted, and must
# still cancel it (16 choices of 450 tokens would take a while)

$before = $t->metrics;
my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port,
                              Proto => 'tcp') or die;
my $req = NalarTest::json()->encode({ prompt => 'A wise man', n => 16,
                                      max_tokens => 450,
                                      ignore_eos => JSON::PP::true });
$s->syswrite("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
             . "Content-Length: " . length($req) . "\r\n\r\n$req");
close $s;
for (1 .. 100 * $NalarTest::SLOW) {
    select(undef, undef, undef, 0.02);
    $m = $t->metrics;
    last if $m->{"nalar_generation_tokens_total{$M}"}
            > $before->{"nalar_generation_tokens_total{$M}"}
         && $m->{"nalar_requests_running{$M}"} == 0;
}
$generated = $m->{"nalar_generation_tokens_total{$M}"}
           - $before->{"nalar_generation_tokens_total{$M}"};
ok($generated < 16 * 450 / 2,
   "a request whose client left before it was read is cancelled "
   . "($generated of 7200 tokens)");

# and the server still answers normally

my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                            max_tokens => 8,
                                            temperature => 0 });
is($r->{json}{usage}{completion_tokens}, 8, 'a request after the storm');

$t->check_log;
done_testing;

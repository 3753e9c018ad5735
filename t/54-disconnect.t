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
ok($before->{"nalar_kv_blocks_total{$M}"} > 0, 'the pool has blocks');

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
for (1 .. 100) {
    $m = $t->metrics;
    last if $m->{"nalar_requests_running{$M}"} == 0
         && $m->{"nalar_requests_waiting{$M}"} == 0
         && $m->{"nalar_kv_blocks_free{$M}"} == $m->{"nalar_kv_blocks_total{$M}"};
    select(undef, undef, undef, 0.05);
}

is($m->{"nalar_requests_running{$M}"}, 0, 'no request running');
is($m->{"nalar_requests_waiting{$M}"}, 0, 'no request waiting');
is($m->{"nalar_kv_blocks_free{$M}"}, $m->{"nalar_kv_blocks_total{$M}"},
   'nalar_kv_blocks_free is back at nalar_kv_blocks_total');

my $generated = $m->{"nalar_generation_tokens_total{$M}"}
              - $before->{"nalar_generation_tokens_total{$M}"};
ok($generated < 32 * $MAX / 2,
   "cancelled sequences stopped generating ($generated of " . 32 * $MAX
   . ' tokens)');

# and the server still answers normally

my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                            max_tokens => 8,
                                            temperature => 0 });
is($r->{json}{usage}{completion_tokens}, 8, 'a request after the storm');

$t->check_log;
done_testing;

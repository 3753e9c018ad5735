#!/usr/bin/perl
# Clients that disconnect mid-stream (32 of them, at random moments) cancel
# their sequences at once: afterwards no request runs or waits and every KV
# block is free again, as /metrics reports.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time);
use NalarTest;

my $t = NalarTest->new->has_model;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    nalar_max_batch_tokens 64;
    log_format early '$status $nalar_prompt_tokens $nalar_completion_tokens';

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location /early/v1/ { nalar_api; access_log early.log early; }
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
            timeout => $stream ? 600 : $delay,
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
for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
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
# still cancel it (16 choices of 450 tokens would take a while).  Its own
# location logs it: 499 says the request was parsed and submitted and then
# cancelled, not refused before it reached the engine (that would be a 4xx
# of its own).  The prompt's count is there only when the engine's intake
# tokenized it before the cancellation arrived, which a client that leaves
# at once may beat, so it is not asserted.

$before = $t->metrics;
my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port,
                              Proto => 'tcp') or die;
my $req = NalarTest::json()->encode({ prompt => 'A wise man', n => 16,
                                      max_tokens => 450,
                                      ignore_eos => JSON::PP::true });
$s->syswrite("POST /early/v1/completions HTTP/1.1\r\nHost: localhost\r\n"
             . "Content-Length: " . length($req) . "\r\n\r\n$req");
close $s;
my $line = '';
my $deadline = time + 30 * $NalarTest::SLOW;
while (time < $deadline) {
    $line = $t->read_file('early.log');
    last if $line ne '';
    select(undef, undef, undef, 0.02);
}
like($line, qr/^499 (?:0|4) \d+$/,
     'the early leaver was submitted and ended as a client that left')
    or diag("early.log: $line");
my ($done) = $line =~ /(\d+)$/;
ok(defined $done && $done < 16 * 450,
   'it was cancelled: ' . ($done // '?') . ' of 7200 tokens generated');
for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
    $m = $t->metrics;
    last if $m->{"nalar_requests_running{$M}"} == 0
         && $m->{"nalar_kv_blocks_free{$M}"}
            == $m->{"nalar_kv_blocks_capacity{$M}"};
    select(undef, undef, undef, 0.05);
}
$generated = $m->{"nalar_generation_tokens_total{$M}"}
           - $before->{"nalar_generation_tokens_total{$M}"};
ok($generated < 16 * 450 / 2,
   "a request whose client left before it was read is cancelled "
   . "($generated of 7200 tokens)");
is($m->{"nalar_kv_blocks_free{$M}"}, $m->{"nalar_kv_blocks_capacity{$M}"},
   'and its KV blocks are free');

# and the server still answers normally

my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                            max_tokens => 8,
                                            temperature => 0 });
is($r->{json}{usage}{completion_tokens}, 8, 'a request after the storm');

$t->check_log;
done_testing;

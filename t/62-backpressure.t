#!/usr/bin/perl
# Streams and slow clients: a client that reads slowly gets the whole
# stream (nginx stops taking output while the socket is full, then goes
# on); a client that stops reading is cut after send_timeout and its
# sequence cancelled; a stream still queued gets `: keep-alive` comments.
# Each step waits on what nginx did (error.log lines, /metrics), not on
# how long it took.
use strict;
use warnings;
use lib 't/lib';
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(sleep time);
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

# small socket buffers so that a stream of a few hundred tokens fills them
$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_max_running 1;
    nalar_stream_keepalive 100ms;
    send_timeout 1s;

    server {
        listen 127.0.0.1:%%PORT%% sndbuf=4k;
        location /v1/ { nalar_api; }
        location /ka/v1/ { nalar_api; nalar_stream_keepalive 1ms; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 450;
my $prompt = 'And it came to pass';
my $want = $t->reference_text($prompt, $N, ignore_eos => 1);
my $body = NalarTest::json()->encode({ prompt => $prompt, max_tokens => $N,
                                       temperature => 0,
                                       ignore_eos => JSON::PP::true,
                                       stream => JSON::PP::true });

# a small receive buffer, so that the stream fills it
sub open_stream { $t->post_socket('/v1/completions', $_[0], rcvbuf => 8192) }

sub wait_log {
    my ($re) = @_;
    my $deadline = time + 30 * $NalarTest::SLOW;
    while (time < $deadline) {
        return 1 if $t->read_file('error.log') =~ $re;
        sleep 0.02;
    }
    return 0;
}

# a slow reader: reads nothing until nginx has stopped taking output (the
# stream is far larger than the socket buffers), then 1 KiB at a time

my $s = open_stream($body);
ok(wait_log(qr/nalar stream blocked: the client is slow/),
   'nginx stopped taking output while the client was behind');
my $raw = '';
while (1) {
    my $n = $s->sysread(my $buf, 1024);
    last unless $n;
    $raw .= $buf;
}
close $s;
is(NalarTest::raw_stream_text($raw), $want, 'a slow reader gets the whole stream, unchanged');

# a client that stops reading: cut after send_timeout, sequence cancelled

my $M = 'model="kjv"';
# four choices: more than the socket buffers hold
my $big = NalarTest::json()->encode({ prompt => $prompt, max_tokens => $N,
                                      n => 4, ignore_eos => JSON::PP::true,
                                      stream => JSON::PP::true });
$s = open_stream($big);
$s->sysread(my $first, 512);
like($first // '', qr{^HTTP/1.1 200}, 'the stream started');
ok(wait_log(qr/nalar: client timed out/),
   'the stalled client timed out (send_timeout)');
close $s;
my $m;
for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
    $m = $t->metrics;
    last if $m->{"nalar_kv_blocks_free{$M}"} == $m->{"nalar_kv_blocks_capacity{$M}"}
         && $m->{"nalar_requests_running{$M}"} == 0;
    sleep 0.05;
}
is($m->{"nalar_requests_running{$M}"}, 0, 'nothing running after the cut');
is($m->{"nalar_kv_blocks_free{$M}"}, $m->{"nalar_kv_blocks_capacity{$M}"},
   'every KV block free after the cut');

# keep-alive comments while queued behind a long request (8 x 450 tokens,
# thousands of steps): the stream is sent once /metrics shows the long
# one running, and its location sends a comment after 1 ms without output

my $busy = NalarTest::fork_client(sub {
    $t->post_json('/v1/completions', { prompt => 'A', max_tokens => $N,
                                       n => 8, ignore_eos => JSON::PP::true });
});
for (1 .. 600 * $NalarTest::SLOW) {
    last if $t->metrics->{"nalar_requests_running{$M}"} > 0;
    sleep 0.05;
}
my $r = $t->request('POST', '/ka/v1/completions', body => $body,
                    headers => { 'Content-Type' => 'application/json' },
                    timeout => 600 * $NalarTest::SLOW);
waitpid $busy, 0;

my ($before_data) = $r->{body} =~ /^(.*?)^data: /ms;
like($before_data // '', qr/^: keep-alive\n\n/m,
     'the queued stream got : keep-alive before its first token');
my @ev = NalarTest::sse_events($r->{body});
is(join('', map { ref $_ ? $_->{choices}[0]{text} // '' : '' } @ev), $want,
   'and then the right answer');

$t->check_log;
done_testing;

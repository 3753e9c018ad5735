#!/usr/bin/perl
# A KV cache smaller than the context: a request that can never fit the
# pool is refused at admission with a 400 naming the numbers (the
# keep-alive connection it came on keeps working), one that fits runs to
# its end, and the gauges are true once the server is idle again (after a
# refused request and after a cancelled stream).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(sleep time);
use NalarTest;

my $t = NalarTest->new->has_model;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_kv_cache 1m;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $total = $t->metrics->{'nalar_kv_blocks_capacity{model="kjv"}'};
ok($total && $total * 16 < 512, "the pool ($total blocks) is smaller than "
   . 'the context') or BAIL_OUT('no nalar_kv_blocks_capacity');
my $cap = $total * 16;

# the gauges settle to running 0 and every block free (deadline generous:
# the engine may still be finishing the last step)
sub gauges_idle {
    my ($what) = @_;
    my ($m, $deadline) = ({}, time + 30 * $NalarTest::SLOW);
    while (time < $deadline) {
        $m = $t->metrics;
        last if ($m->{'nalar_requests_running{model="kjv"}'} // -1) == 0
                && ($m->{'nalar_kv_blocks_free{model="kjv"}'} // -1)
                   == $total;
        sleep 0.1;
    }
    is($m->{'nalar_requests_running{model="kjv"}'}, 0,
       "$what: nalar_requests_running is 0 when idle");
    is($m->{'nalar_kv_blocks_free{model="kjv"}'}, $total,
       "$what: nalar_kv_blocks_free equals the total when idle");
}

# one HTTP/1.1 response from a keep-alive socket (Content-Length or chunked)
sub read_response {
    my ($s) = @_;
    my ($raw, $sel, $deadline) = ('', IO::Select->new($s),
                                  time + 60 * $NalarTest::SLOW);
    while (time < $deadline) {
        if ($raw =~ /^(.*?\r\n\r\n)/s) {
            my ($head, $hl) = ($1, length $1);
            if ($head =~ /^Content-Length:\s*(\d+)/mi) {
                last if length($raw) >= $hl + $1;
            } elsif ($raw =~ /\r\n0\r\n\r\n$/) {
                last;
            }
        }
        last unless $sel->can_read($deadline - time);
        my $n = $s->sysread(my $buf, 65536);
        last unless $n;
        $raw .= $buf;
    }
    my $r = NalarTest::parse_response($raw);
    $r->{json} = eval { NalarTest->json->decode($r->{body}) };
    return $r;
}

sub send_json {
    my ($s, $path, $data) = @_;
    my $body = NalarTest->json->encode($data);
    $s->syswrite("POST $path HTTP/1.1\r\nHost: localhost\r\n"
                 . "Content-Type: application/json\r\n"
                 . 'Content-Length: ' . length($body) . "\r\n\r\n$body");
}

my @prompt = (300) x 100;

# 100 + 300 tokens do not fit a pool of fewer: refused before any work,
# and the next request on the same connection is answered

my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port,
                              Proto => 'tcp', Timeout => 10)
    or die "connect: $!";
send_json($s, '/v1/completions',
          { prompt => \@prompt, max_tokens => 300,
            ignore_eos => JSON::PP::true });
my $r = read_response($s);
is($r->{status}, 400, 'prompt + max_tokens beyond the KV cache: 400');
is($r->{json}{error}{code}, 'context_length_exceeded',
   'code context_length_exceeded');
is($r->{json}{error}{type}, 'invalid_request_error',
   'type invalid_request_error');
like($r->{json}{error}{message} // '',
     qr/KV cache holds $cap tokens but 400 tokens were requested \(100 in the prompt, 300 in the completion\)/,
     'the message names the numbers');
is($r->{headers}{connection} // 'keep-alive', 'keep-alive',
   'the connection is kept');

send_json($s, '/v1/completions', { prompt => 'A wise man', max_tokens => 2 });
$r = read_response($s);
is($r->{status}, 200, 'a second request on the same connection is answered');
is($r->{json}{usage}{completion_tokens}, 2, 'with its 2 tokens');
close $s;

$r = $t->post_json('/v1/completions',
                   { prompt => \@prompt, max_tokens => 300, n => 3,
                     ignore_eos => JSON::PP::true });
is($r->{status}, 400, 'the same with n=3: 400');
is($r->{json}{error}{code}, 'context_length_exceeded', 'n=3: the code');

gauges_idle('after a refused request');

# what fits the pool alone runs to its end, n=3 included (the choices
# take turns: each fits alone)

$r = $t->post_json('/v1/completions',
                   { prompt => \@prompt, max_tokens => $cap - 100, n => 3,
                     ignore_eos => JSON::PP::true },
                   timeout => 120 * $NalarTest::SLOW);
is($r->{status}, 200, 'prompt + max_tokens equal to the KV cache: 200');
is($r->{json}{usage}{completion_tokens}, 3 * ($cap - 100),
   'every choice generated all its tokens');
is(scalar(grep { ($_->{finish_reason} // '') eq 'length' }
          @{ $r->{json}{choices} || [] }), 3, 'each finished with length');

# without max_tokens (chat: until the context is full) the KV cache is
# the limit, as the context is

$r = $t->post_json('/v1/chat/completions',
                   { messages => [ { role => 'user', content => 'Hello' } ],
                     ignore_eos => JSON::PP::true },
                   timeout => 120 * $NalarTest::SLOW);
is($r->{status}, 200, 'chat without max_tokens: 200');
is($r->{json}{choices}[0]{finish_reason}, 'length', 'finish_reason length');
is($r->{json}{usage}{total_tokens}, $cap,
   'prompt and completion fill the KV cache');

gauges_idle('after requests that filled the pool');

# a stream cancelled mid-way

$s = $t->post_socket('/v1/completions',
                     NalarTest->json->encode({ prompt => 'A wise man',
                                               max_tokens => 200,
                                               stream => JSON::PP::true,
                                               ignore_eos => JSON::PP::true }));
{
    my ($raw, $sel) = ('', IO::Select->new($s));
    my $deadline = time + 60 * $NalarTest::SLOW;
    while (time < $deadline && $raw !~ /"text"/) {
        last unless $sel->can_read($deadline - time);
        last unless $s->sysread(my $buf, 4096);
        $raw .= $buf;
    }
    like($raw, qr/"text"/, 'the stream started');
}
close $s;

gauges_idle('after a cancelled stream');

$t->check_log;
done_testing;

#!/usr/bin/perl
# nginx's limit_rate on a streaming location: the stream is paced (nginx
# delays the connection's writes) and still arrives whole, in order, ending
# with [DONE], over HTTP/1.1 and over HTTP/2 + TLS; the module takes more
# from the engine when nginx's delay timer lets the write go on.  A client
# that hangs up while its stream is held back cancels its sequence.
use strict;
use warnings;
use lib 't/lib';
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(time);
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('curl')
                     ->has_tls_cert;
my $dir = $t->dir;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    server {
        listen 127.0.0.1:%%PORT%%;
        listen 127.0.0.1:%%PORT2%% ssl http2;
        ssl_certificate %%PREFIX%%/cert.pem;
        ssl_certificate_key %%PREFIX%%/key.pem;
        location /v1/ { nalar_api; limit_rate 512; }
        location /fast/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 200;
my $prompt = 'And it came to pass';
my $want = $t->reference_text($prompt, $N, ignore_eos => 1);

# a socket on which a streaming completion was posted to $path
sub post_stream {
    my ($path, %req) = @_;
    my $body = NalarTest::json()->encode({ model => 'kjv', prompt => $prompt,
                                           stream => JSON::PP::true,
                                           ignore_eos => JSON::PP::true,
                                           %req });
    return $t->post_socket($path, $body);
}

sub stream {
    my ($path) = @_;
    my $s = post_stream($path, max_tokens => $N, temperature => 0);
    my ($raw, $t0, @at) = ('', time);
    my $sel = IO::Select->new($s);
    while ($sel->can_read(600 * $NalarTest::SLOW)) {
        my $n = $s->sysread(my $buf, 65536);
        last unless $n;
        $raw .= $buf;
        push @at, [ time - $t0, length $raw ];
    }
    close $s;
    return ($raw, time - $t0, \@at);
}

my ($fast_raw, $fast_s) = stream('/fast/completions');
is(NalarTest::raw_stream_text($fast_raw), $want, 'without limit_rate: the whole stream');

my ($raw, $secs, $at) = stream('/v1/completions');
my $bytes = length $raw;
diag(sprintf('%d bytes in %.2f s (unlimited: %.3f s), %d reads', $bytes,
             $secs, $fast_s, scalar @$at));
is(NalarTest::raw_stream_text($raw), $want, 'limit_rate 512: the whole stream, ending [DONE]');
# nginx lets the first second's worth go at once, then paces the rest
my $paced = ($bytes - 512) / 512;
ok($bytes > 2 * 512, "the stream is larger than two seconds' worth "
   . "($bytes bytes)");
# limit_rate sets how fast nginx may send, so only the lower bound is
# nginx's behaviour; how much longer it takes depends on the host
ok($secs > 0.5,
   sprintf('paced by limit_rate: %.2f s (about %.2f expected; nginx '
           . 'counts whole seconds)', $secs, $paced));
my @late = grep { $_->[0] > 0.5 } @$at;
ok(@late >= 1 && @$at >= 2, 'and it arrived in pieces spread over time ('
   . scalar(@$at) . ' reads, ' . scalar(@late) . ' after 0.5 s)');

# HTTP/2 + TLS: the same pacing on a stream of the connection
my $body = NalarTest::json()->encode({ model => 'kjv', prompt => $prompt,
                                       max_tokens => $N, temperature => 0,
                                       ignore_eos => JSON::PP::true,
                                       stream => JSON::PP::true });
$t->write_file('body.json', $body);
my $t0 = time;
my $v = `curl -sS -k -N --http2 -o $dir/h2.body -w '%{http_version}' -H 'Content-Type: application/json' --data-binary \@$dir/body.json --max-time 600 https://127.0.0.1:@{[$t->port(1)]}/v1/completions 2>&1`;
my $h2_s = time - $t0;
is($v, '2', 'the HTTP/2 stream went over HTTP/2');
is(NalarTest::stream_text($t->read_file('h2.body')), $want,
   sprintf('HTTP/2 + limit_rate 512: the whole stream in %.2f s', $h2_s));
ok($h2_s > 0.5, 'and paced');

# a client that hangs up while nginx holds its stream back
{
    # 16 choices of 450 tokens: longer than the client stays
    my $before = $t->metrics;
    my $s = post_stream('/v1/completions', max_tokens => 450, n => 16);
    my $sel = IO::Select->new($s);
    $sel->can_read(600 * $NalarTest::SLOW) and $s->sysread(my $buf, 1024);
    like($buf // '', qr{^HTTP/1.1 200}, 'a paced stream started');
    close $s;
    my ($m, $M) = (undef, 'model="kjv"');
    for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
        $m = $t->metrics;
        last if $m->{"nalar_requests_running{$M}"} == 0
             && $m->{"nalar_kv_blocks_free{$M}"}
                == $m->{"nalar_kv_blocks_capacity{$M}"};
        select(undef, undef, undef, 0.05);
    }
    is($m->{"nalar_requests_running{$M}"}, 0,
       'its client gone: nothing running');
    is($m->{"nalar_kv_blocks_free{$M}"}, $m->{"nalar_kv_blocks_capacity{$M}"},
       'and every KV block free');
    my $generated = $m->{"nalar_generation_tokens_total{$M}"}
                  - $before->{"nalar_generation_tokens_total{$M}"};
    ok($generated < 16 * 450 / 2,
       "its sequences were cancelled ($generated of 7200 tokens generated)");
}

$t->check_log;
done_testing;

#!/usr/bin/perl
# The same stream over HTTP/2 + TLS (curl --http2) as over HTTP/1.1, and a
# browser's CORS preflight from another origin: OPTIONS is answered, and the
# operator's `add_header ... always` appears on streams and errors.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
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

        location /v1/ {
            nalar_api;
            add_header Access-Control-Allow-Origin $http_origin always;
            add_header Vary Origin always;
        }

        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 48;
my $prompt = 'In the beginning';
my $want = $t->reference_text($prompt, $N, ignore_eos => 1);
my $body = NalarTest::json()->encode({ model => 'kjv', prompt => $prompt,
                                       max_tokens => $N, temperature => 0,
                                       ignore_eos => JSON::PP::true,
                                       stream => JSON::PP::true });
$t->write_file('body.json', $body);

# HTTP/2 + TLS

my $port2 = $t->port(1);
my $out = `curl -sS -k -N --http2 -D $dir/h2.head -o $dir/h2.body -w '%{http_version}' -H 'Content-Type: application/json' --data-binary \@$dir/body.json https://127.0.0.1:$port2/v1/completions 2>&1`;
is($out, '2', 'the stream went over HTTP/2');
my $head = $t->read_file('h2.head');
like($head, qr{^content-type: text/event-stream}mi, 'HTTP/2: event stream');
is(NalarTest::stream_text($t->read_file('h2.body')), $want,
   'HTTP/2 + TLS stream equals nalar generate');

# and over HTTP/1.1, the same

my $r = $t->request('POST', '/v1/completions', body => $body,
                    headers => { 'Content-Type' => 'application/json' });
is(NalarTest::stream_text($r->{body}), $want, 'HTTP/1.1 stream equals it too');

# several HTTP/2 streams on one connection at once (browsers multiplex)

my @urls = map { "https://127.0.0.1:$port2/v1/completions" } 1 .. 4;
my $cmd = "curl -sS -k --http2 --parallel -H 'Content-Type: application/json'";
for my $k (1 .. 4) {
    $cmd .= " --data-binary \@$dir/body.json -o $dir/p$k.body $urls[$k - 1]";
    $cmd .= ' --next -k --http2 -H "Content-Type: application/json"'
        if $k < 4;
}
system("$cmd >/dev/null 2>&1");
my $same = grep { (NalarTest::stream_text($t->read_file("p$_.body")) // '') eq $want } 1 .. 4;
is($same, 4, 'four HTTP/2 streams, each equal to nalar generate');

# HTTP/2 clients that go away mid-stream cancel their sequences too

my $big = NalarTest::json()->encode({ prompt => $prompt, max_tokens => 450,
                                      n => 8, ignore_eos => JSON::PP::true,
                                      stream => JSON::PP::true });
$t->write_file('big.json', $big);
# the client leaves once 2000 bytes of its stream came (head exits, curl's
# next write fails), so the request was certainly running
system("curl -sS -k -N --http2 "
       . "-H 'Content-Type: application/json' --data-binary \@$dir/big.json "
       . "https://127.0.0.1:$port2/v1/completions 2>/dev/null "
       . "| head -c 2000 > $dir/gone.body");
like($t->read_file('gone.body'), qr/^data: \{/,
     'the HTTP/2 stream had started when its client left');
{
    my $ok = 0;
    for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
        my $r = $t->get('/metrics');
        my ($run) = $r->{body} =~ /^nalar_requests_running\{model="kjv"\} (\d+)/m;
        my ($free) = $r->{body} =~ /^nalar_kv_blocks_free\{model="kjv"\} (\d+)/m;
        my ($total) = $r->{body} =~ /^nalar_kv_blocks_capacity\{model="kjv"\} (\d+)/m;
        if (defined $run && $run == 0 && $free == $total) { $ok = 1; last; }
        select(undef, undef, undef, 0.05);
    }
    if (!$ok) {
        # tell a stale metric from a sequence really left running
        $t->post_json('/v1/completions', { prompt => 'A', max_tokens => 1 });
        my $b = $t->get('/metrics')->{body};
        diag('after one more request: ',
             join ', ', $b =~ /^(nalar_(?:requests_running|kv_blocks_free|kv_blocks_capacity)\{.*)$/mg);
    }
    ok($ok, 'an HTTP/2 client gone mid-stream: nothing running, KV free');
}

# CORS preflight

my $origin = 'https://app.example';
$r = $t->request('OPTIONS', '/v1/chat/completions',
                 headers => { Origin => $origin,
                              'Access-Control-Request-Method' => 'POST',
                              'Access-Control-Request-Headers' =>
                                  'authorization,content-type' });
is($r->{status}, 204, 'preflight answered 204');
like($r->{headers}{'access-control-allow-methods'} // '', qr/\bPOST\b/,
     'preflight allows POST');
is($r->{headers}{'access-control-allow-headers'}, 'authorization,content-type',
   'preflight allows the headers asked for');
is($r->{headers}{'access-control-allow-origin'}, $origin,
   "the operator's Access-Control-Allow-Origin on the preflight");

$r = $t->request('POST', '/v1/completions', body => $body,
                 headers => { 'Content-Type' => 'application/json',
                              Origin => $origin });
is($r->{headers}{'access-control-allow-origin'}, $origin,
   'Access-Control-Allow-Origin on a stream');
is(NalarTest::stream_text($r->{body}), $want, 'the cross-origin stream is the same');

$r = $t->post_json('/v1/completions', { model => 'nope', prompt => 'x' },
                   headers => { Origin => $origin });
is($r->{status}, 404, 'an error');
is($r->{headers}{'access-control-allow-origin'}, $origin,
   'Access-Control-Allow-Origin on the error (add_header always)');

$r = $t->request('OPTIONS', '/v1/nothing', headers => { Origin => $origin });
is($r->{status}, 404, 'OPTIONS on an unknown endpoint is 404');

$t->check_log;
done_testing;

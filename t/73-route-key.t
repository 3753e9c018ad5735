#!/usr/bin/perl
# $nalar_route_key at an edge without a model: the same for the same scope,
# model (named before the prompt) and leading prompt text, whatever follows;
# different where any of them differs; the scope's own key for a body that
# is not JSON; the same whether the body is in memory or in nginx's
# temporary file.  nalar_route_prefix sets how much text counts and makes
# the location an edge: nalar_jwt_key refuses a request without a token
# there with OpenAI's 401, and nginx's 502 is OpenAI's error JSON.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new;

my $secret = 'route-key-test-secret-0123456789abcdef';
$t->write_file('jwt.secret', $secret);

# a 1k body buffer: larger bodies go to the temporary file
$t->write_conf(<<'CONF')->run(health => '/ping');
http {
    %%NALAR_HTTP%%
    client_body_buffer_size 1k;

    server {
        listen 127.0.0.1:%%PORT%%;

        add_header X-Route-Key $nalar_route_key always;

        location /v1/ {
            nalar_tenant $http_x_tenant;
            proxy_pass http://127.0.0.1:%%PORT2%%;
        }

        location /short/v1/ {
            nalar_tenant $http_x_tenant;
            nalar_route_prefix 16;
            proxy_pass http://127.0.0.1:%%PORT2%%;
        }

        location /jwt/v1/ {
            nalar_jwt_key %%PREFIX%%/jwt.secret;
            nalar_route_prefix 2k;
            proxy_set_header X-Edge-Tenant $nalar_tenant;
            proxy_pass http://127.0.0.1:%%PORT2%%;
        }

        # no node answers
        location /dead/v1/ {
            nalar_route_prefix 2k;
            proxy_pass http://127.0.0.1:1;
        }

        location = /ping { return 200; }
    }

    # the node: answers with the length of the body it got
    server {
        listen 127.0.0.1:%%PORT2%%;
        location / { return 200 "$http_content_length $http_x_edge_tenant"; }
    }
}
CONF

sub key {
    my ($path, $body, %h) = @_;
    $body = $t->json->encode($body) if ref $body;
    my $r = $t->request('POST', $path, body => $body,
                        headers => { 'Content-Type' => 'application/json',
                                     'X-Tenant' => 'acme', %h });
    die "$path: $r->{status}\n" unless $r->{status} == 200;
    die "$path: the body did not reach the node whole: $r->{body}\n"
        unless $r->{body} =~ /^(\d+)/ && $1 == length $body;
    return $r->{headers}{'x-route-key'} // '';
}

my $sys = 'You are the scribe of the house of Judah. ' x 4;
sub chat { { model => 'kjv', messages => [ @_ ] } }
sub m_ { my ($role, $content) = @_; { role => $role, content => $content } }

my $k = key('/v1/chat/completions', chat(m_(system => $sys),
                                         m_(user => 'In the beginning')));
like($k, qr/^[0-9a-f]{32}$/, 'a key of 32 hex digits');

is(key('/v1/chat/completions', chat(m_(system => $sys),
                                    m_(user => 'A wise man'))),
   $k, 'another question with the same system prompt: the same key');
is(key('/v1/chat/completions',
       chat(m_(system => $sys), m_(user => 'In the beginning'),
            m_(assistant => 'was the word'), m_(user => 'and then?'))),
   $k, 'a later turn: the same key');
isnt(key('/v1/chat/completions', chat(m_(system => "$sys!"),
                                      m_(user => 'In the beginning'))),
     $k, 'another system prompt: another key');
isnt(key('/v1/chat/completions', chat(m_(system => $sys),
                                      m_(user => 'In the beginning')),
         'X-Tenant' => 'other'),
     $k, 'another tenant: another key');

# the text in parts, and escaped: the same text
# (canonical JSON: "messages" before "model", "content" before "role")
my $esc = '{"messages":[{"content":['
    . join(',', map { '{"type":"text","text":' . $t->json->encode($_) . '}' }
                ($sys =~ /^(.{10})(.*)$/s))
    . '],"role":"system"},{"content":"x","role":"user"}],"model":"kjv"}';
is(key('/v1/chat/completions', $esc), $k, 'content as text parts: the same');
my $sys_esc = $t->json->encode($sys);
$sys_esc =~ s/J/\\u004a/g;
is(key('/v1/chat/completions',
       '{"messages":[{"content":' . $sys_esc
       . ',"role":"system"},{"content":"x","role":"user"}],"model":"kjv"}'),
   $k, 'escaped text: the same');

# no system prompt: the first message
my $u = key('/v1/chat/completions', chat(m_(user => 'In the beginning')));
is(key('/v1/chat/completions',
       chat(m_(user => 'In the beginning'), m_(assistant => 'was'),
            m_(user => 'the word'))),
   $u, 'no system prompt: every turn keyed by the first message');
isnt($u, $k, '... which is another key');

# the role after the content: a user message is not in the leading text
is(key('/v1/chat/completions',
       '{"messages":[{"content":' . $t->json->encode($sys)
       . ',"role":"system"},{"content":"q1","role":"user"}]}'),
   key('/v1/chat/completions',
       '{"messages":[{"content":' . $t->json->encode($sys)
       . ',"role":"system"},{"content":"q2","role":"user"}]}'),
   'roles after contents: still the system prompt only');

# the model counts where it comes first
my $m1 = key('/v1/chat/completions',
             '{"model":"a","messages":[{"role":"user","content":"x"}]}');
isnt(key('/v1/chat/completions',
         '{"model":"b","messages":[{"role":"user","content":"x"}]}'),
     $m1, 'another model before the prompt: another key');
is(key('/v1/chat/completions',
       '{"messages":[{"role":"user","content":"x"}],"model":"a"}'),
   key('/v1/chat/completions',
       '{"messages":[{"role":"user","content":"x"}],"model":"b"}'),
   'a model after the prompt is not read');

# completions: the first nalar_route_prefix bytes of the prompt
my $long = 'And God said, Let there be light: and there was light. ' x 60;
my $c = key('/v1/completions', { model => 'kjv', prompt => "${long}A" });
is(key('/v1/completions', { model => 'kjv', prompt => "${long}B" }), $c,
   'completions: prompts alike in their first 2k bytes, the same key');
isnt(key('/v1/completions', { model => 'kjv', prompt => "B$long" }), $c,
     '... unlike there, another key');
is(key('/short/v1/completions', { prompt => 'And God said, Let it be' }),
   key('/short/v1/completions', { prompt => 'And God said, Let me go' }),
   'nalar_route_prefix 16: the first 16 bytes');
is(key('/v1/completions', { prompt => [ 1, 2, 3 ] }),
   key('/v1/completions', { prompt => [ [ 1, 2, 3 ], [ 4 ] ] }),
   'token ids, and the first of a batch');
isnt(key('/v1/completions', { prompt => [ 1, 2, 3 ] }),
     key('/v1/completions', { prompt => [ 1, 2, 4 ] }), '... by their ids');

# a body in the temporary file, bigger than the scan: the same key as in
# memory, the body passed on whole
my $big = chat(m_(system => $sys), m_(user => 'In the beginning'));
$big->{user} = 'x' x 200_000;
is(key('/v1/chat/completions', $big), $k,
   'a 200 KB body from the temporary file: the same key, passed on whole');

# not JSON, or no body: the scope's key, and the request goes on
my $bad1 = key('/v1/chat/completions', 'not json');
is(key('/v1/chat/completions', '{"messages": 7}'), $bad1,
   'bodies without a prompt: the scope key');
isnt(key('/v1/chat/completions', 'not json', 'X-Tenant' => 'other'), $bad1,
     "... each scope's own");

# malformed bodies the scan must get through (each once hung the loop)
for my $body ('{"messages":[{"content":[}]}]}', '{"messages":[{"content":[]]}',
              '{"model":,"prompt":"x"}', '{"messages":[{"role":"user",}]}') {
    my $r = $t->request('POST', '/v1/chat/completions', body => $body,
                        timeout => 30,
                        headers => { 'Content-Type' => 'application/json' });
    is($r->{status}, 200, "the edge gets through $body");
}

# JWT at an edge location (nalar_route_prefix): 401 without a token
my $r = $t->post_json('/jwt/v1/chat/completions', chat(m_(user => 'x')));
is($r->{status}, 401, 'nalar_jwt_key at an edge: 401 without a token');
is($r->{json}{error}{type}, 'authentication_error', '... as OpenAI JSON');
my $jwt = NalarJWT::hs256($secret, { sub => 'acme', exp => time + 600 });
$r = $t->post_json('/jwt/v1/chat/completions', chat(m_(user => 'x')),
                   headers => { Authorization => "Bearer $jwt",
                                'X-Edge-Tenant' => 'forged' });
is($r->{status}, 200, '... 200 with one');
like($r->{body}, qr/ acme$/, '... and the node is told the verified tenant');

# nginx's own error page at an edge location: OpenAI's error JSON
$r = $t->post_json('/dead/v1/chat/completions', chat(m_(user => 'x')));
is($r->{status}, 502, 'no node answers: 502');
is($r->{json}{error}{type}, 'server_error', '... as OpenAI JSON');

$t->check_log;

done_testing;

#!/usr/bin/perl
# auth_request in front of nalar_api: a subrequest to an internal location
# that proxies to a second server on loopback, which answers 204 for
# `Authorization: Bearer good` and 401 otherwise.  Refused requests never
# reach the engine (its token counters stay put) and get OpenAI's error
# JSON with the checker's WWW-Authenticate; an accepted one gets the same
# greedy completion as an open location, streamed or not.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

my $v = `$NalarTest::NGINX -V 2>&1`;
NalarTest::missing("$NalarTest::NGINX is built without "
                   . "http_auth_request_module (nginx -V)", optional => 1)
    unless $v =~ /--with-http_auth_request_module\b/;

$t->write_conf(<<'CONF');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    log_format check '$http_authorization|$status';

    server {
        listen 127.0.0.1:%%PORT%%;

        location /v1/ {
            auth_request /auth;
            nalar_api;
        }

        location /open/v1/ { nalar_api; }

        location = /auth {
            internal;
            proxy_pass http://127.0.0.1:%%PORT2%%/check;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
        }

        location = /metrics { nalar_metrics; }
    }

    # the token checker
    server {
        listen 127.0.0.1:%%PORT2%%;
        access_log %%PREFIX%%/check.log check;

        location = /check {
            if ($http_authorization = "Bearer good") {
                return 204;
            }
            add_header WWW-Authenticate 'Bearer realm="nalar"' always;
            return 401;
        }
    }
}
CONF
$t->run(health => '/open/v1/health');   # /v1/health needs the token too

my $N = 24;
my $prompt = 'In the beginning';
my $req = { model => 'kjv', prompt => $prompt, max_tokens => $N,
            temperature => 0, ignore_eos => JSON::PP::true };
my $want = $t->reference_text($prompt, $N, ignore_eos => 1);

sub counters {
    my $m = $t->metrics;
    return ($m->{'nalar_prompt_tokens_total{model="kjv"}'} // 0,
            $m->{'nalar_generation_tokens_total{model="kjv"}'} // 0);
}

# refused: no header, a bad token, another scheme

my @before = counters();

my $r = $t->post_json('/v1/completions', $req);
is($r->{status}, 401, 'no Authorization: 401');
is($r->{json}{error}{type}, 'authentication_error',
   '401 body is an OpenAI error');
like($r->{headers}{'www-authenticate'} // '', qr/^Bearer realm="nalar"/,
     "the checker's WWW-Authenticate is passed on");

$r = $t->post_json('/v1/completions', $req,
                   headers => { Authorization => 'Bearer bad' });
is($r->{status}, 401, 'a bad token: 401');

$r = $t->post_json('/v1/completions', { %$req, stream => JSON::PP::true },
                   headers => { Authorization => 'Bearer bad' });
is($r->{status}, 401, 'a bad token on a stream: 401');
unlike($r->{body} // '', qr/^data:/m, 'and no event');

$r = $t->post_json('/v1/chat/completions',
                   { model => 'kjv', max_tokens => $N,
                     messages => [ { role => 'user', content => $prompt } ] },
                   headers => { Authorization => 'Basic Z29vZA==' });
is($r->{status}, 401, 'chat with another scheme: 401');

is_deeply([ counters() ], \@before,
          'the engine saw none of them: prompt and generation token '
          . 'counters unchanged');

# accepted: the same answer as the open location and `nalar generate`

my $open = $t->post_json('/open/v1/completions', $req);
is($open->{json}{choices}[0]{text}, $want, 'open location: nalar generate');

$r = $t->post_json('/v1/completions', $req,
                   headers => { Authorization => 'Bearer good' });
is($r->{status}, 200, 'the good token: 200');
is($r->{json}{choices}[0]{text}, $want,
   'the same greedy completion as without auth');
is($r->{json}{usage}{completion_tokens}, $N, 'usage.completion_tokens');

my @after = counters();
is($after[1] - $before[1], 2 * $N,
   'the engine generated for the open and the accepted request only');

# a stream with the good token

$r = $t->post_json('/v1/completions', { %$req, stream => JSON::PP::true },
                   headers => { Authorization => 'Bearer good' });
is($r->{status}, 200, 'stream with the good token: 200');
like($r->{headers}{'content-type'} // '', qr{^text/event-stream},
     'an event stream');
my @ev = NalarTest::sse_events($r->{body});
is($ev[-1], '[DONE]', 'the stream ends with data: [DONE]');
pop @ev;
is(join('', map { $_->{choices}[0]{text} // '' } @ev), $want,
   'streamed text equals nalar generate');

# and chat, authorised

$r = $t->post_json('/v1/chat/completions',
                   { model => 'kjv', max_tokens => 4,
                     messages => [ { role => 'user', content => $prompt } ] },
                   headers => { Authorization => 'Bearer good' });
is($r->{status}, 200, 'chat with the good token: 200');

# every request went through the checker exactly once (the open location
# and /metrics never did)

$t->stop;
my @checks = split /\n/, $t->read_file('check.log');
is_deeply(\@checks, [ '-|401', 'Bearer bad|401', 'Bearer bad|401',
                      'Basic Z29vZA==|401', 'Bearer good|204',
                      'Bearer good|204', 'Bearer good|204' ],
          'the checker saw each protected request once, with its header');

$t->check_log;
done_testing;

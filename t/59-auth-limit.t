#!/usr/bin/perl
# nginx's own access control in front of nalar_api works unchanged:
# auth_basic (401 with WWW-Authenticate, then served with credentials),
# limit_req (the configured status once the rate is exceeded), and
# limit_conn.  Their error bodies are OpenAI-shaped JSON.
use strict;
use warnings;
use lib 't/lib';
use MIME::Base64 qw(encode_base64);
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_program('openssl');
my $dir = $t->dir;

my $hash = `openssl passwd -apr1 s3cret`;
chomp $hash;
$t->write_file('htpasswd', "alice:$hash\n");

$t->write_conf(<<'CONF')->run(health => '/one/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    limit_req_zone $binary_remote_addr zone=api:1m rate=1r/m;
    limit_conn_zone $binary_remote_addr zone=conns:1m;

    server {
        listen 127.0.0.1:%%PORT%%;

        location /v1/ {
            auth_basic "nalar";
            auth_basic_user_file %%PREFIX%%/htpasswd;
            nalar_api;
        }

        location /limited/v1/ {
            limit_req zone=api burst=1 nodelay;
            limit_req_status 429;
            nalar_api;
        }

        location /one/v1/ {
            limit_conn conns 1;
            nalar_api;
        }
    }
}
CONF

my $req = { model => 'kjv', prompt => 'A wise man', max_tokens => 4,
            temperature => 0 };

# auth_basic

my $r = $t->post_json('/v1/completions', $req);
is($r->{status}, 401, 'no credentials: 401');
like($r->{headers}{'www-authenticate'} // '', qr/^Basic realm="nalar"/,
     'WWW-Authenticate from auth_basic');
is($r->{json}{error}{type}, 'authentication_error',
   '401 body is an OpenAI error');

$r = $t->post_json('/v1/completions', $req,
                   headers => { Authorization => 'Basic '
                                . encode_base64('alice:wrong', '') });
is($r->{status}, 401, 'wrong password: 401');

$r = $t->post_json('/v1/completions', $req,
                   headers => { Authorization => 'Basic '
                                . encode_base64('alice:s3cret', '') });
is($r->{status}, 200, 'with credentials: 200');
is($r->{json}{usage}{completion_tokens}, 4, 'and the completion');

# limit_req: 1 per minute with a burst of 1, then the limit's status

my @status = map { $t->post_json('/limited/v1/completions', $req)->{status} }
             1 .. 4;
is_deeply([ @status[0, 1] ], [200, 200], 'rate and burst are served');
is_deeply([ @status[2, 3] ], [429, 429], 'then limit_req_status 429');
$r = $t->post_json('/limited/v1/completions', $req);
is($r->{json}{error}{type}, 'rate_limit_error', '429 body is an OpenAI error');
like($t->read_file('error.log'), qr/limiting requests/, 'nginx logged it');

# limit_conn: a second concurrent stream from the same address is refused
# while the first one is still open

my $stream_started = 0;
my $second;
$t->request('POST', '/one/v1/completions',
    json => { %$req, max_tokens => 400, ignore_eos => JSON::PP::true,
              stream => JSON::PP::true },
    on_data => sub {
        return 1 if $stream_started++;
        $second = $t->post_json('/one/v1/completions', $req);
        return 0;
    });
is($second->{status}, 503, 'limit_conn: a second connection gets 503');

$t->check_log;
done_testing;

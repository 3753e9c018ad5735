#!/usr/bin/perl
# nalar_jwt_key: a request without a valid bearer token never reaches the
# model.  A table of forged, tampered, expired, not-yet-valid, wrong
# audience / issuer, alg:none, HS/RS confusion and garbage tokens (made here
# with Digest::SHA and the openssl command) -> 401 with WWW-Authenticate:
# Bearer error="invalid_token" and an OpenAI error body, the precise reason
# in error.log at info level; valid tokens -> 200 with the claim as
# $nalar_tenant.  Bad keys fail `nginx -t`.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model->has_program('openssl');
my $dir = $t->dir;

system("openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 "
       . "-out $dir/rsa.pem 2>/dev/null && openssl pkey -in $dir/rsa.pem "
       . "-pubout -out $dir/rsa.pub 2>/dev/null && openssl genpkey "
       . "-algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out $dir/other.pem "
       . "2>/dev/null") == 0
    or NalarTest::missing('openssl cannot make RSA keys', optional => 1);

my $secret = 'jwt-auth-test-secret-0123456789abcdef';
$t->write_file('jwt.secret', "$secret\n");
$t->write_file('short.secret', "short\n");

# configuration errors: `nginx -t` fails with the reason

for my $case (['missing.key', qr/nalar_jwt_key: .*missing\.key/,
               'a missing key file'],
              ['short.secret', qr/nalar_jwt_key: .*short\.secret/,
               'an HMAC secret shorter than the hash'],
              ['rsa.pub HS256', qr/nalar_jwt_key: /,
               'an RSA key pinned to HS256']) {
    $t->write_conf(<<"CONF");
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_jwt_key %%PREFIX%%/$case->[0]; nalar_api; }
    }
}
CONF
    my ($rc, $out) = $t->test_conf;
    isnt($rc, 0, "nginx -t fails: $case->[2]");
    like($out, $case->[1], "nginx -t says why: $case->[2]");
}

$t->write_conf(<<'CONF')->run(health => '/open/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    nalar_jwt_issuer https://issuer.test;
    nalar_jwt_audience nalar;
    nalar_jwt_leeway 30s;

    server {
        listen 127.0.0.1:%%PORT%%;

        add_header X-Tenant $nalar_tenant always;
        large_client_header_buffers 4 32k;

        location = /metrics { nalar_metrics; }

        location /v1/ {
            nalar_jwt_key %%PREFIX%%/jwt.secret;
            nalar_api;
        }

        location /rs/v1/ {
            nalar_jwt_key %%PREFIX%%/rsa.pub;
            nalar_api;
        }

        location /org/v1/ {
            nalar_jwt_key %%PREFIX%%/jwt.secret HS256;
            nalar_jwt_claim org;
            nalar_api;
        }

        location /any/v1/ {
            satisfy any;
            allow 127.0.0.1;
            deny all;
            nalar_jwt_key %%PREFIX%%/jwt.secret;
            nalar_api;
        }

        location /open/v1/ {
            nalar_jwt_key off;
            nalar_api;
        }
    }
}
CONF

my $now = time;
my %good = (sub => 'alice', org => 'acme', iss => 'https://issuer.test',
            aud => 'nalar', iat => $now, exp => $now + 600);
my $hs = sub { NalarJWT::hs256($secret, { %good, @_ }) };
my $pem = $t->read_file('rsa.pub');

my $req = { model => 'kjv', prompt => 'A wise man', max_tokens => 2,
            temperature => 0 };

my $accepted = 0;       # completions the model answered

sub call {
    my ($path, $token, %o) = @_;
    my %h = defined $token ? (Authorization => $token =~ /^\w+ / ? $token
                                                                 : "Bearer $token")
                           : ();
    my $r = $t->post_json($path, $req, headers => \%h, %o);
    $accepted++ if $r->{status} == 200;
    return $r;
}

# valid tokens

my $r = call('/v1/completions', $hs->());
is($r->{status}, 200, 'HS256 token: 200');
is($r->{headers}{'x-tenant'}, 'alice', '$nalar_tenant is the sub claim');
is($r->{json}{object}, 'text_completion', 'the model answered');

$r = call('/v1/completions', $hs->(exp => $now - 10));
is($r->{status}, 200, 'expired 10 s ago, within nalar_jwt_leeway 30s: 200');

$r = call('/v1/completions', $hs->(aud => ['other', 'nalar']));
is($r->{status}, 200, 'aud array holding the audience: 200');

$r = call('/rs/v1/completions', NalarJWT::rs256("$dir/rsa.pem", \%good));
is($r->{status}, 200, 'RS256 token (openssl dgst -sign): 200');
is($r->{headers}{'x-tenant'}, 'alice', 'RS256: tenant from sub');

$r = call('/org/v1/completions', $hs->());
is($r->{status}, 200, 'nalar_jwt_claim org: 200');
is($r->{headers}{'x-tenant'}, 'acme', 'nalar_jwt_claim org: tenant acme');

$r = call('/v1/completions', 'bEaReR  ' . $hs->() . '  ');
is($r->{status}, 200, 'scheme case-insensitive, spaces around the token');

# refused tokens: [what, path, token, reason in the log]

my $payload_bob = NalarJWT::b64(NalarJWT::json_encode({ %good, sub => 'bob' }));
my @parts = split /\./, $hs->();

my @bad = (
    ['forged: signed with another secret', '/v1/',
     NalarJWT::hs256('another-secret-0123456789abcdefghij', \%good),
     qr/bad HS256 signature/],
    ['tampered payload (sub changed after signing)', '/v1/',
     "$parts[0].$payload_bob.$parts[2]", qr/bad HS256 signature/],
    ['signature cut short', '/v1/', "$parts[0].$parts[1]." . substr($parts[2], 0, 20),
     qr/signature is \d+ bytes|bad HS256 signature/],
    ['expired beyond the leeway', '/v1/', $hs->(exp => $now - 120),
     qr/expired at/],
    ['not yet valid (nbf)', '/v1/', $hs->(nbf => $now + 300),
     qr/not valid before/],
    ['issued in the future', '/v1/', $hs->(iat => $now + 300),
     qr/issued in the future/],
    ['wrong audience', '/v1/', $hs->(aud => 'someone-else'),
     qr/audience nalar is not in aud/],
    ['no audience', '/v1/', NalarJWT::hs256($secret,
                                 { map { $_ => $good{$_} } grep { $_ ne 'aud' }
                                   keys %good }),
     qr/no aud claim/],
    ['wrong issuer', '/v1/', $hs->(iss => 'https://evil.test'),
     qr/issuer "https:\/\/evil.test" is not the required/],
    ['claim missing', '/org/v1/', NalarJWT::hs256($secret,
                                 { %good, org => undef }),
     qr/claim org is not a string or integer|claim org missing/],
    ['empty sub', '/v1/', $hs->(sub => ''), qr/claim sub is empty/],
    ['alg none, no signature', '/v1/',
     NalarJWT::token({ alg => 'none', typ => 'JWT' }, \%good, ''),
     qr/alg none refused/],
    ['alg None (case), no signature', '/v1/',
     NalarJWT::token({ alg => 'None', typ => 'JWT' }, \%good, ''),
     qr/alg none refused|does not match/],
    ['alg HS512 header on an HS256 key', '/v1/',
     NalarJWT::hs256($secret, \%good, alg => 'HS512'),
     qr/token alg HS512 does not match the key's HS256/],
    ['HS/RS confusion: HS256 keyed with the RSA public key PEM', '/rs/v1/',
     NalarJWT::hs256($pem, \%good),
     qr/token alg HS256 does not match the key's RS256/],
    ['RS256 signed by another RSA key', '/rs/v1/',
     NalarJWT::rs256("$dir/other.pem", \%good), qr/bad RS256 signature/],
    ['alg none on the RSA location', '/rs/v1/',
     NalarJWT::token({ alg => 'none' }, \%good, ''), qr/alg none refused/],
    ['garbage', '/v1/', 'garbage', qr/not three dot-separated parts/],
    ['garbage in three parts', '/v1/', 'a.b.c', qr/not base64url|not JSON/],
    ['header not JSON', '/v1/', NalarJWT::b64('{alg') . ".$parts[1].$parts[2]",
     qr/not JSON/],
    ['four parts', '/v1/', $hs->() . '.x', qr/not three dot-separated|base64url/],
    ['oversized token', '/v1/', 'A' x 20000 . '.b.c', qr/over the \d+-byte/],
);

my $refused = 0;
for my $b (@bad) {
    my ($what, $loc, $token, $why) = @$b;
    my $path = $loc . 'completions';
    my $log_before = length $t->read_file('error.log');
    $r = call($path, $token);
    is($r->{status}, 401, "$what: 401");
    is($r->{headers}{'www-authenticate'}, 'Bearer error="invalid_token"',
       "$what: WWW-Authenticate");
    my $e = $r->{json} && $r->{json}{error} || {};
    ok($e->{type} eq 'authentication_error' && $e->{code} eq 'invalid_api_key'
       && $e->{message} && $r->{headers}{'content-type'} =~ m{^application/json},
       "$what: OpenAI error JSON") or diag($r->{body});
    ok(!exists $r->{headers}{'x-tenant'} || $r->{headers}{'x-tenant'} eq '',
       "$what: no tenant");
    my $log = substr($t->read_file('error.log'), $log_before);
    like($log, qr/\[info\].*nalar: bearer token refused: jwt: .*$why/,
         "$what: the reason is logged");
    $refused++;
}

# no credentials at all (RFC 6750: no error code), or another scheme

$r = call('/v1/completions', undef);
is($r->{status}, 401, 'no Authorization: 401');
is($r->{headers}{'www-authenticate'}, 'Bearer', 'no token: WWW-Authenticate: Bearer');
is($r->{json}{error}{type}, 'authentication_error', 'no token: JSON error');

$r = call('/v1/completions', 'Basic YWxpY2U6czNjcmV0');
is($r->{status}, 401, 'Basic credentials: 401');
is($r->{headers}{'www-authenticate'}, 'Bearer', 'Basic: WWW-Authenticate: Bearer');

$r = call('/v1/completions', 'Bearer ');
is($r->{status}, 401, '"Bearer" and no token: 401');

# the other endpoints of a protected location, and a CORS preflight

$r = $t->get('/v1/models');
is($r->{status}, 401, '/v1/models without a token: 401');
$r = $t->get('/v1/models', headers => { Authorization => 'Bearer ' . $hs->() });
is($r->{status}, 200, '/v1/models with a token: 200');
$r = $t->request('OPTIONS', '/v1/completions',
                 headers => { Origin => 'https://app.test',
                              'Access-Control-Request-Method' => 'POST' });
is($r->{status}, 204, 'CORS preflight needs no token');

# satisfy any lets the request past the access phase (allow 127.0.0.1),
# but it still never reaches the model without a valid token

$r = call('/any/v1/completions', undef);
is($r->{status}, 401, 'satisfy any + allow: no token still 401');
is($r->{headers}{'www-authenticate'}, 'Bearer',
   'satisfy any: one WWW-Authenticate header');
is($r->{json} && $r->{json}{error}{type}, 'authentication_error',
   'satisfy any: JSON error');
$r = call('/any/v1/completions', 'garbage');
is($r->{status}, 401, 'satisfy any + allow: bad token still 401');
is($r->{headers}{'www-authenticate'}, 'Bearer error="invalid_token"',
   'satisfy any, bad token: WWW-Authenticate');
$r = call('/any/v1/completions', $hs->());
is($r->{status}, 200, 'satisfy any: a valid token passes');

# /health is for load balancers: no token needed; the models need the
# token completions need, satisfy any included

for my $loc ('/v1', '/any/v1') {
    for my $tok (undef, $hs->()) {
        my %h = defined $tok ? (Authorization => "Bearer $tok") : ();
        my $with = defined $tok ? 'with' : 'without';
        $r = $t->get("$loc/health", headers => \%h);
        is($r->{status}, 200, "$loc/health $with a token: 200");
        for my $path ("$loc/models", "$loc/models/kjv") {
            $r = $t->get($path, headers => \%h);
            is($r->{status}, defined $tok ? 200 : 401,
               "$path $with a token: " . (defined $tok ? 200 : 401));
        }
    }
}
$r = $t->get('/any/v1/models', headers => { Authorization => 'Bearer bad' });
is($r->{status}, 401, 'satisfy any: /models with a bad token: 401');
is(eval { $t->json->decode($r->{body})->{error}{type} },
   'authentication_error', 'satisfy any: /models JSON error');
is($r->{headers}{'www-authenticate'}, 'Bearer error="invalid_token"',
   'satisfy any: /models WWW-Authenticate');

# nalar_jwt_key off: no token needed, a single tenant

$r = call('/open/v1/completions', undef);
is($r->{status}, 200, 'nalar_jwt_key off: 200 without a token');

# the model saw only the accepted completions (4 prompt tokens each)

my $m = $t->metrics;
is($m->{'nalar_prompt_tokens_total{model="kjv"}'}, 4 * $accepted,
   "the engine prefilled only the $accepted accepted completions");

like($t->read_file('error.log'), qr/nalar: no bearer token/,
     'a missing token is logged');

$t->check_log;

done_testing;

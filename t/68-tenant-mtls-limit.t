#!/usr/bin/perl
# Tenants from nginx's own authentication: mutual TLS with two client
# certificates signed by a test CA (openssl), `ssl_verify_client on` and
# `nalar_tenant $ssl_client_fingerprint` -- the two clients never share
# prefix cache hits, each hits its own.  And `limit_req_zone $nalar_tenant`
# (evaluated before the content phase) throttles one tenant with 429 and an
# OpenAI error while another proceeds.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('curl')
                     ->has_program('openssl');
my $dir = $t->dir;

# a test CA, a server certificate, two clients of the CA and one outsider

$t->tls_self_signed('ca', '/CN=nalar-test-ca')
  ->tls_self_signed('server', '/CN=localhost');
$t->tls_client_cert($_, "/CN=$_", 'ca') for qw(alice bob);
$t->tls_self_signed('mallory', '/CN=mallory');

my %fp;
for my $u (qw(alice bob)) {
    my $out = `openssl x509 -in $dir/$u.pem -noout -fingerprint -sha1`;
    ($fp{$u}) = $out =~ /=([0-9A-F:]+)/;
    $fp{$u} = lc($fp{$u} =~ s/://gr);
}

$t->write_conf(<<'CONF')->run(health => 0);
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    nalar_tenant $ssl_client_fingerprint;

    limit_req_zone $nalar_tenant zone=tenants:1m rate=1r/m;
    limit_conn_zone $nalar_tenant zone=tenant_conns:1m;
    limit_req_status 429;

    server {
        listen 127.0.0.1:%%PORT%% ssl;
        ssl_certificate %%PREFIX%%/server.pem;
        ssl_certificate_key %%PREFIX%%/server.key;
        ssl_client_certificate %%PREFIX%%/ca.pem;
        ssl_verify_client on;

        add_header X-Tenant $nalar_tenant always;

        location /v1/ { nalar_api; }

        location /limited/v1/ {
            limit_req zone=tenants nodelay;
            limit_conn tenant_conns 4;
            nalar_api;
        }
    }

    server {
        listen 127.0.0.1:%%PORT2%%;
        location /v1/ { nalar_api; }
    }
}
CONF

# the model is ready once the plain server says so
my $ready = 0;
for (1 .. 1200 * $NalarTest::SLOW) {
    $ready = $t->get('/v1/health', port => $t->port(1))->{status} == 200
        and last;
    select undef, undef, undef, 0.05;
}
$ready or $t->fail_file('the plain server never said the model is ready');

my $N = 16;
my $prompt = 'And God said, Let there be light: and there was light. And God '
           . 'saw the light, that it was good: and God divided the light from '
           . 'the darkness.';
my $n = @{ $t->tokenize_special($prompt) };
my $full = int(($n - 1) / 16) * 16;
my $want = $t->reference_text($prompt, $N, ignore_eos => 1);
ok($full >= 32, "the prompt has $n tokens, $full in full blocks");

my $port = $t->port(0);
$t->write_file('body.json', NalarTest::json()->encode(
    { model => 'kjv', prompt => $prompt, max_tokens => $N, temperature => 0,
      ignore_eos => JSON::PP::true }));

# one request over TLS as `who` (a client certificate, or none)
sub tls {
    my ($who, $path) = @_;
    my $cert = $who ? "--cert $dir/$who.pem --key $dir/$who.key" : '';
    unlink "$dir/out.head", "$dir/out.body";
    system("curl -sS -k $cert -H 'Content-Type: application/json' "
           . "--data-binary \@$dir/body.json -D $dir/out.head -o $dir/out.body "
           . "https://127.0.0.1:$port" . ($path || '/v1/completions')
           . " >$dir/curl.err 2>&1");
    my $r = NalarTest::parse_response($t->read_file('out.head') . "\r\n"
                                      . $t->read_file('out.body'));
    $r->{body} = $t->read_file('out.body');
    $r->{json} = eval { NalarTest::json()->decode($r->{body}) };
    return $r;
}

sub cached {
    my ($r) = @_;
    return $r->{status} == 200
        ? $r->{json}{usage}{prompt_tokens_details}{cached_tokens}
        : "HTTP $r->{status}";
}

# (d) mTLS tenants

my $r = tls('alice');
is($r->{status}, 200, 'alice (client certificate): 200');
is($r->{headers}{'x-tenant'}, $fp{alice},
   '$nalar_tenant is her certificate fingerprint');
is(cached($r), 0, 'alice, first: nothing cached');
is($r->{json}{choices}[0]{text}, $want, 'alice: nalar generate\'s answer');

$r = tls('alice');
is(cached($r), $full, 'alice, again: her full blocks');
is($r->{json}{choices}[0]{text}, $want, 'alice, again: the same answer');

$r = tls('bob');
is($r->{headers}{'x-tenant'}, $fp{bob}, 'bob: his own fingerprint');
is(cached($r), 0, 'bob, the same prompt: no hit on alice\'s blocks');
is($r->{json}{choices}[0]{text}, $want, 'bob: the same answer');

$r = tls('bob');
is(cached($r), $full, 'bob, again: his own blocks');

$r = tls('alice');
is(cached($r), $full, 'alice still hits hers');

$r = tls(undef);
is($r->{status}, 400, 'no client certificate: 400');
$r = tls('mallory');
is($r->{status}, 400, 'a certificate from another CA: 400');

# (e) limit_req keyed on $nalar_tenant: one request a minute per tenant

$r = tls('alice', '/limited/v1/completions');
is($r->{status}, 200, 'limited: alice\'s first request passes');
$r = tls('alice', '/limited/v1/completions');
is($r->{status}, 429, 'limited: alice\'s second request: 429');
is($r->{json} && $r->{json}{error}{type}, 'rate_limit_error',
   '429 has an OpenAI error body');
is($r->{json} && $r->{json}{error}{code}, 'rate_limit_exceeded',
   '429 code rate_limit_exceeded');
$r = tls('bob', '/limited/v1/completions');
is($r->{status}, 200, 'limited: bob proceeds while alice is throttled');
$r = tls('bob', '/limited/v1/completions');
is($r->{status}, 429, 'limited: then bob is throttled too');

$t->check_log;

done_testing;

#!/usr/bin/perl
# The prefix cache scope of a tenant from a client certificate names the
# certificate's CA: two CAs (openssl, in the test's prefix) each sign a
# client certificate with the same subject, `nalar_tenant $ssl_client_s_dn`
# gives both the same tenant value, and the two never share cached
# tokens, while each hits its own.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('curl')
                     ->has_program('openssl');
my $dir = $t->dir;

# two CAs, a server certificate, and the same subject from each CA

$t->tls_self_signed('server', '/CN=localhost');
for my $ca (qw(one two)) {
    $t->tls_self_signed("ca-$ca", "/O=nalar-test/CN=ca-$ca")
      ->tls_client_cert("alice-$ca", '/O=nalar-test/CN=alice', "ca-$ca");
}
$t->write_file('cas.pem', $t->read_file('ca-one.pem')
                          . $t->read_file('ca-two.pem'));

$t->write_conf(<<'CONF')->run(health => 0);
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    nalar_tenant $ssl_client_s_dn;

    server {
        listen 127.0.0.1:%%PORT%% ssl;
        ssl_certificate %%PREFIX%%/server.pem;
        ssl_certificate_key %%PREFIX%%/server.key;
        ssl_client_certificate %%PREFIX%%/cas.pem;
        ssl_verify_client on;

        add_header X-Tenant $nalar_tenant always;

        location /v1/ { nalar_api; }
    }

    server {
        listen 127.0.0.1:%%PORT2%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $ready = 0;
for (1 .. 1200 * $NalarTest::SLOW) {
    $ready = $t->get('/v1/health', port => $t->port(1))->{status} == 200
        and last;
    select undef, undef, undef, 0.05;
}
$ready or $t->fail_file('the plain server never said the model is ready');

my $prompt = 'And God said, Let there be light: and there was light. And God '
           . 'saw the light, that it was good: and God divided the light from '
           . 'the darkness.';
my $n = @{ $t->tokenize_special($prompt) };
my $full = int(($n - 1) / 16) * 16;
ok($full >= 32, "the prompt has $n tokens, $full in full blocks");

my $port = $t->port(0);
$t->write_file('body.json', NalarTest::json()->encode(
    { model => 'kjv', prompt => $prompt, max_tokens => 2,
      temperature => 0 }));

sub tls {
    my ($ca) = @_;
    unlink "$dir/out.head", "$dir/out.body";
    system("curl -sS -k --cert $dir/alice-$ca.pem --key $dir/alice-$ca.key "
           . "-H 'Content-Type: application/json' "
           . "--data-binary \@$dir/body.json -D $dir/out.head "
           . "-o $dir/out.body https://127.0.0.1:$port/v1/completions"
           . " >$dir/curl.err 2>&1");
    my $r = NalarTest::parse_response($t->read_file('out.head') . "\r\n"
                                      . $t->read_file('out.body'));
    $r->{json} = eval { NalarTest::json()->decode($t->read_file('out.body')) };
    return $r;
}

sub cached {
    my ($r) = @_;
    return $r->{status} == 200
        ? $r->{json}{usage}{prompt_tokens_details}{cached_tokens}
        : "HTTP $r->{status}";
}

my $one = tls('one');
is($one->{status}, 200, 'alice of CA one: 200');
is(cached($one), 0, 'alice of CA one, first: nothing cached');
is(cached(tls('one')), $full, 'alice of CA one, again: her full blocks');

my $two = tls('two');
is($two->{status}, 200, 'alice of CA two: 200');
is($two->{headers}{'x-tenant'}, $one->{headers}{'x-tenant'},
   "the same tenant value from both CAs ($one->{headers}{'x-tenant'})");
is(cached($two), 0, 'alice of CA two: no hit on CA one\'s blocks');
is(cached(tls('two')), $full, 'alice of CA two, again: her own blocks');
is(cached(tls('one')), $full, 'alice of CA one still hits hers');

$t->check_log;

done_testing;

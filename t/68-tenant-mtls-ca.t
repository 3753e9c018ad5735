#!/usr/bin/perl
# The prefix cache scope of a tenant from a client certificate names the
# certificate's CA: two CAs (openssl, in the test's prefix) each sign a
# client certificate with the same subject, `nalar_tenant $ssl_client_s_dn`
# gives both the same tenant value, and the two never share cached
# tokens, while each hits its own.  The same holds for two CAs with the
# same name and different keys (the scope names the issuing CA's key, not
# its name).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('curl')
                     ->has_program('openssl');
my $dir = $t->dir;

sub sh {
    my ($cmd) = @_;
    system("cd $dir && ($cmd) >/dev/null 2>&1") == 0
        or NalarTest::missing("openssl failed: $cmd", optional => 1);
}

# two CAs, a server certificate, and the same subject from each CA

sh('openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost '
   . '-keyout server.key -out server.pem');
for my $ca (qw(one two)) {
    sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
       . "-subj /O=nalar-test/CN=ca-$ca -keyout ca-$ca.key -out ca-$ca.pem");
    sh("openssl req -newkey rsa:2048 -nodes -subj /O=nalar-test/CN=alice "
       . "-keyout alice-$ca.key -out alice-$ca.csr && openssl x509 -req "
       . "-in alice-$ca.csr -CA ca-$ca.pem -CAkey ca-$ca.key "
       . "-CAcreateserial -days 2 -out alice-$ca.pem");
}
# two CAs that share one name, each with its own key; the client
# certificates name their CA's key (authorityKeyIdentifier), so that each
# verifies against its own CA
sh('printf "authorityKeyIdentifier=keyid\\n" > akid.cnf');
for my $ca (qw(three four)) {
    sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
       . "-subj /O=nalar-test/CN=ca-same -keyout ca-$ca.key -out ca-$ca.pem");
    sh("openssl req -newkey rsa:2048 -nodes -subj /O=nalar-test/CN=alice "
       . "-keyout alice-$ca.key -out alice-$ca.csr && openssl x509 -req "
       . "-in alice-$ca.csr -CA ca-$ca.pem -CAkey ca-$ca.key "
       . "-CAcreateserial -days 2 -extfile akid.cnf -out alice-$ca.pem");
}
sh('cat ca-one.pem ca-two.pem ca-three.pem ca-four.pem > cas.pem');

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
        ssl_session_cache shared:nalar_test_tls:1m;

        add_header X-Tenant $nalar_tenant always;
        add_header X-Reused $ssl_session_reused always;

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

# the same name, another key

my $three = tls('three');
is($three->{status}, 200, 'alice of CA three: 200');
is(cached($three), 0, 'alice of CA three, first: nothing cached');
is(cached(tls('three')), $full, 'alice of CA three, again: her full blocks');

my $four = tls('four');
is($four->{status}, 200, 'alice of CA four (CA three\'s name): 200');
is($four->{headers}{'x-tenant'}, $three->{headers}{'x-tenant'},
   'the same tenant value from both');
is(cached($four), 0,
   'alice of CA four: no hit on the blocks of CA three, which has her '
   . 'CA\'s name but not its key');
is(cached(tls('four')), $full, 'alice of CA four, again: her own blocks');
is(cached(tls('three')), $full, 'alice of CA three still hits hers');

# a resumed session has no verified chain: its CA is found in the trust
# store by name and key; one curl, two connections (Connection: close), the
# second resuming the first's session

sub tls_resumed {
    my ($ca) = @_;
    my $url = "https://127.0.0.1:$port/v1/completions";
    my $one = "-k --cert $dir/alice-$ca.pem --key $dir/alice-$ca.key "
            . "-H 'Content-Type: application/json' -H 'Connection: close' "
            . "--data-binary \@$dir/body.json";
    unlink map { ("$dir/out$_.head", "$dir/out$_.body") } 1, 2;
    system("curl -sS $one -D $dir/out1.head -o $dir/out1.body $url "
           . "--next $one -D $dir/out2.head -o $dir/out2.body $url"
           . " >$dir/curl.err 2>&1");
    return map {
        my $r = NalarTest::parse_response($t->read_file("out$_.head")
                                          . "\r\n");
        $r->{json} = eval { NalarTest::json()->decode(
            $t->read_file("out$_.body")) };
        $r;
    } 1, 2;
}

my @r = tls_resumed('four');
is($r[0]{status}, 200, 'the first connection: 200')
    or diag($t->read_file('curl.err'));
is($r[1]{headers}{'x-reused'}, 'r', 'the second session is resumed');
is(cached($r[1]), $full, 'alice of CA four, resumed: her own blocks');
@r = tls_resumed('three');
is($r[1]{headers}{'x-reused'}, 'r', 'resumed again');
is(cached($r[1]), $full, 'alice of CA three, resumed: hers');

$t->check_log;

done_testing;

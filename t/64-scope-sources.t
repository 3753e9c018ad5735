#!/usr/bin/perl
# The prefix cache scope names where a tenant came from, not only its
# name: the same name from a JWT `sub`, a JWT `org` claim, a JWT signed by
# another key, and `nalar_tenant $http_x_tenant` (which a client types)
# are four identities, and a JSON number 777 is not the string "777".
# Each pair gets cached_tokens 0; the same identity twice still hits.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model->has_cli;

my $secret = 'scope-sources-test-secret-of-32+bytes!';
my $secret2 = 'another-key-for-the-same-org-claim-32+b';
$t->write_file('jwt.secret', "$secret\n");
$t->write_file('jwt2.secret', "$secret2\n");

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    log_format tenant '$nalar_tenant';

    server {
        listen 127.0.0.1:%%PORT%%;

        location /sub/ {
            nalar_api;
            nalar_jwt_key %%PREFIX%%/jwt.secret;
            access_log %%PREFIX%%/tenant.log tenant;
        }

        location /org/ {
            nalar_api;
            nalar_jwt_key %%PREFIX%%/jwt.secret;
            nalar_jwt_claim org;
        }

        location /org2/ {
            nalar_api;
            nalar_jwt_key %%PREFIX%%/jwt2.secret;
            nalar_jwt_claim org;
        }

        location /hdr/ {
            nalar_api;
            nalar_tenant $http_x_tenant;
        }

        location /v1/ { nalar_api; }
    }
}
CONF

my $prompt = join ' ', ('In the beginning God created the heaven and the '
                        . 'earth. And the earth was without form, and void; '
                        . 'and darkness was upon the face of the deep.') x 4;
my $n = @{ $t->tokenize_special($prompt) };
my $full = int(($n - 1) / 16) * 16;
ok($full >= 64, "the prompt has $n tokens, $full in full blocks");

sub jwt {
    my ($key, $claims) = @_;
    return 'Bearer ' . NalarJWT::hs256($key, { %$claims,
                                               exp => time + 3600 });
}

# cached_tokens of the prompt sent to a location with the given headers
sub cached {
    my ($loc, %h) = @_;
    my $r = $t->post_json("/$loc/v1/completions",
                          { prompt => $prompt, max_tokens => 2,
                            temperature => 0 },
                          headers => \%h);
    is($r->{status}, 200, "$loc: 200") or diag($r->{body});
    return $r->{json}{usage}{prompt_tokens_details}{cached_tokens};
}

my %sub_a = (Authorization => jwt($secret, { sub => 'tenantA' }));
my %org_a = (Authorization => jwt($secret, { sub => 'someone',
                                              org => 'tenantA' }));
my %org2_a = (Authorization => jwt($secret2, { sub => 'someone',
                                                org => 'tenantA' }));
my %hdr_a = ('X-Tenant' => 'tenantA');

is(cached('sub', %sub_a), 0, 'JWT sub tenantA: cold');
is(cached('sub', %sub_a), $full, 'JWT sub tenantA again: hits its blocks');

is(cached('org', %org_a), 0, 'JWT org claim tenantA: not the sub\'s');
is(cached('org', %org_a), $full, 'JWT org claim tenantA again: hits');

is(cached('org2', %org2_a), 0,
   'the org claim tenantA signed by another key: not the first key\'s');

is(cached('hdr', %hdr_a), 0, 'X-Tenant: tenantA (typed): no JWT\'s blocks');
is(cached('hdr', %hdr_a), $full, 'X-Tenant: tenantA again: hits');

is(cached('sub', Authorization => jwt($secret, { sub => 777 })), 0,
   'JWT sub 777 (a number): cold');
is(cached('sub', Authorization => jwt($secret, { sub => '777' })), 0,
   'JWT sub "777" (a string): not the number\'s');
is(cached('sub', Authorization => jwt($secret, { sub => 777 })), $full,
   'JWT sub 777 again: hits');

# $nalar_tenant is still the name alone
my $log = $t->read_file('tenant.log');
like($log, qr/^tenantA$/m, '$nalar_tenant: tenantA');
like($log, qr/^777$/m, '$nalar_tenant: 777');

$t->check_log;

done_testing;

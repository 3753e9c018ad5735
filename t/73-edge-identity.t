#!/usr/bin/perl
# The identity an edge hands its nodes: an edge nginx (no model) signs the
# scope it establishes ($nalar_edge_identity, HMAC-SHA256 under
# nalar_edge_key) and a node (nalar_edge_tenant) takes its tenant and
# prefix cache scope from that header only when the signature verifies.
#  - sources stay apart through the edge, as on one node (t/64): a header
#    tenant, a JWT sub, a JWT org claim and the org claim under another key,
#    all named "victim", read nothing of each other's; the same identity
#    twice does read its cached blocks;
#  - forgeries sent straight to the node from the edge's own address
#    (127.0.0.2, which the node's allow-list admits): no identity, a bare
#    X-Edge-Tenant, a made-up MAC, a MAC of another identity, another key,
#    an expired or future time, a changed time: 403 with OpenAI error JSON,
#    and no request reaches the model; a header signed with the key does
#    (the control: the probe would see a forged scope);
#  - an identity a client sends to the edge is replaced by the edge's;
#  - `nginx -t` names a missing, short, world-readable key file, and a
#    node location that takes its tenant from two places.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64url);
use Time::HiRes qw(sleep time);

my $node = NalarTest->new->has_model->has_cli;
my $edge = NalarTest->new;

my $key = join '', map { sprintf '%02x', int rand 256 } 1 .. 32;
my $secret = 'edge-identity-test-secret-of-32+bytes!';
my $secret2 = 'another-key-for-the-same-org-claim-32+b';

for my $t ($node, $edge) {
    chmod 0600, $t->write_file('edge.key', "$key\n");
}
$edge->write_file('jwt.secret', $secret);
$edge->write_file('jwt2.secret', $secret2);

$node->write_conf(<<'CONF')->run(health => '/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    log_format node '$remote_addr $status tenant=$nalar_tenant '
                    'cached=$nalar_cached_tokens';

    server {
        listen 127.0.0.1:%%PORT%%;

        location /v1/ {
            # defence in depth only: any local process can bind 127.0.0.2
            allow 127.0.0.2;
            deny all;

            nalar_edge_key %%PREFIX%%/edge.key;
            nalar_edge_tenant $http_x_edge_identity;
            access_log %%PREFIX%%/node.log node;
            nalar_api;
        }

        location = /health { nalar_api; }
    }
}
CONF

my $np = $node->port;
my $locations = '';
for (['hdr', 'nalar_tenant $http_x_tenant;'],
     ['sub', 'nalar_jwt_key %%PREFIX%%/jwt.secret;'],
     ['org', "nalar_jwt_key %%PREFIX%%/jwt.secret;\n"
             . '            nalar_jwt_claim org;'],
     ['org2', "nalar_jwt_key %%PREFIX%%/jwt2.secret;\n"
              . '            nalar_jwt_claim org;'],
     ['nokey', "nalar_tenant \$http_x_tenant;\n"
               . '            nalar_edge_key off;'])
{
    my ($name, $tenancy) = @$_;
    $locations .= <<"LOC";
        location /$name/v1/ {
            $tenancy
            nalar_route_prefix 2k;
            proxy_set_header X-Edge-Identity \$nalar_edge_identity;
            proxy_bind 127.0.0.2;
            proxy_pass http://127.0.0.1:$np/v1/;
        }

LOC
}

$edge->write_conf(<<"CONF")->run(health => '/ping');
http {
    %%NALAR_HTTP%%
    nalar_edge_key %%PREFIX%%/edge.key;

    server {
        listen 127.0.0.1:%%PORT%%;

$locations
        location = /ping { return 200; }
    }
}
CONF

my $prompt = join ' ', ('In the beginning God created the heaven and the '
                        . 'earth. And the earth was without form, and void; '
                        . 'and darkness was upon the face of the deep.') x 4;
my $n = @{ $node->tokenize_special($prompt) };
my $full = int(($n - 1) / 16) * 16;
ok($full >= 64, "the prompt has $n tokens, $full in full blocks");

my $body = { prompt => $prompt, max_tokens => 2, temperature => 0 };

sub jwt {
    my ($k, $claims) = @_;
    return 'Bearer ' . NalarJWT::hs256($k, { %$claims, exp => time + 3600 });
}

# through the edge: cached_tokens
sub cached {
    my ($loc, %h) = @_;
    my $r = $edge->post_json("/$loc/v1/completions", $body, headers => \%h);
    is($r->{status}, 200, "$loc: 200") or diag($r->{raw});
    return $r->{json}{usage}{prompt_tokens_details}{cached_tokens} // -1;
}

# --- sources stay apart through the edge -------------------------------------

is(cached('hdr', 'X-Tenant' => 'victim'), 0, 'X-Tenant victim: cold');
is(cached('hdr', 'X-Tenant' => 'victim'), $full,
   'X-Tenant victim again: reads its blocks');

my %sub = (Authorization => jwt($secret, { sub => 'victim' }));
is(cached('sub', %sub), 0, 'JWT sub victim: nothing of X-Tenant victim');
is(cached('sub', %sub), $full, 'JWT sub victim again: reads its blocks');

my %org = (Authorization => jwt($secret, { sub => 'x', org => 'victim' }));
is(cached('org', %org), 0, 'JWT org claim victim: not the sub\'s');
is(cached('org', %org), $full, 'JWT org claim victim again: hits');

is(cached('org2', Authorization => jwt($secret2, { sub => 'x',
                                                    org => 'victim' })),
   0, 'the org claim victim under another key: not the first key\'s');

is(cached('hdr'), 0, 'no X-Tenant (no identity): nothing cached');
is(cached('hdr'), 0, '... and nothing shared among the anonymous');

like($node->read_file('node.log'), qr/^127\.0\.0\.2 200 tenant=victim /m,
     'the node logs the tenant the edge signed: $nalar_tenant victim');

# --- forgeries straight to the node ------------------------------------------

# an identity as the edge makes it: 1.<time>.<payload>.<mac>
sub identity {
    my (%o) = @_;
    my $payload = $o{anon} ? 'a'
                : 'o' . length($o{tenant}) . ":$o{tenant}$o{scope}";
    my $signed = '1.' . int($o{time} // time) . '.'
                 . encode_base64url($payload);
    return "$signed."
           . encode_base64url(hmac_sha256("nalar-edge-identity $signed",
                                          $o{key} // $key));
}

# the scope t/64's single node gives X-Tenant victim: the nalar_tenant
# expression (with its length), no client CA, the name
my $expr = '$http_x_tenant';
my $victim_scope = 'var:' . length($expr) . ":$expr:ca=-:victim";
my %victim = (tenant => 'victim', scope => $victim_scope);

sub direct {
    my (%h) = @_;
    my $from = delete $h{from} // '127.0.0.2';
    my $r = $node->post_json('/v1/completions', $body, headers => \%h,
                             local_addr => $from);
    return $r;
}

# a signed request of its own tenant, once the node has logged it: what
# the node logged between two marks is what it did in between
sub mark {
    my ($name) = @_;
    my $r = direct('X-Edge-Identity' => identity(tenant => $name,
                                                 scope => "mark:$name"));
    die "mark $name: $r->{status}\n" unless $r->{status} == 200;
    my $deadline = time + 30;
    sleep 0.05 until $node->read_file('node.log') =~ /tenant=$name /
                     || time > $deadline;
}

sub between {
    my ($from, $to) = @_;
    my ($log) = $node->read_file('node.log')
                =~ /tenant=$from [^\n]*\n(.*?)[^\n]*tenant=$to /s;
    return [ map { / (\d{3}) tenant=/ ? $1 : '?' } split /\n/, $log // '' ];
}

my $r = direct('X-Edge-Identity' => identity(%victim));
is($r->{status}, 200, 'control: an identity signed with the key, sent '
                      . 'from 127.0.0.2, is taken');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, $full,
   '... and reads X-Tenant victim\'s blocks (the probe sees a forged scope)');

my $valid = identity(%victim);
my ($signed, $mac) = $valid =~ /^(.*)\.([^.]+)$/;
my $flipped = $mac;
substr($flipped, 10, 1) = substr($mac, 10, 1) eq 'A' ? 'B' : 'A';
my ($t0) = $signed =~ /^1\.(\d+)\./;
(my $retimed = $valid) =~ s/^1\.\d+\./'1.' . ($t0 - 1) . '.'/e;
my $other = identity(tenant => 'other',
                     scope => 'var:' . length($expr) . ":$expr:ca=-:other");
my ($other_mac) = $other =~ /\.([^.]+)$/;

my @forged = (
    [ 'no identity', {} ],
    [ 'a bare X-Edge-Tenant', { 'X-Edge-Tenant' => 'victim' } ],
    [ 'a made-up identity header (127.0.0.2 bound by a local process)',
      { 'X-Edge-Identity' => "$signed."
                             . encode_base64url(join '', map { chr rand 256 }
                                                             1 .. 32) } ],
    [ 'a changed signature', { 'X-Edge-Identity' => "$signed.$flipped" } ],
    [ 'the signature of another identity',
      { 'X-Edge-Identity' => "$signed.$other_mac" } ],
    [ 'an identity signed with another key',
      { 'X-Edge-Identity' => identity(%victim, key => 'k' x 64) } ],
    [ 'an expired identity (2 minutes old)',
      { 'X-Edge-Identity' => identity(%victim, time => time - 120) } ],
    [ 'an identity from the future (2 minutes on)',
      { 'X-Edge-Identity' => identity(%victim, time => time + 120) } ],
    [ 'a signed identity with its time changed',
      { 'X-Edge-Identity' => $retimed } ],
    [ 'garbage', { 'X-Edge-Identity' => '1.abc' } ],
    [ 'the bare name', { 'X-Edge-Identity' => 'victim' } ],
);

mark('mark1');
for (@forged) {
    my ($what, $h) = @$_;
    my $r = direct(%$h);
    is($r->{status}, 403, "refused: $what");
    is_deeply([ @{ $r->{json}{error} || {} }{qw(type code)} ],
              [ 'permission_error', 'invalid_edge_identity' ],
              '... with OpenAI error JSON') or diag($r->{body});
    ok(!$r->{json}{usage}, '... and no usage: nothing was read');
}
mark('mark2');
is("@{ between('mark1', 'mark2') }", join(' ', (403) x @forged),
   'the node logged each forgery as 403, and served none');

$r = direct('X-Edge-Identity' => identity(%victim), from => '127.0.0.1');
is($r->{status}, 403, 'from another address even a signed identity meets '
                      . 'the allow-list (defence in depth)');

# --- a client's identity header never passes the edge ------------------------

is(cached('hdr', 'X-Tenant' => 'intruder',
          'X-Edge-Identity' => identity(%victim)),
   0, 'a signed X-Edge-Identity a client sends the edge is replaced');

# --- an edge location without the key sends no identity ---------------------

$r = $edge->post_json('/nokey/v1/completions', $body,
                      headers => { 'X-Tenant' => 'victim' });
is($r->{status}, 403, 'an edge without nalar_edge_key: the node refuses');
like($edge->read_file('error.log'),
     qr/\$nalar_edge_identity without nalar_edge_key/,
     '... and the edge says why');

$edge->check_log;
$node->check_log;

# --- nginx -t ---------------------------------------------------------------

my $c = NalarTest->new;
chmod 0600, $c->write_file('good.key', "$key\n");
chmod 0600, $c->write_file('short.key', "0123456789abcdef\n");
chmod 0644, $c->write_file('open.key', "$key\n");
mkdir $c->dir . '/dir.key';

sub conf_t {
    my ($lines) = @_;
    $c->write_conf(<<"CONF");
http {
    %%NALAR_HTTP%%
    server {
        listen 127.0.0.1:%%PORT%%;
        location / {
            $lines
        }
    }
}
CONF
    return $c->test_conf;
}

my ($rc, $out) = conf_t('nalar_edge_key %%PREFIX%%/good.key; '
                        . 'nalar_edge_tenant $http_x_edge_identity;');
is($rc, 0, 'nginx -t: a node location with a good key') or diag($out);

($rc, $out) = conf_t('nalar_edge_key %%PREFIX%%/good.key skew=5s; '
                     . 'return 200 $nalar_edge_identity;');
is($rc, 0, 'nginx -t: an edge with skew=5s') or diag($out);

for ([ 'nalar_edge_key %%PREFIX%%/none.key;',
       qr/nalar_edge_key: cannot open ".*none\.key".*No such file/,
       'a missing key file' ],
     [ 'nalar_edge_key %%PREFIX%%/short.key;',
       qr/holds 16 bytes; a key of at least 32 is needed/,
       'a short key' ],
     [ 'nalar_edge_key %%PREFIX%%/open.key;',
       qr/can be read by every user/, 'a key file every user can read' ],
     [ 'nalar_edge_key %%PREFIX%%/dir.key;',
       qr/is not a file/, 'a directory' ],
     [ 'nalar_edge_key %%PREFIX%%/good.key skew=0;',
       qr/invalid "skew=0"/, 'skew=0' ],
     [ 'nalar_edge_tenant $http_x_edge_identity;',
       qr/"nalar_edge_tenant" needs "nalar_edge_key"/,
       'nalar_edge_tenant without a key' ],
     [ 'nalar_edge_key %%PREFIX%%/good.key; nalar_tenant $http_x_tenant; '
       . 'nalar_edge_tenant $http_x_edge_identity;',
       qr/"nalar_edge_tenant" cannot be used with "nalar_tenant"/,
       'nalar_edge_tenant with nalar_tenant' ])
{
    my ($lines, $re, $what) = @$_;
    ($rc, $out) = conf_t($lines);
    ok($rc != 0 && $out =~ $re, "nginx -t refuses $what") or diag($out);
}

SKIP: {
    skip 'root reads any file', 1 if $> == 0;
    chmod 0000, $c->write_file('locked.key', "$key\n");
    ($rc, $out) = conf_t('nalar_edge_key %%PREFIX%%/locked.key;');
    ok($rc != 0 && $out =~ /cannot open .*Permission denied/,
       'nginx -t refuses an unreadable key file') or diag($out);
}

done_testing;

#!/usr/bin/perl
# A cluster on loopback: three engine nodes behind an edge nginx that loads
# the module without a model and routes with `hash $nalar_route_key
# consistent` (the edge location as README's recipe writes it); eight
# tenants, each with a system prompt (tenants 0 and 1 with the same text).
#  - affinity: a tenant's requests with its system prompt all reach one
#    node, and every one after the first reads the prompt from its cache;
#  - the trust boundary: the edge signs the scope it establishes
#    ($nalar_edge_identity under nalar_edge_key) and the nodes take it only
#    when it verifies (nalar_edge_tenant); a node refuses a client that
#    connects to it directly; an identity a client sets, even a validly
#    signed one, never reaches a node's scope when the edge sets its own
#    (an edge location that forgets proxy_set_header is the control that
#    shows the probe would see it), and a bare X-Edge-Tenant is refused;
#  - isolation: no tenant's prompt is cached for anyone else on any node;
#  - reload of the edge under load: every request answered 200 with the
#    greedy answer it has alone;
#  - failover: a stream on a node killed with SIGKILL ends at the client
#    with an error event and [DONE]; new requests go to the other nodes.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use Time::HiRes qw(sleep time);
use IO::Socket::INET;
use IO::Select;
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64url);

my @nodes = map { NalarTest->new->has_model } 0 .. 2;
my $edge = NalarTest->new;

# the key edge and nodes share
my $key = join '', map { sprintf '%02x', int rand 256 } 1 .. 32;
chmod 0600, $_->write_file('edge.key', "$key\n") for @nodes, $edge;

for my $i (0 .. 2) {
    $nodes[$i]->write_conf(<<"CONF")->run(health => '/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    # the failover test slows its stream down to keep it running
    map \$http_x_test_slow \$test_rate { default 0; 1 256; }

    server {
        listen 127.0.0.1:%%PORT%%;
        add_header X-Node node$i always;

        location /v1/ {
            allow 127.0.0.2;
            deny all;
            nalar_edge_key %%PREFIX%%/edge.key;
            nalar_edge_tenant \$http_x_edge_identity;
            limit_rate \$test_rate;
            nalar_api;
        }

        location = /health { nalar_api; }
    }
}
CONF
}

my $servers = join '', map {
    '        server 127.0.0.1:' . $nodes[$_]->port
    . " max_fails=1 fail_timeout=60s;\n" } 0 .. 2;

# /nodeN/ and /leakyN/: one node each, for the probes; /leakyN/ passes the
# client's headers as they come
my $direct = join '', map { my $p = $nodes[$_]->port; <<"LOC" } 0 .. 2;
        location /node$_/ {
            nalar_tenant \$http_x_tenant;
            proxy_set_header X-Edge-Identity \$nalar_edge_identity;
            proxy_bind 127.0.0.2;
            proxy_pass http://127.0.0.1:$p/;
        }

        location /leaky$_/ {
            proxy_bind 127.0.0.2;
            proxy_pass http://127.0.0.1:$p/;
        }
LOC

$edge->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_edge_key %%PREFIX%%/edge.key;

    upstream nalar_nodes {
        hash \$nalar_route_key consistent;
$servers
    }

    log_format edge '\$request_uri \$status key=\$nalar_route_key '
                    'upstream=\$upstream_addr';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/access.log edge;

        location /v1/ {
            nalar_tenant \$http_x_tenant;
            proxy_set_header X-Edge-Identity \$nalar_edge_identity;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_bind 127.0.0.2;
            proxy_next_upstream error timeout http_502 http_503;
            proxy_pass http://nalar_nodes;
        }

$direct
    }
}
CONF

# tenants 0 and 1 have the same system prompt
my @names = qw(Judah Reuben Simeon Levi Dan Naphtali Gad Asher);
my @system = map {
    my $n = $names[$_ == 1 ? 0 : $_];
    join ' ', map { "These are the words of the house of $n, verse $_:" }
              1 .. 8
} 0 .. 7;
my @questions = ('And it came to pass', 'In the beginning', 'A wise man',
                 'And the Lord spake unto Moses');

sub body {
    my ($t, $q, %o) = @_;
    return { model => 'kjv', max_tokens => 4, temperature => 0,
             messages => [ { role => 'system', content => $system[$t] },
                           { role => 'user', content => $questions[$q] } ],
             %o };
}

# -> (status, node, cached tokens, answer, response)
sub chat {
    my ($path, $t, $q, %o) = @_;
    my $headers = delete $o{headers} || { 'X-Tenant' => "tenant$t" };
    my $r = $edge->post_json($path, body($t, $q, %o), headers => $headers);
    my $j = $r->{json} || {};
    return ($r->{status}, $r->{headers}{'x-node'} // '',
            $j->{usage}{prompt_tokens_details}{cached_tokens},
            $j->{choices}[0]{message}{content}, $r);
}

# --- affinity ---------------------------------------------------------------

my (%node_of, %answer, @first_cached, @later_cached);
my $affine = 1;

for my $t (0 .. 7) {
    for my $q (0 .. $#questions) {
        my ($status, $node, $cached, $answer, $r) =
            chat('/v1/chat/completions', $t, $q);
        die "tenant $t question $q: $status $r->{raw}\n"
            unless $status == 200 && $node ne '';
        $node_of{$t} //= $node;
        $affine = 0 if $node ne $node_of{$t};
        $answer{"$t.$q"} = $answer;
        push @{ $q ? \@later_cached : \@first_cached }, $cached;
    }
}

ok($affine, 'every request of a tenant reached one node')
    or diag(explain \%node_of);
is_deeply(\@first_cached, [ (0) x 8 ],
          "each tenant's first request: nothing cached (tenant 1's system "
          . "prompt is tenant 0's text)");
ok(!grep({ !$_ || $_ < 32 } @later_cached),
   'every later request read the system prompt from the cache')
    or diag("cached: @later_cached");

# eight keys on three nodes: all on one would be a 3^-7 chance
my %used = map { $_ => 1 } values %node_of;
ok(keys %used >= 2, 'the tenants spread over the nodes: '
                    . join(' ', sort keys %used));

# the key: the same for the same scope and leading text, whatever follows
# or comes later in the body
my @keys = map { /key=(\w+)/ ? $1 : () } split /\n/,
           $edge->read_file('access.log');
my %per_tenant;
for (split /\n/, $edge->read_file('access.log')) {
    push @{ $per_tenant{$1} }, $2 if m{^/v1/chat/\S+ 200 key=(\w+)}
}
ok(@keys >= 32 && !grep({ length != 32 } @keys),
   '$nalar_route_key: 32 hex digits');
is(scalar(keys %per_tenant), 8,
   'one key per tenant and system prompt, whatever the question');

# --- the trust boundary -------------------------------------------------------

my $r = $edge->post_json('/v1/chat/completions', body(2, 0),
                         port => $nodes[0]->port,
                         headers => { 'X-Edge-Tenant' => 'tenant2' });
is($r->{status}, 403, 'a node refuses a client that connects directly');
is($r->{json}{error}{type}, 'permission_error', '... with OpenAI error JSON');

# tenant 2's identity as the edge signs it (ngx_nalar_edge.c): the scope
# names the nalar_tenant expression, the client CA (none) and the name
my $expr = '$http_x_tenant';
my $payload = 'o7:tenant2var:' . length($expr) . ":$expr:ca=-:tenant2";
my $signed = '1.' . int(time) . '.' . encode_base64url($payload);
my $identity = "$signed."
               . encode_base64url(hmac_sha256("nalar-edge-identity $signed",
                                              $key));

# tenant 2's prompt is cached on its node: a request carrying tenant 2's
# signed identity while the edge knows it as someone else reads nothing of
# it, on any node
my @forged;
for my $i (0 .. 2) {
    my (undef, undef, $cached) = chat("/node$i/v1/chat/completions", 2, 0,
        headers => { 'X-Tenant' => "intruder$i",
                     'X-Edge-Identity' => $identity,
                     'X-Edge-Tenant' => 'tenant2' });
    push @forged, $cached // 'none';
}
is("@forged", '0 0 0', 'a client-set X-Edge-Identity never reaches a scope');

my ($victim_idx) = $node_of{2} =~ /(\d)/;
my (undef, undef, $leaked) = chat("/leaky$victim_idx/v1/chat/completions",
    2, 0, headers => { 'X-Edge-Identity' => $identity });
ok($leaked && $leaked >= 32,
   "control: an edge that passes the client's identity header leaks "
   . "tenant 2's cache (the probe sees a forged scope)");

my ($status) = chat("/leaky$victim_idx/v1/chat/completions", 2, 0,
                    headers => { 'X-Edge-Tenant' => 'tenant2' });
is($status, 403, 'a bare X-Edge-Tenant, even from the edge\'s address: 403');

# --- isolation ----------------------------------------------------------------

my @strangers;
for my $t (0 .. 7) {
    for my $i (0 .. 2) {
        my ($status, undef, $cached) =
            chat("/node$i/v1/chat/completions", $t, 0,
                 headers => { 'X-Tenant' => "stranger$t.$i" });
        push @strangers, $status == 200 ? $cached : "HTTP $status";
    }
}
is("@strangers", join(' ', (0) x 24),
   "no tenant's prompt is cached for a stranger on any node");

# --- reload of the edge under load ------------------------------------------

my $dir = $edge->dir;
my @clients;
for my $c (0 .. 3) {
    push @clients, NalarTest::fork_client(sub {
        open my $out, '>', "$dir/client$c" or die "$!";
        for my $k (0 .. 9) {
            my ($t, $q) = (($c * 3 + $k) % 8, $k % 4);
            my $stream = $k % 2;
            my $r = $edge->post_json('/v1/chat/completions',
                                     body($t, $q, stream => $stream
                                                  ? JSON::PP::true
                                                  : JSON::PP::false),
                                     headers => { 'X-Tenant' => "tenant$t" });
            my $text;
            if ($stream) {
                my @ev = NalarTest::sse_events($r->{body} // '');
                $text = join '', map { $_->{choices}[0]{delta}{content} // '' }
                                 @ev[0 .. $#ev - 1]
                    if @ev && $ev[-1] eq '[DONE]';
            } else {
                $text = $r->{json}{choices}[0]{message}{content};
            }
            print $out "$r->{status} $t.$q ", $edge->json->encode([$text]),
                       "\n";
            $out->flush;
        }
        close $out;
    });
}

# reload once some requests are answered, then wait for the new workers
sub answered {
    my $n = 0;
    $n += () = $edge->read_file("client$_") =~ /\n/g for 0 .. 3;
    return $n;
}

my $deadline = time + 120;
sleep 0.05 while answered() < 6 && time < $deadline;
my $reloads = () = $edge->read_file('error.log') =~ /reconfiguring/g;
$edge->signal('HUP');
$deadline = time + 60;
sleep 0.05 while time < $deadline
    && (() = $edge->read_file('error.log') =~ /reconfiguring/g) == $reloads;
ok((() = $edge->read_file('error.log') =~ /reconfiguring/g) > $reloads,
   'the edge reloaded');

waitpid $_, 0 for @clients;

my @bad;
for my $c (0 .. 3) {
    for (split /\n/, $edge->read_file("client$c")) {
        my ($status, $tq, $json) = /^(\d+) (\S+) (.*)$/ or next;
        my $text = $edge->json->decode($json)->[0];
        push @bad, $_ unless $status == 200 && defined $text
                             && $text eq $answer{$tq};
    }
}
is(answered(), 40, 'every request under the reload was answered');
ok(!@bad, 'every one 200 with the answer it has alone') or diag("@bad");

# --- failover -----------------------------------------------------------------

my ($victim) = $node_of{0} =~ /(\d)/;
my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                              PeerPort => $edge->port, Proto => 'tcp')
    or die "connect: $!";
my $json = $edge->json->encode(body(0, 0, max_tokens => 200,
                                    ignore_eos => JSON::PP::true,
                                    stream => JSON::PP::true));
$s->syswrite("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
             . "Connection: close\r\nContent-Type: application/json\r\n"
             . "X-Tenant: tenant0\r\nX-Test-Slow: 1\r\n"
             . 'Content-Length: ' . length($json) . "\r\n\r\n$json");

my $raw = '';
my $sel = IO::Select->new($s);
$deadline = time + 60;
while (time < $deadline && $raw !~ /\r\n\r\n.*data: \{.*\n\n/s) {
    last unless $sel->can_read($deadline - time);
    $s->sysread(my $buf, 65536) or last;
    $raw .= $buf;
}
like($raw, qr/^HTTP\/1\.1 200.*X-Node: node$victim\r\n/s,
     "the stream runs on tenant 0's node");

$nodes[$victim]->kill_hard;

$deadline = time + 60;
while (time < $deadline) {
    last unless $sel->can_read($deadline - time);
    $s->sysread(my $buf, 65536) or last;
    $raw .= $buf;
}
close $s;

my $resp = NalarTest::parse_response($raw);
my @ev = eval { NalarTest::sse_events($resp->{body}) };
ok(!$@ && @ev >= 3 && $ev[-1] eq '[DONE]' && ref $ev[-2]
   && ($ev[-2]{error}{code} // '') eq 'node_failed',
   'the cut stream: whole events, then an error event and [DONE]')
    or diag("$@$resp->{body}");
like($raw, qr/\r\n0\r\n\r\n\z/, '... and a whole chunked response');
ok(!grep({ ref && $_->{choices} && ($_->{choices}[0]{finish_reason} // '') }
         @ev), '... with no finish_reason before it');

my @after;
for my $t (0 .. 7) {
    my ($status, $node) = chat('/v1/chat/completions', $t, 1);
    push @after, "$status $node";
}
ok(!grep({ !/^200 node[0-2]$/ || /node$victim/ } @after),
   'new requests succeed on the other nodes') or diag("@after");

$edge->check_log;
$nodes[$_]->check_log for grep { $_ != $victim } 0 .. 2;

done_testing;

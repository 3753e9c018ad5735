#!/usr/bin/perl
# The edge's own /metrics and /health, through a real edge (two workers,
# the upstream's state in a `zone`) in front of three real nodes:
#  - /health (nalar_edge_health): 200 "ok" with every node up, 200
#    "degraded" once a stopped node has failed a try, 503 "failed" once
#    every node has; the same JSON shape as a node's /health;
#  - /metrics (nalar_edge_metrics): accepted by `promtool check metrics`;
#    the counters of nalar_edge_zone move by exactly the requests sent, by
#    the status class the edge sent, by route key (with or without prompt
#    text), by identity signing (signed, or no key), by node and outcome of
#    each try, and retries; the /metrics and /health requests themselves,
#    and a location without the zone, are not counted; a reload keeps the
#    counters.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use Time::HiRes qw(sleep time);

my @nodes = map { NalarTest->new->has_model } 0 .. 2;
my $edge = NalarTest->new->has_program('promtool');

my $key = join '', map { sprintf '%02x', int rand 256 } 1 .. 32;
chmod 0600, $_->write_file('edge.key', "$key\n") for @nodes, $edge;

for my $i (0 .. 2) {
    $nodes[$i]->write_conf(<<"CONF")->run(health => '/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        add_header X-Node node$i always;

        location /v1/ {
            nalar_edge_key %%PREFIX%%/edge.key;
            nalar_edge_tenant \$http_x_edge_identity;
            nalar_api;
        }

        location = /health { nalar_api; }
    }
}
CONF
}

my %node_of_addr = map { ('127.0.0.1:' . $nodes[$_]->port) => $_ } 0 .. 2;
my $servers = join '', map {
    "        server $_ max_fails=1 fail_timeout=600s;\n" }
    sort keys %node_of_addr;

$edge->write_conf(<<"CONF")->run(health => 0);
worker_processes 2;

http {
    %%NALAR_HTTP%%
    nalar_edge_key %%PREFIX%%/edge.key;

    upstream nalar_nodes {
        zone nalar_nodes 64k;
        hash \$nalar_route_key consistent;
$servers
    }

    server {
        listen 127.0.0.1:%%PORT%%;

        location /v1/ {
            nalar_edge_zone edge;
            nalar_tenant \$http_x_tenant;
            nalar_route_prefix 2k;
            proxy_set_header X-Edge-Identity \$nalar_edge_identity;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_next_upstream error timeout http_502 http_503
                                non_idempotent;
            proxy_pass http://nalar_nodes;
        }

        # an edge location that forgot its key: no identity is signed
        location /nokey/ {
            nalar_edge_zone edge;
            nalar_edge_key off;
            nalar_tenant \$http_x_tenant;
            proxy_set_header X-Edge-Identity \$nalar_edge_identity;
            proxy_pass http://nalar_nodes/;
        }

        # not counted
        location /uncounted/ {
            nalar_tenant \$http_x_tenant;
            proxy_set_header X-Edge-Identity \$nalar_edge_identity;
            proxy_pass http://nalar_nodes/;
        }

        location = /metrics { nalar_edge_metrics edge; }
        location = /health  { nalar_edge_health nalar_nodes; }
    }
}
CONF

sub chat {
    my ($path, $t, %o) = @_;
    return $edge->post_json($path,
        { model => 'kjv', max_tokens => 2, temperature => 0,
          messages => [ { role => 'system',
                          content => "You are the scribe of tribe $t." },
                        { role => 'user', content => 'In the beginning' } ] },
        headers => { 'X-Tenant' => "tenant$t" }, %o);
}

# the exposition, checked by promtool, as { 'name{labels}' => value }
sub scrape {
    my ($what) = @_;
    my $r = $edge->get('/metrics');
    is($r->{status}, 200, "$what: /metrics 200");
    like($r->{headers}{'content-type'} // '', qr{^text/plain; version=0\.0\.4},
         "$what: the exposition's content type");
    my $file = $edge->write_file('metrics.txt', $r->{body} // '');
    my $out = `promtool check metrics < $file 2>&1`;
    is($?, 0, "$what: promtool check metrics accepts it") or diag($out);
    my %m;
    for (split /\n/, $r->{body} // '') {
        next if /^#/;
        my ($k, $v) = /^(\S+)\s+(\S+)$/ or next;
        $m{$k} = $v;
    }
    return \%m;
}

# A request is counted when it ends, which may be a moment after its
# client has the answer (and another worker may serve the next scrape):
# wait until the edge has counted `$n` requests in all, then scrape.
sub settled {
    my ($what, $n) = @_;
    my $deadline = time + 10 * $NalarTest::SLOW;
    while (time < $deadline) {
        my %m = map { /^(nalar_edge_requests_total\S*)\s+(\S+)$/ ? ($1, $2) : () }
                split /\n/, $edge->get('/metrics')->{body} // '';
        my $got = 0;
        $got += $_ for values %m;
        last if $got >= $n;
        sleep 0.05;
    }
    return scrape($what);
}

# the sum of a metric's series whose labels match
sub total {
    my ($m, $name, $labels) = @_;
    my $n = 0;
    for (keys %$m) {
        next unless /^\Q$name\E(?:\{(.*)\})?$/;
        my $l = $1 // '';
        $n += $m->{$_} if !defined $labels || $l =~ $labels;
    }
    return $n;
}

sub tries {
    my ($m, $addr, $outcome) = @_;
    return $m->{"nalar_edge_upstream_tries_total{node=\"$addr\","
                . "outcome=\"$outcome\"}"} // 0;
}

sub health {
    my $r = $edge->get('/health');
    my $j = eval { $edge->json->decode($r->{body}) } || {};
    my %state = map { $_->{id} => $_->{status} } @{ $j->{nodes} || [] };
    return ($r->{status}, $j, \%state);
}

# --- all nodes up -----------------------------------------------------------

my ($status, $j, $state) = health();
is($status, 200, '/health: 200 with every node up');
is($j->{status}, 'ok', '... "status": "ok"');
is($j->{upstream}, 'nalar_nodes', '... naming the upstream');
is_deeply($state, { map { $_ => 'up' } keys %node_of_addr },
          '... and every node "up"') or diag(explain $j);

my $m0 = scrape('before traffic');
is(total($m0, 'nalar_edge_requests_total'), 0, 'no request counted yet');
like(join(' ', sort keys %$m0),
     qr/nalar_edge_requests_total\{code="5xx"\}/,
     'every status class is there from the start');

# --- traffic: 6 answered, 2 refused by the node, 1 unsigned -------------------

my (%node_of, @codes);
for my $t (0 .. 5) {
    my $r = chat('/v1/chat/completions', $t);
    push @codes, $r->{status};
    $node_of{$t} = $r->{headers}{'x-node'} // '';
}
for (1 .. 2) {
    my $r = $edge->request('POST', '/v1/chat/completions',
                           body => '{"model": "kjv", "messages": [',
                           headers => { 'Content-Type' => 'application/json',
                                        'X-Tenant' => 'tenant0' });
    push @codes, $r->{status};
}
my $nokey = chat('/nokey/v1/chat/completions', 0);
push @codes, $nokey->{status};
is("@codes", '200 200 200 200 200 200 400 400 403',
   'six answers, two bodies the node refuses, one request without '
   . 'an identity (the node refuses it)');

# neither counted
$edge->get('/health');
is(chat('/uncounted/v1/chat/completions', 1)->{status}, 200,
   'a request in a location without nalar_edge_zone');

my $m1 = settled('after traffic', 9);
my %d = map { $_ => total($m1, 'nalar_edge_requests_total', qr/"$_"/)
                    - total($m0, 'nalar_edge_requests_total', qr/"$_"/) }
        qw(1xx 2xx 3xx 4xx 5xx);
is_deeply(\%d, { '1xx' => 0, '2xx' => 6, '3xx' => 0, '4xx' => 3,
                 '5xx' => 0 },
          'requests by the class the edge sent: exactly what was sent')
    or diag(explain \%d);
is($m1->{'nalar_edge_route_keys_total{prompt="yes"}'}, 7,
   'route keys with prompt text: the seven readable bodies');
is($m1->{'nalar_edge_route_keys_total{prompt="no"}'}, 2,
   'route keys without: the two broken bodies');
is($m1->{nalar_edge_identities_signed_total}, 8, 'identities signed: 8');
is($m1->{'nalar_edge_identity_failures_total{reason="no_key"}'}, 1,
   'identity failures: the one location without a key');
is(total($m1, 'nalar_edge_identity_failures_total'), 1,
   '... and no other failure');
is(total($m1, 'nalar_edge_upstream_tries_total', qr/outcome="2xx"/), 6,
   'node tries answered 2xx: 6');
is(total($m1, 'nalar_edge_upstream_tries_total', qr/outcome="4xx"/), 3,
   'node tries answered 4xx: 3');
is(total($m1, 'nalar_edge_upstream_tries_total'), 9,
   'no other try (no error, timeout or abort)');
is($m1->{nalar_edge_upstream_retries_total}, 0, 'no retry');
my %per_node;
for (keys %$m1) {
    # a node another outcome reached has a 2xx series too, at 0
    $per_node{"node$node_of_addr{$1}"} += $m1->{$_}
        if /node="([^"]+)",outcome="2xx"/ && $m1->{$_} > 0;
}
my %expect;
$expect{$node_of{$_}}++ for 0 .. 5;
is_deeply(\%per_node, \%expect,
          'each node labelled by its address, with the 2xx it answered')
    or diag(explain \%per_node, \%expect);

# --- one node stopped: degraded -----------------------------------------------

my ($x) = $node_of{0} =~ /node(\d)/;
my $addr_x = '127.0.0.1:' . $nodes[$x]->port;
$nodes[$x]->stop;

my $r = chat('/v1/chat/completions', 0);
is($r->{status}, 200, "tenant 0's node is stopped: the edge retries on "
                      . 'another');
isnt($r->{headers}{'x-node'} // '', "node$x", '... which answers');

($status, $j, $state) = health();
is($status, 200, '/health: still 200 with one node failed');
is($j->{status}, 'degraded', '... "status": "degraded"');
is($state->{$addr_x}, 'failed', '... the stopped node "failed"');
is(scalar(grep { $_ eq 'up' } values %$state), 2, '... the others "up"');

my $m2 = settled('one node down', 10);
is(tries($m2, $addr_x, 'error') - tries($m1, $addr_x, 'error'), 1,
   'the stopped node: one try without an answer');
is($m2->{nalar_edge_upstream_retries_total}, 1, 'one retry');
is(total($m2, 'nalar_edge_requests_total', qr/"2xx"/)
   - total($m1, 'nalar_edge_requests_total', qr/"2xx"/), 1,
   'the request counted once, as 2xx');

# --- every node stopped: failed -------------------------------------------------

$nodes[$_]->stop for grep { $_ != $x } 0 .. 2;
$r = chat('/v1/chat/completions', 1);
is($r->{status}, 502, 'every node stopped: 502');
is($r->{json}{error}{type}, 'server_error', '... as OpenAI error JSON')
    or diag($r->{body});

($status, $j, $state) = health();
is($status, 503, '/health: 503 once every node has failed');
is($j->{status}, 'failed', '... "status": "failed"');
is_deeply($state, { map { $_ => 'failed' } keys %node_of_addr },
          '... every node "failed"') or diag(explain $j);

my $m3 = settled('every node down', 11);
diag($edge->read_file('metrics.txt')) if $ENV{NALAR_TEST_SHOW};
is(total($m3, 'nalar_edge_requests_total', qr/"5xx"/), 1,
   'the 502 counted once, as 5xx');
for my $i (grep { $_ != $x } 0 .. 2) {
    my $a = '127.0.0.1:' . $nodes[$i]->port;
    is(tries($m3, $a, 'error') - tries($m2, $a, 'error'), 1,
       "node $i: one try without an answer");
}
is(tries($m3, $addr_x, 'error'), tries($m2, $addr_x, 'error'),
   'the node that had failed already is not tried again');
is($m3->{nalar_edge_upstream_no_live_total}, 1,
   'then nginx had no node left to try: counted once, not as a node');
ok(!grep({ /node="nalar_nodes"/ } keys %$m3), '... (no node named after the '
                                              . 'upstream)');
is($m3->{nalar_edge_upstream_retries_total}
   - $m2->{nalar_edge_upstream_retries_total}, 1,
   'the 502: two tries, one retry');

# --- a reload keeps the counters ----------------------------------------------

# once both old workers are shutting down (they close their listening
# sockets first), only the new ones answer
sub shutting { scalar(() = $edge->read_file('error.log')
                           =~ /gracefully shutting down/g) }
my $before = shutting();
$edge->signal('HUP');
my $deadline = time + 60;
sleep 0.05 while time < $deadline && shutting() < $before + 2;
is(shutting(), $before + 2, 'the edge reloaded: both old workers left');

$r = chat('/v1/chat/completions', 2);
is($r->{status}, 502, 'a request after the reload (the nodes are still '
                      . 'stopped): 502');
my $m4 = settled('after a reload', 12);
is(total($m4, 'nalar_edge_requests_total'),
   total($m3, 'nalar_edge_requests_total') + 1,
   'a reload keeps the counters: the new workers add to them');

$r = $edge->request('POST', '/metrics', body => 'x');
is($r->{status}, 405, '/metrics: POST is not allowed');

$edge->check_log;

# --- configuration mistakes that nginx -t names -------------------------------

my $bad = NalarTest->new;
my @mistakes = (
    [ 'location / { nalar_edge_zone a; nalar_edge_zone a; }',
      qr/"nalar_edge_zone" directive is duplicate/, 'a repeated zone' ],
    [ "limit_req_zone \$binary_remote_addr zone=a:1m rate=1r/s;\n"
      . '    server { location / { nalar_edge_metrics a; } }',
      qr/already declared for a different use/,
      "a zone name another module's zone has" ],
    [ 'location / { nalar_edge_health nowhere; }',
      qr/in upstream "nowhere"/,
      'nalar_edge_health of an upstream that does not exist' ],
);
for my $case (@mistakes) {
    my ($conf, $re, $what) = @$case;
    $conf = "server { listen 127.0.0.1:%%PORT%%; $conf }"
        unless $conf =~ /server \{/;
    $bad->write_conf("http {\n    %%NALAR_HTTP%%\n    $conf\n}\n");
    my ($rc, $out) = $bad->test_conf;
    ok($rc != 0 && $out =~ $re, "nginx -t refuses $what") or diag($out);
}

done_testing;

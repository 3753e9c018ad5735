#!/usr/bin/perl
# Cluster routing benchmark (run by bench/cluster.sh): the prefix cache hit
# rate (cached / prompt tokens) and client-side TTFT p50/p99 of one chat
# workload through an edge nginx over three engine nodes, with the upstream
# balanced by `hash $nalar_route_key consistent`, round-robin and `hash
# $nalar_tenant consistent`, against the same edge over a single node.
#
# Workload: 8 tenants, each with 2 system prompts (two apps) of 110-150
# tokens; per app, USERS conversations of TURNS turns, and per tenant
# USERS conversations without a system prompt.  Turns go in rounds (every
# conversation's turn 1, then every turn 2, ...), each round CONC
# requests at a time; a turn's history holds the answers the conversation
# got before.  Greedy, 8 tokens per answer, streamed with usage.
#
# Usage: perl bench/cluster.pl [USERS] [TURNS] [CONC]
use strict;
use warnings;
use lib 't/lib';
use NalarTest;
use Time::HiRes qw(time);
use POSIX qw(floor);
use List::Util qw(sum max min);

my ($USERS, $TURNS, $CONC) = (@ARGV, 3, 3, 4)[0 .. 2];

my @names = qw(Judah Reuben Simeon Levi Dan Naphtali Gad Asher);
my @apps = ('scribe', 'judge');
my @words = qw(light darkness water earth heaven seed fruit tree beast
               fowl man woman garden river gold stone);

# the conversations: [tenant, system prompt or undef, [user messages]]
my @convs;
for my $t (0 .. 7) {
    for my $a (0 .. 1) {
        my $sys = join ' ', map {
            "Thou art the $apps[$a] of the house of $names[$t], and this is "
            . "the law of verse $_:" } 1 .. 5;
        for my $u (0 .. $USERS - 1) {
            push @convs, [ $t, $sys, [ map {
                "Tell of the $words[($t + $a * 3 + $u * 5 + $_) % @words]"
                . " and the $words[($u * 7 + $_ * 3) % @words]" }
                0 .. $TURNS - 1 ] ];
        }
    }
    for my $u (0 .. $USERS - 1) {
        push @convs, [ $t, undef, [ map {
            "Speak of the $words[($t * 5 + $u * 3 + $_) % @words]" }
            0 .. $TURNS - 1 ] ];
    }
}

sub start_nodes {
    my ($n) = @_;
    my @nodes;
    for my $i (0 .. $n - 1) {
        my $node = NalarTest->new->has_model;
        $node->write_conf(<<"CONF")->run(health => '/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_kv_cache 64m;

    server {
        listen 127.0.0.1:%%PORT%%;
        add_header X-Node node$i always;
        location /v1/ {
            allow 127.0.0.2;
            deny all;
            nalar_tenant \$http_x_edge_tenant;
            nalar_api;
        }
        location = /health { nalar_api; }
    }
}
CONF
        push @nodes, $node;
    }
    return @nodes;
}

sub start_edge {
    my ($balance, @nodes) = @_;
    my $servers = join '', map {
        '        server 127.0.0.1:' . $_->port . ";\n" } @nodes;
    my $edge = NalarTest->new;
    $edge->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    upstream nalar_nodes {
        $balance
$servers
        keepalive 16;
    }
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ {
            nalar_tenant \$http_x_tenant;
            nalar_route_prefix 2k;
            proxy_set_header X-Edge-Tenant \$nalar_tenant;
            proxy_set_header Connection "";
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_bind 127.0.0.2;
            proxy_pass http://nalar_nodes;
        }
    }
}
CONF
    return $edge;
}

# one request: (node, cached, prompt, ttft ms, answer)
sub ask {
    my ($edge, $conv, $answers, $turn) = @_;
    my ($t, $sys, $users) = @$conv;
    my @m = $sys ? ({ role => 'system', content => $sys }) : ();
    for my $k (0 .. $turn) {
        push @m, { role => 'user', content => $users->[$k] };
        push @m, { role => 'assistant', content => $answers->[$k] }
            if $k < $turn;
    }
    my $t0 = time;
    my $first;
    my $r = $edge->post_json('/v1/chat/completions',
        { model => 'kjv', messages => \@m, max_tokens => 8,
          temperature => 0, stream => JSON::PP::true,
          stream_options => { include_usage => JSON::PP::true } },
        headers => { 'X-Tenant' => "tenant$t" },
        on_data => sub { $first //= time if $_[0] =~ /\r\n\r\n.*data: /s;
                         1 });
    die "HTTP $r->{status}: $r->{body}\n" unless $r->{status} == 200;
    my @ev = NalarTest::sse_events($r->{body});
    die "stream did not end: $r->{body}\n" unless @ev && $ev[-1] eq '[DONE]';
    my ($usage) = map { $_->{usage} } grep { ref && $_->{usage} } @ev;
    my $text = join '', map { $_->{choices}[0]{delta}{content} // '' }
                        grep { ref && @{ $_->{choices} || [] } } @ev;
    return ($r->{headers}{'x-node'} // '?',
            $usage->{prompt_tokens_details}{cached_tokens} // 0,
            $usage->{prompt_tokens}, 1000 * ($first - $t0), $text);
}

sub pct {
    my ($p, @v) = @_;
    @v = sort { $a <=> $b } @v;
    return $v[min($#v, floor($p / 100 * @v))];
}

sub run_workload {
    my ($edge) = @_;
    my @answers = map { [] } @convs;
    my (@ttft, %per_node);
    my ($cached, $prompt) = (0, 0);
    my $dir = $edge->dir;

    for my $turn (0 .. $TURNS - 1) {
        my @pids;
        for my $c (0 .. $CONC - 1) {
            push @pids, NalarTest::fork_client(sub {
                open my $out, '>', "$dir/w$c" or die "$!";
                for (my $i = $c; $i < @convs; $i += $CONC) {
                    my @res = ask($edge, $convs[$i], $answers[$i], $turn);
                    print $out $edge->json->encode([ $i, @res ]), "\n";
                }
                close $out;
            });
        }
        for (@pids) {
            waitpid $_, 0;
            die "a client failed\n" if $?;
        }
        for my $c (0 .. $CONC - 1) {
            for (split /\n/, $edge->read_file("w$c")) {
                my ($i, $node, $ca, $pr, $ms, $text) =
                    @{ $edge->json->decode($_) };
                $answers[$i][$turn] = $text;
                $cached += $ca;
                $prompt += $pr;
                push @ttft, $ms;
                $per_node{$node}++;
            }
        }
    }
    return { hit => $cached / $prompt, cached => $cached,
             prompt => $prompt, n => scalar @ttft,
             p50 => pct(50, @ttft), p99 => pct(99, @ttft),
             nodes => join('/', map { $per_node{$_} } sort keys %per_node) };
}

my @rows;
for my $case (['single node', 1, 'hash $nalar_route_key consistent;'],
              ['3 nodes, hash $nalar_route_key consistent', 3,
               'hash $nalar_route_key consistent;'],
              ['3 nodes, round-robin', 3, ''],
              ['3 nodes, hash $nalar_tenant consistent', 3,
               'hash $nalar_tenant consistent;'])
{
    my ($name, $n, $balance) = @$case;
    my @nodes = start_nodes($n);
    my $edge = start_edge($balance, @nodes);
    my $res = run_workload($edge);
    $edge->stop;
    $_->stop for @nodes;
    push @rows, [ $name, $res ];
    printf STDERR "%s: %.1f%%\n", $name, 100 * $res->{hit};
}

my $single = $rows[0][1]{hit};
printf "%d conversations (8 tenants; per tenant %d per system prompt x 2 "
       . "and %d without), %d turns, %d at a time: %d requests per row\n\n",
       scalar @convs, $USERS, $USERS, $TURNS, $CONC, $rows[0][1]{n};
print "| routing | hit rate | of single node | TTFT p50 | TTFT p99 "
    . "| requests per node |\n|---|---:|---:|---:|---:|---|\n";
for (@rows) {
    my ($name, $r) = @$_;
    printf "| %s | %.1f%% (%d/%d) | %.1f%% | %.1f ms | %.1f ms | %s |\n",
           $name, 100 * $r->{hit}, $r->{cached}, $r->{prompt},
           100 * $r->{hit} / $single, $r->{p50}, $r->{p99}, $r->{nodes};
}

#!/usr/bin/perl
# Nothing of a tenant's cache crosses to another: tenant A caches a
# 400-token prompt; then alternating pairs of probes, each by a tenant never
# seen before: A's prompt, and a never-seen prompt of the same length, while
# A's own repeats keep her prompt cached (and most recently used) as the
# probes fill the pool.  Every foreign probe of A's prompt reports
# cached_tokens 0; every repeat of A's hits in full.  Whether the foreign
# probes also *time* like misses is measured by bench/prefix-timing.pl (a
# benchmark: time depends on the host).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model;

my $secret = 'isolation-test-secret-0123456789abcdefgh';
$t->write_file('jwt.secret', $secret);

# /ready/v1/health: readiness without a token
$t->write_conf(<<'CONF')->run(health => '/ready/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_jwt_key %%PREFIX%%/jwt.secret;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /ready/v1/health { nalar_jwt_key off; nalar_api; }
    }
}
CONF

my $L = 400;
my $PAIRS = 10;
srand(6);
sub random_prompt { [ 1, map { 3 + int rand 2045 } 2 .. $L ] }

my $secret_prompt = random_prompt();

sub probe {
    my ($who, $p) = @_;
    my $r = $t->post_json('/v1/completions',
        { model => 'kjv', prompt => $p, max_tokens => 1, temperature => 0 },
        headers => { Authorization => 'Bearer '
                     . NalarJWT::hs256($secret, { sub => $who,
                                                  exp => time + 600 }) });
    die "probe by $who: HTTP $r->{status} $r->{body}\n"
        unless $r->{status} == 200;
    return $r->{json}{usage}{prompt_tokens_details}{cached_tokens};
}

is(probe(alice => $secret_prompt), 0, 'alice caches her prompt');
my $full = int(($L - 1) / 16) * 16;

my (@foreign_cached, @own_cached, @cold_cached);
for my $i (1 .. $PAIRS) {
    push @own_cached, probe(alice => $secret_prompt) if $i % 5 == 1;

    my @pair = ([foreign => $secret_prompt], [cold => random_prompt()]);
    @pair = reverse @pair if $i % 2;
    for my $p (@pair) {
        my $cached = probe("probe-$i-$p->[0]", $p->[1]);
        push @{ $p->[0] eq 'foreign' ? \@foreign_cached : \@cold_cached },
             $cached;
    }
}

is(scalar(grep { $_ != 0 } @foreign_cached), 0,
   "all $PAIRS foreign probes of alice's prompt: cached_tokens 0");
is(scalar(grep { $_ != 0 } @cold_cached), 0,
   "all $PAIRS never-seen prompts: cached_tokens 0");
is(scalar(grep { $_ != $full } @own_cached), 0,
   "alice's own repeats hit all along ($full tokens)");

$t->check_log;

done_testing;

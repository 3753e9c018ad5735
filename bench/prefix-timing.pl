#!/usr/bin/perl
# Benchmark (not a test: it measures time): nothing of a tenant's cache
# crosses to another, not even as timing.
# Tenant A caches a 400-token prompt; then 100 alternating pairs of probes,
# each by a tenant never seen before: A's prompt, and a never-seen prompt of
# the same length.  The foreign probes of A's prompt report cached_tokens 0
# and their time to first token ($nalar_ttft_ms, measured by the server)
# is indistinguishable from the cold probes' (Welch's t-test, |t| < 4),
# while A's own repeats -- the positive control that shows the measurement
# can see a hit -- are clearly faster (median under 3/4 of the cold one).
# t/69-prefix-isolation.t asserts the behaviour (cached_tokens); this
# measures the timing side channel.  Prints TAP; run from the repository
# root: `perl bench/prefix-timing.pl` (NALAR_TIMING_PAIRS=N pairs, 100 by
# default), on a quiet machine.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../t/lib";
use List::Util qw(sum);
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model;

my $secret = 'timing-test-secret-0123456789abcdefgh';
$t->write_file('jwt.secret', $secret);

# /ready/v1/health: readiness without a token
$t->write_conf(<<'CONF')->run(health => '/ready/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;    # one compute thread: no barrier stalls when the
                        # machine is busy, so prefill time is what shows
    nalar_jwt_key %%PREFIX%%/jwt.secret;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ {
            nalar_api;
            add_header X-TTFT $nalar_ttft_ms always;
        }
        location = /ready/v1/health { nalar_jwt_key off; nalar_api; }
    }
}
CONF

my $L = 400;
my $PAIRS = $ENV{NALAR_TIMING_PAIRS} || ($ENV{NALAR_ASAN} ? 30 : 100);
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
        unless $r->{status} == 200 && defined $r->{headers}{'x-ttft'};
    return ($r->{headers}{'x-ttft'},
            $r->{json}{usage}{prompt_tokens_details}{cached_tokens});
}

my ($ms, $cached) = probe(alice => $secret_prompt);
is($cached, 0, 'alice caches her prompt');
my $full = int(($L - 1) / 16) * 16;

my (@foreign, @cold, @own, @foreign_cached, @own_cached);
for my $i (1 .. $PAIRS) {
    # alice touches her prompt every 5 pairs, so that it stays cached (and
    # most recently used) while the probes fill the pool
    if ($i % 5 == 1) {
        ($ms, $cached) = probe(alice => $secret_prompt);
        push @own, $ms;
        push @own_cached, $cached;
    }

    # alternate which of the pair goes first
    my @pair = ([foreign => $secret_prompt], [cold => random_prompt()]);
    @pair = reverse @pair if $i % 2;
    for my $p (@pair) {
        ($ms, $cached) = probe("probe-$i-$p->[0]", $p->[1]);
        if ($p->[0] eq 'foreign') {
            push @foreign, $ms;
            push @foreign_cached, $cached;
        } else {
            push @cold, $ms;
        }
    }
}

is(scalar(grep { $_ != 0 } @foreign_cached), 0,
   "all $PAIRS foreign probes of alice's prompt: cached_tokens 0");
is(scalar(grep { $_ != $full } @own_cached), 0,
   "alice's own repeats hit all along ($full tokens)");

sub mean { sum(@_) / @_ }
sub var { my $m = mean(@_); sum(map { ($_ - $m) ** 2 } @_) / (@_ - 1) }
sub welch {
    my ($a, $b) = @_;
    return (mean(@$a) - mean(@$b))
           / sqrt(var(@$a) / @$a + var(@$b) / @$b + 1e-12);
}

my $tf = welch(\@foreign, \@cold);
diag(sprintf "TTFT ms: foreign %.3f (sd %.3f), cold %.3f (sd %.3f), "
             . "own hits %.3f; Welch t = %.2f", mean(@foreign),
             sqrt(var(@foreign)), mean(@cold), sqrt(var(@cold)), mean(@own),
             $tf);
cmp_ok(abs($tf), '<', 4,
       'foreign probes of a cached prompt time like cold misses');

# medians: robust to the load of whatever else runs on the machine
sub median { my @s = sort { $a <=> $b } @_; ($s[$#s / 2] + $s[@s / 2]) / 2 }
cmp_ok(median(@own), '<', 0.75 * median(@cold),
       'positive control: alice\'s own hits are clearly faster');

$t->check_log;

done_testing;

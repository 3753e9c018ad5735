#!/usr/bin/perl
# Eviction under a small KV cache (nalar_kv_cache of 40 blocks): many
# different prompts, one after another and six clients at once, repeated so
# that some hit and some were evicted.  Every answer equals `nalar generate`
# (no cache), cached_tokens is always a whole number of blocks, the metrics
# count evictions, and once idle every block is free again.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

# block bytes = 2 (K, V) * 6 layers * 16 positions * 2 kv heads * 32 * 4
my $block = 2 * 6 * 16 * 2 * 32 * 4;
my $kv = 40 * $block;

$t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    nalar_kv_cache $kv;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $m = $t->metrics;
is($m->{'nalar_kv_blocks_capacity{model="kjv"}'}, 40, 'the pool has 40 blocks');

my $N = 24;
my $text = 'In the beginning God created the heaven and the earth. And the '
         . 'earth was without form, and void; and darkness was upon the face '
         . 'of the deep.';
my @prompts = map { "Chapter $_. $text" } 1 .. 10;
my %want = map { $_ => $t->reference_text($_, $N, ignore_eos => 1) } @prompts;

sub ask {
    my ($p) = @_;
    my $r = $t->post_json('/v1/completions',
                          { model => 'kjv', prompt => $p, max_tokens => $N,
                            temperature => 0, ignore_eos => JSON::PP::true });
    return ('', -1) unless $r->{status} == 200;
    return ($r->{json}{choices}[0]{text},
            $r->{json}{usage}{prompt_tokens_details}{cached_tokens});
}

# one after another, then again in reverse order: the second round finds
# the latest prompts still cached (least recently used goes first) and the
# earliest evicted to make room

my ($bad, @cached) = (0);
for my $round (1 .. 2) {
    for my $p ($round == 1 ? @prompts : reverse @prompts) {
        my ($got, $c) = ask($p);
        if ($got ne $want{$p}) {
            $bad++;
            diag("round $round \"$p\": got \"$got\"\nwant \"$want{$p}\"");
        }
        push @cached, $c;
    }
}
is($bad, 0, 'sequential: every answer equals nalar generate');
is(scalar(grep { $_ < 0 || $_ % 16 } @cached), 0,
   'cached_tokens is always a whole number of blocks');
is(scalar(grep { $_ > 0 } @cached[0 .. 9]), 0,
   'first round: no prompt shares a block with another');
ok($cached[10] > 0, 'second round: the latest prompt hits');
is($cached[19], 0, 'second round: the earliest prompt was evicted');

$m = $t->metrics;
cmp_ok($m->{'nalar_prefix_cache_evictions_total{model="kjv"}'} // 0, '>', 0,
       'evictions counted');
cmp_ok($m->{'nalar_prefix_cache_blocks{model="kjv"}'}, '<=', 40,
       'published blocks fit the pool');

# six clients at once: running sequences hold their blocks while others
# are evicted around them

my @pids;
for my $k (0 .. 5) {
    push @pids, NalarTest::fork_client(sub {
        for my $i (0 .. 3) {
            my $p = $prompts[($k * 3 + $i) % @prompts];
            my ($got) = ask($p);
            die "client $k \"$p\": got \"$got\"\n" if $got ne $want{$p};
        }
    });
}
my $failed = 0;
for (@pids) {
    waitpid($_, 0);
    $failed++ if $?;
}
is($failed, 0, 'concurrent: every answer equals nalar generate');

# idle: no block held by a sequence (cached ones count as free)

my $free;
for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
    $m = $t->metrics;
    $free = $m->{'nalar_kv_blocks_free{model="kjv"}'};
    last if $free == 40 && $m->{'nalar_requests_running{model="kjv"}'} == 0;
    select undef, undef, undef, 0.05;
}
is($free, 40, 'idle: kv_blocks_free is back at 40');
cmp_ok($m->{'nalar_prefix_cache_evictions_total{model="kjv"}'}, '>', 0,
       'evictions after the concurrent round');
cmp_ok($m->{'nalar_prefix_cache_hits_total{model="kjv"}'}, '>', 0,
       'and hits');

$t->check_log;

done_testing;

#!/usr/bin/perl
# nalar_kv_cache dtype= on the CPU backend: with f16 and bf16 the same
# size holds twice the blocks of f32 (the capacity gauge says so), and the
# server's greedy ids equal `nalar generate --kv-type` with the same type,
# token for token, for prompts prefilled in chunks and decoded side by
# side; every block is free again after.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Time::HiRes qw(sleep time);
use NalarTest;

my $M = 'model="kjv"';
my @prompts = ('In the beginning', 'And it came to pass', 'A wise man',
               join(' ', ('And God said, Let there be light.') x 6));
my $N = 32;
my %cap;

for my $dt (qw(f32 f16 bf16)) {
    my $t = NalarTest->new->has_model->has_cli;

    $t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    nalar_kv_cache 1m dtype=$dt;
    nalar_max_batch_tokens 16;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

    $cap{$dt} = $t->metrics->{"nalar_kv_blocks_capacity{$M}"};
    ok($cap{$dt}, "$dt: the pool has $cap{$dt} blocks");

    my %ref = map { $_ => $t->reference_ids($_, $N, ignore_eos => 1,
                                            kv_type => $dt) } @prompts;
    my @pids;
    for my $p (@prompts) {
        push @pids, NalarTest::fork_client(sub {
            my $r = $t->post_json('/v1/completions', {
                model => 'kjv', prompt => $p, max_tokens => $N,
                temperature => 0, ignore_eos => JSON::PP::true,
                logprobs => 0, return_tokens_as_token_ids => JSON::PP::true,
            });
            my $lp = ($r->{json} || {})->{choices}[0]{logprobs} || {};
            my $got = join ' ', map { /^token_id:(\d+)$/ ? $1 : "?$_" }
                                @{ $lp->{tokens} || [] };
            die "$dt '$p': got $got\nwant @{ $ref{$p} }\n"
                unless $r->{status} == 200 && $got eq "@{ $ref{$p} }";
        });
    }
    my $bad = 0;
    for (@pids) { waitpid $_, 0; $bad++ if $?; }
    is($bad, 0, "$dt: 4 concurrent requests equal nalar generate "
       . "--kv-type $dt, token for token");

    # the gauge settles once the engine has finished its last step
    my ($m, $deadline) = ({}, time + 30 * $NalarTest::SLOW);
    while (time < $deadline) {
        $m = $t->metrics;
        last if ($m->{"nalar_kv_blocks_free{$M}"} // -1) == $cap{$dt};
        sleep 0.1;
    }
    is($m->{"nalar_kv_blocks_free{$M}"}, $cap{$dt},
       "$dt: every KV block free after");
    $t->check_log;
}

for my $dt (qw(f16 bf16)) {
    ok($cap{$dt} >= 2 * $cap{f32} && $cap{$dt} <= 2 * $cap{f32} + 1,
       "$dt: 1m holds twice the f32 blocks ($cap{$dt} against $cap{f32})");
}

done_testing;

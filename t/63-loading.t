#!/usr/bin/perl
# The model loads off the event loop after the worker starts: meanwhile
# /v1/health and the API answer 503 with Retry-After (the other endpoints
# keep working), then the same requests succeed.  A model the engine cannot
# load is reported by /v1/health and the API, and nginx keeps running.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Time::HiRes qw(sleep time);
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;
my $dir = $t->dir;

# a model big enough to take a moment to load (random weights, f16)
system(NalarTest::root() . '/build/nalar', 'mkmodel', '--dim', '768',
       '--layers', '6', '--heads', '12', '--kv-heads', '12', '--ffn', '2048',
       '--vocab', '32000', '--ctx', '512', '--type', 'f16', '--seed', '1',
       '-o', "$dir/big.gguf") == 0
    or plan(skip_all => 'nalar mkmodel failed');

$t->write_conf(<<'CONF')->run(health => 0);
http {
    %%NALAR_HTTP%%
    nalar_model big %%PREFIX%%/big.gguf;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $h = $t->get('/v1/health');
my $c = $t->post_json('/v1/completions', { prompt => 'x', max_tokens => 1 });
my $models = $t->get('/v1/models');

SKIP: {
    skip 'the model loaded before the first request could see it', 6
        if $h->{status} == 200;

    is($h->{status}, 503, 'health: 503 while loading');
    is($h->{headers}{'retry-after'}, '1', 'health: Retry-After');
    like($h->{body}, qr/"status":"loading"/, 'health says loading');

    ok($c->{status} == 503 || $c->{status} == 200,
       'a completion while loading: 503 (or served if loading just ended)');
    if ($c->{status} == 503) {
        is($c->{json}{error}{code}, 'model_loading', 'code model_loading');
        is($c->{headers}{'retry-after'}, '1', 'with Retry-After');
    } else {
        pass('served') for 1 .. 2;
    }
}
is($models->{status}, 200, '/v1/models answers while loading');

my $deadline = time + 30 * $NalarTest::SLOW;
do { sleep 0.05; $h = $t->get('/v1/health') }
    while $h->{status} != 200 && time < $deadline;
is($h->{status}, 200, 'health: 200 once loaded');

$c = $t->post_json('/v1/completions', { prompt => 'x', max_tokens => 3,
                                        ignore_eos => JSON::PP::true });
is($c->{json}{usage}{completion_tokens}, 3, 'and completions are served');

$t->check_log;

# an engine that cannot load: nginx -t passes (the file is well formed),
# the worker reports the failure instead of dying

my $t2 = NalarTest->new;
$t2->write_conf(<<'CONF')->run(health => 0);
http {
    %%NALAR_HTTP%%
    nalar_model big %%MODEL%%;
    nalar_kv_cache 1k;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

$deadline = time + 10 * $NalarTest::SLOW;
do { sleep 0.05; $h = $t2->get('/v1/health') }
    while $h->{body} !~ /failed|ready/ && time < $deadline;

if ($h->{body} =~ /"ready"/) {
    pass('the engine accepted a 1k KV cache (nothing to fail)') for 1 .. 3;
} else {
    is($h->{status}, 503, 'a model that failed to load: health 503');
    like($h->{body}, qr/"status":"failed".*"error":"/, 'with the reason');
    $c = $t2->post_json('/v1/completions', { prompt => 'x' });
    is($c->{json}{error}{code}, 'model_failed', 'the API says why');
}
$t2->check_log;

done_testing;

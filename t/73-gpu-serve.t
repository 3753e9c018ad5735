#!/usr/bin/perl
# bench/gpu-serve.sh in its CPU mode (BACKEND=cpu SMALL=1, short runs):
# the script builds its models, starts nginx, drives every phase through
# it and the in-process engine, and prints every table, with every request
# answered.  What it measures is not checked here.
use strict;
use warnings;
use File::Temp qw(tempdir);
use FindBin;
use lib "$FindBin::Bin/lib";
use NalarTest;
use Test::More;

my $root = NalarTest->root;
NalarTest::missing('build/nalar not built') unless -x "$root/build/nalar";
NalarTest::missing('the module is not built')
    unless -f "$root/build/module/ngx_nalar_module.so";
NalarTest::missing("$NalarTest::NGINX missing") unless -x $NalarTest::NGINX;
NalarTest->new->has_program('curl');

my $log = tempdir(CLEANUP => 1);
my $port = NalarTest::free_port();
my $out = `cd $root && BACKEND=cpu SMALL=1 BUILD=0 STREAMS="1 8" DUR=0.3 \\
           REPS=1 PORT=$port LOG=$log NTOK=16 PRED_NTOK=32 \\
           sh bench/gpu-serve.sh 2>&1`;
my $rc = $? >> 8;
is($rc, 0, 'gpu-serve.sh (CPU, small) exits 0') or diag($out);

like($out, qr/^## streams.*\n.*\n.*\n\s+1\s+[\d.]+\s+[\d.]+.*\n\s+8\s+[\d.]+/m,
     'the streams table has rows for 1 and 8 streams');
like($out, qr/^## prefix reuse.*\n.*\n\s+1\s+[\d.]+ ms\s+[\d.]+ ms/m,
     'the prefix-reuse table: cold and shared TTFT');
like($out, qr/^Predicted Outputs, 1 stream: plain [\d.]+ tok\/s, predicted [\d.]+/m,
     'predicted outputs against plain');
like($out, qr/prediction: \d+ answer tokens, [1-9]\d* altered; accepted \d+/,
     'the prediction was altered, and the usage counted its tokens');
like($out, qr/^auto with the draft, 32 streams: plain [\d.]+ tok\/s, auto [\d.]+/m,
     'auto against plain');
like($out, qr/^draft forced, 1 stream: [\d.]+ tok\/s; \d+ steps/m,
     'the forced draft and its cost');
like($out, qr/^## nginx against the engine.*\n.*\n\s+1\s+[\d.]+\s+[\d.]+/m,
     'nginx against the in-process engine');
like($out, qr/^requests [1-9]\d*, errors 0$/m, 'requests ran, none failed');
like($out, qr/gpu-serve: all phases ran, every request succeeded/,
     'every phase ran');

done_testing();

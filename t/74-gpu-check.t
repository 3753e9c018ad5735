#!/usr/bin/perl
# bench/gpu-check.sh's report without a device (FROM=DIR): the goals are
# read from the bench's table, including the rows a run on a GPU adds
# (16 streams, launches per step, the verify curve), and a table without
# them says "not measured" rather than failing.
use strict;
use warnings;
use File::Temp qw(tempdir);
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;

my $root = "$FindBin::Bin/..";
my $dir = tempdir(CLEANUP => 1);

# the bench table of an earlier H200 run (bench/results/gpu-bench.txt)
open my $in, '<', "$root/bench/results/gpu-bench.txt" or die $!;
my @table = grep { /^model / .. 0 } <$in>;
close $in;
ok(@table > 5, 'the committed bench table is there');

sub report {
    my (@lines) = @_;
    open my $f, '>', "$dir/bench.txt" or die $!;
    print $f @lines;
    close $f;
    my $out = `cd $root && FROM=$dir sh bench/gpu-check.sh 2>&1`;
    return ($? >> 8, $out);
}

my ($rc, $out) = report(@table);
is($rc, 0, 'a report from an earlier table') or diag($out);
like($out, qr/goal: batch-1 decode\s+69\.50% of copy bandwidth \(goal >= 85%\): not met/,
     'batch-1 decode against copy bandwidth');
like($out, qr/goal: 8 streams\s+2\.97x batch 1 \(goal >= 7x\): not met/,
     '8 streams against batch 1');
like($out, qr/goal: 16 streams\s+not measured/, 'no 16-stream row: not measured');
like($out, qr/goal: verify pass of 8 tokens\s+not measured/,
     'no verify curve: not measured');
like($out, qr/goal: verify pass of 8 tokens, mma\s+not measured/,
     'no MMA rows: not measured');
like($out, qr/goal: paged attention 8k\s+51\.20% of copy bandwidth/,
     'paged attention (F32 KV)');
like($out, qr/goal: paged attention 8k, BF16 KV\s+not measured/,
     'no BF16 KV row: not measured');
like($out, qr/the report of .* \(nothing built or run\)/, 'says it ran nothing');

# the rows kernels/cuda_bench.cu adds, in its printf formats (values made up
# for the parser, not measurements)
my @more = (
    sprintf("%-34s %10.1f tok/s  %.1fx batch 1\n", 'decode batch 16', 2500.0, 13.1),
    sprintf("%-34s %10d       %.1f per token\n", 'launches per step, batch 1', 387, 387),
    sprintf("%-34s %10.1f GB/s  %.1f us in %d splits, %.1f%% of copy bandwidth\n",
            'paged attention, ctx 8192, BF16 KV', 3500.0, 9.6, 64, 81.8),
    (map { sprintf("%-34s %10.3f ms     %.3fx one token\n", "verify pass, k+1 = $_",
                   5.0 + $_ / 10, 1 + ($_ - 1) / 50) } 1 .. 9),
    sprintf("%-34s %10.2f tok/s  %.2fx the GEMV's\n", 'decode batch 1, mma', 200.0, 1.05),
    sprintf("%-34s %10.1f tok/s  %.1fx batch 1 (mma)\n", 'decode batch 8, mma', 1500.0, 7.5),
    (map { sprintf("%-34s %10.3f ms     %.3fx one token\n", "verify pass, k+1 = $_, mma",
                   5.0, 1 + ($_ - 1) / 100) } 1 .. 9),
);
($rc, $out) = report(@table, @more);
is($rc, 0, 'a report with the new rows') or diag($out);
like($out, qr/goal: 16 streams\s+13\.08x batch 1 \(goal >= 13x\): met/,
     '16 streams against batch 1');
like($out, qr/goal: verify pass of 8 tokens\s+1\.14x one token \(goal <= 1\.15x\): met/,
     'the 8-token verify pass against one token');
like($out, qr/goal: paged attention 8k, BF16 KV\s+81\.80% of copy bandwidth \(goal >= 80%\): met/,
     'paged attention with a BF16 KV cache');
like($out, qr/goal: paged attention 8k\s+51\.20%/,
     'the F32 row is still the F32 goal');
like($out, qr/batch-1 decode step\s+387 kernel launches per token/,
     'launches per token');
like($out, qr/goal: 8 streams, mma\s+7\.50x batch 1 \(goal >= 7x\): met/,
     '8 streams on the MMA kernel');
like($out, qr/goal: verify pass of 8 tokens, mma\s+1\.07x one token \(goal <= 1\.15x\): met/,
     'the 8-token verify pass on the MMA kernel');
like($out, qr/goal: 16 streams, mma\s+not measured/, 'no 16-stream MMA row');
like($out, qr/verify curve \(k\+1 = 2\.\.9\)\s+1\.02 1\.04 1\.06 1\.08 1\.10 1\.12 1\.14 1\.16/,
     'the verify curve');
like($out, qr/goal: Q4_K_M batch-1 decode\s+not measured/,
     'no Q4_K_M bench: not measured');
like($out, qr/goal: Q8_0 batch-1 decode\s+not measured/,
     'no Q8_0 bench: not measured');

# the quantized models' benches (bench-TYPE.txt, `nalar bench --backend
# cuda -m`), in cuda_bench.cu's printf formats (values made up)
sub quant_table {
    my ($type, $tps, $gbs, $pct) = @_;
    open my $f, '>', "$dir/bench-$type.txt" or die $!;
    printf $f "model build/gpu-models/llama3-8b-%s.gguf: dim 4096, 32 layers, "
        . "32/8 heads, ffn 14336, vocab 128256, 4.92 GB of weights read per token\n",
        $type;
    printf $f "%-34s %10.1f GB/s  %s\n", 'HBM copy bandwidth (D2D)', 4278.2,
        'read + write';
    printf $f "%-34s %10.2f tok/s  %.1f GB/s = %.1f%% of copy bandwidth\n",
        'decode batch 1', $tps, $gbs, $pct;
    batch_rows($f, 16 => $tps * 9, 32 => $tps * 14);
    close $f;
}
sub batch_rows {
    my ($f, %tps) = @_;
    for my $k (sort { $a <=> $b } keys %tps) {
        printf $f "%-34s %10.1f tok/s  %.1fx batch 1\n", "decode batch $k",
            $tps{$k}, 1.0;
        printf $f "%-34s %10.1f tok/s  %.1fx batch 1\n",
            "decode batch $k, logits to host", 1.0, 1.0;
    }
}
quant_table('q4_k_m', 700.0, 3400.0, 79.5);
quant_table('q8_0', 400.0, 3000.0, 70.1);
open my $sk, '>', "$dir/bench-q8_0.skipped" or die $!;
print $sk "skipped: 120 s of the budget left\n";
close $sk;
($rc, $out) = report(@table, @more);
is($rc, 0, 'a report with the quantized benches') or diag($out);
like($out, qr/goal: Q4_K_M batch-1 decode\s+79\.50% of copy bandwidth \(goal >= 75%\): met/,
     'Q4_K_M decode against copy bandwidth');
like($out, qr/goal: Q8_0 batch-1 decode\s+70\.10% of copy bandwidth \(goal >= 75%\): not met/,
     'Q8_0 decode against copy bandwidth');
like($out, qr/Q8_0: skipped: 120 s of the budget left/, 'a skipped type says so');
like($out, qr/^model build\/gpu-models\/llama3-8b-q4_k_m\.gguf/m,
     "the quantized bench's model line");
unlike($out, qr/Q4_K_M decode batch/, 'no GEMV run: no comparison rows');

# the Q4_K_M run through the GEMV at 16 and 32 streams
open my $g, '>', "$dir/bench-q4_k_m-gemv32.txt" or die $!;
batch_rows($g, 16 => 8000.0, 32 => 9000.0);
close $g;
($rc, $out) = report(@table, @more);
like($out, qr/Q4_K_M decode batch 16\s+6300\.0 tok\/s with cuBLAS, 8000\.0 with the GEMV/,
     '16 streams: cuBLAS against the GEMV');
like($out, qr/Q4_K_M decode batch 32\s+9800\.0 tok\/s with cuBLAS, 9000\.0 with the GEMV/,
     '32 streams: cuBLAS against the GEMV');
unlink "$dir/bench-q4_k_m-gemv32.txt";
open my $gs, '>', "$dir/bench-q4_k_m-gemv32.skipped" or die $!;
print $gs "skipped: 100 s of the budget left\n";
close $gs;
($rc, $out) = report(@table, @more);
like($out, qr/Q4_K_M, gemv_max 32: skipped: 100 s of the budget left/,
     'a skipped GEMV run says so');

done_testing();

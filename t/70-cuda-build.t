#!/usr/bin/perl
# The CUDA backend compiles (no GPU needed), links into build/nalar, and
# without a GPU fails cleanly; with a GPU, the op-by-op check runs.
use strict;
use warnings;

my $nvcc = `command -v nvcc 2>/dev/null`;
chomp $nvcc;
$nvcc = '/usr/local/cuda/bin/nvcc' if !$nvcc && -x '/usr/local/cuda/bin/nvcc';
if (!$nvcc || (defined $ENV{NALAR_CUDA} && $ENV{NALAR_CUDA} eq '0')) {
    print "1..0 # SKIP nvcc not found (or NALAR_CUDA=0)\n";
    exit 0;
}

print "1..5\n";

my $out = `make build/libnalar_cuda.a build/nalar-cuda-check build/nalar 2>&1`;
my $rc = $? >> 8;
print(($rc == 0 ? "ok" : "not ok"), " 1 - kernels/cuda/*.cu compile with nvcc"
      . " (-Werror) into build/libnalar_cuda.a\n");
if ($rc != 0) {
    my @l = split /\n/, $out;
    splice @l, 0, @l - 40 if @l > 40;
    print map { "# $_\n" } @l;
}

my @syms = `nm -C build/libnalar_cuda.a 2>/dev/null`;
my %want = map { $_ => 0 } qw(nalar_cuda_backend_create nalar_cuda_attn_decode
    nalar_cuda_attn_prefill nalar_cuda_matmul nalar_cuda_gemv_q8
    nalar_cuda_argmax nalar_cuda_free_memory nalar_cuda_bench);
for (@syms) {
    $want{$1} = 1 if / T (\w+)$/ && exists $want{$1};
}
my @missing = grep { !$want{$_} } sort keys %want;
print((@missing ? "not ok" : "ok"), " 2 - the library defines the backend,"
      . " its ops and the bench" . (@missing ? " (missing @missing)" : "")
      . "\n");

# exit 77: no GPU, so the check did not run: a TAP skip, not a pass
my $check = `./build/nalar-cuda-check 2>&1`;
my $crc = $? >> 8;
my $gpu = $crc != 77;
if ($gpu) {
    print(($crc == 0 ? "ok" : "not ok"), " 3 - nalar-cuda-check on a GPU"
          . " (exit $crc)\n");
    if ($crc != 0) {
        print map { "# $_\n" } grep { /FAIL|WARN|failed/ } split /\n/, $check;
    }
} else {
    print "ok 3 # SKIP nalar-cuda-check: no GPU (exit 77)\n";
}

my $cmd = "./build/nalar generate -m models/nalar-kjv-target-f32.gguf"
        . " -p 'In the beginning' -n 4 --backend cuda 2>&1";
my $gen = `$cmd`;
my $grc = $?;
if ($gpu) {
    print(($grc == 0 ? "ok" : "not ok"), " 4 - generate --backend cuda runs"
          . " on the GPU\n");
} else {
    print((($grc >> 8) == 1 && ($grc & 127) == 0 && $gen =~ /cuda/
           ? "ok" : "not ok"),
          " 4 - generate --backend cuda without a GPU: a clean error\n");
    print "# $gen" if $gen !~ /cuda/;
}

my $b = `./build/nalar bench --synthetic no-such-shape 2>&1`;
my $brc = $?;
print((($brc >> 8) != 0 && ($brc & 127) == 0 && $b =~ /nalar:/
       ? "ok" : "not ok"),
      " 5 - bench --synthetic with a bad shape or no GPU: a clean error\n");

#!/usr/bin/perl
# Decode's row kernels ask for the bytes some distance ahead of those they
# read (a hint, which no output may depend on): with none asked for
# (NALAR_CPU_PREFETCH=0) and with the distance past every matrix's end
# (1 MiB), every type's one-token products on every instruction set still
# give the scalar kernel's bits, with 8-bit and with 16-bit activations
# (the C unit tests' own checks, run under each distance; the default
# distance is theirs as they run alone).
use strict;
use warnings;
use Test::More;

for my $pf (0, 1048576) {
    for my $bin ('test_quant_q8', 'test_quant_x16') {
        local $ENV{NALAR_CPU_PREFETCH} = $pf;
        my $out = `./build/t/$bin 2>&1`;
        is($?, 0, "$bin passes with NALAR_CPU_PREFETCH=$pf") or diag($out);
        my $n = () = $out =~ /^ok \d+ .*one token/mg;
        my $bad = () = $out =~ /^not ok/mg;
        ok($n >= 5 && $bad == 0,
           "  its one-token checks ran and passed ($n, $bad failed)");
    }
}
done_testing();

#!/usr/bin/perl
# 16-bit activations' kernels (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): x's codes
# and their two planes, the scalar reference against an int64
# double-check (random, extreme and saturated blocks, codes at +-32639),
# every instruction set's bits against the reference, batch invariance
# (C unit test under ASan/UBSan).
exec './build/t/test_quant_x16' or die "cannot run build/t/test_quant_x16: $!";

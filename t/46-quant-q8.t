#!/usr/bin/perl
# 8-bit activations' integer kernels (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): x's
# codes, every instruction set's bits against the scalar reference (random
# blocks, extreme scales and mins), products against double products,
# batch invariance (C unit test under ASan/UBSan).
exec './build/t/test_quant_q8' or die "cannot run build/t/test_quant_q8: $!";

#!/usr/bin/perl
# Pair-multiplier activations (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): x's codes
# on every instruction set path the scalar reference's bytes, the rule
# (D, n and the codes per pair) as cpu_quant_pairs.c writes it, x' = n c,
# least squares over the 8 candidates, the 16-bit planes and their sums,
# and the products against an int64/double check (C unit test under
# ASan/UBSan).
exec './build/t/test_quant_pairs' or die "cannot run build/t/test_quant_pairs: $!";

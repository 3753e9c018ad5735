#!/usr/bin/perl
# Pair-multiplier activations' one-token kernels (Q4_K, Q5_K, four rows at
# a time): the 16-bit scalar reference's bits on x' = n * c, on every
# instruction set, both layouts, row ranges off the four-row turns, with
# random and extreme codes and weights; -1 where there is no kernel, and
# why Q6_K has none (C unit test under ASan/UBSan).
exec './build/t/test_quant_pairs_rows'
    or die "cannot run build/t/test_quant_pairs_rows: $!";

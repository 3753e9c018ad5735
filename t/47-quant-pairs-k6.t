#!/usr/bin/perl
# The pairs mode's Q6_K contract (L of x' = n * c exact in int32): the
# pairs tiles of 1 .. 40 tokens and the pair rows give the pairs scalar
# reference's bits on every instruction set, both layouts, ragged row
# ranges, random and extreme codes and weights, and lanes where the
# 16-bit contract rounds otherwise; and nalar_quant_matmul_pairs gives
# each token of a batch the bits it gets alone, every type (C unit test
# under ASan/UBSan).
exec './build/t/test_quant_pairs_k6'
    or die "cannot run build/t/test_quant_pairs_k6: $!";

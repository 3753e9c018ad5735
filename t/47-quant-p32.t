#!/usr/bin/perl
# The 16-bit activations' Q8_0 and Q4_0 products on panels of 16 rows:
# the layout packed and unpacked, the scalar reference against the
# contract, the kernels of each instruction set (1 .. 19 tokens, ragged
# row ranges, extreme weights and codes) against the reference, and a
# backend matrix's layout and products through the activation modes (C
# unit test under ASan/UBSan).
exec './build/t/test_quant_p32'
    or die "cannot run build/t/test_quant_p32: $!";

#!/usr/bin/perl
# CPU matrix products: bit-exact FMA chains for F32/F16/BF16 on awkward
# shapes, row ranges and token counts; Q8_0 within tolerance; nothing
# outside the asked rows written (C unit test under ASan/UBSan).
exec './build/t/test_cpu_matmul' or die "cannot run build/t/test_cpu_matmul: $!";

#!/usr/bin/perl
# CPU matrix products: bit-exact FMA chains for F32/F16/BF16 on awkward
# shapes, row ranges and token counts; Q8_0 within tolerance; a draft's
# narrowed weights (BF16 pair panels with AVX512-BF16: the same bits in
# every tile, near the BF16 products); nothing outside the asked rows
# written (C unit test under ASan/UBSan).
exec './build/t/test_cpu_matmul' or die "cannot run build/t/test_cpu_matmul: $!";

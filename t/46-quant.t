#!/usr/bin/perl
# Block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): ggml's layouts
# (the kit's llama3 files, quantized by llama.cpp, dequantize to their F32
# weights), kernels against exact products, batch invariance, owned
# copies, 16-bit activations' codes made once and read by the products,
# the quantizer (C unit test under ASan/UBSan).
exec './build/t/test_quant' or die "cannot run build/t/test_quant: $!";

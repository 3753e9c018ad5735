#!/usr/bin/perl
# CPU backend: logits bit-identical whatever pass a token is computed in
# (chunks, verification-sized passes, mixed batches, passes of eight
# sequences, thread counts) for head layouts that tile attention
# differently, and for quantized models with 16-bit activations (C unit
# test under ASan/UBSan).
exec './build/t/test_cpu_backend' or die "cannot run build/t/test_cpu_backend: $!";

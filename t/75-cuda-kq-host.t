#!/usr/bin/perl
# The CUDA kernels' decoding of ggml's block types, built as host C++
# (t/gpu/kq_decode_host.cc): the bits of the CPU's dequantization on random
# blocks, the project's quantizer's rows and every block-type tensor of the
# conformance kit.  Needs no GPU and no nvcc.
exec './build/t/test_kq_decode_host'
    or die "cannot run build/t/test_kq_decode_host: $!";

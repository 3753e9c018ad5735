#!/usr/bin/perl
# CPU backend, LoRA adapters made by hand: run-time adapters equal the
# merged model (llama, qwen2, gemma2, phi3's fused views; F32 and F16
# adapters; both ways of a pass), and sixteen sequences over four adapters
# and the base in one pass equal each run alone, bit for bit (C unit test
# under ASan/UBSan).
exec './build/t/test_cpu_lora' or die "cannot run build/t/test_cpu_lora: $!";

#!/usr/bin/perl
# LoRA adapters: loading, checks, identity (C unit test, ASan).
exec './build/t/test_lora' or die "cannot run build/t/test_lora: $!";

#!/usr/bin/perl
# LoRA adapters in the engine: run time equals the merged file, mixed
# batches, speculation, prefix cache, counters (C unit test, ASan).
exec './build/t/test_lora_engine' or die "cannot run build/t/test_lora_engine: $!";

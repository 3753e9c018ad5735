#!/usr/bin/perl
# Engine: reference greedy outputs, batch invariance, chunked prefill,
# preemption, KV accounting (C unit test under ASan/UBSan).
exec './build/t/test_engine' or die "cannot run build/t/test_engine: $!";

#!/usr/bin/perl
# GGUF reader/writer unit test (t/c/test_gguf.c, built with ASan+UBSan).
exec './build/t/test_gguf' or die "cannot run build/t/test_gguf: $!";

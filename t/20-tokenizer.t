#!/usr/bin/perl
exec './build/t/test_tokenizer' or die "cannot run build/t/test_tokenizer: $!";

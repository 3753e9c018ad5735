#!/usr/bin/perl
# Random-weights model writer unit test (t/c/test_mkmodel.c, ASan+UBSan).
exec './build/t/test_mkmodel' or die "cannot run build/t/test_mkmodel: $!";

#!/usr/bin/perl
exec './build/t/test_cuda_plan' or die "cannot run build/t/test_cuda_plan: $!";

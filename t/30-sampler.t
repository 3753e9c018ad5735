#!/usr/bin/perl
exec './build/t/test_sampler' or die "cannot run build/t/test_sampler: $!";

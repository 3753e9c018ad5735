#!/usr/bin/perl
# Speculative sampling keeps the target's distribution (C unit test,
# optimized build).
exec './build/t/test_spec_dist' or die "cannot run build/t/test_spec_dist: $!";

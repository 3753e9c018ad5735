#!/usr/bin/perl
# verify-bench's round trip between two threads always stops (C unit
# test).
exec './build/t/test_round_trip' or die "cannot run build/t/test_round_trip: $!";

#!/usr/bin/perl
# Speculative decoding's cost model and step gate (C unit test).
exec './build/t/test_spec_gate' or die "cannot run build/t/test_spec_gate: $!";

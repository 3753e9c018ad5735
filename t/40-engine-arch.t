#!/usr/bin/perl
# The engine on the conformance kit's other architectures and on an
# all-sliding model (C unit test).
exec './build/t/test_engine_arch' or die "cannot run build/t/test_engine_arch: $!";

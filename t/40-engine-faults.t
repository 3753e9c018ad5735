#!/usr/bin/perl
# Engine: injected allocation failures end only the request that owns
# them, with the error; the choices of a request share its large
# parameters (C unit test under ASan/UBSan, built with NALAR_TEST_HOOKS).
exec './build/t/test_engine_faults'
    or die "cannot run build/t/test_engine_faults: $!";

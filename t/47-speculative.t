#!/usr/bin/perl
# Speculative decoding: exactness, distribution, rollback (C unit test).
exec './build/t/test_spec' or die "cannot run build/t/test_spec: $!";

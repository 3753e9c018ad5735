#!/usr/bin/perl
# The engine's logits and greedy decode against the float64 references of
# the model conformance kit (t/data/conformance), with the kit's tolerances
# (C unit test under ASan/UBSan).
exec './build/t/test_conformance' or die "cannot run build/t/test_conformance: $!";

#!/usr/bin/perl
# The step budget sized to an ITL target: the cost model's fit and
# fallbacks, admission decisions under a fake clock, adapting to a slower
# clock, prefill never starving, greedy ids identical under every budget
# (C unit test under ASan/UBSan).
exec './build/t/test_budget' or die "cannot run build/t/test_budget: $!";

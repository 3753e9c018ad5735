#!/usr/bin/perl
# Worker pool: barrier and run correct with more threads than cores and
# through sleeps; waiting threads (barrier, end of a run, between passes,
# an idle engine) sleep instead of spinning (C unit test under ASan/UBSan).
exec './build/t/test_threadpool' or die "cannot run build/t/test_threadpool: $!";

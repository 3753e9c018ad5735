#!/usr/bin/perl
# The Jinja interpreter's own tests (t/c/test_jinja.c, ASan+UBSan): user text
# keeps its spans through string operations, hostile templates stop with an
# error, and jinja2's semantics the real templates rely on.
exec './build/t/test_jinja' or die "cannot run build/t/test_jinja: $!";

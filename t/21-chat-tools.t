#!/usr/bin/perl
# The tool call parser (t/c/test_tools.c): answers in each chat style's call
# format become calls and content, fed whole or a byte at a time.
exec './build/t/test_tools' or die "cannot run build/t/test_tools: $!";

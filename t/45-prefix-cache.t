#!/usr/bin/perl
# Prefix KV cache: identity, tenant scope, eviction (C unit test, ASan).
exec './build/t/test_prefix' or die "cannot run build/t/test_prefix: $!";

#!/usr/bin/perl
# JWT verification: keys and tokens made by the openssl tool (C unit test, ASan).
exec './build/t/test_jwt' or die "cannot run build/t/test_jwt: $!";

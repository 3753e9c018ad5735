#!/usr/bin/perl
# The test hooks (the nalar_test_* directives, src/engine_test.h) exist only
# in the test build (-DNALAR_TEST_HOOKS: build/asan/ and make module-asan).
# The production module rejects each directive as unknown at `nginx -t`,
# and no hook symbol is in the production library, CLI or module; the test
# build of the module accepts the same configuration and its library has
# the hooks (which shows the symbol check can see them).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

plan skip_all => 'NALAR_ASAN=1: this file checks the production module'
    if $NalarTest::TEST_BUILD;

my $root = NalarTest::root();
my $hooks = qr/\b(?:nalar_engine_test_\w+|nalar_test_\w+|ngx_http_nalar_test_hold)\b/;
my @directives = ('nalar_test_fault_forward 4',
                  'nalar_test_hold_parse %%PREFIX%%/release');

sub conf {
    my ($directive) = @_;
    return <<"CONF";
http {
    %%NALAR_HTTP%%
    $directive;
    server {
        listen 127.0.0.1:%%PORT%%;
    }
}
CONF
}

# defined symbols (nm: "T", "D", "B", ...) matching the hooks
sub hook_symbols {
    my ($file) = @_;
    my @out = `nm --defined-only $file 2>/dev/null`;
    return (-1) if $? != 0 || !@out;
    return grep { /$hooks/ } @out;
}

my $t = NalarTest->new;
for my $d (@directives) {
    my ($name) = $d =~ /^(\S+)/;
    $t->write_conf(conf($d));
    my ($rc, $out) = $t->test_conf;
    isnt($rc, 0, "production module: nginx -t with $name fails");
    like($out, qr/unknown directive "\Q$name\E"/,
         "production module: $name is an unknown directive");
}

for my $file ('build/libnalar.a', 'build/nalar',
              'build/module/ngx_nalar_module.so')
{
    SKIP: {
        skip "$file not built", 1 unless -f "$root/$file";
        my @found = hook_symbols("$root/$file");
        is_deeply(\@found, [], "$file: no test hook symbol");
    }
}

# the test build: the same directives pass, and its library has the hooks
SKIP: {
    my $asan_lib = "$root/build/asan/libnalar.a";
    skip 'build/asan/libnalar.a not built (make build/asan/libnalar.a)', 1
        unless -f $asan_lib;
    my @found = hook_symbols($asan_lib);
    ok(@found >= 4 && $found[0] ne '-1',
       'build/asan/libnalar.a: the test hooks are there ('
       . scalar(@found) . ' symbols)');
}

SKIP: {
    skip 'the test build of the module is not built (make module-asan)',
         scalar @directives
        unless -f "$root/build/asan/module/ngx_nalar_module.so";
    NalarTest::use_test_build();
    my $tb = NalarTest->new;
    for my $d (@directives) {
        my ($name) = $d =~ /^(\S+)/;
        $tb->write_conf(conf($d));
        my ($rc, $out) = $tb->test_conf;
        is($rc, 0, "test build: nginx -t with $name passes")
            or diag($out);
    }
}

done_testing();

#!/usr/bin/perl
# The 16-bit KV cache's stores and loads on each instruction set they are
# compiled for (kernels/cpu/cpu_kv16.h): build/t/test_kv16 (this machine),
# -avx2, -avx2-nof16c and -scalar, each a C unit test under ASan/UBSan.
# A copy for an instruction set this machine lacks is skipped, by name.
use strict;
use warnings;
use Test::More;

my %needs = ('' => [], '-avx2' => ['avx2', 'f16c'],
             '-avx2-nof16c' => ['avx2'], '-scalar' => []);
open(my $fh, '<', '/proc/cpuinfo') or die "cannot read /proc/cpuinfo: $!";
my ($flags) = grep { /^flags\s*:/ } <$fh>;
close $fh;
my %has = map { $_ => 1 } split ' ', ($flags // '');

for my $v ('', '-avx2', '-avx2-nof16c', '-scalar') {
    my $bin = "./build/t/test_kv16$v";
    SKIP: {
        my @miss = grep { !$has{$_} } @{ $needs{$v} };
        skip "test_kv16$v: this CPU lacks @miss", 1 if @miss;
        ok(-x $bin, "$bin is built") or next;
        my $out = `$bin 2>&1`;
        my $rc = $? >> 8;
        my $pass = () = $out =~ /^ok \d+/mg;
        my $fail = () = $out =~ /^not ok \d+/mg;
        diag($out) if $rc || $fail;
        ok($rc == 0 && $fail == 0 && $pass >= 5,
           "test_kv16$v: $pass checks pass, $fail fail (exit $rc)");
    }
}
done_testing();

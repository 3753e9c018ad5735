#!/usr/bin/perl
# Runs every libFuzzer target (fuzz/fuzz_NAME.c, built as build/fuzz_NAME by
# `make fuzz`) from its committed seed corpus fuzz/corpus/NAME, for a few
# seconds (3; NALAR_FUZZ_SECONDS=N for N: scripts/stress-test.sh runs 20).
# The corpus is copied to a temporary directory: libFuzzer adds the inputs
# it finds to the directory it is given, and the repository must not change.
# A crashing input is kept as build/fuzz-crash/NAME-crash-*.  Longer runs:
# make fuzz FUZZ_SECONDS=300.
use strict;
use warnings;
use File::Copy qw(copy);
use File::Path qw(make_path);
use File::Temp qw(tempdir tempfile);

my $secs = $ENV{NALAR_FUZZ_SECONDS} || 3;
die "NALAR_FUZZ_SECONDS must be a number of seconds\n" if $secs !~ /^\d+$/;
my @names = map { m{^fuzz/fuzz_(\w+)\.c$} ? $1 : () } sort glob 'fuzz/fuzz_*.c';

if (!grep { -x "./build/fuzz_$_" } @names) {
    # `make test` builds them; under CI=true their absence fails
    if (($ENV{CI} // '') eq 'true') {
        print "1..1\nnot ok 1 - no fuzz target built (make fuzz needs clang)\n";
        exit 1;
    }
    print "1..0 # SKIP no fuzz target built (make fuzz needs clang)\n";
    exit 0;
}

print "1..", 2 * @names, "\n";
make_path('build/fuzz-crash');
my $t = 0;
for my $name (@names) {
    my $fuzzer = "./build/fuzz_$name";
    my $dir = tempdir("fuzz_$name.XXXXXX", TMPDIR => 1, CLEANUP => 1);
    my $n = 0;

    for my $seed (glob "fuzz/corpus/$name/*") {
        copy($seed, "$dir/") or die "copy $seed: $!";
        $n++;
    }
    $t++;
    print(($n > 0 && -x $fuzzer ? "ok" : "not ok"),
          " $t - $name: $n seed files, $fuzzer built\n");

    my (undef, $log) = tempfile("fuzz_${name}_log.XXXXXX", TMPDIR => 1,
                                UNLINK => 1);
    my $rc = system("$fuzzer -max_total_time=$secs -timeout=10"
                    . " -rss_limit_mb=1024 -print_final_stats=1"
                    . " -artifact_prefix=build/fuzz-crash/$name- $dir"
                    . " >$log 2>&1");
    my $status = $rc == -1 ? -1 : $? >> 8;
    open my $fh, '<', $log or die "$log: $!";
    my @lines = <$fh>;
    my ($runs) = map { /^stat::number_of_executed_units: (\d+)/ ? $1 : () }
                 @lines;
    $t++;
    if ($status == 0) {
        print "ok $t - $name: ${secs} s, ", $runs // '?', " inputs, no crash,",
              " leak, timeout or broken promise\n";
    } else {
        print "not ok $t - fuzz_$name exited with $status\n";
        splice @lines, 0, @lines - 40 if @lines > 40;
        print map { "# $_" } @lines;
    }
}

#!/usr/bin/perl
# Structured output in the engine (t/c/test_grammar_engine.c): greedy output
# under the ten test schemas equal with and without forced-token
# speculation, alone and batched, prefix cache off and on; then sampled
# outputs, every one validated by python3-jsonschema (t/lib/validate_json.py).
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);

my $dir = tempdir(CLEANUP => 1);
my $out = "$dir/outputs.jsonl";
$ENV{GRAMMAR_OUT} = $out;
$ENV{GRAMMAR_SAMPLES} = 10;
my $tap = `./build/t/test_grammar_engine 2>&1`;
is($? >> 8, 0, 'build/t/test_grammar_engine passes') or diag($tap);
my @notok = grep { /^not ok/ } split /\n/, $tap;
is(scalar @notok, 0, 'no failing engine test') or diag(join "\n", @notok);

SKIP: {
    skip 'python3-jsonschema missing', 2
        if system('python3 -c "import jsonschema" 2>/dev/null') != 0;
    my $res = `python3 t/lib/validate_json.py t/data/grammar/schemas.json $out`;
    my ($n, $bad) = $res =~ /^checked (\d+) invalid (\d+)$/m;
    ok(defined $n && $n >= 100, 'greedy and sampled outputs checked ('
       . ($n // 'none') . ')') or diag($res);
    is($bad, 0, 'every output valid under python3-jsonschema') or diag($res);
}
done_testing();

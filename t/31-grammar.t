#!/usr/bin/perl
# The grammar engine's unit tests (t/c/test_grammar.c), then its random
# walks through the token masks of the ten test schemas validated by an
# independent validator (python3-jsonschema, t/lib/validate_json.py).
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);

my $dir = tempdir(CLEANUP => 1);
my $out = "$dir/walks.jsonl";
$ENV{GRAMMAR_WALK_OUT} = $out;
$ENV{GRAMMAR_WALKS} = 30;
my $tap = `./build/t/test_grammar 2>&1`;
is($? >> 8, 0, 'build/t/test_grammar passes') or diag($tap);
my @notok = grep { /^not ok/ } split /\n/, $tap;
is(scalar @notok, 0, 'no failing unit test') or diag(join "\n", @notok);

SKIP: {
    skip 'python3-jsonschema missing', 2
        if system('python3 -c "import jsonschema" 2>/dev/null') != 0;
    my $res = `python3 t/lib/validate_json.py t/data/grammar/schemas.json $out`;
    like($res, qr/^checked 300 invalid 0$/m,
         '300 walks (30 per schema) valid under python3-jsonschema')
        or diag($res);
    unlike($res, qr/^invalid/m, 'no invalid output');
}
done_testing();

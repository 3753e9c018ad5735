#!/usr/bin/perl
# Sampled structured output under the keywords real schemas use
# (t/c/test_grammar_keywords.c): 200 sampled values for each of the five
# schemas of t/data/grammar/keywords.json (integer and number bounds, item
# counts, string lengths, patterns, the date, time, date-time, email, uri,
# ipv4, ipv6 and uuid formats) on the demo model, every one complete and
# valid under python3-jsonschema with format checking on
# (t/lib/validate_json.py).
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);

my $dir = tempdir(CLEANUP => 1);
my $out = "$dir/outputs.jsonl";
$ENV{GRAMMAR_OUT} = $out;
$ENV{GRAMMAR_SAMPLES} = 200;
my $tap = `./build/t/test_grammar_keywords 2>&1`;
is($? >> 8, 0, 'build/t/test_grammar_keywords passes') or diag($tap);
my @notok = grep { /^not ok/ } split /\n/, $tap;
is(scalar @notok, 0, 'no failing test') or diag(join "\n", @notok);

SKIP: {
    skip 'python3-jsonschema missing', 3
        if system('python3 -c "import jsonschema" 2>/dev/null') != 0;
    my $res = `python3 t/lib/validate_json.py t/data/grammar/keywords.json $out`;
    like($res, qr/^checked 1000 invalid 0$/m,
         '1000 sampled values (200 per schema) valid under python3-jsonschema')
        or diag($res);
    unlike($res, qr/^invalid/m, 'no invalid output');
    # the validator asserts formats: a wrong date is refused
    my $bad = "$dir/bad.jsonl";
    open(my $fh, '>', $bad) or die;
    print $fh '{"schema":"dates","output":"{\"day\": \"2023-02-29\", '
        . '\"at\": \"2023-01-01T00:00:00Z\", \"t\": \"00:00:00Z\", '
        . '\"ip4\": \"1.2.3.4\", \"ip6\": \"::1\"}"}' . "\n";
    print $fh '{"schema":"contact","output":"{\"email\": \"a@b.cd\", '
        . '\"site\": \"http://a b\", '
        . '\"id\": \"0e9f1c3a-1b2c-4d5e-8f90-a1b2c3d4e5f6\", '
        . '\"ratio\": 0.5, \"codes\": [\"ab\"]}"}' . "\n";
    close $fh;
    $res = `python3 t/lib/validate_json.py t/data/grammar/keywords.json $bad`;
    like($res, qr/^checked 2 invalid 2$/m,
         'the validator refuses a bad date and a bad uri') or diag($res);
}
done_testing();

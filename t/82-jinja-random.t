#!/usr/bin/perl
# Random small templates (t/jinja_gen.py, fixed seeds): the interpreter
# (build/t/jinja_batch, ASan/UBSan) and python3-jinja2 under Hugging Face's
# setup (t/jinja_ref.py) give the same bytes, or both fail.  Where Python
# prints an object's address (a generator, an iterator) no text can match:
# those cases are left out, and this interpreter must fail on them.
use strict;
use warnings;
use Test::More;
use Encode ();
use JSON::PP;
use File::Temp qw(tempdir);
use lib 't/lib';
use NalarTest;

my $batch = './build/t/jinja_batch';
NalarTest::missing("$batch not built") unless -x $batch;
my $py = '/usr/bin/python3';
NalarTest::missing('python3-jinja2 (scripts/deps.sh installs it)')
    unless system("$py -c 'import jinja2' 2>/dev/null") == 0;

my $json = JSON::PP->new->utf8;
for my $seed (1 .. 3) {
    my $dir = tempdir("jinja_random.XXXXXX", TMPDIR => 1, CLEANUP => 1);
    system($py, 't/jinja_gen.py', $seed, 400, $dir) == 0
        or die "jinja_gen.py failed";
    my $ref = $json->decode(scalar `$py t/jinja_ref.py $dir/cases.json`);
    my $got = $json->decode(scalar `$batch $dir/cases.json`);
    is(scalar @$got, scalar @$ref, "seed $seed: every case rendered");
    my ($same, $rendered, $addr, @bad) = (0, 0, 0);
    for my $i (0 .. $#$ref) {
        my ($r, $g) = ($ref->[$i], $got->[$i]);
        if ($r->{ok} && $r->{text} =~ / at 0x[0-9a-f]+>/) {
            $addr++;
            push @bad, $i if $g->{ok};
            next;
        }
        $rendered++ if $r->{ok};
        if ($r->{ok} ? ($g->{ok} && $g->{text} eq $r->{text}) : !$g->{ok}) {
            $same++;
        } else {
            push @bad, $i;
        }
    }
    is(scalar @bad, 0, "seed $seed: $same cases agree ($rendered rendered,"
       . " $addr print an address)") or do {
        for my $i (@bad[0 .. ($#bad < 4 ? $#bad : 4)]) {
            open my $fh, '<', "$dir/t$i.jinja" or die;
            local $/;
            diag("template: " . <$fh>);
            diag("want: " . JSON::PP->new->ascii->encode($ref->[$i]));
            diag("got:  " . JSON::PP->new->ascii->encode($got->[$i]));
        }
    };
    cmp_ok($rendered, '>=', 60, "seed $seed: enough cases render to mean"
           . " something");
}

done_testing();

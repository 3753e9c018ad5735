#!/usr/bin/perl
# nalar eval: the model teacher-forced over ids, one JSON line per position
# {"pos": P, "top": [[ID, LOGIT], ...], "logsumexp": X}, checked for its
# exact shape and against a conformance reference (t/data/conformance).
use strict;
use warnings;
use JSON::PP;
use Test::More;
use lib 't/lib';
use NalarTest;

my $nalar = './build/nalar';
NalarTest::missing("$nalar not built") unless -x $nalar;

sub run { my $out = `@_ 2>&1`; return ($? >> 8, $out); }

my $dir = 't/data/conformance';
my $tol = 1e-4;    # F32 activations and KV cache on exactly read weights

for my $name ('gemma2-F16', 'qwen3-F16') {
    my $ref = decode_json(do {
        local $/;
        open(my $fh, '<', "$dir/$name.ref.json") or die "$name: $!";
        <$fh>;
    });
    my $seq = $ref->{sequences}[1];
    my $tch = $ref->{teacher}[1];
    my $ids = join(' ', @{$seq->{ids}});
    my ($rc, $out) = run($nalar, 'eval', '-m', "$dir/$name.gguf", '--ids',
                         "'$ids'");
    is($rc, 0, "$name: eval exits 0");
    my @lines = split /\n/, $out;
    is(scalar @lines, 64, "$name: one line per position");
    my $num = qr/-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?/;
    my ($shape, $top1, $max_err, $max_lse) = (1, 1, 0, 0);
    for my $p (0 .. $#lines) {
        my $l = $lines[$p];
        $shape = 0 unless $l =~ /^\{"pos": $p, "top": \[\[\d+, $num\](?:, \[\d+, $num\]){15}\], "logsumexp": $num\}$/;
        my $j = eval { decode_json($l) } or do { $shape = 0; next };
        $shape = 0 unless join(',', sort keys %$j) eq 'logsumexp,pos,top'
            && @{$j->{top}} == 16;
        my %got = map { $_->[0] => $_->[1] } @{$j->{top}};
        for my $k (0 .. 15) {
            my $id = $tch->{top_ids}[$p][$k];
            my $e = exists $got{$id}
                ? abs($got{$id} - $tch->{top_logits}[$p][$k]) : 1e9;
            $max_err = $e if $e > $max_err;
        }
        my $e = abs($j->{logsumexp} - $tch->{logsumexp}[$p]);
        $max_lse = $e if $e > $max_lse;
        $top1 = 0 if $tch->{margin}[$p] > 2 * $tol
            && $j->{top}[0][0] != $tch->{top_ids}[$p][0];
    }
    ok($shape, "$name: every line is {\"pos\": P, \"top\": [16 x [ID, "
       . "LOGIT]], \"logsumexp\": X}");
    ok($max_err <= $tol, "$name: the reference's top-16 ids are in the "
       . "top 16, their logits within $tol (max error $max_err)");
    ok($max_lse <= $tol, "$name: logsumexp within $tol (max error $max_lse)");
    ok($top1, "$name: the top id is the reference's where its margin > "
       . 2 * $tol);
}

my $m = "$dir/qwen3-F16.gguf";
my ($rc, $out) = run($nalar, 'eval', '-m', $m, '--ids', "'1 780 262'",
                     '--top', 2);
my $x = qr/-?[\d.]+/;
like($out, qr/^(\{"pos": \d, "top": \[\[\d+, $x\], \[\d+, $x\]\], "logsumexp": $x\}\n){3}$/,
     '--top 2: two pairs on each of 3 lines');
($rc, $out) = run($nalar, 'eval', '-m', $m, '--ids', "'1 2048'");
is($rc, 2, 'an id outside the vocabulary: exit 2');
like($out, qr/not a token id/, '... and says so');
($rc, $out) = run($nalar, 'eval', '-m', $m);
is($rc, 2, 'no --ids: exit 2');
($rc, $out) = run($nalar, 'eval', '-m', $m, '--ids', "'1 2'", '--backend',
                  'nosuch');
is($rc, 1, 'an unknown backend: exit 1');
like($out, qr/backend 'nosuch'/, '... naming it');

done_testing();

#!/usr/bin/perl
# README.md's `nalar` synopsis is what `nalar --help` prints: the block
# between the "nalar --help: begin" and "nalar --help: end" markers, fenced
# as code, must equal the usage text line for line.  A command or option
# added to the tool without the README (or the other way round) fails here.
use strict;
use warnings;
use Test::More;
use lib 't/lib';
use NalarTest;

my $nalar = './build/nalar';
NalarTest::missing("$nalar not built") unless -x $nalar;

open(my $fh, '<', 'README.md') or die "README.md: $!";
my $readme = do { local $/; <$fh> };
close $fh;

my ($block) = $readme =~ m{<!-- nalar --help: begin -->\n```\n(.*?)```\n<!-- nalar --help: end -->}s;
ok(defined $block, 'README.md has the delimited `nalar --help` block')
    or BAIL_OUT('no usage block in README.md');

my $usage = `$nalar --help 2>&1`;
my $rc = $? >> 8;
ok($usage =~ /^usage:\n/, 'nalar --help prints its usage');
is($rc, 0, 'nalar --help exits 0');
my $bad = `$nalar no-such-command 2>&1`;
is($? >> 8, 2, 'an unknown command exits 2, with the usage')
    and like($bad, qr/^usage:\n/, 'the usage goes with it');

my @want = split /\n/, $usage;
my @have = split /\n/, $block;
is_deeply(\@have, \@want, 'README.md synopsis equals nalar --help')
    or diag("nalar --help prints:\n$usage");

done_testing();

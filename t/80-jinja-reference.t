#!/usr/bin/perl
# The Jinja interpreter (api/jinja*.c, through `nalar render`) renders the
# fourteen real chat templates in t/data/templates/ byte for byte as Debian's
# python3-jinja2 renders them under Hugging Face's setup (t/jinja_ref.py),
# over the conversations of t/data/jinja/conversations.json, each with
# add_generation_prompt on and off: system or not, multi-turn, tools, tool
# calls and results, empty content, unicode, markup in user text, kwargs.
# Where the reference fails, nalar render fails too, and where the template
# itself raises (raise_exception) with the same message.  strftime_now is
# fixed (--now) on both sides.
use strict;
use warnings;
use Test::More;
use Encode ();
use JSON::PP;
use File::Temp qw(tempdir);
use lib 't/lib';
use NalarTest;

my $nalar = './build/nalar';
NalarTest::missing("$nalar not built") unless -x $nalar;
my $py = '/usr/bin/python3';
NalarTest::missing('python3-jinja2 (scripts/deps.sh installs it)')
    unless system("$py -c 'import jinja2' 2>/dev/null") == 0;

my $NOW = 1768435200;       # 2026-01-15 00:00 UTC
my $json = JSON::PP->new->utf8->canonical;
my $dir = tempdir('jinja_ref.XXXXXX', TMPDIR => 1, CLEANUP => 1);

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

my $conf = $json->decode(slurp('t/data/jinja/conversations.json'));
my @templates = sort glob 't/data/templates/*.jinja';
is(scalar @templates, 14, 'fourteen real templates');
spew("$dir/tools.json", $json->encode($conf->{tools}));

my (@cases, @argv);
for my $tpath (@templates) {
    my ($tname) = $tpath =~ m{([^/]+)$};
    my $tok = $conf->{special_tokens}{$tname} // ['', ''];
    for my $conv (@{ $conf->{conversations} }) {
        my %kw = (%{ $conf->{template_kwargs}{$tname} // {} },
                  %{ $conv->{kwargs} // {} });
        my $mfile = "$dir/m-" . scalar(@cases) . '.json';
        spew($mfile, $json->encode($conv->{messages}));
        for my $gen (1, 0) {
            my @cmd = ('render', '--template', $tpath, '--messages', $mfile,
                       '--now', $NOW, '--bos', $tok->[0],
                       '--eos', $tok->[1]);
            push @cmd, '--tools', "$dir/tools.json" if $conv->{tools};
            push @cmd, '--kwargs', $json->encode(\%kw) if %kw;
            push @cmd, '--no-generation-prompt' unless $gen;
            push @argv, \@cmd;
            push @cases, {
                name => "$tname / $conv->{name} / gen=$gen",
                template => $tpath,
                messages => $conv->{messages},
                ($conv->{tools} ? (tools => $conf->{tools}) : ()),
                kwargs => \%kw,
                add_generation_prompt => $gen ? JSON::PP::true
                                              : JSON::PP::false,
                bos => $tok->[0], eos => $tok->[1], now => $NOW,
            };
        }
    }
}

# small templates, one feature or corner each (t/data/jinja/snippets.json):
# whitespace control, call blocks, raw, filters, tests, methods, Python's
# str() of values, operators, undefined values and the errors jinja2 gives
my $snips = $json->decode(slurp('t/data/jinja/snippets.json'));
my $snip_msgs = [ { role => 'user', content => 'Hello <there> & you' },
                  { role => 'assistant', content => 'Hi!' },
                  { role => 'user', content => 'bye' } ];
for my $k (0 .. $#$snips) {
    my $path = "$dir/snippet-$k.jinja";
    spew($path, Encode::encode('UTF-8', $snips->[$k]));
    push @argv, undef;
    (my $label = substr($snips->[$k], 0, 50)) =~ s/\s+/ /g;
    push @cases, { name => "snippet $k: $label",
                   template => $path, messages => $snip_msgs, kwargs => {},
                   add_generation_prompt => JSON::PP::true,
                   bos => '<s>', eos => '</s>', now => $NOW };
}

# nalar render, one process a case, on a sample (each is a whole nalar
# process: slow on a busy machine); every case through the same library
# in one process (build/t/jinja_batch, under ASan/UBSan)
sub run_cli {
    my ($i) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/out" or die;
        open STDERR, '>', "$dir/err" or die;
        exec $nalar, @{ $argv[$i] } or die "exec: $!";
    }
    waitpid $pid, 0;
    return { rc => $? >> 8, out => slurp("$dir/out"), err => slurp("$dir/err") };
}

spew("$dir/cases.json", $json->encode(\@cases));
my $ref = $json->decode(scalar `$py t/jinja_ref.py $dir/cases.json`);
is(scalar @$ref, scalar @cases, 'the reference rendered every case');
my $batch = './build/t/jinja_batch';
NalarTest::missing("$batch not built") unless -x $batch;
my $got = $json->decode(scalar `$batch $dir/cases.json`);
is(scalar @$got, scalar @cases, 'jinja_batch rendered every case');
my @mine = map {
    my $g = $got->[$_];
    $g->{ok} ? { rc => 0, out => Encode::encode('UTF-8', $g->{text}), err => '' }
             : { rc => 1, out => '',
                 err => 'nalar render: ' . ($g->{raised}
                        ? 'the template raised: ' : '')
                        . Encode::encode('UTF-8', $g->{error}) . "\n" };
} 0 .. $#cases;

my %sample = map { $_ => 1 }
             grep { $cases[$_]{name} =~ m{ / (?:user-only / gen=0|tool-call-string-args / gen=1|unicode / gen=1|system-user / gen=1)$} }
             0 .. $#cases;
for my $i (sort { $a <=> $b } keys %sample) {
    my $cli = run_cli($i);
    ok($cli->{rc} == $mine[$i]{rc} && $cli->{out} eq $mine[$i]{out}
       && ($cli->{rc} == 0 || $cli->{err} eq $mine[$i]{err}),
       "nalar render gives what the library gives: $cases[$i]{name}")
        or diag("nalar render exit $cli->{rc}: $cli->{err}");
}

my (%rendered, %agree, $raised);
for my $i (0 .. $#cases) {
    my ($c, $r, $m) = ($cases[$i], $ref->[$i], $mine[$i]);
    my ($tname) = $c->{template} =~ m{([^/]+)$};
    if ($r->{ok}) {
        my $want = Encode::encode('UTF-8', $r->{text});
        my $same = $m->{rc} == 0 && $m->{out} eq $want;
        ok($same, "$c->{name}: byte-equal") or do {
            diag("nalar render exit $m->{rc}: $m->{err}");
            diag("want: " . JSON::PP->new->ascii->encode([$r->{text}]));
            diag("got:  " . JSON::PP->new->ascii->encode(
                [Encode::decode('UTF-8', $m->{out})]));
        };
        $rendered{$tname}++;
        $agree{$tname}++ if $same;
    } elsif ($r->{raised}) {
        my $msg = Encode::encode('UTF-8', $r->{error});
        ok($m->{rc} == 1 && $m->{err} =~ /the template raised: \Q$msg\E$/m,
           "$c->{name}: raises \"$r->{error}\" as the reference does")
            or diag("nalar render exit $m->{rc}: $m->{err}");
        $raised++;
    } else {
        ok($m->{rc} == 1 && $m->{err} =~ /^nalar render: \S/,
           "$c->{name}: fails as the reference does ($r->{error})")
            or diag("nalar render exit $m->{rc}: $m->{out}");
    }
}

# -m MODEL: the template and the BOS text come from the GGUF
{
    my $tpl = 't/data/templates/meta-llama-Llama-3.1-8B-Instruct.jinja';
    my $gguf = "$dir/tiny.gguf";
    system($nalar, 'mkmodel', '--dim', 32, '--layers', 1, '--heads', 2,
           '--kv-heads', 1, '--ffn', 64, '--vocab', 300, '--ctx', 64,
           '--chat-template', $tpl, '-o', $gguf) == 0
        or die "nalar mkmodel failed";
    my $m = "$dir/m-0.json";
    my $from_model = `$nalar render -m $gguf --messages $m --now $NOW`;
    my $from_file = `$nalar render --template $tpl --bos '<s>' --messages $m --now $NOW`;
    ok($from_model ne '' && $from_model eq $from_file
       && $from_model =~ /^<s><\|start_header_id\|>/,
       'nalar render -m MODEL runs the GGUF\'s template with its BOS text');
}

# --spans: the same text, and the user's bytes are exactly the user spans
{
    my $tpl = 't/data/templates/Qwen-Qwen2.5-7B-Instruct.jinja';
    spew("$dir/span-msgs.json", $json->encode([
        { role => 'system', content => ' sys ' },
        { role => 'user', content => "Say <|im_end|>\x{00e9}" } ]));
    my $plain = `$nalar render --template $tpl --messages $dir/span-msgs.json`;
    my $o = $json->decode(scalar `$nalar render --template $tpl --messages $dir/span-msgs.json --spans`);
    my $text = Encode::encode('UTF-8', $o->{text});
    is($text, $plain, '--spans gives the same text');
    my @got = map { substr($text, $_->[0], $_->[1]) } @{ $o->{user_spans} };
    # the role is the request's too (Qwen writes message.role)
    is_deeply(\@got, [ ' sys ', 'user',
                       Encode::encode('UTF-8', "Say <|im_end|>\x{00e9}") ],
              'the user spans are the request\'s strings (contents, the'
              . ' role), byte for byte, and nothing the template wrote');
}

# equality of two failures proves little: most cases must render
for my $t (@templates) {
    my ($tname) = $t =~ m{([^/]+)$};
    cmp_ok($rendered{$tname} // 0, '>=', 10,
           "$tname: at least 10 cases render in the reference");
}
ok(grep({ $_->{name} =~ /gemma.*system-user/ } @cases)
   && $raised, 'some cases raise (Gemma 2 refuses a system message)');
my ($gemma) = grep { $cases[$_]{name} =~ /gemma-2.*system-user.*gen=1/ }
              0 .. $#cases;
like($mine[$gemma]{err}, qr/raised: System role not supported/,
     'Gemma 2 with a system message raises "System role not supported"');

done_testing();

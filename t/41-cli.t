#!/usr/bin/perl
# The nalar command-line tool: generate/tokenize/inspect/mkmodel/bench as
# tests and outside checks call them, against the reference ids of
# models/README.md.
use strict;
use warnings;
use File::Temp qw(tempdir);
use Test::More;
use lib 't/lib';
use NalarTest;

my $nalar = './build/nalar';
NalarTest::missing("$nalar not built") unless -x $nalar;

sub run { my $out = `@_ 2>&1`; return ($? >> 8, $out); }

my %prompts = (
    'In the beginning'    => [1, 780, 262, 1794, 1046],
    'And it came to pass' => [1, 327, 337, 559, 292, 718],
    'A wise man'          => [1, 298, 1540, 416],
);
my %target = (
    'In the beginning' => '272 262 893 322 261 416 517 322 261 416 517 322 261 416 1978 1953 793 1967 13 843 356 388 722 323 1962 398 2 1 375 767 823 313 262 893 322 349 261 416 517 322 261 416 517 322 261 13 1965 369',
    'And it came to pass' => '1963 313 1963 313 1963 313 1963 463 262 581 272 262 822 389 566 292 262 485 1963 313 306 389 566 292 262 485 1963 274 292 262 485 1963 274 292 262 485 1963 274 292 262 485 1963 274 292 262 485 1963 274',
    'A wise man' => '322 261 416 517 322 261 416 517 322 261 416 517 322 261 416 517 322 261 416 1978 1953 793 13 329 261 416 517 322 261 416 517 322 261 416 517 322 261 416 517 322 261 416 1978 1953 13 1965 369 956',
);
my %draft = (
    'In the beginning' => '272 262 893 322 261 13 1966 317 272 262 893 1967 13 843 356 1616 1552 293 706 1999 2008 2008 2018 2006 2007 1999 1999 1999 2008 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006 2006',
    'And it came to pass' => '1963 313 262 485 430 357 262 485 272 529 1963 1181 710 262 386 1963 304 410 349 418 292 262 485 272 1542 1963 768 262 485 272 1542 1963 768 262 485 272 1542 1963 768 262 485 272 1542 1963 768 262 485 272',
    'A wise man' => '322 261 416 517 322 261 416 517 322 261 416 517 322 261 416 517 322 261 416 1967 13 843 356 1318 644 1967 370 1967 370 1967 2 1 375 416 517 322 261 416 517 322 261 416 517 322 261 416 517 322',
);

for my $p (sort keys %prompts) {
    my ($rc, $out) = run($nalar, 'tokenize', '-m',
        'models/nalar-kjv-target-f32.gguf', "'$p'");
    is($out, join(' ', @{$prompts{$p}}) . "\n", "tokenize '$p'");
    for my $m (['target-f32', \%target], ['target-f16', \%target],
               ['draft-f32', \%draft]) {
        ($rc, $out) = run($nalar, 'generate', '-m',
            "models/nalar-kjv-$m->[0].gguf", '-p', "'$p'", '-n', 48,
            '--temp', 0, '--ids', '--ignore-eos');
        is($out, $m->[1]{$p} . "\n", "generate $m->[0] '$p' --ids");
    }
}

# text output stops at EOS and holds only the continuation
my ($rc, $out) = run($nalar, 'generate', '-m',
    'models/nalar-kjv-target-f32.gguf', '-p', "'In the beginning'", '-n', 48,
    '--temp', 0);
is($out, " of the world is a man who is a man who is a man's life.\n"
    . "                -- Mark Twain\n", 'generate text stops at EOS');

# speculative generation changes nothing at temperature 0
($rc, $out) = run($nalar, 'generate', '-m', 'models/nalar-kjv-target-f32.gguf',
    '--draft', 'models/nalar-kjv-draft-f32.gguf', '--spec-k', 4, '-p',
    "'A wise man'", '-n', 48, '--temp', 0, '--ids', '--ignore-eos');
is($out, $target{'A wise man'} . "\n", 'generate with a draft: same ids');

# seeded sampling is reproducible
my ($rc1, $s1) = run($nalar, 'generate', '-m',
    'models/nalar-kjv-target-f32.gguf', '-p', "'Love is'", '-n', 24,
    '--temp', 0.9, '--top-p', 0.95, '--seed', 42, '--ids', '--ignore-eos');
my ($rc2, $s2) = run($nalar, 'generate', '-m',
    'models/nalar-kjv-target-f32.gguf', '-p', "'Love is'", '-n', 24,
    '--temp', 0.9, '--top-p', 0.95, '--seed', 42, '--ids', '--ignore-eos');
my ($rc3, $s3) = run($nalar, 'generate', '-m',
    'models/nalar-kjv-target-f32.gguf', '-p', "'Love is'", '-n', 24,
    '--temp', 0.9, '--top-p', 0.95, '--seed', 43, '--ids', '--ignore-eos');
ok($rc1 == 0 && $s1 eq $s2, 'same seed, same sample');
isnt($s1, $s3, 'another seed, another sample');

# inspect
($rc, $out) = run($nalar, 'inspect', 'models/nalar-kjv-target-f16.gguf');
like($out, qr/architecture:\s+llama/, 'inspect: architecture');
like($out, qr/dim:\s+128/, 'inspect: dim');
like($out, qr/heads:\s+4 \(kv heads 2, head_dim 32\)/, 'inspect: heads');
like($out, qr/context:\s+512/, 'inspect: context');
like($out, qr/attn_q F16/, 'inspect: types');
like($out, qr/SentencePiece/, 'inspect: tokenizer');

# mkmodel of every type loads and generates; bad files get a clear error
my $dir = tempdir(CLEANUP => 1);
for my $t (qw(f32 f16 bf16 q8_0)) {
    ($rc, $out) = run($nalar, 'mkmodel', '--dim', 64, '--layers', 2,
        '--heads', 4, '--kv-heads', 2, '--ffn', 96, '--vocab', 512,
        '--type', $t, '-o', "$dir/m-$t.gguf");
    is($rc, 0, "mkmodel --type $t") or diag $out;
    ($rc, $out) = run($nalar, 'generate', '-m', "$dir/m-$t.gguf", '-p',
        'hello', '-n', 8, '--temp', 0, '--ids', '--ignore-eos');
    like($out, qr/^\d+( \d+){7}\n$/, "random $t model generates 8 ids");
}
# the K-quants need widths that are multiples of 256; the mix's types and
# the resident bytes show in inspect
for my $t (qw(q4_0 q4_k q5_k q6_k q4_k_m q5_k_m)) {
    ($rc, $out) = run($nalar, 'mkmodel', '--dim', 256, '--layers', 2,
        '--heads', 4, '--kv-heads', 2, '--ffn', 512, '--vocab', 512,
        '--type', $t, '-o', "$dir/m-$t.gguf");
    is($rc, 0, "mkmodel --type $t") or diag $out;
    ($rc, $out) = run($nalar, 'generate', '-m', "$dir/m-$t.gguf", '-p',
        'hello', '-n', 8, '--temp', 0, '--ids', '--ignore-eos');
    like($out, qr/^\d+( \d+){7}\n$/, "random $t model generates 8 ids");
}
($rc, $out) = run($nalar, 'inspect', "$dir/m-q4_k_m.gguf");
like($out, qr/^type mix:\s+F32 x5 \([\d.]+ MiB\), Q6_K x3 \([\d.]+ MiB\), Q4_K x13 /m,
    'inspect: the Q4_K_M mix (output and layer 1 attn_v/ffn_down Q6_K)')
    or diag $out;
like($out, qr/^resident:\s+\d+ bytes of weights/m, 'inspect: resident bytes');
($rc, $out) = run($nalar, 'mkmodel', '--bpe', '--vocab', 600, '-o',
    "$dir/bpe.gguf");
($rc, $out) = run($nalar, 'tokenize', '-m', "$dir/bpe.gguf", "'hello world'");
like($out, qr/^\d+( \d+)*\n$/, 'byte-level BPE vocabulary tokenizes');

open(my $fh, '>', "$dir/bad.gguf"); print $fh "GGUF\x03\0\0\0garbage"; close $fh;
($rc, $out) = run($nalar, 'generate', '-m', "$dir/bad.gguf", '-p', 'x');
ok($rc != 0 && $out =~ /bad\.gguf/, "truncated file refused: $out");
($rc, $out) = run($nalar, 'generate', '-m', "$dir/missing.gguf");
ok($rc != 0 && $out =~ /missing\.gguf/, "missing file refused: $out");

# bench --json has the documented keys
($rc, $out) = run($nalar, 'bench', '-m', 'models/nalar-kjv-draft-f32.gguf',
    '-p', 16, '-n', 8, '-b', '1,4', '--json');
like($out, qr/^\{"resident_bytes": \d+, "file_bytes": \d+, "kv_pool_bytes": \d+, "read_bytes_per_s": \d+, "prefill_tokens_per_s": [\d.]+, "decode_tokens_per_s": [\d.]+, "batched": \{"1": [\d.]+, "4": [\d.]+\}, "batched_cpu_ms_per_token": \{"1": [\d.]+, "4": [\d.]+\}, "weight_bytes_per_s": \d+\}\n$/,
    'bench --json line') or diag $out;
# --kv-type: the same pool in 2-byte elements is half the bytes; --ctx
# sets the batched decode's context; another type is refused
{
    my ($kv32) = $out =~ /"kv_pool_bytes": (\d+)/;
    ($rc, $out) = run($nalar, 'bench', '-m', 'models/nalar-kjv-draft-f32.gguf',
        '-p', 16, '-n', 8, '-b', '1,4', '--kv-type', 'f16', '--json');
    my ($kv16) = $out =~ /"kv_pool_bytes": (\d+)/;
    ok($rc == 0 && $kv32 && $kv16 && $kv16 * 2 == $kv32,
       "bench --kv-type f16: the pool in half the bytes ($kv16 of $kv32)")
        or diag $out;
    ($rc, $out) = run($nalar, 'bench', '-m', 'models/nalar-kjv-draft-f32.gguf',
        '-p', 16, '-n', 8, '-b', '2', '--ctx', 40, '--kv-type', 'bf16');
    ok($rc == 0 && $out =~ /KV bf16; batched decode at a context of 40\n/
       && $out =~ /decode batch 2: [\d.]+ tokens\/s aggregate \([\d.]+ ms of CPU time per token\)/,
       'bench --ctx 40 --kv-type bf16: said, and the CPU time per token')
        or diag $out;
    # NALAR_CPU_ISA picks the integer kernels' path: the widest this CPU
    # runs at or below it (AVX-VNNI where /proc/cpuinfo has avx_vnni)
    my $cpu = -r '/proc/cpuinfo' ? `cat /proc/cpuinfo` : '';
    my %want = (scalar => 'scalar',
                avx2 => $cpu =~ /\bavx2\b/ ? 'avx2' : 'scalar',
                avxvnni => $cpu =~ /\bavx_vnni\b/ && $cpu =~ /\bavx2\b/
                           ? 'avx-vnni'
                           : $cpu =~ /\bavx2\b/ ? 'avx2' : 'scalar');
    for my $isa (sort keys %want) {
        ($rc, $out) = run("NALAR_CPU_ISA=$isa", $nalar, 'bench', '-m',
            'models/nalar-kjv-draft-f32.gguf', '-p', 8, '-n', 2, '-b', 1);
        ok($rc == 0 && $out =~ /8- and 16-bit kernels \Q$want{$isa}\E;/,
           "NALAR_CPU_ISA=$isa: the $want{$isa} kernels") or diag $out;
    }
    ($rc, $out) = run($nalar, 'bench', '-m', 'models/nalar-kjv-draft-f32.gguf',
        '--kv-type', 'q8_0');
    ok($rc == 2 && $out =~ /--kv-type f32\|f16\|bf16/,
       "bench --kv-type q8_0 refused: $out");
}

# verify-bench: one line per pass size, each with a measured cost (how
# the costs compare is bench/spec.sh's to report: a test asserts no speed)
($rc, $out) = run('timeout', 600, $nalar, 'verify-bench', '-m',
    'models/nalar-kjv-draft-f32.gguf', '-t', 1, '--reps', 1, '--json');
my @vb = map { /"tokens": (\d+), "pos": 200, "us_per_pass": ([\d.]+), "ratio": ([\d.]+), "gflops": ([\d.]+), "line_round_trip_ns": (\d+)\}/ ? [$1, $2, $3, $5] : () }
         split /\n/, $out;
is(join(',', map { $_->[0] } @vb), '1,2,3,5,9,17,33',
   'verify-bench --json: passes of 1 to 33 tokens') or diag $out;
ok(@vb == 7 && !grep({ $_->[1] <= 0 || $_->[2] <= 0 } @vb),
   'each pass size has a cost and a ratio to single steps') if @vb;
ok(@vb && $vb[0][3] > 0,
   "verify-bench measures a cache line's round trip between two threads "
   . "($vb[0][3] ns)") if @vb;
# that the round trip's two threads always stop (a peer answering the
# last trip after the stop signal once spun for good) is
# t/41-round-trip.t's: 16 stops in one process, without a model's passes
($rc, $out) = run($nalar, 'verify-bench', '-m',
    'models/nalar-kjv-draft-f32.gguf', '--pos', 600);
ok($rc == 2 && $out =~ /--pos must leave 33 positions/,
   "verify-bench refuses a position past the context: $out");

# spec-bench: the editing tasks run end to end (the draft model as target:
# small and quick); an unknown task is refused
my %label = ('edit' => 'prediction', 'edit-spans' => 'prediction-spans',
             'edit-rename' => 'prediction-rename');
for my $task (sort keys %label) {
    ($rc, $out) = run($nalar, 'spec-bench', '-m',
        'models/nalar-kjv-draft-f32.gguf', '--task', $task, '-b', 1, '-k', 4,
        '-n', 64, '--reps', 1, '-t', 1, '--json');
    my $label = $label{$task};
    ok($rc == 0 && $out =~ /"proposer": "$label", "streams": 1, "k": "4".*"acceptance": ([\d.]+)/
       && $1 > 0.3, "spec-bench --task $task: a $label row, most proposals "
       . "accepted") or diag $out;
    next unless $task eq 'edit-rename';
    # it says how much of the output its prediction got right: at least
    # 90%, and not all of it (some recurring token was renamed)
    ok($out =~ /edit-rename: ([\d.]+)% of the output predicted/
       && $1 >= 90 && $1 < 100, "edit-rename renames up to a tenth: $out");
}
# each row's "speedups" are its paired ratios (speculative run over the
# plain run before it) in run order, so their median is the row's
# "speedup"; the medians' in-place sort once scrambled them into ratios of
# the i-th slowest runs, which pair none
($rc, $out) = run($nalar, 'spec-bench', '-m',
    'models/nalar-kjv-draft-f32.gguf', '--task', 'edit', '-b', 1,
    '-k', '0,2,4,8', '-n', 64, '--reps', 5, '-t', 1, '--json');
{
    my ($rows, $paired) = (0, 0);

    for my $l (split /\n/, $out) {
        next unless $l =~ /"speedup": ([\d.]+).*"speedups": \[([^\]]*)\]/;
        my ($sp, @r) = ($1, sort { $a <=> $b } split /,\s*/, $2);
        $rows++;
        $paired++ if @r == 5 && abs($r[2] - $sp) < 0.0015;
    }
    ok($rows == 4 && $paired == 4,
       "spec-bench: each row's speedup is the median of its paired "
       . "ratios ($paired of $rows rows)") or diag $out;
}

# a draft that never proposes the target's token (random weights sharing
# the vocabulary), proposing at every step (-k 4: fixed k, no step gate):
# it confirms (next to) nothing.  Whether auto lets n-gram lookup stand in
# for it is the step gate's call from measured step times, so it is
# measured by bench/spec-standin.sh, not asserted here.
{
    my $dir = tempdir(CLEANUP => 1);

    ($rc, $out) = run($nalar, 'mkmodel', '--dim', 64, '--layers', 1,
        '--ffn', 128, '--vocab-from', 'models/nalar-kjv-target-f32.gguf',
        '--seed', 7, '-o', "$dir/bad.gguf");
    is($rc, 0, "a random-weights draft: $out");
    ($rc, $out) = run($nalar, 'spec-bench', '-m',
        'models/nalar-kjv-target-f32.gguf', '--draft', "$dir/bad.gguf",
        '--only', 'draft', '-b', 1, '-k', 4, '-n', 96, '--reps', 1, '-t', 2,
        '--json');
    my ($n, $prop) = $out =~ /"accepted": (\d+), "proposed": (\d+)/;
    ok($rc == 0 && defined $n && $prop > 0 && $n <= 2,
       'the random draft proposes and confirms (next to) nothing: '
       . ($n // '?') . ' of ' . ($prop // '?')) or diag $out;
}
($rc, $out) = run($nalar, 'spec-bench', '-m',
    'models/nalar-kjv-draft-f32.gguf', '--task', 'code');
ok($rc == 2
   && $out =~ /--task is prompts, edit, edit-spans or edit-rename, not 'code'/,
   "spec-bench refuses an unknown task: $out");

# every command reads its options from one table (cli/opts.c): a value that
# is not a number, a missing value, an unknown option and a repeated option
# past its limit are refused, by name, with status 2 (atoi once read
# "-n abc" as 0 and "--reps 2x" as 2)
for my $c (
    [[qw(generate -m models/nalar-kjv-target-f32.gguf -n abc)],
     qr/^nalar generate: -n wants an integer, not 'abc'$/m],
    [[qw(generate -m models/nalar-kjv-target-f32.gguf --temp 0.5x)],
     qr/^nalar generate: --temp wants a number, not '0.5x'$/m],
    [[qw(generate -m models/nalar-kjv-target-f32.gguf --seed -3)],
     qr/^nalar generate: --seed wants a non-negative integer, not '-3'$/m],
    [['mkmodel', '--seed', "' -3'", '-o', '/dev/null'],
     qr/^nalar mkmodel: --seed wants a non-negative integer, not ' -3'$/m],
    [[qw(generate -m models/nalar-kjv-target-f32.gguf --spec maybe)],
     qr/^nalar generate: --spec off\|draft\|ngram\|auto$/m],
    [[qw(generate -m models/nalar-kjv-target-f32.gguf),
      map { ('--stop', "s$_") } 1 .. 17],
     qr/^nalar generate: --stop at most 16 times$/m],
    [[qw(spec-bench -m models/nalar-kjv-target-f32.gguf --reps 2x)],
     qr/^nalar spec-bench: --reps wants an integer, not '2x'$/m],
    [[qw(prefix-bench -m models/nalar-kjv-target-f32.gguf --bogus 1)],
     qr/^nalar prefix-bench: unknown option '--bogus'$/m],
    [[qw(verify-bench -m models/nalar-kjv-target-f32.gguf --pos)],
     qr/^nalar verify-bench: --pos needs a value$/m],
    [[qw(bench -m models/nalar-kjv-target-f32.gguf -t two)],
     qr/^nalar bench: -t wants an integer, not 'two'$/m],
    [[qw(mkmodel --dim 6.4 -o /dev/null)],
     qr/^nalar mkmodel: --dim wants an integer, not '6.4'$/m],
    [[qw(mkmodel --type q4 -o /dev/null)],
     qr/^nalar mkmodel: unknown type 'q4'/m],
    [[qw(tokenize -m models/nalar-kjv-target-f32.gguf In the)],
     qr/^nalar tokenize: unexpected argument 'the'$/m],
    [[qw(tokenize --no-bos In -m)],
     qr/^nalar tokenize: -m needs a value$/m],
) {
    ($rc, $out) = run($nalar, @{$c->[0]});
    ok($rc == 2 && $out =~ $c->[1], "refused: @{$c->[0]}[0, -2, -1]")
        or diag $out;
}
($rc, $out) = run($nalar, qw(generate -m models/nalar-kjv-target-f32.gguf
    -p In --threads 1 --seed 18446744073709551615 --temp 0.7 --stop zz
    --stop yy -n 4 --ids --ignore-eos));
ok($rc == 0 && $out =~ /^\d+ \d+ \d+ \d+$/,
   "options at their limits and an alias (--threads) are taken: $out");
# tokenize's text is its one argument that is no option, wherever it is
($rc, $out) = run($nalar, qw(tokenize In --no-bos -m
    models/nalar-kjv-target-f32.gguf));
is($out, "780\n", "tokenize: the text before the options, --no-bos taken");

# LoRA: a random adapter, the merged file, and generate under the adapter
{
    my $dir = tempdir(CLEANUP => 1);
    my $base = 'models/nalar-kjv-target-f32.gguf';
    my @gen = ('-p', "'In the beginning'", qw(-n 16 --temp 0
        --ids --ignore-eos));

    ($rc, $out) = run($nalar, qw(mkmodel --lora-of), $base,
        qw(--rank 8 --seed 3 -o), "$dir/a.gguf");
    is($rc, 0, 'mkmodel --lora-of writes an adapter') or diag $out;
    ($rc, $out) = run($nalar, qw(mkmodel --merge), $base, '--lora',
        "$dir/a.gguf", qw(--scale 0.5 -o), "$dir/m.gguf");
    is($rc, 0, 'mkmodel --merge writes the merged file') or diag $out;
    my ($rc1, $plain) = run($nalar, qw(generate -m), $base, @gen);
    my ($rc2, $under) = run($nalar, qw(generate -m), $base, '--lora',
        "t=$dir/a.gguf:0.5", qw(--adapter t), @gen);
    my ($rc3, $merged) = run($nalar, qw(generate -m), "$dir/m.gguf",
        @gen);
    ok($rc1 == 0 && $rc2 == 0 && $rc3 == 0 && $under =~ /^\d+( \d+){15}$/,
       'generate --lora t=FILE:0.5 --adapter t runs') or diag $under;
    isnt($under, $plain, 'the adapter changes the greedy output');
    is($under, $merged, 'and it equals the merged file\'s');
    ($rc, $out) = run($nalar, qw(generate -m), $base, '--lora',
        "t=$dir/a.gguf", qw(--adapter u), @gen);
    ok($rc == 2 && $out =~ /--adapter u names no --lora/,
       'an --adapter that names no --lora is refused') or diag $out;
    ($rc, $out) = run($nalar, qw(generate -m), $base, '--lora', "t=$base",
        @gen);
    ok($rc == 1 && $out =~ /general.type is absent/,
       'a model given as an adapter is refused at load') or diag $out;

    # eval --lora: each position's top logits under the adapter at run
    # time, as the merged file gives them (F32: within 1e-3)
    my @ids = ('--ids', "'1 780 33 412 9 57'", qw(--top 3));
    my ($e1, $rt) = run($nalar, qw(eval -m), $base, '--lora',
        "$dir/a.gguf:0.5", @ids);
    my ($e2, $mg) = run($nalar, qw(eval -m), "$dir/m.gguf", @ids);
    my ($e3, $bo) = run($nalar, qw(eval -m), $base, @ids);
    my @rt = $rt =~ /(-?\d+\.\d+)/g;
    my @mg = $mg =~ /(-?\d+\.\d+)/g;
    my $d = @rt == @mg && @rt == 6 * 4 ? 0 : 1e9;
    for my $i (0 .. $#rt) {
        my $e = abs($rt[$i] - ($mg[$i] // 1e9));
        $d = $e if $e > $d;
    }
    ok($e1 == 0 && $e2 == 0 && $e3 == 0 && $d < 1e-3,
       "eval --lora FILE:0.5 equals the merged file's logits (off by $d)")
        or diag "$rt\n$mg";
    isnt($rt, $bo, 'eval --lora: the adapter changes the logits');
    ($rc, $out) = run($nalar, qw(eval -m), $base, '--lora',
        "$dir/a.gguf:0", @ids);
    ok($rc == 2 && $out =~ /the scale is a number/,
       'eval --lora FILE:0 is refused') or diag $out;
}

done_testing();

#!/usr/bin/perl
# /v1/completions equals `nalar generate` greedy output token for token,
# streaming and not, alone and 16 at once, with chunked prefill of a long
# prompt; OpenAI response and SSE shapes.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

# a small per-step budget: every prompt below is prefilled in chunks
$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    nalar_max_batch_tokens 32;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $long = join ' ', ('And God said, Let there be light: and there was light.')
                     x 20;
my @prompts = ('In the beginning', 'And it came to pass', 'A wise man', $long);
my $N = 48;

my (%ref_ids, %ref_text, %ref_eos_text);
for my $p (@prompts) {
    $ref_ids{$p} = $t->reference_ids($p, $N, ignore_eos => 1);
    $ref_text{$p} = $t->reference_text($p, $N, ignore_eos => 1);
    $ref_eos_text{$p} = $t->reference_text($p, $N);
}

# the README's reference ids for the demo model, as a check on the oracle
is("@{ $ref_ids{'A wise man'} }[0 .. 7]", '322 261 416 517 322 261 416 517',
   'CLI reference agrees with models/README.md');

sub body {
    my ($p, %o) = @_;
    return { model => 'kjv', prompt => $p, max_tokens => $N,
             temperature => 0, ignore_eos => JSON::PP::true,
             logprobs => 0, return_tokens_as_token_ids => JSON::PP::true,
             %o };
}

sub ids_of {
    my ($lp) = @_;
    return [ map { /^token_id:(\d+)$/ ? $1 : "?$_" } @{ $lp->{tokens} } ];
}

# Non-streaming: one JSON, the right shape, the reference text and ids.
# The checks return '' or what went wrong (children of the concurrency
# test must not print TAP).
sub check_plain {
    my ($p) = @_;
    my $r = $t->post_json('/v1/completions', body($p));
    my $j = $r->{json} || {};
    my $c = $j->{choices}[0] || {};
    my $ok = $r->{status} == 200
        && $j->{object} eq 'text_completion'
        && $j->{id} =~ /^cmpl-/
        && $c->{text} eq $ref_text{$p}
        && "@{ ids_of($c->{logprobs}) }" eq "@{ $ref_ids{$p} }"
        && $c->{finish_reason} eq 'length'
        && $j->{usage}{completion_tokens} == $N;
    return $ok ? '' : "$r->{raw}\nwant: $ref_text{$p}\n@{ $ref_ids{$p} }";
}

# Streaming: SSE chunks whose text and ids concatenate to the reference.
sub check_stream {
    my ($p) = @_;
    my $r = $t->post_json('/v1/completions',
                          body($p, stream => JSON::PP::true,
                               stream_options => { include_usage =>
                                                   JSON::PP::true }));
    my @ev = NalarTest::sse_events($r->{body});
    my ($text, @ids, %id, $finish) = ('');
    my $usage;
    for my $e (@ev[0 .. $#ev - 1]) {
        $id{ $e->{id} } = 1;
        if (@{ $e->{choices} }) {
            $text .= $e->{choices}[0]{text};
            push @ids, @{ ids_of($e->{choices}[0]{logprobs}) }
                if $e->{choices}[0]{logprobs};
            $finish = $e->{choices}[0]{finish_reason}
                if defined $e->{choices}[0]{finish_reason};
        } else {
            $usage = $e->{usage};
        }
    }
    my $ok = $r->{status} == 200
        && $r->{headers}{'content-type'} =~ m{^text/event-stream}
        && ($r->{headers}{'x-accel-buffering'} // '') eq 'no'
        && $ev[-1] eq '[DONE]'
        && keys(%id) == 1
        && $text eq $ref_text{$p}
        && "@ids" eq "@{ $ref_ids{$p} }"
        && ($finish // '') eq 'length'
        && $usage && $usage->{completion_tokens} == $N
        && $usage->{total_tokens} == $usage->{prompt_tokens} + $N;
    return $ok ? '' : "$r->{raw}\nwant: $ref_text{$p}\n@{ $ref_ids{$p} }";
}

for my $i (0 .. $#prompts) {
    my $err = check_plain($prompts[$i]);
    is($err, '', "prompt $i: non-streaming equals nalar generate");
    $err = check_stream($prompts[$i]);
    is($err, '', "prompt $i: streaming equals nalar generate");
}

# stopping at EOS, as nalar generate does without --ignore-eos

my $r = $t->post_json('/v1/completions',
                      { model => 'kjv', prompt => 'In the beginning',
                        max_tokens => $N, temperature => 0 });
is($r->{json}{choices}[0]{text}, $ref_eos_text{'In the beginning'},
   'stops at EOS like nalar generate');
is($r->{json}{choices}[0]{finish_reason}, 'stop', 'finish_reason stop');
is($r->{json}{usage}{prompt_tokens}, 5, 'prompt_tokens (BOS + 4)');
ok(exists $r->{json}{usage}{prompt_tokens_details}{cached_tokens},
   'usage has prompt_tokens_details.cached_tokens');

# a prompt as token ids

$r = $t->post_json('/v1/completions',
                   body([1, 298, 1540, 416]));
is($r->{json}{choices}[0]{text}, $ref_text{'A wise man'},
   'prompt as token ids gives the same text');

# stop strings

$r = $t->post_json('/v1/completions',
                   body('A wise man', stop => ['who'], logprobs => undef));
is($r->{json}{choices}[0]{text}, ' is a man ', 'stop string ends the text');
is($r->{json}{choices}[0]{finish_reason}, 'stop', 'stop string: finish stop');

# n = 3 greedy choices are all the reference

$r = $t->post_json('/v1/completions', body('A wise man', n => 3));
is(scalar @{ $r->{json}{choices} || [] }, 3, 'n=3 gives three choices');
is_deeply([ map { $_->{index} } @{ $r->{json}{choices} } ], [0, 1, 2],
          'choice indexes');
is_deeply([ map { $_->{text} } @{ $r->{json}{choices} } ],
          [ ($ref_text{'A wise man'}) x 3 ], 'each greedy choice is the reference');
is($r->{json}{usage}{completion_tokens}, 3 * $N, 'usage sums the choices');

# n = 8 choices of a long prompt (one copy of its text, shared by the
# engine's requests) each answer as the prompt alone

my $long = 'And God said, Let there be light: and there was light. ' x 28;
my $one = $t->post_json('/v1/completions', body($long, max_tokens => 4));
$r = $t->post_json('/v1/completions', body($long, max_tokens => 4, n => 8));
is($r->{status}, 200, 'n=8 of a long prompt: 200') or diag($r->{body});
ok($one->{json}{usage}{prompt_tokens} > 300,
   "the prompt is $one->{json}{usage}{prompt_tokens} tokens");
is_deeply([ map { $_->{text} } @{ $r->{json}{choices} || [] } ],
          [ ($one->{json}{choices}[0]{text}) x 8 ],
          'each of the 8 choices is the answer of n=1');

# seeded sampling is reproducible

my @s = map {
    $t->post_json('/v1/completions',
                  { prompt => 'A wise man', max_tokens => 16,
                    temperature => 0.9, top_p => 0.95, seed => 42,
                    ignore_eos => JSON::PP::true })
} 1 .. 2;
for my $i (0, 1) {
    is($s[$i]{status}, 200, "seeded sample $i: 200");
    is($s[$i]{json}{usage}{completion_tokens}, 16,
       "seeded sample $i: 16 tokens");
}
is($s[0]{json}{choices}[0]{text}, $s[1]{json}{choices}[0]{text},
   'the same seed gives the same sample');

# 16 at once: every client gets the reference, streaming or not

my @pids;
for my $k (0 .. 15) {
    my $p = $prompts[$k % @prompts];
    push @pids, NalarTest::fork_client(sub {
        my $err = ($k % 2) ? check_stream($p) : check_plain($p);
        die "client $k differs: $err\n" if $err;
    });
}
my $bad = 0;
for (@pids) { waitpid $_, 0; $bad++ if $?; }
is($bad, 0, '16 concurrent clients all equal nalar generate');

my $m = $t->metrics;
is($m->{'nalar_requests_running{model="kjv"}'}, 0, 'nothing running after');
is($m->{'nalar_kv_blocks_free{model="kjv"}'},
   $m->{'nalar_kv_blocks_capacity{model="kjv"}'}, 'every KV block free after');

$t->check_log;
done_testing;

#!/usr/bin/perl
# nalar_cpu_activations f32 | i16 | q8 | pairs: nginx -t takes the four
# values and refuses others; an engine of a quantized model run with i16
# answers with the greedy ids of f32 (the conformance file's logits move
# by about 1e-3 at most) and with logprobs that differ from f32's, but
# only slightly: the directive reaches the engine.  With q8 the first
# step's id is f32's and its logprob is another, within the kit's Q8_0
# tolerance.  pairs gives a Q8_0 model i16's logprobs to the bit (per 32
# the mode takes the 16-bit codes) and a Q4_K_M model logprobs of its
# own, neither i16's nor f32's.  With no directive the engine runs the
# default mode, pairs: its logprobs to the bit.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model;
my $q8 = NalarTest->root . '/t/data/conformance/llama3-Q8_0.gguf';
my $q4k = NalarTest->root . '/t/data/conformance/llama3-Q4_K_M.gguf';

sub conf_with {
    my ($lines) = @_;
    $t->write_conf(<<"CONF");
http {
    nalar_model q8 $q8;
    $lines
}
CONF
    return $t->test_conf;
}

for my $l ('nalar_cpu_activations f32;', 'nalar_cpu_activations i16;',
           'nalar_cpu_activations q8;', 'nalar_cpu_activations pairs;') {
    my ($rc, $out) = conf_with($l);
    is($rc, 0, "nginx -t accepts: $l") or diag($out);
}
{
    my ($rc, $out) = conf_with('nalar_cpu_activations i8;');
    isnt($rc, 0, 'nginx -t refuses nalar_cpu_activations i8');
    like($out, qr/invalid value "i8"/, '  naming it') or diag($out);
    ($rc, $out) = conf_with('nalar_cpu_activations i16; '
                            . 'nalar_cpu_activations f32;');
    isnt($rc, 0, 'nginx -t refuses it twice');
    like($out, qr/is duplicate/, '  saying so') or diag($out);
}

my %got;
for my $run (['q8', 'f32'], ['q8', 'i16'], ['q8', 'q8'], ['q8', 'pairs'],
             ['q4k', 'default'], ['q4k', 'f32'], ['q4k', 'i16'],
             ['q4k', 'pairs']) {
    my ($m, $mode) = @$run;
    my $file = $m eq 'q8' ? $q8 : $q4k;
    my $dir = $mode eq 'default' ? '' : "nalar_cpu_activations $mode;";
    $t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_model $m $file;
    nalar_threads 2;
    $dir

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF
    my $r = $t->post_json('/v1/completions', {
        model => $m, prompt => 'In the beginning God created',
        max_tokens => 16, temperature => 0, ignore_eos => JSON::PP::true,
        logprobs => 1, return_tokens_as_token_ids => JSON::PP::true });
    is($r->{status}, 200, "$m $mode: 200") or diag($r->{body});
    $got{"$m $mode"} = $r->{json}{choices}[0]{logprobs};
    $t->stop;
    $t->check_log;
}

sub lps { return join(',', @{ $_[0]{token_logprobs} }) }

# no directive: the CPU backend's default, the pair multipliers (the
# fastest exact mode, src/backend.h NALAR_ACT_DEFAULT), to the bit
is_deeply($got{'q4k default'}, $got{'q4k pairs'}, 'no directive: the pairs '
          . 'mode, logprobs and all');
isnt(lps($got{'q4k default'}), lps($got{'q4k f32'}), '  not f32\'s');
isnt(lps($got{'q4k default'}), lps($got{'q4k i16'}), '  not i16\'s');

is_deeply($got{'q8 i16'}{tokens}, $got{'q8 f32'}{tokens},
          'i16: the greedy ids of f32');
my ($max, $n) = (0, 0);
for my $i (0 .. $#{ $got{'q8 f32'}{token_logprobs} }) {
    my $d = abs($got{'q8 i16'}{token_logprobs}[$i]
                - $got{'q8 f32'}{token_logprobs}[$i]);
    $max = $d if $d > $max;
    $n++;
}
ok($n == 16 && $max > 0, "i16: logprobs are not f32's (largest difference "
   . sprintf('%.2e', $max) . ')');
ok($max < 0.01, '  but within 0.01 of them');

# q8: 8-bit codes move the logits by up to the kit's tolerance for Q8_0
# (0.25), so only the first step is compared
is($got{'q8 q8'}{tokens}[0], $got{'q8 f32'}{tokens}[0],
   'q8: the first greedy id of f32');
my $d8 = abs($got{'q8 q8'}{token_logprobs}[0]
             - $got{'q8 f32'}{token_logprobs}[0]);
my $d16 = abs($got{'q8 q8'}{token_logprobs}[0]
              - $got{'q8 i16'}{token_logprobs}[0]);
ok($d8 > 0 && $d16 > 0, 'q8: its logprob is neither f32\'s nor i16\'s ('
   . sprintf('%.2e', $d8) . ' from f32)');
ok($d8 < 0.25, '  but within 0.25 of f32\'s');

# pairs: per 32 (Q8_0) the 16-bit codes, so i16's logprobs to the bit;
# per 256 (Q4_K_M) int8 codes with a multiplier per pair, closer than q8
# but not exact: the first step as q8's
is_deeply($got{'q8 pairs'}, $got{'q8 i16'}, 'pairs, Q8_0: i16\'s logprobs '
          . 'to the bit');
is($got{'q4k pairs'}{tokens}[0], $got{'q4k f32'}{tokens}[0],
   'pairs, Q4_K_M: the first greedy id of f32');
my $dp = abs($got{'q4k pairs'}{token_logprobs}[0]
             - $got{'q4k f32'}{token_logprobs}[0]);
ok($dp > 0 && $got{'q4k pairs'}{token_logprobs}[0]
              != $got{'q4k i16'}{token_logprobs}[0],
   'pairs, Q4_K_M: its logprob is neither f32\'s nor i16\'s ('
   . sprintf('%.2e', $dp) . ' from f32)');
ok($dp < 0.25, '  but within 0.25 of f32\'s');

done_testing;

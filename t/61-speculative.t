#!/usr/bin/perl
# nalar_model ... draft=PATH: speculative decoding with the draft model
# leaves greedy answers equal to `nalar generate` token for token, and the
# metrics show proposals verified and accepted; OpenAI's `prediction` field
# is verified the same way; nalar_prefix_cache reports cached prompt tokens.
# Speculation is `fixed`: every step proposes, whatever the step gate would
# measure on this host, so the proposal counts are certain.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%% draft=%%DRAFT%%;
    nalar_model plain %%MODEL%%;
    nalar_threads 2;
    nalar_prefix_cache on;
    nalar_speculative auto max=4 fixed;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 48;
my @prompts = ('In the beginning', 'And it came to pass', 'A wise man');

for my $p (@prompts) {
    my $want = $t->reference_text($p, $N, ignore_eos => 1);
    for my $stream (0, 1) {
        my $r = $t->post_json('/v1/completions',
                              { model => 'kjv', prompt => $p,
                                max_tokens => $N, temperature => 0,
                                ignore_eos => JSON::PP::true,
                                stream => $stream ? JSON::PP::true
                                                  : JSON::PP::false });
        my $text = $stream
            ? join('', map { ref $_ ? $_->{choices}[0]{text} // '' : '' }
                       NalarTest::sse_events($r->{body}))
            : $r->{json}{choices}[0]{text};
        is($text, $want, "draft model, '$p'" . ($stream ? ', streaming' : '')
                         . ': equals nalar generate');
    }
}

my $m = $t->metrics;
ok($m->{'nalar_spec_decode_num_draft_tokens_total{model="kjv"}'} > 0,
   'the draft proposed tokens');
ok($m->{'nalar_spec_decode_num_accepted_tokens_total{model="kjv"}'} > 0,
   'and some were accepted');
is($m->{'nalar_spec_decode_num_draft_tokens_total{model="plain"}'}, 0,
   'nothing proposed for a model not asked yet');

# a predicted output is verified, not trusted: a right prediction and a
# wrong one give the same answer

my $p = 'A wise man';
my $want = $t->reference_text($p, $N, ignore_eos => 1);
for my $pred ($want, ' the quick brown fox jumps over the lazy dog') {
    my $r = $t->post_json('/v1/completions',
                          { model => 'plain', prompt => $p, max_tokens => $N,
                            temperature => 0, ignore_eos => JSON::PP::true,
                            prediction => { type => 'content',
                                            content => $pred } });
    is($r->{json}{choices}[0]{text}, $want,
       'prediction "' . substr($pred, 0, 12) . '...": equals nalar generate');
}
$m = $t->metrics;
ok($m->{'nalar_spec_decode_num_accepted_tokens_total{model="plain"}'} > 0,
   'the right prediction was accepted');

my $r = $t->post_json('/v1/completions', { model => 'plain', prompt => $p,
                                            prediction => 'text' });
is($r->{status}, 400, 'prediction must be an object');

# the prefix cache: the same long prompt twice, the second time cached

my $long = join ' ', ('And God said, Let there be light: and there was light.')
                     x 8;
my @u = map {
    $t->post_json('/v1/completions', { model => 'plain', prompt => $long,
                                       max_tokens => 4, temperature => 0 })
      ->{json}{usage}
} 1 .. 2;
is($u[0]{prompt_tokens_details}{cached_tokens}, 0, 'first time: nothing cached');
ok($u[1]{prompt_tokens_details}{cached_tokens} >= 16,
   "second time: $u[1]{prompt_tokens_details}{cached_tokens} of "
   . "$u[1]{prompt_tokens} prompt tokens cached");

$t->check_log;
done_testing;

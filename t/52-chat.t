#!/usr/bin/perl
# /v1/chat/completions: messages rendered with the chat template (the
# model's, ChatML when it has none, or nalar_chat_template), answers equal
# to `nalar generate` on the rendered prompt, chat SSE chunk shapes,
# content parts, logprobs.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location /llama3/v1/ { nalar_api; nalar_chat_template llama3; }
        location /zephyr/v1/ { nalar_api; nalar_chat_template zephyr; }
        location /llama2/v1/ { nalar_api; nalar_chat_template llama2; }
    }
}
CONF

my $N = 32;
my @messages = ({ role => 'system', content => 'You are wise.' },
                { role => 'user', content => 'In the beginning' });

sub chat {
    my ($prefix, %o) = @_;
    return $t->post_json("$prefix/v1/chat/completions",
                         { model => 'kjv', messages => \@messages,
                           max_tokens => $N, temperature => 0,
                           ignore_eos => JSON::PP::true, %o });
}

# ChatML, the default for a model without tokenizer.chat_template

my $chatml = "<|im_start|>system\nYou are wise.<|im_end|>\n"
           . "<|im_start|>user\nIn the beginning<|im_end|>\n"
           . "<|im_start|>assistant\n";
my $want = $t->reference_text($chatml, $N, ignore_eos => 1,
                              stop => ['<|im_end|>']);

my $r = chat('');
is($r->{status}, 200, 'chat 200');
my $j = $r->{json};
is($j->{object}, 'chat.completion', 'object chat.completion');
like($j->{id}, qr/^chatcmpl-\w+$/, 'id chatcmpl-...');
is($j->{choices}[0]{message}{role}, 'assistant', 'message role');
is($j->{choices}[0]{message}{content}, $want,
   'ChatML prompt: equals nalar generate on the rendered text');
is($j->{choices}[0]{index}, 0, 'choice index');
ok(exists $j->{choices}[0]{logprobs}, 'logprobs key present (null)');
is($j->{usage}{prompt_tokens}, scalar @{ $t->tokenize_special($chatml) },
   'prompt_tokens of the rendered prompt');

# streaming chat chunks

$r = chat('', stream => JSON::PP::true);
my @ev = NalarTest::sse_events($r->{body});
is($ev[-1], '[DONE]', 'stream ends with [DONE]');
pop @ev;
is($ev[0]{choices}[0]{delta}{role}, 'assistant', 'first chunk has the role');
is($ev[0]{choices}[0]{delta}{content}, '', 'with empty content');
is($ev[-1]{choices}[0]{finish_reason}, 'length', 'last chunk: finish_reason');
is_deeply($ev[-1]{choices}[0]{delta}, {}, 'last chunk: empty delta');
my %obj = map { $_->{object} => 1 } @ev;
is_deeply([keys %obj], ['chat.completion.chunk'], 'object chat.completion.chunk');
my %ids = map { $_->{id} => 1 } @ev;
is(scalar keys %ids, 1, 'one id for the stream');
my $text = join '', map { $_->{choices}[0]{delta}{content} // '' } @ev;
is($text, $want, 'streamed content equals the reference');

# content as an array of text parts is the same message

@messages = ({ role => 'system', content => [ { type => 'text',
                                                 text => 'You are ' },
                                               { type => 'text',
                                                 text => 'wise.' } ] },
             { role => 'user', content => 'In the beginning' });
$r = chat('');
is($r->{json}{choices}[0]{message}{content}, $want, 'content parts joined');

@messages = ({ role => 'user', content => 'In the beginning' });

# Llama-3 layout (no special tokens in this vocabulary: literal text)

my $llama3 = "<|start_header_id|>user<|end_header_id|>\n\nIn the beginning"
           . "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
$r = chat('/llama3');
is($r->{json}{choices}[0]{message}{content},
   $t->reference_text($llama3, $N, ignore_eos => 1, stop => ['<|eot_id|>']),
   'nalar_chat_template llama3');

# Zephyr closes turns with </s>, which is this vocabulary's EOS: the prompt
# must be the ids with control tokens parsed

my $zephyr = "<|user|>\nIn the beginning</s>\n<|assistant|>\n";
my $zids = $t->tokenize_special($zephyr);
ok((grep { $_ == 2 } @$zids), '</s> is parsed as EOS in the zephyr prompt');
my $c = $t->post_json('/v1/completions',
                      { prompt => $zids, max_tokens => $N, temperature => 0,
                        ignore_eos => JSON::PP::true, stop => ['</s>'] });
$r = chat('/zephyr');
is($r->{json}{usage}{prompt_tokens}, scalar @$zids, 'zephyr prompt tokens');
is($r->{json}{choices}[0]{message}{content}, $c->{json}{choices}[0]{text},
   'nalar_chat_template zephyr');

# Llama-2: system folded into the first [INST]

@messages = ({ role => 'system', content => 'Be brief.' },
             { role => 'user', content => 'Hi' },
             { role => 'assistant', content => 'Hello' },
             { role => 'user', content => 'In the beginning' });
my $llama2 = "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s>"
           . "<s>[INST] In the beginning [/INST]";
my $lids = $t->tokenize_special($llama2);
$r = chat('/llama2');
is($r->{json}{usage}{prompt_tokens}, scalar @$lids, 'llama2 prompt tokens');
$c = $t->post_json('/v1/completions',
                   { prompt => $lids, max_tokens => $N, temperature => 0,
                     ignore_eos => JSON::PP::true, stop => ['</s>'] });
is($r->{json}{choices}[0]{message}{content}, $c->{json}{choices}[0]{text},
   'nalar_chat_template llama2');

# errors

$r = $t->post_json('/v1/chat/completions',
                   { messages => [ { role => 'wizard', content => 'x' } ] });
is($r->{status}, 400, 'unknown role: 400');
like($r->{json}{error}{message}, qr/role "wizard"/, 'names the role');

$r = $t->post_json('/v1/chat/completions', { messages => [] });
is($r->{status}, 400, 'empty messages: 400');
is($r->{json}{error}{param}, 'messages', 'param messages');

# logprobs in the chat shape

@messages = ({ role => 'user', content => 'A wise man' });
$r = chat('', logprobs => JSON::PP::true, top_logprobs => 2, max_tokens => 4);
my $lp = $r->{json}{choices}[0]{logprobs}{content};
is(scalar @{ $lp || [] }, 4, 'a logprobs entry per token');
ok($lp->[0]{logprob} <= 0, 'logprob is a log probability');
is(scalar @{ $lp->[0]{top_logprobs} }, 2, 'top_logprobs has 2 entries');
is(join('', map { $_->{token} } @$lp),
   $r->{json}{choices}[0]{message}{content}, 'tokens spell the content');
is_deeply($lp->[0]{bytes}, [ unpack 'C*', $lp->[0]{token} ], 'bytes');
ok($lp->[0]{top_logprobs}[0]{logprob} >= $lp->[0]{top_logprobs}[1]{logprob},
   'alternatives sorted');

$t->check_log;
done_testing;

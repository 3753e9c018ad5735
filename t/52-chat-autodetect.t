#!/usr/bin/perl
# The chat template comes from the model: `nalar mkmodel --chat-template`
# writes Llama-3, Zephyr, Llama-2 and an unrecognised (Alpaca-like) Jinja
# template into four models of the same weights and vocabulary; each is
# served under its own name with no nalar_chat_template, which runs its
# own template: usage.prompt_tokens and $nalar_prompt_tokens are the count
# `nalar render --openai --ids` predicts, and the answer is the completion
# of those ids.  The explicit nalar_chat_template of the style recognised
# in each template renders that style (the prompt `nalar tokenize` counts
# for that style's rendering), and the ChatML rendering differs.  The
# unrecognised template runs as itself.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;
my $dir = $t->dir;
my $root = NalarTest::root();

# Jinja templates in the style of the ones the model families ship: only
# their marker tokens matter to the detection, but they are complete.

my %jinja = (
    llama3 => <<'J',
{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}
J
    zephyr => <<'J',
{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}
J
    llama2 => <<'J',
{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}
J
    # Alpaca's layout: none of the known markers, so ChatML
    other => <<'J',
{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '### Instruction:\n' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}{{ '### Response:\n' + message['content'] + eos_token + '\n\n' }}{% else %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '### Response:\n' }}{% endif %}
J
);

# model name => the style its template must be detected as
my %style = (l3 => 'llama3', zephyr => 'zephyr', l2 => 'llama2',
             other => 'chatml');
my %tmpl_of = (l3 => 'llama3', zephyr => 'zephyr', l2 => 'llama2',
               other => 'other');

# the same random weights (same seed) and the demo vocabulary for all four:
# only the template differs
for my $name (sort keys %tmpl_of) {
    my $jf = $t->write_file("$name.jinja", $jinja{ $tmpl_of{$name} });
    my $out = `$root/build/nalar mkmodel --vocab-from $NalarTest::MODEL \\
        --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 384 --seed 5 \\
        --chat-template $jf -o $dir/$name.gguf 2>&1`;
    is($?, 0, "mkmodel --chat-template for $name") or diag($out);
}

# the option takes a file: a missing one fails and names it
my $out = `$root/build/nalar mkmodel --vocab-from $NalarTest::MODEL \\
    --chat-template $dir/none.jinja -o $dir/x.gguf 2>&1`;
isnt($?, 0, 'mkmodel --chat-template with a missing file fails');
like($out, qr{\Q$dir/none.jinja\E}, 'and names the file');
ok(!-e "$dir/x.gguf", 'and writes nothing');

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model l3 %%PREFIX%%/l3.gguf;
    nalar_model zephyr %%PREFIX%%/zephyr.gguf;
    nalar_model l2 %%PREFIX%%/l2.gguf;
    nalar_model other %%PREFIX%%/other.gguf;
    nalar_threads 1;

    log_format chat '$nalar_model $nalar_prompt_tokens $request_uri';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/chat.log chat;

        location /v1/ { nalar_api; }
        location /chatml/v1/ { nalar_api; nalar_chat_template chatml; }
        location /llama3/v1/ { nalar_api; nalar_chat_template llama3; }
        location /zephyr/v1/ { nalar_api; nalar_chat_template zephyr; }
        location /llama2/v1/ { nalar_api; nalar_chat_template llama2; }
    }
}
CONF

my $N = 24;
my @messages = ({ role => 'system', content => 'You are wise.' },
                { role => 'user', content => 'In the beginning' });

# the prompt each style renders for @messages (BOS from the tokenizer)
my %rendered = (
    chatml => "<|im_start|>system\nYou are wise.<|im_end|>\n"
            . "<|im_start|>user\nIn the beginning<|im_end|>\n"
            . "<|im_start|>assistant\n",
    llama3 => "<|start_header_id|>system<|end_header_id|>\n\nYou are wise."
            . "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            . "In the beginning<|eot_id|>"
            . "<|start_header_id|>assistant<|end_header_id|>\n\n",
    zephyr => "<|system|>\nYou are wise.</s>\n<|user|>\nIn the beginning</s>\n"
            . "<|assistant|>\n",
    llama2 => "[INST] <<SYS>>\nYou are wise.\n<</SYS>>\n\n"
            . "In the beginning [/INST]",
);
my %n_prompt = map { $_ => scalar @{ $t->tokenize_special($rendered{$_}) } }
               keys %rendered;
my %counts = map { $_ => 1 } values %n_prompt;
is(scalar keys %counts, 4, 'the four renderings have four prompt lengths: '
   . join ', ', map { "$_ $n_prompt{$_}" } sort keys %n_prompt);

sub chat {
    my ($prefix, $model) = @_;
    my $r = $t->post_json("$prefix/v1/chat/completions",
                          { model => $model, messages => \@messages,
                            max_tokens => $N, temperature => 0,
                            ignore_eos => JSON::PP::true });
    return { status => $r->{status},
             content => $r->{json}{choices}[0]{message}{content},
             prompt => $r->{json}{usage}{prompt_tokens} };
}

my @log;   # expected access-log lines, in order

# what `nalar render` predicts of the model's own template: its ids
sub predict {
    my ($model) = @_;
    my $f = $t->write_file('messages.json', NalarTest::json()->encode(
                           \@messages));
    my $got = `$root/build/nalar render -m $dir/$model.gguf --messages $f --openai --ids`;
    return NalarTest::json()->decode($got)->{ids};
}

for my $model (qw(l3 zephyr l2 other)) {
    my $s = $style{$model};
    my $auto = chat('', $model);
    my $over = chat("/$s", $model);
    my $cml = chat('/chatml', $model);
    my $ids = predict($model);
    push @log, "$model $auto->{prompt} /v1/chat/completions",
               "$model $over->{prompt} /$s/v1/chat/completions",
               "$model $cml->{prompt} /chatml/v1/chat/completions";

    # auto runs the model's own template
    my $c = $t->post_json('/v1/completions',
                          { model => $model, prompt => $ids, max_tokens => $N,
                            temperature => 0,
                            ignore_eos => JSON::PP::true });
    is($auto->{status}, 200, "$model: 200");
    is($auto->{prompt}, scalar @$ids,
       "$model: prompt_tokens of its own template, as nalar render "
       . "predicts (" . scalar(@$ids) . ")");
    is($auto->{content}, $c->{json}{choices}[0]{text},
       "$model: the answer is the completion of those ids");
    ok(length($auto->{content} // '') > 0, "$model: a non-empty answer");

    # the style its template is recognised as, named
    is($over->{prompt}, $n_prompt{$s},
       "$model: nalar_chat_template $s renders that style "
       . "($n_prompt{$s})");
    next if $s eq 'chatml';

    isnt($cml->{prompt}, $over->{prompt},
         "$model: the ChatML rendering has another length ($cml->{prompt})");
    isnt($cml->{content}, $over->{content},
         "$model: and another answer");
}

# the unrecognised template runs as itself, not as ChatML
isnt(chat('', 'other')->{prompt}, $n_prompt{chatml},
     'other: an unrecognised template is run, not replaced by ChatML');
push @log, "other " . scalar(@{ predict('other') })
           . " /v1/chat/completions";

# $nalar_prompt_tokens in the access log agrees with usage

$t->stop;
my @lines = grep { m{/chat/completions$} }   # not run()'s health checks
            split /\n/, $t->read_file('chat.log');
is_deeply(\@lines, \@log, '$nalar_prompt_tokens in the access log equals '
          . 'usage.prompt_tokens for every request');

$t->check_log;
done_testing;

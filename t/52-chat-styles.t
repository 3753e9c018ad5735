#!/usr/bin/perl
# Chat styles through nginx, each on a model whose vocabulary has the
# style's markers as control tokens and whose tokenizer.chat_template is in
# that style (`nalar mkmodel --control-tokens --chat-template`; the BPE ones
# with the pre-tokenizer of the family: llama-bpe, qwen2, tekken; the
# Mistral templates are the ones Hugging Face ships), each model served
# through a location that names its style (`nalar_chat_template auto` runs the Jinja template itself:
# t/83-chat-template.t):
#  - the chat prompt is the style's rendering: its ids, computed here with
#    `nalar tokenize` (markup with control tokens parsed, the user's text
#    literally), give /v1/completions the same greedy answer and count as
#    usage.prompt_tokens of the chat request;
#  - the user's text holds the style's end-of-turn marker, which stays
#    text (the ids above tokenize it literally);
#  - the end-of-turn token, forced with logit_bias, ends the answer with
#    finish_reason "stop" and is not shown.
# Then `nginx -t` refuses a vocabulary with an unknown tokenizer.ggml.pre,
# listing the supported ones, and accepts each supported one.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_cli;
my $dir = $t->dir;
my $root = NalarTest::root();
my $cli = "$root/build/nalar";

my %jinja = (
    llama3 => q({{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>

' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}),
    chatml => q({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}),
    mistral => q({%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }}{%- for message in loop_messages %}{%- if message["role"] == "user" %}{%- if loop.last and system_message is defined %}{{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }}{%- else %}{{- "[INST]" + message["content"] + "[/INST]" }}{%- endif %}{%- elif message["role"] == "assistant" %}{{- message["content"] + eos_token}}{%- endif %}{%- endfor %}),
    'mistral-v7' => q({%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }}{%- if system_message is defined %}{{- "[SYSTEM_PROMPT]" + system_message + "[/SYSTEM_PROMPT]" }}{%- endif %}{%- for message in loop_messages %}{%- if message["role"] == "user" %}{{- "[INST]" + message["content"] + "[/INST]" }}{%- elif message["role"] == "assistant" %}{{- message["content"] + eos_token }}{%- endif %}{%- endfor %}),
    # Mistral 7B v0.2 (v1: SentencePiece, no control tokens but BOS/EOS)
    'mistral-v1' => q({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
),
    # Mistral 7B v0.3 (v3: SentencePiece, [INST] and [/INST] are control
    # tokens)
    'mistral-v3' => q({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
),
    # Mistral Large 2411 (v7, SentencePiece)
    'mistral-v7-spm' => q({{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}),
    gemma => q({{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "" -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if (message['role'] == 'assistant') -%}{%- set role = "model" -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}),
    phi3 => q({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}),
);

# style => [mkmodel vocabulary options, end-of-turn token]
my %style = (
    llama3 => [ '--bpe --pre llama-bpe --control-tokens '
                . "'<|start_header_id|>,<|end_header_id|>,<|eot_id|>'",
                '<|eot_id|>' ],
    chatml => [ '--bpe --pre qwen2 --chatml', '<|im_end|>' ],
    mistral => [ "--bpe --pre tekken --control-tokens '[INST],[/INST],</s>'",
                 '</s>' ],
    'mistral-v7' => [ '--bpe --pre tekken --control-tokens '
                      . "'[INST],[/INST],[SYSTEM_PROMPT],[/SYSTEM_PROMPT],</s>'",
                      '</s>' ],
    'mistral-v1' => [ '', '</s>' ],
    'mistral-v3' => [ "--control-tokens '[INST],[/INST]'", '</s>' ],
    'mistral-v7-spm' => [ '--control-tokens '
                          . "'[INST],[/INST],[SYSTEM_PROMPT],[/SYSTEM_PROMPT]'",
                          '</s>' ],
    gemma => [ "--control-tokens '<start_of_turn>,<end_of_turn>'",
               '<end_of_turn>' ],
    phi3 => [ "--control-tokens '<|system|>,<|user|>,<|assistant|>,<|end|>'",
              '<|end|>' ],
);

# The rendering of (system "Be brief.", user "hi MARK there") as pieces cut
# at control tokens: [text, 1] is tokenized with control tokens parsed,
# [text, 0] literally (the user's text, with what surrounds it up to the
# next control tokens).
sub pieces {
    my ($s, $m) = @_;
    my $u = "hi $m there";
    return {
        llama3 => [ [ "<|start_header_id|>system<|end_header_id|>", 1 ],
                    [ "\n\nBe brief.", 0 ],
                    [ "<|eot_id|><|start_header_id|>user<|end_header_id|>",
                      1 ],
                    [ "\n\n$u", 0 ],
                    [ "<|eot_id|><|start_header_id|>assistant"
                      . "<|end_header_id|>\n\n", 1 ] ],
        chatml => [ [ "<|im_start|>system\nBe brief.<|im_end|>\n"
                      . "<|im_start|>user", 1 ],
                    [ "\n$u", 0 ],
                    [ "<|im_end|>\n<|im_start|>assistant\n", 1 ] ],
        mistral => [ [ "[INST]", 1 ], [ "Be brief.\n\n$u", 0 ],
                     [ "[/INST]", 1 ] ],
        'mistral-v7' => [ [ "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]",
                            1 ],
                          [ $u, 0 ], [ "[/INST]", 1 ] ],
        # no control token but the user's </s>, which stays text
        'mistral-v1' => [ [ " [INST] Be brief.\n\n$u [/INST]", 0 ] ],
        'mistral-v3' => [ [ "[INST]", 1 ], [ " Be brief.\n\n$u", 0 ],
                          [ "[/INST]", 1 ] ],
        'mistral-v7-spm' => [ [ "[SYSTEM_PROMPT]", 1 ], [ " Be brief.", 0 ],
                              [ "[/SYSTEM_PROMPT][INST]", 1 ], [ " $u", 0 ],
                              [ "[/INST]", 1 ] ],
        gemma => [ [ "<start_of_turn>", 1 ],
                   [ "user\nBe brief.\n\n$u", 0 ],
                   [ "<end_of_turn>\n<start_of_turn>model\n", 1 ] ],
        phi3 => [ [ "<|system|>\nBe brief.<|end|>\n<|user|>", 1 ],
                  [ "\n$u", 0 ],
                  [ "<|end|>\n<|assistant|>\n", 1 ] ],
    }->{$s};
}

sub tokenize {
    my ($model, $text, @opt) = @_;
    open my $fh, '-|', $cli, 'tokenize', '-m', $model, @opt, $text
        or die "nalar tokenize: $!";
    local $/;
    my $out = <$fh>;
    close $fh;
    die "nalar tokenize failed" if $?;
    return [ map { 0 + $_ } split ' ', $out ];
}

my $shape = '--dim 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 '
          . '--vocab 1024 --ctx 256 --seed 7';

for my $s (sort keys %style) {
    my $jf = $t->write_file("$s.jinja", $jinja{$s});
    my $out = `$cli mkmodel $shape $style{$s}[0] --chat-template $jf \\
        -o $dir/$s.gguf 2>&1`;
    is($?, 0, "mkmodel: a $s model") or diag($out);
}

$t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_model llama3 %%PREFIX%%/llama3.gguf;
    nalar_model chatml %%PREFIX%%/chatml.gguf;
    nalar_model mistral %%PREFIX%%/mistral.gguf;
    nalar_model mistral-v7 %%PREFIX%%/mistral-v7.gguf;
    nalar_model mistral-v1 %%PREFIX%%/mistral-v1.gguf;
    nalar_model mistral-v3 %%PREFIX%%/mistral-v3.gguf;
    nalar_model mistral-v7-spm %%PREFIX%%/mistral-v7-spm.gguf;
    nalar_model gemma %%PREFIX%%/gemma.gguf;
    nalar_model phi3 %%PREFIX%%/phi3.gguf;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
@{[ map { "        location /$_/v1/ { nalar_chat_template $_; nalar_api; }\n" }
        sort keys %style ]}
    }
}
CONF

my $N = 12;

for my $s (sort keys %style) {
    my $model = "$dir/$s.gguf";
    my $mark = $style{$s}[1];
    my @msgs = ({ role => 'system', content => 'Be brief.' },
                { role => 'user', content => "hi $mark there" });

    # the prompt's ids: BOS where the vocabulary adds it, then the pieces
    my @ids;
    my $first = 1;
    for my $p (@{ pieces($s, $mark) }) {
        my @opt = $first ? () : ('--no-bos');
        push @opt, '--special' if $p->[1];
        push @ids, @{ tokenize($model, $p->[0], @opt) };
        $first = 0;
    }
    my $eot = tokenize($model, $mark, '--no-bos', '--special');
    is(scalar @$eot, 1, "$s: $mark is one token ($eot->[0])");
    my $lit = tokenize($model, $mark, '--no-bos');
    ok(@$lit > 1, "$s: $mark as text is " . scalar(@$lit) . " tokens");
    ok(!grep({ $_ == $eot->[0] } @$lit), "$s: none of them $mark");

    my $chat = $t->post_json("/$s/v1/chat/completions",
                             { model => $s, messages => \@msgs,
                               max_tokens => $N, temperature => 0,
                               ignore_eos => JSON::PP::true });
    my $cmpl = $t->post_json('/v1/completions',
                             { model => $s, prompt => \@ids,
                               max_tokens => $N, temperature => 0,
                               ignore_eos => JSON::PP::true });
    is($chat->{status}, 200, "$s: chat 200") or diag($chat->{body});
    is($cmpl->{status}, 200, "$s: completion of the ids 200")
        or diag($cmpl->{body});
    is($chat->{json}{usage}{prompt_tokens}, scalar @ids,
       "$s: prompt_tokens are the rendering's " . scalar(@ids));
    is($chat->{json}{choices}[0]{message}{content},
       $cmpl->{json}{choices}[0]{text},
       "$s: the chat answer is the completion of the rendering's ids");
    is($chat->{json}{usage}{completion_tokens}, $N, "$s: $N tokens");

    # the end-of-turn token stops and is not shown
    my $stop = $t->post_json("/$s/v1/chat/completions",
                             { model => $s, messages => \@msgs,
                               max_tokens => $N, temperature => 0,
                               logit_bias => { $eot->[0] => 100 } });
    is($stop->{status}, 200, "$s: forced $mark: 200") or diag($stop->{body});
    is($stop->{json}{choices}[0]{finish_reason}, 'stop',
       "$s: $mark ends the answer with finish_reason stop");
    is($stop->{json}{choices}[0]{message}{content}, '',
       "$s: and is not shown");
    is($stop->{json}{usage}{completion_tokens}, 1, "$s: after one token");
}

$t->stop;
$t->check_log;

# tokenizer.ggml.pre at nginx -t: each supported one passes, an unknown
# one is refused with the list

for my $pre (qw(llama-bpe qwen2 tekken smollm deepseek-llm deepseek-coder
                starcoder falcon gpt-2 nonesuch)) {
    my $out = `$cli mkmodel $shape --bpe --pre $pre -o $dir/pre.gguf 2>&1`;
    is($?, 0, "mkmodel --pre $pre") or diag($out);
    $t->write_conf(<<'CONF');
http {
    %%NALAR_HTTP%%
    nalar_model m %%PREFIX%%/pre.gguf;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF
    my ($rc, $msg) = $t->test_conf;
    if ($pre eq 'nonesuch') {
        isnt($rc, 0, 'nginx -t refuses tokenizer.ggml.pre nonesuch');
        like($msg, qr/tokenizer\.ggml\.pre 'nonesuch' is not supported/,
             'saying so') or diag($msg);
        like($msg, qr/supported: [^\n]*llama-bpe[^\n]*qwen2[^\n]*tekken
                      [^\n]*smollm[^\n]*deepseek-llm[^\n]*deepseek-coder
                      [^\n]*falcon/x, 'and listing the supported ones');
    } else {
        is($rc, 0, "nginx -t accepts tokenizer.ggml.pre $pre") or diag($msg);
    }
}

done_testing;

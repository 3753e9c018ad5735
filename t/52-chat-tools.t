#!/usr/bin/perl
# Tools on chat, through nginx, on one model per chat style that has a
# tool format (chatml, llama3, mistral, mistral-v3, mistral-v7,
# mistral-v7-spm), each with its markers and tool markers as control
# tokens (`nalar mkmodel --control-tokens`):
#  - a conversation with tools, an assistant's tool_calls and a tool's
#    answer renders as the style's format: the prompt's ids, computed here
#    with `nalar tokenize` from the expected text (split at the template's
#    control tokens; the client's text, which holds <tool_call>,
#    [TOOL_CALLS] and the like, tokenized literally), give /v1/completions
#    the same greedy answer and count as usage.prompt_tokens;
#  - a named tool_choice ends the prompt with the style's call opener;
#  - tool_choice "required" gives a call whose arguments python3-jsonschema
#    validates against the tool's parameters, in every style;
#  - tool_choice "auto" parses an answer that is a call (llama3, its JSON
#    held to the call's shape by response_format), streamed or not;
#  - tool_choice "auto" on an answer that is no call leaves it content,
#    streamed or not;
#  - bad tools, tool_choice and tool_calls get 400s naming what is wrong,
#    tools on a style without a tool format too, unless tool_choice is
#    "none".
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_cli->has_program('python3');
my $dir = $t->dir;
my $root = NalarTest::root();
my $cli = "$root/build/nalar";

my $tool_marks = '[AVAILABLE_TOOLS],[/AVAILABLE_TOOLS],[TOOL_CALLS],'
               . '[TOOL_RESULTS],[/TOOL_RESULTS]';

# style => [mkmodel vocabulary options, the control tokens a template
# writes]
my %style = (
    chatml => [ "--bpe --pre qwen2 --chatml --control-tokens "
                . "'<tool_call>,</tool_call>'",
                [ '<|im_start|>', '<|im_end|>', '<tool_call>',
                  '</tool_call>' ] ],
    llama3 => [ "--bpe --pre llama-bpe --control-tokens "
                . "'<|start_header_id|>,<|end_header_id|>,<|eot_id|>'",
                [ '<|start_header_id|>', '<|end_header_id|>',
                  '<|eot_id|>' ] ],
    mistral => [ "--bpe --pre tekken --control-tokens "
                 . "'[INST],[/INST],</s>,$tool_marks'",
                 [ '[INST]', '[/INST]', '</s>', split /,/, $tool_marks ] ],
    'mistral-v7' => [ "--bpe --pre tekken --control-tokens "
                      . "'[INST],[/INST],[SYSTEM_PROMPT],[/SYSTEM_PROMPT],"
                      . "</s>,$tool_marks'",
                      [ '[INST]', '[/INST]', '[SYSTEM_PROMPT]',
                        '[/SYSTEM_PROMPT]', '</s>', split /,/, $tool_marks ] ],
    'mistral-v3' => [ "--control-tokens '[INST],[/INST],$tool_marks'",
                      [ '[INST]', '[/INST]', '</s>', split /,/, $tool_marks ] ],
    'mistral-v7-spm' => [ "--control-tokens '[INST],[/INST],[SYSTEM_PROMPT],"
                          . "[/SYSTEM_PROMPT],$tool_marks'",
                          [ '[INST]', '[/INST]', '[SYSTEM_PROMPT]',
                            '[/SYSTEM_PROMPT]', '</s>',
                            split /,/, $tool_marks ] ],
);

my $shape = '--dim 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 '
          . '--vocab 1024 --ctx 2048 --seed 7';

for my $s (sort keys %style) {
    my $out = `$cli mkmodel $shape $style{$s}[0] -o $dir/$s.gguf 2>&1`;
    is($?, 0, "mkmodel: a $s model") or diag($out);
}
my $out = `$cli mkmodel $shape --control-tokens '<start_of_turn>,<end_of_turn>' -o $dir/gemma.gguf 2>&1`;
is($?, 0, 'mkmodel: a gemma model') or diag($out);

my $locations = join '', map {
    "        location /$_/ { nalar_chat_template $_; nalar_api; }\n"
} sort keys %style;

$t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
@{[ map { "    nalar_model $_ %%PREFIX%%/$_.gguf;\n" } sort keys %style ]}
    nalar_model gemma %%PREFIX%%/gemma.gguf;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
$locations
        location /gemma/ { nalar_chat_template gemma; nalar_api; }
        location /v1/ { nalar_api; }
    }
}
CONF

sub tokenize {
    my ($model, $text, @opt) = @_;
    open my $fh, '-|', $cli, 'tokenize', '-m', $model, @opt, $text
        or die "nalar tokenize: $!";
    local $/;
    my $o = <$fh>;
    close $fh;
    die "nalar tokenize failed" if $?;
    return [ map { 0 + $_ } split ' ', $o ];
}

# The ids of a rendering given as [text, markup] segments: markup is cut
# at the template's control tokens, which become those tokens; all other
# text (the client's, and markup between control tokens) is one literal
# text up to the next control token.
sub expected_ids {
    my ($model, $controls, @segs) = @_;
    my $re = join '|', map { quotemeta } sort { length $b <=> length $a }
                                            @$controls;
    my (@units, $lit);
    $lit = '';
    for my $seg (@segs) {
        my ($text, $markup) = @$seg;
        if (!$markup) {
            $lit .= $text;
            next;
        }
        for my $part (split /($re)/, $text) {
            next if $part eq '';
            if (grep { $_ eq $part } @$controls) {
                push @units, [ $lit, 0 ] if length $lit;
                $lit = '';
                push @units, [ $part, 1 ];
            } else {
                $lit .= $part;
            }
        }
    }
    push @units, [ $lit, 0 ] if length $lit;

    my @ids;
    my $first = 1;
    for my $u (@units) {
        my @opt = $first ? () : ('--no-bos');
        push @opt, '--special' if $u->[1];
        push @ids, @{ tokenize($model, $u->[0], @opt) };
        $first = 0;
    }
    return \@ids;
}

sub py_json {
    my ($data, $indent) = @_;
    my $in = NalarTest::json()->encode($data);
    open my $fh, '-|', 'python3', '-c',
        'import json,sys; print(json.dumps(json.loads(sys.argv[1]), '
        . 'ensure_ascii=False' . ($indent ? ', indent=4' : '') . '), '
        . 'end="")', $in or die "python3: $!";
    local $/;
    my $o = <$fh>;
    close $fh;
    return $o;
}

# the conversation: the client's text holds every style's markers

my $user = 'Weather in Paris? <tool_call> [TOOL_CALLS] [TOOL_RESULTS] '
         . '<|eot_id|> [INST]';
my $result = '22 C </tool_call> [/TOOL_RESULTS] <|im_end|>';
my $params = { type => 'object', properties => { city => {
                   type => 'string', maxLength => 8 } },
               required => [ 'city' ] };
my $tools = [ { type => 'function',
                function => { name => 'get_weather',
                              description => 'Weather <tool_call> '
                                             . '[TOOL_CALLS] of a city',
                              parameters => $params } } ];
my $id = 'abcDEF123';
my $args = '{"city":"Paris"}';
my @msgs = ({ role => 'system', content => 'Be brief.' },
            { role => 'user', content => $user },
            { role => 'assistant', content => undef,
              tool_calls => [ { id => $id, type => 'function',
                                function => { name => 'get_weather',
                                              arguments => $args } } ] },
            { role => 'tool', tool_call_id => $id, content => $result });

my $tool_json = py_json($tools->[0]);
my $tool_json4 = py_json($tools->[0], 1);
my $tools_json = py_json($tools);
my $args_json = py_json(NalarTest::json()->decode($args));

# What each style renders: [text, markup] segments, without the
# generation prompt (the answer's opener), which follows them.
my %render = (
    chatml => [
        [ "<|im_start|>system\n", 1 ], [ 'Be brief.', 0 ],
        [ "\n\n# Tools\n\nYou may call one or more of the functions below "
          . "to help with the user's request. Their signatures are within "
          . "<tools></tools> XML tags:\n<tools>\n", 1 ],
        [ $tool_json, 0 ],
        [ "\n</tools>\n\nTo call a function, answer with a JSON object of "
          . "its name and arguments within <tool_call></tool_call> XML tags, "
          . "one call each:\n<tool_call>\n{\"name\": <function-name>, "
          . "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
          . "<|im_start|>user\n", 1 ],
        [ $user, 0 ],
        [ "<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": ", 1 ],
        [ '"get_weather"', 0 ], [ ', "arguments": ', 1 ], [ $args_json, 0 ],
        [ "}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n",
          1 ],
        [ $result, 0 ],
        [ "\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 1 ] ],
    llama3 => [
        [ "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: "
          . "ipython\n\nYou can call the functions below. To call one, "
          . "answer with nothing but a JSON object of the form {\"name\": "
          . "function name, \"parameters\": object of argument names and "
          . "their values}. Write the values themselves, not variables."
          . "\n\n", 1 ],
        [ $tool_json4, 0 ], [ "\n\n", 1 ], [ 'Be brief.', 0 ],
        [ "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n", 1 ],
        [ $user, 0 ],
        [ "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
          . "{\"name\": ", 1 ],
        [ '"get_weather"', 0 ], [ ', "parameters": ', 1 ], [ $args_json, 0 ],
        [ "}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n", 1 ],
        [ $result, 0 ],
        [ "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
          1 ] ],
);

# Mistral: the tools before the last user turn, the calls with their id,
# the result with its call_id; SentencePiece templates put a space after
# each opening marker
for my $s (qw(mistral mistral-v3 mistral-v7 mistral-v7-spm)) {
    my $sp = $s =~ /v3|spm/ ? ' ' : '';
    my $v7 = $s =~ /v7/;
    $render{$s} = [
        ($v7 ? ([ "[SYSTEM_PROMPT]$sp", 1 ], [ 'Be brief.', 0 ],
                [ '[/SYSTEM_PROMPT]', 1 ]) : ()),
        [ "[AVAILABLE_TOOLS]$sp", 1 ], [ $tools_json, 0 ],
        [ "[/AVAILABLE_TOOLS][INST]$sp", 1 ],
        ($v7 ? () : ([ 'Be brief.', 0 ], [ "\n\n", 1 ])),
        [ $user, 0 ],
        [ "[/INST][TOOL_CALLS]$sp" . '[{"name": ', 1 ],
        [ '"get_weather"', 0 ], [ ', "arguments": ', 1 ], [ $args_json, 0 ],
        [ ', "id": ', 1 ], [ "\"$id\"", 0 ],
        [ "}]</s>[TOOL_RESULTS]$sp" . '{"content": ', 1 ],
        [ $result, 0 ], [ ', "call_id": ', 1 ], [ "\"$id\"", 0 ],
        [ '}[/TOOL_RESULTS]', 1 ] ];
}

my %opener = (chatml => "<tool_call>\n", llama3 => '',
              mistral => '[TOOL_CALLS][', 'mistral-v7' => '[TOOL_CALLS][',
              'mistral-v3' => '[TOOL_CALLS] [',
              'mistral-v7-spm' => '[TOOL_CALLS] [');

my $N = 8;
my @required;
my $r;

for my $s (sort keys %style) {
    my $model = "$dir/$s.gguf";
    my $ctl = $style{$s}[1];

    # the template's control tokens are one token each, and the client's
    # text with them is not
    my $lit_ok = 1;
    for my $c (@$ctl) {
        my $one = tokenize($model, $c, '--no-bos', '--special');
        my $lit = tokenize($model, $c, '--no-bos');
        $lit_ok &&= @$one == 1 && !grep { $_ == $one->[0] } @$lit;
    }
    ok($lit_ok, "$s: " . join(' ', @$ctl) . ' are control tokens, each '
       . 'a different text literally');

    my $ids = expected_ids($model, $ctl, @{ $render{$s} });

    my $chat = $t->post_json("/$s/v1/chat/completions",
                             { model => $s, messages => \@msgs,
                               tools => $tools, max_tokens => $N,
                               temperature => 0, tool_choice => 'auto',
                               ignore_eos => JSON::PP::true });
    my $cmpl = $t->post_json("/$s/v1/completions",
                             { model => $s, prompt => $ids,
                               max_tokens => $N, temperature => 0,
                               ignore_eos => JSON::PP::true });
    is($chat->{status}, 200, "$s: chat with tools 200")
        or diag($chat->{body});
    is($cmpl->{status}, 200, "$s: completion of the ids 200")
        or diag($cmpl->{body});
    is($chat->{json}{usage}{prompt_tokens}, scalar @$ids,
       "$s: prompt_tokens are the rendering's " . scalar(@$ids));

    # auto: the random model writes no call; its answer is content
    my $c0 = $chat->{json}{choices}[0];
    is($c0->{message}{content}, $cmpl->{json}{choices}[0]{text},
       "$s: the chat answer is the completion of the rendering's ids");
    ok(!exists $c0->{message}{tool_calls}, "$s: auto, no call: no tool_calls");
    is($c0->{finish_reason}, 'length', "$s: finish_reason length");

    # streamed, the same content, in content deltas
    my $st = $t->post_json("/$s/v1/chat/completions",
                           { model => $s, messages => \@msgs,
                             tools => $tools, max_tokens => $N,
                             temperature => 0, stream => JSON::PP::true,
                             ignore_eos => JSON::PP::true });
    my @ev = NalarTest::sse_events($st->{body} // '');
    my @ch = map { $_->{choices}[0] } grep { ref } @ev;
    is(join('', map { $_->{delta}{content} // '' } @ch), $c0->{message}{content},
       "$s: streamed, auto: the same content");
    ok(!grep({ exists $_->{delta}{tool_calls} } @ch)
       && ($ch[-1]{finish_reason} // '') eq 'length' && $ev[-1] eq '[DONE]',
       "$s: streamed, auto: no tool_calls, finish_reason length, [DONE]");

    # a named function: the prompt ends with the call's opener
    my $named = $t->post_json("/$s/v1/chat/completions",
                              { model => $s, messages => \@msgs,
                                tools => $tools, max_tokens => 1,
                                tool_choice => { type => 'function',
                                                 function => {
                                                     name => 'get_weather' } }
                              });
    my $open = expected_ids($model, $ctl, @{ $render{$s} },
                            [ $opener{$s}, 1 ]);
    is($named->{status}, 200, "$s: a named tool_choice 200")
        or diag($named->{body});
    is($named->{json}{usage}{prompt_tokens}, scalar @$open,
       "$s: the prompt ends with the opener (". length($opener{$s}) . " bytes, "
       . (@$open - @$ids) . ' tokens)');

    # required: one call, held by the grammar to the tool's parameters
    my $req = $t->post_json("/$s/v1/chat/completions",
                            { model => $s, messages => \@msgs,
                              tools => $tools, max_tokens => 300,
                              temperature => 1, seed => 5,
                              tool_choice => 'required' });
    my $rc = $req->{json}{choices}[0] // {};
    my $call = $rc->{message}{tool_calls}[0] // {};
    is($req->{status}, 200, "$s: tool_choice required 200")
        or diag($req->{body});
    ok($rc->{finish_reason} eq 'tool_calls'
       && !defined $rc->{message}{content}
       && ($call->{function}{name} // '') eq 'get_weather'
       && $call->{id} =~ ($s =~ /mistral/ ? qr/^[A-Za-z0-9]{9}$/
                                          : qr/^call_[A-Za-z0-9]{24}$/),
       "$s: required: a call to get_weather, id "
       . ($s =~ /mistral/ ? '9 letters and digits' : 'call_...')
       . ', finish_reason tool_calls') or diag($req->{body});
    push @required, [ $s, $call->{function}{arguments} // '' ];
}

my $vf = "$dir/required.jsonl";
open my $vfh, '>', $vf or die "$vf: $!";
print $vfh NalarTest::json()->encode({ schema => $_->[0],
                                       schema_json => $params,
                                       output => $_->[1] }), "\n"
    for @required;
close $vfh;
my $report = `python3 $root/t/lib/validate_json.py $root/t/data/grammar/schemas.json $vf 2>&1`;
like($report, qr/^checked 6 invalid 0$/m, 'required, every style: '
     . 'python3-jsonschema validates the arguments against the parameters')
    or diag($report);

# auto, on an answer that is a call: llama3's call is the answer's JSON
# object, here held to the call's shape by response_format

my $call_schema = { type => 'object',
                    properties => { name => { const => 'get_weather' },
                                    parameters => $params },
                    required => [ 'name', 'parameters' ],
                    additionalProperties => JSON::PP::false };
my %auto = (model => 'llama3', messages => \@msgs, tools => $tools,
            max_tokens => 300, temperature => 1, seed => 9,
            response_format => { type => 'json_schema',
                                 json_schema => { name => 'call',
                                                  schema => $call_schema } });
$r = $t->post_json('/llama3/v1/chat/completions', \%auto);
my $ac = $r->{json}{choices}[0] // {};
ok($r->{status} == 200 && $ac->{finish_reason} eq 'tool_calls'
   && !defined $ac->{message}{content}
   && $ac->{message}{tool_calls}[0]{function}{name} eq 'get_weather',
   'llama3, auto: an answer that is a call is parsed into tool_calls')
    or diag($r->{body});
my $aargs = $ac->{message}{tool_calls}[0]{function}{arguments} // '';
my $adec = eval { NalarTest::json()->decode($aargs) };
ok(ref $adec eq 'HASH' && defined $adec->{city} && !ref $adec->{city},
   "llama3, auto: its arguments are the JSON object written ($aargs)");

$r = $t->post_json('/llama3/v1/chat/completions',
                   { %auto, stream => JSON::PP::true });
my @aev = grep { ref } NalarTest::sse_events($r->{body} // '');
my @acalls = map { @{ $_->{choices}[0]{delta}{tool_calls} // [] } } @aev;
ok(@acalls >= 2 && $acalls[0]{function}{name} eq 'get_weather'
   && join('', map { $_->{function}{arguments} } @acalls) eq $aargs
   && $aev[-1]{choices}[0]{finish_reason} eq 'tool_calls',
   'llama3, auto, streamed: the same call, its arguments in fragments')
    or diag($r->{body});

# 400s

my @bad = (
    [ 'tools not an array', { tools => { type => 'function' } },
      'tools', qr/tools must be an array/ ],
    [ 'a tool of another type', { tools => [ { type => 'retrieval' } ] },
      'tools', qr/tools\[0\] must be \{"type": "function"/ ],
    [ 'a name with a space',
      { tools => [ { type => 'function',
                     function => { name => 'get weather' } } ] },
      'tools', qr/tools\[0\]\.function\.name must be 1 to 64 letters/ ],
    [ 'a name of 65 characters',
      { tools => [ { type => 'function',
                     function => { name => 'x' x 65 } } ] },
      'tools', qr/tools\[0\]\.function\.name must be/ ],
    [ 'two tools of one name',
      { tools => [ $tools->[0], $tools->[0] ] },
      'tools', qr/tools\[1\]\.function\.name: the function `get_weather` is already in tools/ ],
    [ 'parameters not an object',
      { tools => [ { type => 'function',
                     function => { name => 'f', parameters => 'x' } } ] },
      'tools', qr/tools\[0\]\.function\.parameters must be a JSON Schema/ ],
    [ 'parameters with a keyword the grammar does not take',
      { tools => [ { type => 'function',
                     function => { name => 'f', parameters => {
                         type => 'object',
                         patternProperties => { '^x' => {} } } } } ] },
      'tools', qr/tools\[0\]\.function\.parameters: .*patternProperties/ ],
    [ 'a description that is no string',
      { tools => [ { type => 'function',
                     function => { name => 'f', description => 7 } } ] },
      'tools', qr/description must be a string/ ],
    [ 'tool_choice of an unknown function',
      { tools => $tools,
        tool_choice => { type => 'function',
                         function => { name => 'get_time' } } },
      'tool_choice', qr/tool_choice names the function `get_time`, which is not in tools/ ],
    [ 'tool_choice "required" without tools',
      { tool_choice => 'required' }, 'tool_choice',
      qr/tool_choice is only allowed when tools are given/ ],
    [ 'tool_choice "sometimes"',
      { tools => $tools, tool_choice => 'sometimes' }, 'tool_choice',
      qr/tool_choice must be "none", "auto", "required"/ ],
    [ 'parallel_tool_calls "yes"',
      { tools => $tools, parallel_tool_calls => 'yes' },
      'parallel_tool_calls', qr/must be a boolean/ ],
    [ 'tool_calls without arguments',
      { messages => [ { role => 'user', content => 'hi' },
                      { role => 'assistant',
                        tool_calls => [ { id => 'a', type => 'function',
                                          function => { name => 'f' } } ] },
                      { role => 'user', content => 'hi' } ] },
      'messages', qr/messages\[1\]\.tool_calls\[0\] must be/ ],
    [ 'tool_calls in a user message',
      { messages => [ { role => 'user', content => 'hi',
                        tool_calls => [] } ] },
      'messages', qr/messages\[0\]\.tool_calls must be an array, in an assistant/ ],
    [ 'a tool_call_id that is no string',
      { messages => [ { role => 'tool', content => '1',
                        tool_call_id => 5 } ] },
      'messages', qr/messages\[0\]\.tool_call_id must be a string/ ],
);

for my $b (@bad) {
    my ($what, $body, $param, $re) = @$b;
    my %req = (model => 'chatml', max_tokens => 1,
               messages => [ { role => 'user', content => 'hi' } ], %$body);
    my $r = $t->post_json('/chatml/v1/chat/completions', \%req);
    is($r->{status}, 400, "$what: 400") or diag($r->{body});
    is($r->{json}{error}{param}, $param, "$what: param $param");
    is($r->{json}{error}{type}, 'invalid_request_error',
       "$what: invalid_request_error");
    like($r->{json}{error}{message} // '', $re, "$what: says so")
        or diag($r->{body});
}

$r = $t->post_json('/mistral/v1/chat/completions',
                      { model => 'mistral', max_tokens => 1,
                        messages => [ { role => 'user', content => 'hi' },
                                      { role => 'tool', content => '1' } ] });
is($r->{status}, 400, 'mistral: a tool message without tool_call_id: 400');
like($r->{json}{error}{message} // '',
     qr/messages\[1\]: the mistral chat template needs the tool_call_id/,
     'saying so');

$r = $t->post_json('/llama3/v1/chat/completions',
                   { model => 'llama3', max_tokens => 1,
                     messages => [ $msgs[1],
                                   { role => 'assistant', tool_calls => [
                                       $msgs[2]{tool_calls}[0],
                                       $msgs[2]{tool_calls}[0] ] } ] });
is($r->{status}, 400, 'llama3: two calls in one assistant message: 400');
like($r->{json}{error}{message} // '',
     qr/messages\[1\]: the llama3 chat template takes one tool call per/,
     'saying so');

$r = $t->post_json('/gemma/v1/chat/completions',
                   { model => 'gemma', max_tokens => 1, tools => $tools,
                     messages => [ { role => 'user', content => 'hi' } ] });
is($r->{status}, 400, 'gemma: tools: 400');
is($r->{json}{error}{param}, 'tools', 'param tools');
like($r->{json}{error}{message} // '',
     qr/the gemma chat template has no tool format/, 'saying so');

$r = $t->post_json('/gemma/v1/chat/completions',
                   { model => 'gemma', max_tokens => 1, tools => $tools,
                     tool_choice => 'none',
                     messages => [ { role => 'user', content => 'hi' } ] });
is($r->{status}, 200, 'gemma: tools with tool_choice "none": 200')
    or diag($r->{body});

$r = $t->post_json('/gemma/v1/chat/completions',
                   { model => 'gemma', max_tokens => 1,
                     messages => [ $msgs[1], $msgs[2] ] });
is($r->{status}, 400, 'gemma: tool_calls in the messages: 400');
like($r->{json}{error}{message} // '',
     qr/messages\[1\]: the gemma chat template has no tool format for tool_calls/,
     'saying so');

$t->stop;
$t->check_log;

done_testing;

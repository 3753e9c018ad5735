#!/usr/bin/perl
# Tool calls the model must make, on a model of random weights (ChatML,
# byte-level BPE; the grammar does all the work):
#  - tool_choice "required" over two tools and a named function give one
#    call each time, sampled with 20 seeds: the name is one of the tools
#    (the named one), the arguments are a JSON string that python3-jsonschema
#    validates against that tool's parameters, content is null and
#    finish_reason "tool_calls";
#  - streamed, a call is a first delta.tool_calls chunk with index, id, type
#    and name, then argument fragments, then finish_reason "tool_calls";
#    the fragments join to the arguments of the same seed not streamed;
#  - the official `openai` npm client makes the round trip: the call, the
#    tool's answer as a `role: "tool"` message, the final message; streamed
#    and not.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_cli->has_program('python3');
my $root = NalarTest::root();
my $dir = $t->dir;

my $out = `$root/build/nalar mkmodel --dim 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 --vocab 1024 --ctx 2048 --seed 3 --bpe --pre qwen2 --chatml -o $dir/m.gguf 2>&1`;
is($?, 0, 'mkmodel: a ChatML model') or diag($out);

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%PREFIX%%/m.gguf;
    nalar_threads 2;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $weather = { type => 'object',
                properties => { city => { type => 'string', maxLength => 12 },
                                unit => { type => 'string',
                                          enum => [ 'celsius',
                                                    'fahrenheit' ] } },
                required => [ 'city', 'unit' ],
                additionalProperties => JSON::PP::false };
my $time = { type => 'object',
             properties => { zone => { type => 'integer' },
                             where => { '$ref' => '#/$defs/place' } },
             required => [ 'zone', 'where' ],
             additionalProperties => JSON::PP::false,
             '$defs' => { place => { type => 'object',
                                     properties => { lat => {
                                         type => 'number' } },
                                     required => [ 'lat' ],
                                     additionalProperties =>
                                         JSON::PP::false } } };
my %params = (get_weather => $weather, get_time => $time);
my $tools = [ map { { type => 'function',
                      function => { name => $_, parameters => $params{$_} } } }
              sort keys %params ];
my $question = [ { role => 'user', content => 'And it came to pass' } ];

# Validates [name, arguments text] pairs with python3-jsonschema; returns
# the lines of its report.
sub validate {
    my @pairs = @_;
    my $file = $t->dir . '/outputs.jsonl';
    open my $fh, '>', $file or die "$file: $!";
    for my $p (@pairs) {
        print $fh NalarTest::json()->encode(
            { schema => $p->[0], schema_json => $params{$p->[0]} // {},
              output => $p->[1] }), "\n";
    }
    close $fh;
    my $out = `python3 $root/t/lib/validate_json.py $root/t/data/grammar/schemas.json $file 2>&1`;
    return $out;
}

my (@pairs, %by_seed, $names_ok, $shape_ok);
$names_ok = $shape_ok = 0;

for my $seed (1 .. 20) {
    my $named = $seed % 4 == 0;
    my $r = $t->post_json('/v1/chat/completions',
                          { model => 'kjv', messages => $question,
                            tools => $tools, temperature => 1, seed => $seed,
                            max_tokens => 400,
                            tool_choice => $named
                                ? { type => 'function',
                                    function => { name => 'get_time' } }
                                : 'required' });
    my $c = $r->{json}{choices}[0] // {};
    my $call = $c->{message}{tool_calls}[0] // {};
    my $name = $call->{function}{name} // '';

    $shape_ok++ if $r->{status} == 200
                   && $c->{finish_reason} eq 'tool_calls'
                   && exists $c->{message}{content}
                   && !defined $c->{message}{content}
                   && @{ $c->{message}{tool_calls} } == 1
                   && ($call->{id} // '') =~ /^call_[A-Za-z0-9]{24}$/
                   && ($call->{type} // '') eq 'function';
    diag($r->{body}) unless $r->{status} == 200;
    $names_ok++ if $named ? $name eq 'get_time' : exists $params{$name};
    push @pairs, [ $name, $call->{function}{arguments} // '' ];
    $by_seed{$seed} = $call;
}

is($shape_ok, 20, '20 answers: one call each, content null, finish_reason '
   . 'tool_calls, call_ ids, type function');
is($names_ok, 20, 'the name is a tool\'s, the named one where named');
my $report = validate(@pairs);
like($report, qr/^checked 20 invalid 0$/m,
     'python3-jsonschema: every call\'s arguments match its parameters')
    or diag($report);
my %seen_names = map { $_->[0] => 1 } @pairs;
ok($seen_names{get_weather} && $seen_names{get_time},
   'both tools were called (' . join(', ', sort keys %seen_names) . ')');

# streamed: the same calls, in OpenAI's chunks

my $stream_ok = 0;
for my $seed (1 .. 4) {
    my $named = $seed % 4 == 0;
    my $r = $t->post_json('/v1/chat/completions',
                          { model => 'kjv', messages => $question,
                            tools => $tools, temperature => 1, seed => $seed,
                            max_tokens => 400, stream => JSON::PP::true,
                            tool_choice => $named
                                ? { type => 'function',
                                    function => { name => 'get_time' } }
                                : 'required' });
    my @ev = NalarTest::sse_events($r->{body});
    my @chunks = map { $_->{choices}[0] } grep { ref } @ev;
    my @calls = grep { $_->{delta}{tool_calls} } @chunks;
    my $head = $calls[0]{delta}{tool_calls}[0] // {};
    my @frags = map { $_->{delta}{tool_calls}[0] } @calls[1 .. $#calls];
    my $args = join '', map { $_->{function}{arguments} } @frags;
    my $want = $by_seed{$seed};

    my $ok = $ev[-1] eq '[DONE]'
        && $chunks[0]{delta}{role} eq 'assistant'
        && $head->{index} == 0 && $head->{type} eq 'function'
        && $head->{id} =~ /^call_[A-Za-z0-9]{24}$/
        && $head->{function}{name} eq $want->{function}{name}
        && $head->{function}{arguments} eq ''
        && @frags >= 1
        && !grep({ $_->{index} != 0 || exists $_->{id}
                   || exists $_->{function}{name} } @frags)
        && $args eq $want->{function}{arguments}
        && $chunks[-1]{finish_reason} eq 'tool_calls'
        && !grep({ defined $_->{delta}{content}
                   && $_->{delta}{content} ne '' } @chunks);
    $stream_ok++ if $ok;
    diag($r->{body}) unless $ok;
}
is($stream_ok, 4, 'streamed: role, then the call\'s id, type and name, '
   . 'then its arguments in fragments that join to the answer not '
   . 'streamed, then finish_reason tool_calls');

# the official client, round trip

SKIP: {
    skip 'node or t/node_modules/openai missing', 12
        unless grep({ -x "$_/node" } split /:/, $ENV{PATH})
               && -d "$root/t/node_modules/openai";

    my $base = 'http://127.0.0.1:' . $t->port . '/v1';
    my $json = `node $root/t/js/openai-tools.mjs $base kjv 7 2>&1`;
    is($?, 0, 'the node client ran') or diag($json);
    my $o = eval { NalarTest::json()->decode($json) } || {};

    my $call = $o->{call}{tool_calls}[0] // {};
    is($o->{call}{finish_reason}, 'tool_calls', 'client: finish_reason '
       . 'tool_calls');
    ok(!defined $o->{call}{content}, 'client: content null');
    like($call->{id} // '', qr/^call_/, 'client: the call\'s id');
    $report = validate([ $call->{function}{name} // '',
                         $call->{function}{arguments} // '' ]);
    like($report, qr/^checked 1 invalid 0$/m, 'client: valid arguments')
        or diag($report);
    ok(defined $o->{final}{content} && !defined $o->{final}{tool_calls},
       'client: after the tool\'s answer, a message of content');
    like($o->{final}{finish_reason} // '', qr/^(stop|length)$/,
         'client: its finish_reason');

    my $sc = $o->{stream}{tool_calls}[0] // {};
    is($o->{stream}{finish_reason}, 'tool_calls',
       'client, streamed: finish_reason tool_calls');
    is_deeply([ $sc->{function}{name}, $sc->{function}{arguments} ],
              [ $call->{function}{name}, $call->{function}{arguments} ],
              'client, streamed: the same call assembled from the deltas');
    ok(defined $o->{stream_final}{content}
       && ($o->{stream_final}{finish_reason} // '') =~ /^(stop|length)$/,
       'client, streamed: the final message after the tool\'s answer');
    is($o->{error_status}, 400, 'client: an unknown tool_choice name: 400');
    is($o->{error_param}, 'tool_choice', 'client: param tool_choice');
}

$t->stop;
$t->check_log;

done_testing;

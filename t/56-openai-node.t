#!/usr/bin/perl
# The official `openai` npm client (Node.js) streams and non-streams
# completions and chat completions against the server and gets the same
# text as `nalar generate`.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli->has_program('node');
NalarTest::missing('t/node_modules/openai missing (cd t && npm install)',
                   optional => 1)
    unless -d NalarTest::root() . '/t/node_modules/openai';

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $N = 32;
my $prompt = 'And it came to pass';
my $want = $t->reference_text($prompt, $N, ignore_eos => 1);
my $chatml = "<|im_start|>user\n$prompt<|im_end|>\n<|im_start|>assistant\n";
my $want_chat = $t->reference_text($chatml, $N, ignore_eos => 1,
                                   stop => ['<|im_end|>']);

my $root = NalarTest::root();
my $base = 'http://127.0.0.1:' . $t->port . '/v1';
my $json = `node $root/t/js/openai.mjs $base '$prompt' $N 2>&1`;
is($?, 0, 'the node client ran') or diag($json);
my $o = eval { NalarTest::json()->decode($json) } || {};

is($o->{completion}, $want, 'completions.create equals nalar generate');
is($o->{completion_object}, 'text_completion', 'object text_completion');
is($o->{completion_finish}, 'length', 'finish_reason length');
is($o->{usage}{completion_tokens}, $N, 'usage.completion_tokens');
is($o->{completion_stream}, $want, 'streamed completion equals it too');
ok($o->{completion_chunks} > 1, "streamed in $o->{completion_chunks} chunks");
is($o->{stream_usage}{completion_tokens}, $N, 'stream usage chunk');
is($o->{chat}, $want_chat, 'chat.completions.create equals nalar generate');
is($o->{chat_object}, 'chat.completion', 'object chat.completion');
is($o->{chat_stream}, $want_chat, 'streamed chat equals it too');
is_deeply($o->{models}, ['kjv'], 'models.list');
is($o->{model}{id}, 'kjv', 'models.retrieve: the id');
is($o->{model}{object}, 'model', 'models.retrieve: object model');
is($o->{model}{owned_by}, 'nalar', 'models.retrieve: owned_by');
ok(($o->{model}{created} // 0) > 0, 'models.retrieve: created');
is($o->{retrieve_error_status}, 404, 'models.retrieve of an unknown id: 404');
is($o->{retrieve_error_code}, 'model_not_found', 'and the error code');
is($o->{retrieve_error_type}, 'invalid_request_error', 'and the type');
is($o->{error_status}, 404, 'unknown model: the client sees 404');
is($o->{error_code}, 'model_not_found', 'and the error code');
is($o->{error_param}, 'model', 'and the param');

$t->check_log;
done_testing;

#!/usr/bin/perl
# The official `openai` npm client with response_format: zodResponseFormat
# through beta.chat.completions.parse (a parsed object), a json_schema
# streamed, and the 400 an unsupported keyword gets (t/js/
# openai-response-format.mjs).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_program('node');
NalarTest::missing('t/node_modules/openai or zod missing (cd t && npm install)',
                   optional => 1)
    unless -d NalarTest::root() . '/t/node_modules/openai'
           && -d NalarTest::root() . '/t/node_modules/zod';

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

my $root = NalarTest::root();
my $base = 'http://127.0.0.1:' . $t->port . '/v1';
my $json = `node $root/t/js/openai-response-format.mjs $base 2>&1`;
is($?, 0, 'the node client ran') or diag($json);
my $o = eval { NalarTest::json()->decode($json) } || {};

my $p = $o->{parsed};
ok(ref $p eq 'HASH', 'zodResponseFormat: message.parsed is an object')
    or diag($json);
like($p->{color} // '', qr/^(red|green|blue)$/, 'parsed.color from the enum');
like($p->{count} // '', qr/^-?\d+$/, 'parsed.count an integer');
ok(JSON::PP::is_bool($p->{ok}), 'parsed.ok a boolean');
ok(ref $p->{tags} eq 'ARRAY' && @{ $p->{tags} } <= 2, 'parsed.tags');
is($o->{finish}, 'stop', 'finish_reason stop');

my $v = eval { NalarTest::json()->decode($o->{stream_text} // '') };
ok(ref $v eq 'HASH' && ($v->{answer} // '') =~ /^(yes|no)$/
   && ($v->{score} // '') =~ /^-?\d+$/, 'streamed json_schema: valid')
    or diag($o->{stream_text});
ok(($o->{stream_chunks} // 0) > 2, "streamed in $o->{stream_chunks} chunks");
is($o->{stream_finish}, 'stop', 'streamed finish_reason stop');

is($o->{error_status}, 400, 'unsupported keyword: 400');
is($o->{error_param}, 'response_format', 'error.param response_format');
is($o->{error_type}, 'invalid_request_error', 'error.type');
like($o->{error_message} // '', qr/'pattern'/, 'the message names it');

$t->check_log;
done_testing();

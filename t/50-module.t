#!/usr/bin/perl
# The module loads into Debian's nginx; nginx -t validates model files and
# the KV cache size, and warns of draft speculation without a draft;
# /v1/health, /v1/models, /v1/models/{id}, endpoint routing by URI suffix,
# the variables.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model;

# nginx -t: a model that cannot serve fails the configuration with a reason

$t->write_file('bad.gguf', "GGUF\x03\x00\x00\x00garbage");
$t->write_conf(<<'CONF');
http {
    nalar_model broken %%PREFIX%%/bad.gguf;
}
CONF
my ($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t fails on a corrupt model');
like($out, qr/nalar_model "broken": .*bad\.gguf/,
     'and names the model and file') or diag($out);

$t->write_conf(<<'CONF');
http {
    nalar_model missing %%PREFIX%%/nonexistent.gguf;
}
CONF
($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t fails on a missing model');
like($out, qr/nonexistent\.gguf/, 'and names the missing file');

# an architecture the engine does not compute: refused with the list; one
# it does (gemma2) passes
{
    open(my $fh, '<:raw', 't/data/conformance/qwen2-F16.gguf') or die $!;
    my $data = do { local $/; <$fh> };
    close $fh;
    $data =~ s/(general\.architecture\x08\x00\x00\x00\x05\x00{7})qwen2/${1}mamba/
        or die 'no architecture key';
    $t->write_file('mamba.gguf', $data);
}
$t->write_conf(<<'CONF');
http {
    nalar_model snake %%PREFIX%%/mamba.gguf;
}
CONF
($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t fails on an unsupported architecture');
like($out, qr/unsupported architecture 'mamba' \(supported: llama .*qwen2, qwen3, gemma2, phi3\)/,
     'and names the supported ones') or diag($out);
$t->write_conf(<<'CONF');
http {
    nalar_model gemma %%ROOT%%/t/data/conformance/gemma2-F16.gguf;
}
CONF
($rc, $out) = $t->test_conf;
is($rc, 0, 'nginx -t accepts a gemma2 model') or diag($out);

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%%;
    nalar_model kjv %%MODEL%%;
}
CONF
($rc, $out) = $t->test_conf;
like($out, qr/is duplicate/, 'a model name used twice is refused');

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%%;
    server { location / { nalar_chat_template jinja; } }
}
CONF
($rc, $out) = $t->test_conf;
like($out, qr/invalid chat template "jinja"/, 'unknown chat template refused');

# a KV cache smaller than one block of a model is refused; speculation by
# a draft for a model without one is a warning naming the model

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%%;
    nalar_kv_cache 16k;
}
CONF
($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t fails on a KV cache smaller than one block');
like($out, qr/"nalar_kv_cache" of 16384 bytes is smaller than one KV block of model "kjv" \(49152 bytes\)/,
     'and says which model and how big a block is') or diag($out);

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%%;
    nalar_kv_cache 48k;
}
CONF
($rc, $out) = $t->test_conf;
is($rc, 0, 'one block is enough for nginx -t') or diag($out);

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%%;
    nalar_model fast %%MODEL%% draft=%%DRAFT%%;
    server { location / { nalar_speculative draft; nalar_api; } }
}
CONF
($rc, $out) = $t->test_conf;
is($rc, 0, 'nalar_speculative draft without a draft= model: nginx -t passes')
    or diag($out);
like($out, qr/\[warn\].*"nalar_speculative draft": model "kjv" has no "draft=" model/,
     'with a warning naming the model') or diag($out);
unlike($out, qr/model "fast" has no/, 'none for the model with a draft');

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%%;
    nalar_speculative auto;
}
CONF
($rc, $out) = $t->test_conf;
unlike($out, qr/nalar_speculative/, 'no warning for auto') or diag($out);

# a working configuration

$t->write_conf(<<'CONF');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;
    nalar_kv_cache 16m;
    nalar_max_batch_tokens 128;
    nalar_max_queue 64;

    log_format nalar '$status $nalar_model $nalar_prompt_tokens '
                     '$nalar_cached_tokens $nalar_completion_tokens '
                     '$nalar_ttft_ms $nalar_queue_ms';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/nalar.log nalar;

        location /v1/ { nalar_api; }
        location /fast/v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF
($rc, $out) = $t->test_conf;
is($rc, 0, 'nginx -t accepts the demo model') or diag($out);

$t->run;

my $r = $t->get('/v1/health');
is($r->{status}, 200, 'health 200 once loaded');
my $j = $t->json->decode($r->{body});
is($j->{status}, 'ok', 'health status ok');
is($j->{models}[0]{id}, 'kjv', 'health lists the model');
like($r->{headers}{'content-type'}, qr{^application/json}, 'health is JSON');

$r = $t->get('/v1/models');
is($r->{status}, 200, 'models 200');
$j = $t->json->decode($r->{body});
is($j->{object}, 'list', 'models: object list');
is($j->{data}[0]{id}, 'kjv', 'models: id');
is($j->{data}[0]{object}, 'model', 'models: object model');
ok($j->{data}[0]{created} > 0, 'models: created');

$r = $t->get('/fast/v1/models');
is($r->{status}, 200, 'endpoint chosen by the URI suffix in another location');

# one model: /models/{id}

for my $path ('/v1/models/kjv', '/v1/models/kjv/', '/fast/v1/models/kjv') {
    $r = $t->get($path);
    is($r->{status}, 200, "GET $path: 200");
    $j = eval { $t->json->decode($r->{body}) } || {};
    is_deeply([ @$j{qw(id object owned_by)} ], [ 'kjv', 'model', 'nalar' ],
              "GET $path: the model object");
    ok(($j->{created} // 0) > 0, "GET $path: created");
}
for my $path ('/v1/models/nope', '/v1/models/kjv/x', '/v1/models/KJV') {
    $r = $t->get($path);
    is($r->{status}, 404, "GET $path: 404");
    $j = eval { $t->json->decode($r->{body}) } || {};
    is($j->{error}{code}, 'model_not_found', "GET $path: model_not_found");
    is($j->{error}{type}, 'invalid_request_error',
       "GET $path: invalid_request_error");
    is($j->{error}{param}, 'model', "GET $path: param model");
}
$r = $t->request('HEAD', '/v1/models/kjv');
is($r->{status}, 200, 'HEAD /v1/models/kjv');
$r = $t->post_json('/v1/models/kjv', {});
is($r->{status}, 405, 'POST /v1/models/kjv: 405');
is($r->{headers}{allow}, 'GET, HEAD, OPTIONS', 'with Allow');

$r = $t->request('HEAD', '/v1/models');
is($r->{status}, 200, 'HEAD models');
is($r->{body}, '', 'HEAD has no body');

$r = $t->post_json('/fast/v1/completions',
                   { model => 'kjv', prompt => 'A wise man', max_tokens => 4,
                     temperature => 0 });
is($r->{status}, 200, 'completion under /fast/v1/');
is($r->{json}{usage}{completion_tokens}, 4, 'four tokens');

# the access log is written after the response: wait for the line
my ($log, $line) = ('', undef);
for (1 .. 600 * $NalarTest::SLOW) {
    $log = $t->read_file('nalar.log');
    ($line) = grep { /^200 kjv/ } split /\n/, $log;
    last if defined $line;
    select(undef, undef, undef, 0.05);
}
like($line // '', qr/^200 kjv 4 \d+ 4 [\d.]+ [\d.]+$/,
     'variables: model, prompt, cached, completion tokens, ttft, queue')
    or diag($log);
like($log, qr/^200 - - - - - -$/m, 'variables are empty for other requests');

$r = $t->get('/metrics');
is($r->{status}, 200, 'metrics 200');
like($r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4},
     'metrics content type');
like($r->{body}, qr/^nalar_generation_tokens_total\{model="kjv"\} 4$/m,
     'generation tokens counted');

$t->check_log;
done_testing;

#!/usr/bin/perl
# LoRA adapters through nginx.  A verified JWT's claim, mapped, chooses the
# adapter (nalar_adapter): the answer names it, $nalar_adapter logs it,
# its counters count it, and its greedy output is not the base's.  A
# client cannot get another adapter by naming it: where the server chose,
# any other `model` is an unknown model; elsewhere only the adapters
# nalar_lora_allow lists may be named (none by default), and an unknown
# and a forbidden adapter get the same bytes but for the name.
# /v1/models lists exactly what the location may serve.  The prefix cache
# keys on the adapter.  A value of nalar_adapter that names no adapter is
# the operator's mistake: 500 and an error-log line naming it.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model->has_cli;
my $dir = $t->dir;
my $cli = $t->root . '/build/nalar';

# adapters of the demo model, made by the CLI: random, B not zero
for my $a (['psalms', 1], ['proverbs', 2], ['secret', 3]) {
    my $out = `$cli mkmodel --lora-of $NalarTest::MODEL --rank 8 --seed $a->[1] -o $dir/$a->[0].gguf 2>&1`;
    $? == 0 or BAIL_OUT("nalar mkmodel --lora-of failed: $out");
}

my $secret = 'lora-nginx-test-secret-0123456789abcdef';
$t->write_file('jwt.secret', "$secret\n");

$t->write_conf(<<'CONF')->run(health => '/open/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_lora psalms psalms.gguf;
    nalar_lora proverbs %%PREFIX%%/proverbs.gguf base=kjv;
    nalar_lora secret secret.gguf scale=0.5;

    map $nalar_tenant $tenant_adapter {
        default  "";
        acme     psalms;
        globex   proverbs;
        broken   nonexistent;
    }

    log_format lora '$nalar_tenant|$nalar_adapter|$nalar_model|$status';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/lora.log lora;

        location = /metrics { nalar_metrics; }

        location /v1/ {
            nalar_jwt_key %%PREFIX%%/jwt.secret;
            nalar_adapter $tenant_adapter;
            nalar_api;
        }

        location /open/v1/ {
            nalar_lora_allow psalms proverbs;
            nalar_api;
        }

        location /base/v1/ { nalar_api; }

        location /all/v1/ {
            nalar_lora_allow all;
            nalar_api;

            location /all/v1/none/ { nalar_lora_allow none; nalar_api; }
        }
    }
}
CONF

sub bearer {
    my ($sub) = @_;
    return { Authorization => 'Bearer '
             . NalarJWT::hs256($secret, { sub => $sub, exp => time + 600 }) };
}

my $prompt = 'And it came to pass';
sub complete {
    my ($path, $model, %o) = @_;
    my $body = { prompt => $prompt, max_tokens => 12, temperature => 0,
                 ignore_eos => JSON::PP::true };
    $body->{model} = $model if defined $model;
    return $t->post_json($path, $body, %o);
}

sub text { $_[0]{json} ? $_[0]{json}{choices}[0]{text} : undef }

# the adapter a tenant's claim chose

my $m0 = $t->metrics;
my $base = complete('/base/v1/completions', undef);
is($base->{status}, 200, 'the base model serves a location without adapters');
is($base->{json}{model}, 'kjv', '... and its answer names the base');

my $acme = complete('/v1/completions', undef, headers => bearer('acme'));
is($acme->{status}, 200, 'a token whose claim maps to an adapter: 200');
is($acme->{json}{model}, 'psalms', '... the answer names the adapter');
isnt(text($acme), text($base),
     '... and its greedy output is not the base model\'s');

my $again = complete('/v1/completions', 'psalms', headers => bearer('acme'));
is(text($again), text($acme), 'naming the chosen adapter: the same answer');
my $as_base = complete('/v1/completions', 'kjv', headers => bearer('acme'));
is($as_base->{json}{model}, 'psalms',
   'naming the base model: still the chosen adapter');
is(text($as_base), text($acme), '... with its output');

my $globex = complete('/v1/completions', undef, headers => bearer('globex'));
is($globex->{json}{model}, 'proverbs', 'another tenant, another adapter');
isnt(text($globex), text($acme), '... with another output');

my $open = complete('/open/v1/completions', 'psalms');
is($open->{json}{model}, 'psalms', 'an allowed adapter named in the body');
is(text($open), text($acme), '... serves what the claim chose');

# a client cannot name its way to another adapter

my $other = complete('/v1/completions', 'proverbs', headers => bearer('acme'));
my $unknown = complete('/v1/completions', 'nope', headers => bearer('acme'));
is($other->{status}, 404, 'a chosen tenant naming another adapter: 404');
is($other->{json}{error}{code}, 'model_not_found', '... model_not_found');
is($other->{json}{error}{message},
   'The model `proverbs` does not exist or you do not have access to it.',
   '... OpenAI\'s message');
(my $o = $other->{body}) =~ s/proverbs/X/g;
(my $u = $unknown->{body}) =~ s/nope/X/g;
is($o, $u, '... the same bytes as an unknown model but for the name');

my $plain = complete('/v1/completions', undef, headers => bearer('nobody'));
is($plain->{json}{model}, 'kjv', 'a tenant the map gives no adapter: the base');
is(text($plain), text($base), '... with the base\'s output');
my $plain_named = complete('/v1/completions', 'psalms',
                           headers => bearer('nobody'));
is($plain_named->{status}, 404, '... and it cannot name an adapter');

my $forbidden = complete('/open/v1/completions', 'secret');
my $nothing = complete('/open/v1/completions', 'nothing');
is($forbidden->{status}, 404, 'an adapter the location does not allow: 404');
(my $f = $forbidden->{body}) =~ s/secret/X/g;
(my $n = $nothing->{body}) =~ s/nothing/X/g;
is($f, $n, '... the same bytes as an unknown one but for the name');
is($forbidden->{headers}{'content-length'}
   - length('secret'), $nothing->{headers}{'content-length'}
   - length('nothing'), '... and the same length');

# a body over 16 KiB is parsed on a parse thread, with the same choice
my $pad = ' ' x (20 * 1024);
my $big = $t->post_json('/open/v1/completions',
    qq({"model": "psalms", "prompt": "$prompt", "max_tokens": 12,$pad)
    . q("temperature": 0, "ignore_eos": true}));
is($big->{json}{model}, 'psalms', 'a large body names an allowed adapter');
is(text($big), text($acme), '... and gets its output');
my $big_f = $t->post_json('/open/v1/completions',
    qq({"model": "secret", "prompt": "$prompt",$pad "max_tokens": 1}));
is($big_f->{status}, 404, '... and a forbidden one is unknown there too');

is(complete('/base/v1/completions', 'psalms')->{status}, 404,
   'no nalar_lora_allow: no adapter may be named');
is(complete('/all/v1/completions', 'secret')->{json}{model}, 'secret',
   'nalar_lora_allow all: any adapter');
is(complete('/all/v1/none/completions', 'secret')->{status}, 404,
   'nalar_lora_allow none below it: none');

# the prefix cache keys on the adapter: one tenant, one long prompt, a hit
# under the same adapter and none under another or the base

my $long = join ' ', ('In the beginning God created the heaven and the '
                      . 'earth.') x 8;
sub cached {
    my ($model) = @_;
    my $r = $t->post_json('/all/v1/completions', { model => $model,
                          prompt => $long, max_tokens => 1 });
    return $r->{json}{usage}{prompt_tokens_details}{cached_tokens} // -1;
}
cached('psalms');
ok(cached('psalms') > 0, 'the same prompt under the same adapter: cached');
is(cached('proverbs'), 0, '... under another adapter: nothing cached');
is(cached('kjv'), 0, '... under the base alone: nothing cached');

# a stream names the adapter in each chunk

my $s = $t->request('POST', '/v1/completions', headers => bearer('acme'),
                    json => { prompt => $prompt, max_tokens => 4,
                              ignore_eos => JSON::PP::true,
                              stream => JSON::PP::true });
my @ev = grep { ref } NalarTest::sse_events($s->{body});
ok(@ev && !grep({ $_->{model} ne 'psalms' } @ev),
   'a stream\'s chunks name the adapter');

# the operator's mistake

my $broken = complete('/v1/completions', undef, headers => bearer('broken'));
is($broken->{status}, 500, 'nalar_adapter naming no adapter: 500');
like($t->read_file('error.log'),
     qr/nalar_adapter: "nonexistent" is not a nalar_lora/,
     '... error.log names the value');

# /v1/models: exactly what the location may serve

sub models {
    my ($path, %o) = @_;
    my $r = $t->get($path, %o);
    return join ' ', map { $_->{id} . ($_->{parent} ? "<$_->{parent}" : '') }
                     @{ $t->json->decode($r->{body})->{data} };
}

is(models('/v1/models', headers => bearer('acme')), 'psalms<kjv',
   '/v1/models for a chosen tenant: its adapter alone');
is(models('/v1/models', headers => bearer('nobody')), 'kjv',
   '/v1/models for a tenant without one: the base');
is(models('/open/v1/models'), 'kjv psalms<kjv proverbs<kjv',
   '/v1/models lists the allowed adapters with their parent');
is(models('/base/v1/models'), 'kjv', '... and none where none is allowed');
is(models('/all/v1/models'), 'kjv psalms<kjv proverbs<kjv secret<kjv',
   '... and all where all are');
my $card = $t->get('/open/v1/models/psalms');
is($card->{status}, 200, '/v1/models/{adapter}: 200');
is($t->json->decode($card->{body})->{parent}, 'kjv', '... with its parent');
ok(!exists $t->json->decode($card->{body})->{root},
   '... and no root (the file\'s path is the server\'s)');
my $c1 = $t->get('/open/v1/models/secret');
my $c2 = $t->get('/open/v1/models/nothing');
is($c1->{status}, 404, '/v1/models/{forbidden adapter}: 404');
(my $c1b = $c1->{body}) =~ s/secret/X/g;
(my $c2b = $c2->{body}) =~ s/nothing/X/g;
is($c1b, $c2b, '... the same bytes as an unknown one but for the name');

# the log and the counters

my $log = $t->read_file('lora.log');
like($log, qr/^acme\|psalms\|kjv\|200$/m, '$nalar_adapter logs the adapter');
like($log, qr/^nobody\|\|kjv\|200$/m, '... and nothing for the base');

my $m1 = $t->metrics;
my $key = 'nalar_lora_requests_total{model="kjv",adapter="psalms"}';
# psalms served: acme x3 (completions), the open one, the large body,
# the two cache probes, the stream
is(($m1->{$key} // 0) - ($m0->{$key} // 0), 8,
   'nalar_lora_requests_total counts the adapter\'s requests');
my $gen = 'nalar_lora_generation_tokens_total{model="kjv",adapter="psalms"}';
is(($m1->{$gen} // 0) - ($m0->{$gen} // 0), 5 * 12 + 2 + 4,
   'nalar_lora_generation_tokens_total counts its tokens');
my $pt = 'nalar_lora_prompt_tokens_total{model="kjv",adapter="proverbs"}';
ok(($m1->{$pt} // 0) > 0, 'nalar_lora_prompt_tokens_total counts prompts');

$t->check_log;
done_testing();

#!/usr/bin/perl
# A table of bad requests: each gets its status and OpenAI's error shape
# {"error":{"message","type","param","code"}}; a full queue answers 503
# with Retry-After.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_max_queue 1;
    nalar_max_running 1;
    client_max_body_size 8k;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $long = join ' ', ('In the beginning God created the heaven and the earth.')
                     x 60;

# [ name, method, path, body (ref: JSON, string: raw), status, param, code,
#   message (a pattern) ]
my @table = (
    [ 'bad JSON', 'POST', '/v1/completions', '{"prompt": "x",', 400, undef,
      'invalid_json' ],
    [ 'not an object', 'POST', '/v1/completions', '[1,2]', 400, undef,
      'invalid_json' ],
    [ 'empty body', 'POST', '/v1/completions', '', 400, undef,
      'invalid_json' ],
    [ 'duplicate keys', 'POST', '/v1/completions',
      '{"prompt":"a","prompt":"b"}', 400, undef, 'invalid_json' ],
    [ 'unknown model', 'POST', '/v1/completions',
      { model => 'gpt-4', prompt => 'x' }, 404, 'model', 'model_not_found' ],
    [ 'an unknown model of 600 three-byte characters (the message cut to '
      . 'its size stays whole characters)', 'POST', '/v1/completions',
      { model => "\x{2603}" x 600, prompt => 'x' }, 404, 'model',
      'model_not_found', qr/^The model `\x{2603}+$/ ],
    [ 'model not a string', 'POST', '/v1/completions',
      { model => 5, prompt => 'x' }, 400, 'model' ],
    [ 'prompt missing', 'POST', '/v1/completions', { model => 'kjv' }, 400,
      'prompt' ],
    [ 'prompt an object', 'POST', '/v1/completions', { prompt => {} }, 400,
      'prompt' ],
    [ 'prompt id out of vocabulary', 'POST', '/v1/completions',
      { prompt => [1, 99999] }, 400, 'prompt' ],
    [ 'prompt longer than the context', 'POST', '/v1/completions',
      { prompt => $long }, 400, 'prompt', 'context_length_exceeded' ],
    [ 'prompt + max_tokens over the context', 'POST', '/v1/completions',
      { prompt => 'x', max_tokens => 600 }, 400, 'prompt',
      'context_length_exceeded' ],
    [ 'temperature a string', 'POST', '/v1/completions',
      { prompt => 'x', temperature => 'hot' }, 400, 'temperature' ],
    [ 'temperature 3', 'POST', '/v1/completions',
      { prompt => 'x', temperature => 3 }, 400, 'temperature' ],
    [ 'top_p 1.5', 'POST', '/v1/completions', { prompt => 'x', top_p => 1.5 },
      400, 'top_p' ],
    [ 'top_k -2', 'POST', '/v1/completions', { prompt => 'x', top_k => -2 },
      400, 'top_k' ],
    [ 'presence_penalty 5', 'POST', '/v1/completions',
      { prompt => 'x', presence_penalty => 5 }, 400, 'presence_penalty' ],
    [ 'max_tokens 0', 'POST', '/v1/completions',
      { prompt => 'x', max_tokens => 0 }, 400, 'max_tokens' ],
    [ 'max_tokens 1.5', 'POST', '/v1/completions',
      { prompt => 'x', max_tokens => 1.5 }, 400, 'max_tokens' ],
    [ 'n 0', 'POST', '/v1/completions', { prompt => 'x', n => 0 }, 400, 'n' ],
    [ 'n 17', 'POST', '/v1/completions', { prompt => 'x', n => 17 }, 400,
      'n' ],
    [ 'five stop strings', 'POST', '/v1/completions',
      { prompt => 'x', stop => [qw(a b c d e)] }, 400, 'stop' ],
    [ 'empty stop string', 'POST', '/v1/completions',
      { prompt => 'x', stop => [''] }, 400, 'stop' ],
    [ 'chat: five stop strings', 'POST', '/v1/chat/completions',
      { messages => [ { role => 'user', content => 'x' } ],
        stop => [qw(a b c d e)] }, 400, 'stop', 'invalid_value',
      qr/at most 4 strings/ ],
    [ 'a stop string of 257 bytes', 'POST', '/v1/completions',
      { prompt => 'x', stop => 'a' x 257 }, 400, 'stop', 'invalid_value',
      qr/at most 256 bytes/ ],
    [ 'chat: a stop string of 257 bytes among short ones', 'POST',
      '/v1/chat/completions',
      { messages => [ { role => 'user', content => 'x' } ],
        stop => [ 'a', 'b' x 257, 'c' ] }, 400, 'stop', 'invalid_value',
      qr/at most 256 bytes/ ],
    [ 'a stop string of 129 two-byte characters (258 bytes)', 'POST',
      '/v1/completions', { prompt => 'x', stop => "\x{e9}" x 129 }, 400,
      'stop', 'invalid_value', qr/at most 256 bytes/ ],
    [ 'stream not a boolean', 'POST', '/v1/completions',
      { prompt => 'x', stream => 'yes' }, 400, 'stream' ],
    [ 'logprobs 6', 'POST', '/v1/completions', { prompt => 'x', logprobs => 6 },
      400, 'logprobs' ],
    [ 'seed a string', 'POST', '/v1/completions',
      { prompt => 'x', seed => 'abc' }, 400, 'seed' ],
    [ 'echo', 'POST', '/v1/completions', { prompt => 'x', echo => \1 }, 400,
      'echo' ],
    [ 'chat: messages not an array', 'POST', '/v1/chat/completions',
      { messages => 'hi' }, 400, 'messages' ],
    [ 'chat: message without role', 'POST', '/v1/chat/completions',
      { messages => [ { content => 'hi' } ] }, 400, 'messages' ],
    [ 'chat: image part', 'POST', '/v1/chat/completions',
      { messages => [ { role => 'user',
                        content => [ { type => 'image_url' } ] } ] },
      400, 'messages' ],
    [ 'chat: top_logprobs 21', 'POST', '/v1/chat/completions',
      { messages => [ { role => 'user', content => 'x' } ],
        logprobs => \1, top_logprobs => 21 }, 400, 'top_logprobs' ],
    [ 'chat: top_logprobs without logprobs', 'POST', '/v1/chat/completions',
      { messages => [ { role => 'user', content => 'x' } ],
        top_logprobs => 2 }, 400, 'top_logprobs' ],
    [ 'best_of 2', 'POST', '/v1/completions', { prompt => 'x', best_of => 2 },
      400, 'best_of' ],
    [ 'suffix', 'POST', '/v1/completions', { prompt => 'x', suffix => 'end' },
      400, 'suffix' ],
    [ 'logit_bias not an object', 'POST', '/v1/completions',
      { prompt => 'x', logit_bias => [1] }, 400, 'logit_bias' ],
    [ 'logit_bias: a key not a token id', 'POST', '/v1/completions',
      { prompt => 'x', logit_bias => { abc => 1 } }, 400, 'logit_bias' ],
    [ 'logit_bias: a token beyond the vocabulary', 'POST', '/v1/completions',
      { prompt => 'x', logit_bias => { 999999 => 1 } }, 400, 'logit_bias' ],
    [ 'logit_bias: a negative token id', 'POST', '/v1/completions',
      { prompt => 'x', logit_bias => { -1 => 1 } }, 400, 'logit_bias' ],
    [ 'logit_bias 101', 'POST', '/v1/completions',
      { prompt => 'x', logit_bias => { 300 => 101 } }, 400, 'logit_bias' ],
    [ 'logit_bias a string', 'POST', '/v1/completions',
      { prompt => 'x', logit_bias => { 300 => 'x' } }, 400, 'logit_bias' ],
    [ 'unknown path', 'POST', '/v1/embeddings', { input => 'x' }, 404, undef,
      'unknown_url' ],
    [ 'GET completions', 'GET', '/v1/completions', undef, 405, undef,
      'method_not_allowed' ],
    [ 'POST models', 'POST', '/v1/models', {}, 405, undef,
      'method_not_allowed' ],
    [ 'DELETE health', 'DELETE', '/v1/health', undef, 405, undef,
      'method_not_allowed' ],
    [ 'body over client_max_body_size', 'POST', '/v1/completions',
      { prompt => 'x' x 10000 }, 413, undef, 'request_too_large' ],
);

for my $row (@table) {
    my ($name, $method, $path, $body, $status, $param, $code, $msg) = @$row;
    my %o;
    if (ref $body) {
        $o{json} = $body;
    } elsif (defined $body) {
        $o{body} = $body;
        $o{headers} = { 'Content-Type' => 'application/json' };
    }

    my $r = $t->request($method, $path, %o);
    my $j = eval { NalarTest::json()->decode($r->{body}) } || {};
    my $e = $j->{error} || {};

    subtest $name => sub {
        is($r->{status}, $status, "status $status");
        like($r->{headers}{'content-type'} // '', qr{^application/json},
             'JSON body');
        is_deeply([ sort keys %$e ], [qw(code message param type)],
                  'error has message, type, param, code');
        ok(defined $e->{message} && length $e->{message}, 'a message');
        is($e->{type}, $status >= 500 ? 'server_error'
                                      : 'invalid_request_error', 'type');
        is($e->{param}, $param, 'param') if defined $param;
        is($e->{code}, $code, "code $code") if defined $code;
        like($e->{message} // '', $msg, 'message') if defined $msg;
        like($r->{headers}{allow} // '', qr/OPTIONS/, 'Allow header')
            if $status == 405;
    };
}

# accepted as no-ops: best_of 1, an empty suffix

for my $f ([ best_of => 1 ], [ suffix => '' ]) {
    my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                               max_tokens => 2, @$f });
    is($r->{status}, 200, "$f->[0] " . NalarTest::json()->encode($f->[1])
                          . ' changes nothing: 200');
}

# the most stop strings, each as long as allowed (256 bytes, here 128
# two-byte characters): accepted

{
    my $r = $t->post_json('/v1/completions',
                          { prompt => 'A wise man', max_tokens => 2,
                            stop => [ ('a' x 256), ('b' x 256),
                                      ("\x{e9}" x 128), ('d' x 256) ] });
    is($r->{status}, 200, '4 stop strings of 256 bytes: 200');
}

# logit_bias: +100 on one token makes greedy and sampled decoding choose it,
# -100 on the greedy choice makes greedy choose another

{
    my %req = (prompt => 'A wise man', max_tokens => 4, temperature => 0,
               ignore_eos => JSON::PP::true, logprobs => 1,
               return_tokens_as_token_ids => JSON::PP::true);
    my $ids = sub {
        my ($r) = @_;
        return [ map { /^token_id:(\d+)$/ ? $1 : $_ }
                 @{ $r->{json}{choices}[0]{logprobs}{tokens} || [] } ];
    };
    my $plain = $t->post_json('/v1/completions', \%req);
    my $first = $ids->($plain)->[0];
    ok(defined $first, "greedy's first token is $first");

    my $r = $t->post_json('/v1/completions',
                          { %req, logit_bias => { 300 => 100 } });
    is($r->{status}, 200, 'logit_bias +100: 200');
    is_deeply($ids->($r), [ (300) x 4 ], 'greedy: every token is the biased one');

    $r = $t->post_json('/v1/completions',
                       { %req, temperature => 1, seed => 7,
                         logit_bias => { 300 => 100 } });
    is_deeply($ids->($r), [ (300) x 4 ],
              'sampled: every token is the biased one');

    $r = $t->post_json('/v1/completions',
                       { %req, logit_bias => { $first => -100 } });
    is($r->{status}, 200, 'logit_bias -100: 200');
    isnt($ids->($r)->[0], $first, 'greedy avoids the banned token');
    ok(!grep({ $_ == $first } @{ $ids->($r) }), 'in every position');
}

# the connection survives a 400 (keep-alive) and the next request works

my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                            max_tokens => 2 });
is($r->{status}, 200, 'server still serves after the error table');

# a full queue: one running, one waiting, the rest 503 with Retry-After

my @pids;
my $dir = $t->dir;
for my $k (0 .. 23) {
    push @pids, NalarTest::fork_client(sub {
        my $r = $t->post_json('/v1/completions',
                              { prompt => $long =~ s/^(.{600}).*/$1/sr,
                                max_tokens => 300,
                                ignore_eos => JSON::PP::true });
        open my $fh, '>', "$dir/q$k" or die;
        print $fh join("\t", $r->{status}, $r->{headers}{'retry-after'} // '',
                       $r->{json}{error}{code} // '',
                       $r->{json}{error}{type} // ''), "\n";
        close $fh;
    });
}
waitpid $_, 0 for @pids;

my (%by_status, $shape_ok);
$shape_ok = 1;
for my $k (0 .. 23) {
    my ($status, $retry, $code, $type) = split /\t/, $t->read_file("q$k");
    chomp $type if defined $type;
    $by_status{$status}++;
    if ($status == 503) {
        $shape_ok = 0 unless $retry eq '1' && $code eq 'queue_full'
                             && $type eq 'server_error';
    }
}
ok($by_status{200}, 'some requests were served') or diag(explain \%by_status);
ok($by_status{503}, 'a full queue answers 503') or diag(explain \%by_status);
is(($by_status{200} // 0) + ($by_status{503} // 0), 24,
   'nothing but 200 and 503');
ok($shape_ok, '503: Retry-After: 1, code queue_full, type server_error');

$t->check_log;
done_testing;

#!/usr/bin/perl
# Speculation seen from the outside: a draft with another vocabulary fails
# `nginx -t` with a message about the vocabulary; `nalar_speculative`
# arguments are checked; usage.completion_tokens_details is always there
# (zeros without a prediction) and counts an exact prediction as accepted,
# in plain and streamed responses, completions and chat; a stop string
# inside an accepted run cuts where decoding without speculation does;
# $nalar_spec_accepted / $nalar_spec_proposed reach the access log; the
# metrics pass promtool.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;
my $nalar = $t->root . '/build/nalar';
my $other = $t->dir . '/other-vocab.gguf';

# nginx -t: the draft must share the target's vocabulary

system($nalar, 'mkmodel', '--dim', 64, '--layers', 1, '--ffn', 128,
       '--vocab', 2048, '-o', $other) == 0
    or BAIL_OUT('nalar mkmodel failed');

$t->write_conf(<<"CONF");
http {
    nalar_model kjv %%MODEL%% draft=$other;
}
CONF
my ($rc, $out) = $t->test_conf;
isnt($rc, 0, 'nginx -t fails with a draft of another vocabulary');
like($out, qr/nalar_model "kjv" draft: .*other-vocab\.gguf.*vocabulary/,
     'and says the vocabulary differs') or diag($out);

system($nalar, 'mkmodel', '--dim', 64, '--layers', 1, '--ffn', 128,
       '--vocab', 512, '-o', $other) == 0
    or BAIL_OUT('nalar mkmodel failed');
($rc, $out) = $t->test_conf;
like($out, qr/vocabulary of 512 tokens but the target .* has 2048/,
     'a smaller vocabulary: both sizes named') or diag($out);

for my $bad ('nalar_speculative on;', 'nalar_speculative auto max=0;',
             'nalar_speculative auto max=9;', 'nalar_speculative ngram k=2;',
             'nalar_speculative auto fixed fixed;',
             'nalar_speculative auto max=2 always;')
{
    $t->write_conf(<<"CONF");
http {
    nalar_model kjv %%MODEL%%;
    server { location / { $bad } }
}
CONF
    ($rc, $out) = $t->test_conf;
    isnt($rc, 0, "nginx -t refuses '$bad'");
    like($out, qr/invalid (value|parameter)/, '  with a reason') or diag($out);
}

$t->write_conf(<<'CONF');
http {
    nalar_model kjv %%MODEL%% draft=%%DRAFT%%;
    nalar_speculative draft max=8;
    server {
        location / { nalar_speculative off; }
        location /f/ { nalar_speculative ngram fixed max=3; }
    }
}
CONF
($rc, $out) = $t->test_conf;
is($rc, 0, 'nginx -t accepts the demo pair and nalar_speculative')
    or diag($out);

# a working server

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%% draft=%%DRAFT%%;
    nalar_model plain %%MODEL%%;
    nalar_threads 2;

    log_format spec '$nalar_model $nalar_completion_tokens '
                    'accepted=$nalar_spec_accepted '
                    'proposed=$nalar_spec_proposed';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/spec.log spec;
        # fixed: the draft, n-gram lookup and a prediction propose at every
        # step, whatever the step gate would measure on this host
        location /v1/ { nalar_speculative auto max=4 fixed; nalar_api; }
        location /off/v1/ { nalar_speculative off; nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 48;
my $p = 'A wise man';
my $want = $t->reference_text($p, $N, ignore_eos => 1);

sub post {
    my ($path, $body) = @_;
    my $r = $t->post_json($path, { temperature => 0, max_tokens => $N,
                                   ignore_eos => JSON::PP::true, %$body });
    return $r unless $body->{stream};
    my @ev = NalarTest::sse_events($r->{body});
    my ($usage) = map { $_->{usage} } grep { ref $_ && $_->{usage} } @ev;
    my $text = join '', map {
        ref $_ && $_->{choices} && @{ $_->{choices} }
            ? $_->{choices}[0]{text} // $_->{choices}[0]{delta}{content} // ''
            : ''
    } @ev;
    return { %$r, stream_text => $text, stream_usage => $usage };
}

# usage details: present, zero, without a prediction

my $r = post('/v1/completions', { model => 'kjv', prompt => $p });
is($r->{json}{choices}[0]{text}, $want, 'draft model answer');
is_deeply($r->{json}{usage}{completion_tokens_details},
          { accepted_prediction_tokens => 0, rejected_prediction_tokens => 0 },
          'usage.completion_tokens_details without a prediction: zeros');

$r = post('/v1/completions', { model => 'plain', prompt => $p,
                               stream => JSON::PP::true,
                               stream_options => { include_usage =>
                                                   JSON::PP::true } });
is($r->{stream_text}, $want, 'streamed answer');
is_deeply($r->{stream_usage}{completion_tokens_details},
          { accepted_prediction_tokens => 0, rejected_prediction_tokens => 0 },
          'and its usage chunk carries zeros too');

# an exact prediction: accepted

my $pred = { type => 'content', content => $want };

$r = post('/v1/completions', { model => 'plain', prompt => $p,
                               prediction => $pred });
my $d = $r->{json}{usage}{completion_tokens_details};
is($r->{json}{choices}[0]{text}, $want, 'exact prediction: same answer');
ok($d->{accepted_prediction_tokens} > 0,
   "exact prediction: $d->{accepted_prediction_tokens} tokens accepted");
ok($d->{accepted_prediction_tokens} + $d->{rejected_prediction_tokens}
   <= $r->{json}{usage}{completion_tokens} + 8,
   'accepted + rejected within what was decoded');

$r = post('/v1/completions', { model => 'plain', prompt => $p,
                               prediction => $pred,
                               stream => JSON::PP::true,
                               stream_options => { include_usage =>
                                                   JSON::PP::true } });
is($r->{stream_text}, $want, 'exact prediction, streamed: same answer');
ok($r->{stream_usage}{completion_tokens_details}{accepted_prediction_tokens}
   > 0, 'and the usage chunk counts the accepted prediction');

# text parts, as OpenAI allows

my @parts = map { { type => 'text', text => $_ } }
            substr($want, 0, 20), substr($want, 20);
$r = post('/v1/completions', { model => 'plain', prompt => $p,
                               prediction => { type => 'content',
                                               content => \@parts } });
is($r->{json}{choices}[0]{text}, $want, 'prediction as text parts');
ok($r->{json}{usage}{completion_tokens_details}{accepted_prediction_tokens}
   > 0, 'text parts: accepted like one string');

# a wrong prediction: the same answer, rejections counted

$r = post('/v1/completions', { model => 'plain', prompt => $p,
                               prediction => { type => 'content',
                               content => ' is a man who is a fool and a '
                                          . 'fool is a man who' } });
$d = $r->{json}{usage}{completion_tokens_details};
is($r->{json}{choices}[0]{text}, $want, 'partly wrong prediction: same answer');
ok($d->{rejected_prediction_tokens} > 0,
   "partly wrong prediction: $d->{rejected_prediction_tokens} rejected, "
   . "$d->{accepted_prediction_tokens} accepted");

# nalar_speculative off ignores the prediction

$r = post('/off/v1/completions', { model => 'plain', prompt => $p,
                                   prediction => $pred });
is($r->{json}{choices}[0]{text}, $want, 'off: same answer');
is($r->{json}{usage}{completion_tokens_details}{accepted_prediction_tokens},
   0, 'off: the prediction is not used');

# chat with a prediction

my $chat = { model => 'plain', messages => [ { role => 'user',
                                               content => $p } ] };
my $want_chat = post('/off/v1/chat/completions', $chat)
                ->{json}{choices}[0]{message}{content};
ok(length $want_chat, 'chat answer without speculation');
$r = post('/v1/chat/completions', { %$chat, prediction => {
                                        type => 'content',
                                        content => $want_chat } });
is($r->{json}{choices}[0]{message}{content}, $want_chat,
   'chat with the answer as prediction: same answer');
ok($r->{json}{usage}{completion_tokens_details}{accepted_prediction_tokens}
   > 0, 'chat: the prediction was accepted');

# a stop string inside an accepted run is cut where it is without
# speculation

for my $stop ("man's", 'who is a man who', "\n") {
    my $ref = $t->reference_text($p, $N, ignore_eos => 1, stop => [$stop]);
    my $off = post('/off/v1/completions', { model => 'plain', prompt => $p,
                                            stop => $stop });
    is($off->{json}{choices}[0]{text}, $ref, "stop '\Q$stop\E', off: "
       . 'equals nalar generate');
    for my $c ([ 'prediction', 'plain', prediction => $pred ],
               [ 'draft', 'kjv' ], [ 'n-gram', 'plain' ])
    {
        my ($name, $model, @extra) = @$c;
        for my $stream (0, 1) {
            $r = post('/v1/completions', { model => $model, prompt => $p,
                                           stop => $stop, @extra,
                                           stream => $stream
                                               ? JSON::PP::true
                                               : JSON::PP::false });
            is($stream ? $r->{stream_text} : $r->{json}{choices}[0]{text},
               $ref, "stop '\Q$stop\E', $name"
                     . ($stream ? ', streamed' : '') . ': cut at the same '
                     . 'place');
        }
    }
}

# the access log

$r = post('/v1/completions', { model => 'plain', prompt => $p,
                               prediction => $pred });
my $acc = $r->{json}{usage}{completion_tokens_details}
          {accepted_prediction_tokens};
my $log = '';
for (1 .. 600 * $NalarTest::SLOW) {
    $log = $t->read_file('spec.log');
    last if $log =~ /accepted=$acc proposed=\d+\n\z/;
    select(undef, undef, undef, 0.05);
}
my ($last) = (split /\n/, $log)[-1];
like($last, qr/^plain $N accepted=$acc proposed=(\d+)$/,
     'access log: $nalar_spec_accepted equals the accepted prediction');
my ($proposed) = $last =~ /proposed=(\d+)/;
ok($proposed >= $acc, "proposed ($proposed) >= accepted ($acc)");
my ($first) = grep { /^kjv / } split /\n/, $log;
like($first, qr/^kjv $N accepted=\d+ proposed=[1-9]\d*$/,
     'access log: the draft model proposed');

# promtool accepts the metrics (t/55 checks the rest)

SKIP: {
    my $promtool = grep { -x "$_/promtool" } split /:/, $ENV{PATH};
    skip 'promtool not installed', 2 unless $promtool;
    my $body = $t->get('/metrics')->{body};
    $t->write_file('metrics.txt', $body);
    my $dir = $t->dir;
    my $res = `promtool check metrics < $dir/metrics.txt 2>&1`;
    is($?, 0, 'promtool check metrics') or diag($res);
    like($body, qr/^nalar_spec_decode_num_accepted_tokens_per_pos_total\{model="kjv",position="7"\} \d+$/m,
         'positions 0..7 reported');
}

$t->check_log;
done_testing;

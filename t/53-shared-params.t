#!/usr/bin/perl
# A request's large parameters are one copy its n choices share (the
# engine's nalar_params; t/c/test_engine_faults.c checks the sharing
# itself): n = 16 with a 200 KB prediction, a schema and 4 stop strings of
# 256 bytes answers each choice as n = 1 does, completions and chat,
# plain and streamed, and the server answers a small request after it.
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
    nalar_threads 2;
    client_max_body_size 1m;

    server {
        listen 127.0.0.1:%%PORT%%;
        # fixed: the prediction proposes at every step
        location /v1/ { nalar_speculative auto max=4 fixed; nalar_api; }
    }
}
CONF

my $N = 24;
my $line = '{"name": "And it came to pass that the king spake"} ';
my $pred = $line x int(200 * 1024 / length $line);
my $schema = { type => 'object',
               properties => { name => { type => 'string' } },
               required => ['name'] };
my @stops = (('a' x 250) . 'zzzzzz', ('b' x 256), ("\x{e9}" x 128),
             ('}' x 256));

sub body {
    my ($chat, $n, %o) = @_;
    return { ($chat ? (messages => [ { role => 'user',
                                       content => 'A wise man' } ])
                    : (prompt => 'A wise man')),
             n => $n, temperature => 0, max_tokens => $N,
             ignore_eos => JSON::PP::true, stop => \@stops,
             prediction => { type => 'content', content => $pred },
             response_format => { type => 'json_schema',
                                  json_schema => { name => 'n',
                                                   schema => $schema } },
             %o };
}

sub texts {
    my ($chat, $r) = @_;
    if ($r->{json}) {
        return [ map { $chat ? $_->{message}{content} : $_->{text} }
                 sort { $a->{index} <=> $b->{index} }
                 @{ $r->{json}{choices} || [] } ];
    }
    my @t;
    for my $ev (NalarTest::sse_events($r->{body})) {
        next unless ref $ev && $ev->{choices};
        for my $c (@{ $ev->{choices} }) {
            $t[$c->{index}] .= $chat ? $c->{delta}{content} // ''
                                     : $c->{text} // '';
        }
    }
    return \@t;
}

for my $chat (0, 1) {
    my $path = $chat ? '/v1/chat/completions' : '/v1/completions';
    my $what = $chat ? 'chat' : 'completions';

    my $one = $t->post_json($path, body($chat, 1));
    is($one->{status}, 200, "$what: n = 1 with the large parameters: 200")
        or diag($one->{body});
    my $want = texts($chat, $one)->[0] // '';
    like($want, qr/^\{"name"/, "$what: its answer follows the schema")
        or diag($want);

    my $r = $t->post_json($path, body($chat, 16));
    is($r->{status}, 200, "$what: n = 16: 200") or diag($r->{body});
    my $got = texts($chat, $r);
    is(scalar(@$got), 16, "$what: 16 choices");
    is(scalar(grep { defined $_ && $_ eq $want } @$got), 16,
       "$what: each answers as n = 1");
    # the answer opens as the prediction does: every choice used it
    cmp_ok($r->{json}{usage}{completion_tokens_details}
               {accepted_prediction_tokens} // 0, '>=', 16,
           "$what: the choices accept tokens of the shared prediction");

    $r = $t->post_json($path, body($chat, 16, stream => JSON::PP::true));
    is($r->{status}, 200, "$what: n = 16 streamed: 200");
    $got = texts($chat, $r);
    is(scalar(grep { defined $_ && $_ eq $want } @$got), 16,
       "$what: streamed, each answers as n = 1");
}

my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                           max_tokens => 2 });
is($r->{status}, 200, 'a small request after them: 200');

done_testing();

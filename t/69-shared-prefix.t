#!/usr/bin/perl
# nalar_shared_prefix: the whole blocks of an operator's system text live
# in the global scope, so tenant B reuses what tenant A computed of it --
# and nothing past it: B sending A's very prompt gets exactly the shared
# blocks.  Without the directive the same prompts share nothing; the hit is
# rounded down to whole blocks; a bad file fails `nginx -t`.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model->has_cli;

my $secret = 'shared-prefix-test-secret-0123456789';
$t->write_file('jwt.secret', $secret);

my $system = 'You are a careful reader of the King James Bible. Answer in '
           . 'its own language, and quote the verses that you use.';
$t->write_file('system.txt', "$system\n");
$t->write_file('empty.txt', "\n");
$t->write_file('chat-system.txt', "<|im_start|>system\n$system<|im_end|>\n");

for my $case (['missing.txt', qr/nalar_shared_prefix: .*missing\.txt/],
              ['empty.txt', qr/nalar_shared_prefix: .*empty/]) {
    $t->write_conf(<<"CONF");
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_shared_prefix %%PREFIX%%/$case->[0];
    server { listen 127.0.0.1:%%PORT%%; location /v1/ { nalar_api; } }
}
CONF
    my ($rc, $out) = $t->test_conf;
    isnt($rc, 0, "nginx -t fails: $case->[0]");
    like($out, $case->[1], "nginx -t says why: $case->[0]");
}

# /ready/v1/health: readiness without a token
$t->write_conf(<<'CONF')->run(health => '/ready/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    nalar_jwt_key %%PREFIX%%/jwt.secret;
    nalar_shared_prefix %%PREFIX%%/system.txt;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location /private/v1/ { nalar_shared_prefix off; nalar_api; }
        location /chat/v1/ {
            nalar_chat_template chatml;
            nalar_shared_prefix %%PREFIX%%/chat-system.txt;
            nalar_api;
        }
        location = /metrics { nalar_metrics; }
        location = /ready/v1/health { nalar_jwt_key off; nalar_api; }
    }
}
CONF

my $sys_ids = $t->tokenize_special($system);
my $shared = int(@$sys_ids / 16) * 16;
ok(@$sys_ids >= 32 && @$sys_ids < 48,
   scalar(@$sys_ids) . " tokens of system text: $shared in whole blocks");

my $N = 12;
my $qa = "$system\nQuestion: who was Moses, and what did the LORD say unto "
       . "him in the mount of Sinai?\nAnswer:";
my $qb = "$system\nQuestion: what did Solomon ask of God in Gibeon, in a "
       . "dream by night?\nAnswer:";
my %want = map { $_ => $t->reference_text($_, $N, ignore_eos => 1) } $qa, $qb;
my $full_a = int((@{ $t->tokenize_special($qa) } - 1) / 16) * 16;
ok($full_a >= $shared + 16, "alice's prompt has $full_a tokens in whole "
   . 'blocks, past the shared ones');

sub ask {
    my ($who, $p, $path) = @_;
    my $r = $t->post_json($path || '/v1/completions',
        { model => 'kjv', prompt => $p, max_tokens => $N, temperature => 0,
          ignore_eos => JSON::PP::true },
        headers => { Authorization => 'Bearer '
                     . NalarJWT::hs256($secret, { sub => $who,
                                                  exp => time + 600 }) });
    return ("HTTP $r->{status}", -1) unless $r->{status} == 200;
    return ($r->{json}{choices}[0]{text},
            $r->{json}{usage}{prompt_tokens_details}{cached_tokens});
}

my ($text, $cached) = ask(alice => $qa);
is($cached, 0, 'alice, first: cold');
is($text, $want{$qa}, 'alice: nalar generate\'s answer');

($text, $cached) = ask(alice => $qa);
is($cached, $full_a, 'alice, again: all her full blocks');

($text, $cached) = ask(bob => $qa);
is($cached, $shared, "bob sends alice's prompt: only the $shared shared tokens");
is($text, $want{$qa}, 'bob: the same answer');

($text, $cached) = ask(carol => $qb);
is($cached, $shared, 'carol, another question: the shared tokens');
is($text, $want{$qb}, 'carol: nalar generate\'s answer');

($text, $cached) = ask(carol => $qb);
cmp_ok($cached, '>', $shared, 'carol, again: her own blocks too');

# a prompt holding only the first 20 tokens of the system text: the
# shared part is rounded down to one block

my @part = (@$sys_ids[0 .. 19], 263, 264, 265, 266, 267, 268, 269, 270,
            271, 272, 273, 274, 275, 276, 277, 278);
($text, $cached) = ask(dave => \@part);
is($cached, 16, 'the first 20 system tokens: one shared block');

# the system text with a leading space is other tokens: no hit

($text, $cached) = ask(erin => " $qa");
is($cached, 0, 'leading space: no hit');

# where nalar_shared_prefix is off, the same prompt stays in the tenant's
# scope: nothing from the others

($text, $cached) = ask(frank => $qa, '/private/v1/completions');
is($cached, 0, 'nalar_shared_prefix off: no shared blocks');
is($text, $want{$qa}, 'nalar_shared_prefix off: the same answer');
($text, $cached) = ask(frank => $qa, '/private/v1/completions');
is($cached, $full_a, 'nalar_shared_prefix off: his own blocks');

# chat: the file is the system turn as the template renders it

my $chat_shared = int(@{ $t->tokenize_special(
                         "<|im_start|>system\n$system<|im_end|>\n") } / 16) * 16;

sub chat {
    my ($who, $q) = @_;
    my $r = $t->post_json('/chat/v1/chat/completions',
        { model => 'kjv', max_tokens => 4, temperature => 0,
          messages => [ { role => 'system', content => $system },
                        { role => 'user', content => $q } ] },
        headers => { Authorization => 'Bearer '
                     . NalarJWT::hs256($secret, { sub => $who,
                                                  exp => time + 600 }) });
    return $r->{status} == 200
        ? $r->{json}{usage}{prompt_tokens_details}{cached_tokens} : -1;
}

is(chat(grace => 'Who was Moses, and what did the LORD say unto him?'), 0,
   'chat, grace: cold');
my $c = chat(heidi => 'What did Solomon ask of God in Gibeon by night?');
ok($c >= 32 && $c <= $chat_shared && $c % 16 == 0,
   "chat, heidi: the shared system turn's blocks ($c of $chat_shared)");
cmp_ok(chat(grace => 'Who was Moses, and what did the LORD say unto him?'),
       '>', $c, 'chat, grace again: her own blocks too');

$t->check_log;

done_testing;

#!/usr/bin/perl
# The prefix cache is scoped by the authenticated tenant (a verified JWT
# here): the same prompt twice from tenant A hits on the second request
# (cached_tokens = its full blocks, the same output); tenant B sending it
# gets 0 and the same output.  Near misses never hit: a leading space, a
# prepended token, another model; a prompt diverging inside a block hits up
# to the last full matching block.  $nalar_tenant and $nalar_cached_tokens
# in log_format; the nalar_prefix_cache_* metrics agree with the responses.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use NalarJWT;

my $t = NalarTest->new->has_model->has_cli;
my $dir = $t->dir;

my $secret = 'prefix-cache-test-secret-of-32+bytes!';
$t->write_file('jwt.secret', "$secret\n");

# /ready/v1/health: readiness without a token
$t->write_conf(<<'CONF')->run(health => '/ready/v1/health');
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_model kjv2 %%MODEL%%;
    nalar_threads 2;

    nalar_jwt_key %%PREFIX%%/jwt.secret;

    log_format tenants '$nalar_tenant $nalar_model $nalar_prompt_tokens '
                       '$nalar_cached_tokens';

    server {
        listen 127.0.0.1:%%PORT%%;

        location /v1/ {
            nalar_api;
            access_log %%PREFIX%%/tenants.log tenants;
        }

        location = /metrics { nalar_metrics; }
        location = /ready/v1/health { nalar_jwt_key off; nalar_api; }
    }
}
CONF

my %bearer = map {
    $_ => 'Bearer ' . NalarJWT::hs256($secret, { sub => $_,
                                                 exp => time + 3600 })
} qw(alice bob carol);

my $N = 16;
my $prompt = 'In the beginning God created the heaven and the earth. And '
           . 'the earth was without form, and void; and darkness was upon '
           . 'the face of the deep. And the Spirit of God moved upon the face '
           . 'of the waters.';
my $ids = $t->tokenize_special($prompt);
my $n = @$ids;
my $full = int(($n - 1) / 16) * 16;     # a hit leaves one token to compute
ok($n > 48 && $n % 16, "the prompt has $n tokens: 3 full blocks and a tail");

my $want = $t->reference_text($prompt, $N, ignore_eos => 1);
my %sum;                                # cached tokens reported, per model

sub complete {
    my ($who, $p, %o) = @_;
    my $model = delete $o{model} || 'kjv';
    my $r = $t->post_json('/v1/completions',
                          { model => $model, prompt => $p, max_tokens => $N,
                            temperature => 0, ignore_eos => JSON::PP::true,
                            %o },
                          headers => { Authorization => $bearer{$who} });
    my $u = $r->{json}{usage} || {};
    my $cached = $u->{prompt_tokens_details}{cached_tokens};
    $sum{$model} += $cached // 0;
    return ($r->{status} == 200 ? $r->{json}{choices}[0]{text} : "HTTP $r->{status}: $r->{body}",
            $cached, $u->{prompt_tokens});
}

# (a) one tenant reuses its own prefix; another does not see it

my ($text, $cached, $pt) = complete(alice => $prompt);
is($text, $want, 'alice, first: nalar generate\'s answer');
is($cached, 0, 'alice, first: nothing cached');
is($pt, $n, 'prompt_tokens');

($text, $cached) = complete(alice => $prompt);
is($cached, $full, "alice, again: cached_tokens = $full (the full blocks)");
is($text, $want, 'alice, again: the same answer');

($text, $cached) = complete(bob => $prompt);
is($cached, 0, 'bob, the same prompt: nothing cached');
is($text, $want, 'bob: the same answer');

($text, $cached) = complete(bob => $prompt);
is($cached, $full, 'bob, again: his own blocks');

# the streamed usage chunk reports it too

my $r = $t->post_json('/v1/completions',
                      { model => 'kjv', prompt => $prompt, max_tokens => $N,
                        temperature => 0, ignore_eos => JSON::PP::true,
                        stream => JSON::PP::true,
                        stream_options => { include_usage => JSON::PP::true } },
                      headers => { Authorization => $bearer{alice} });
my @ev = NalarTest::sse_events($r->{body});
my ($usage) = map { $_->{usage} } grep { ref && $_->{usage} } @ev;
is($usage && $usage->{prompt_tokens_details}{cached_tokens}, $full,
   'stream: usage chunk has cached_tokens');
is(join('', map { ref && @{ $_->{choices} } ? $_->{choices}[0]{text} : '' }
            @ev), $want, 'stream: the same answer');
$sum{kjv} += $full;

# (b) near misses

($text, $cached) = complete(alice => " $prompt");
is($cached, 0, 'leading space (tokenized differently): no hit');

($text, $cached) = complete(alice => $ids);
is($cached, $full, 'the same prompt as token ids: hit');
is($text, $want, 'token ids: the same answer');

my @shifted = ($ids->[0], 263, @$ids[1 .. $#$ids]);
($text, $cached) = complete(alice => \@shifted);
is($cached, 0, 'positions shifted by a prepended token: no hit');

# diverging inside block 2 (positions 32..47): the hit stops at 32; the
# answer equals a cold run of the same ids (carol has nothing cached)
my @div = @$ids;
$div[40] = $div[40] == 263 ? 264 : 263;
my ($cold, $c0) = complete(carol => \@div);
is($c0, 0, 'carol: the diverging prompt, cold');
($text, $cached) = complete(alice => \@div);
is($cached, 32, 'diverging at position 40: cached up to block 2 (32)');
is($text, $cold, 'partial hit: the same answer as cold');

@div = @$ids;
$div[5] = $div[5] == 263 ? 264 : 263;
($text, $cached) = complete(alice => \@div);
is($cached, 0, 'diverging in block 0: no hit');

# another model (its own engine and identity): no hit, then its own

($text, $cached) = complete(alice => $prompt, model => 'kjv2');
is($cached, 0, 'another model: no hit');
is($text, $want, 'another model: the same answer (same weights)');
($text, $cached) = complete(alice => $prompt, model => 'kjv2');
is($cached, $full, 'another model, again: its own blocks');

# variables in log_format (written when the request is logged)

my $log = $t->read_file('tenants.log');
like($log, qr/^alice kjv $n $full$/m, '$nalar_tenant and $nalar_cached_tokens');
like($log, qr/^bob kjv $n 0$/m, 'bob logged with 0 cached');

# the metrics agree with what the responses reported

my $m = $t->metrics;
for my $model (qw(kjv kjv2)) {
    is($m->{"nalar_prefix_cache_hits_total{model=\"$model\"}"}, $sum{$model},
       "$model: nalar_prefix_cache_hits_total = the sum of cached_tokens");
    cmp_ok($m->{"nalar_prefix_cache_queries_total{model=\"$model\"}"} // 0,
           '>=', $sum{$model}, "$model: queries >= hits");
    cmp_ok($m->{"nalar_prefix_cache_blocks{model=\"$model\"}"} // 0, '>', 0,
           "$model: published blocks held");
    ok(defined $m->{"nalar_prefix_cache_evictions_total{model=\"$model\"}"},
       "$model: evictions counter present");
}

$t->check_log;

done_testing;

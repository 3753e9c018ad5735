#!/usr/bin/perl
# Clients hanging up in the middle of speculative streams (draft model,
# n-gram lookup, predictions, greedy and sampled): every KV block returns
# to the free count, no provisional block is left, nothing keeps running;
# then the same server still answers exactly.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%% draft=%%DRAFT%%;
    nalar_model plain %%MODEL%%;
    nalar_threads 2;
    nalar_kv_cache 8m;

    server {
        listen 127.0.0.1:%%PORT%%;
        # fixed: every step speculates when the clients hang up, whatever
        # the step gate would measure on this host
        location /v1/ { nalar_speculative auto max=8 fixed; nalar_api; }
        location /ngram/v1/ { nalar_speculative ngram fixed; nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $MAX = 400;
my $p = 'A wise man';
my $want = $t->reference_text($p, 48, ignore_eos => 1);
my $long = join '', ($want) x 8;

for my $round (1 .. 3) {
    my @pids;
    for my $k (0 .. 7) {
        my $stop_after = 2 + int rand 10;     # SSE events before hanging up
        my %body = (prompt => $k % 2 ? 'In the beginning' : $p,
                    max_tokens => $MAX, ignore_eos => JSON::PP::true,
                    stream => JSON::PP::true,
                    temperature => $k % 3 ? 0 : 0.8, seed => $k);
        my $path = '/v1/completions';
        if ($k % 4 == 0) {
            $body{model} = 'kjv';                 # draft
        } elsif ($k % 4 == 1) {
            $body{model} = 'plain';               # n-gram
            $path = '/ngram/v1/completions';
        } else {
            $body{model} = $k % 4 == 2 ? 'plain' : 'kjv';
            $body{prediction} = { type => 'content', content => $long };
        }
        push @pids, NalarTest::fork_client(sub {
            my $r = $t->request('POST', $path, json => \%body, timeout => 600,
                on_data => sub {
                    my $n = () = $_[0] =~ /^data: /mg;
                    return $n < $stop_after;
                });
            die "stream $k finished before the disconnect\n"
                unless $r->{aborted};
        });
    }
    my $failed = 0;
    for (@pids) { waitpid $_, 0; $failed++ if $?; }
    is($failed, 0, "round $round: 8 speculative streams hung up mid-stream");

    # the cancellations land at the next step boundary: poll briefly

    my ($m, $ok);
    for (1 .. 1200 * $NalarTest::SLOW) {   # >= 60 s
        $m = $t->metrics;
        $ok = 1;
        for my $model (qw(kjv plain)) {
            my $M = "model=\"$model\"";
            $ok &&= $m->{"nalar_requests_running{$M}"} == 0
                 && $m->{"nalar_requests_waiting{$M}"} == 0
                 && $m->{"nalar_spec_decode_provisional_kv_blocks{$M}"} == 0
                 && $m->{"nalar_kv_blocks_free{$M}"}
                    == $m->{"nalar_kv_blocks_capacity{$M}"};
        }
        last if $ok;
        select(undef, undef, undef, 0.05);
    }
    ok($ok, "round $round: nothing running, every KV block free, no "
            . 'provisional block')
        or diag(join "\n", map { "$_ $m->{$_}" }
                           grep { /running|free|provisional/ } sort keys %$m);
}

my $m = $t->metrics;
ok($m->{'nalar_spec_decode_num_draft_tokens_total{model="kjv"}'} > 0
   && $m->{'nalar_spec_decode_num_draft_tokens_total{model="plain"}'} > 0,
   'the streams were speculating');

# still exact afterwards

for my $c ([ 'kjv', '/v1' ], [ 'plain', '/ngram/v1' ], [ 'plain', '/v1' ]) {
    my $r = $t->post_json("$c->[1]/completions",
                          { model => $c->[0], prompt => $p, max_tokens => 48,
                            temperature => 0, ignore_eos => JSON::PP::true,
                            prediction => { type => 'content',
                                            content => $want } });
    is($r->{json}{choices}[0]{text}, $want,
       "$c->[0] at $c->[1] afterwards: equals nalar generate");
}

$t->check_log;
done_testing;

#!/usr/bin/perl
# nalar_itl_target TIME | off and nalar_max_batch_tokens auto | N: nginx -t
# takes the values and refuses others, and a target beside a fixed budget,
# clearly; a server with a tight target answers with the greedy ids of a
# fixed budget's, and /metrics has the step-duration histogram, the count
# of steps over the target and the step's prompt-token budget.
# (Admission decisions against a known cost: t/40-step-budget.t.)
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model;

sub conf_with {
    my ($lines) = @_;
    $t->write_conf(<<"CONF");
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    $lines
}
CONF
    return $t->test_conf;
}

for my $l ('nalar_itl_target 100ms;', 'nalar_itl_target 1s;',
           'nalar_itl_target off;', 'nalar_max_batch_tokens auto;',
           'nalar_max_batch_tokens 128;',
           'nalar_max_batch_tokens auto; nalar_itl_target 50ms;',
           'nalar_max_batch_tokens 128; nalar_itl_target off;') {
    my ($rc, $out) = conf_with($l);
    is($rc, 0, "nginx -t accepts: $l") or diag($out);
}

for my $c (['nalar_itl_target fast;', qr/invalid value "fast": a time/],
           ['nalar_itl_target 0ms;', qr/invalid value "0ms"/],
           ['nalar_itl_target 2h;', qr/invalid value "2h"/],
           ['nalar_max_batch_tokens 0;', qr/invalid value "0": "auto" or/],
           ['nalar_max_batch_tokens lots;', qr/invalid value "lots"/],
           ['nalar_itl_target 100ms; nalar_itl_target 50ms;',
            qr/is duplicate/],
           ['nalar_max_batch_tokens 64; nalar_max_batch_tokens auto;',
            qr/is duplicate/],
           ['nalar_max_batch_tokens 64; nalar_itl_target 50ms;',
            qr/"nalar_itl_target" needs "nalar_max_batch_tokens auto"/]) {
    my ($l, $re) = @$c;
    my ($rc, $out) = conf_with($l);
    isnt($rc, 0, "nginx -t refuses: $l");
    like($out, $re, '  saying why') or diag($out);
}

# A long prompt beside short streams, under a tight target and under a
# fixed budget: the same greedy ids, and the metrics.
my $long = join ' ', ('And it came to pass that the') x 40;
my %ids;
for my $budget ('nalar_itl_target 1ms;', 'nalar_max_batch_tokens 512;') {
    $t->write_conf(<<"CONF")->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    $budget

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF
    my @pids;
    for my $p ('In the beginning', 'A wise man', $long) {
        push @pids, NalarTest::fork_client(sub {
            my $r = $t->post_json('/v1/completions', {
                model => 'kjv', prompt => $p, max_tokens => 24,
                temperature => 0, ignore_eos => JSON::PP::true,
                logprobs => 0 });
            my $j = eval { $t->json->decode($r->{body}) } || {};
            $t->write_file("out-" . length($p), $r->{status} . ' '
                           . ($j->{choices}[0]{text} // ''));
            return 0;
        });
    }
    waitpid($_, 0) for @pids;
    for my $p ('In the beginning', 'A wise man', $long) {
        my $got = $t->read_file("out-" . length($p));
        like($got, qr/^200 /, "$budget: a completion of "
             . length($p) . " characters");
        $ids{$budget}{$p} = $got;
    }

    my $r = $t->get('/metrics');
    my $m = $t->metrics;
    my $n = 'nalar_step_duration_seconds';
    like($r->{body}, qr/^# TYPE $n histogram$/m, "$budget: $n is a histogram");
    my $count = $m->{"${n}_count{model=\"kjv\"}"} // 0;
    ok($count > 0, "$budget: steps counted ($count)");
    is($m->{"${n}_bucket{model=\"kjv\",le=\"+Inf\"}"}, $count,
       "$budget: its +Inf bucket is the count");
    like($r->{body}, qr/^# TYPE nalar_steps_over_target_total counter$/m,
         "$budget: nalar_steps_over_target_total is a counter");
    like($r->{body}, qr/^# TYPE nalar_step_prefill_budget_tokens gauge$/m,
         "$budget: nalar_step_prefill_budget_tokens is a gauge");
    my $over = $m->{'nalar_steps_over_target_total{model="kjv"}'};
    if ($budget =~ /512/) {
        is($over, 0, "$budget: no target, no step over it");
        is($m->{'nalar_step_prefill_budget_tokens{model="kjv"}'} + 0 <= 512,
           1, "$budget: the prompt budget is what 512 leaves");
    } else {
        ok(defined $over && $over <= $count,
           "$budget: steps over the target ($over of $count)");
    }
    $t->check_log;
    $t->stop;
}
for my $p ('In the beginning', 'A wise man', $long) {
    is($ids{'nalar_itl_target 1ms;'}{$p},
       $ids{'nalar_max_batch_tokens 512;'}{$p},
       'the same text under a 1 ms target as under 512 tokens ('
       . length($p) . ' characters)');
}

done_testing;

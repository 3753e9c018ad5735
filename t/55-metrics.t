#!/usr/bin/perl
# nalar_metrics: Prometheus text accepted by `promtool check metrics`, the
# fixed metric names, counters and histograms that move with traffic.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_program('promtool');

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_model draft %%DRAFT%%;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

for my $model (qw(kjv draft kjv)) {
    my $r = $t->post_json('/v1/completions',
                          { model => $model, prompt => 'A wise man',
                            max_tokens => 10, ignore_eos => JSON::PP::true });
    is($r->{status}, 200, "a completion on $model");
}

my $r = $t->get('/metrics');
is($r->{status}, 200, 'metrics 200');

my $file = $t->write_file('metrics.txt', $r->{body});
my $out = `promtool check metrics < $file 2>&1`;
is($?, 0, 'promtool check metrics accepts the exposition') or diag($out);

my @names = qw(nalar_requests_running nalar_requests_waiting
               nalar_prompt_tokens_total nalar_generation_tokens_total
               nalar_kv_blocks_capacity nalar_kv_blocks_free
               nalar_preemptions_total);
for my $n (@names) {
    like($r->{body}, qr/^# TYPE $n (gauge|counter)$/m, "$n typed");
}
for my $n (qw(nalar_kv_blocks_capacity nalar_kv_blocks_free
              nalar_requests_running nalar_requests_waiting)) {
    like($r->{body}, qr/^# TYPE $n gauge$/m, "$n is a gauge");
}
for my $h (qw(nalar_time_to_first_token_seconds
              nalar_inter_token_latency_seconds nalar_queue_time_seconds)) {
    like($r->{body}, qr/^# TYPE $h histogram$/m, "$h is a histogram");
    like($r->{body}, qr/^${h}_bucket\{model="kjv",le="\+Inf"\} 2$/m,
         "$h: +Inf bucket counts both kjv requests")
        unless $h eq 'nalar_inter_token_latency_seconds';
}

my $m = $t->metrics;
is($m->{'nalar_generation_tokens_total{model="kjv"}'}, 20,
   'generation tokens per model (kjv)');
is($m->{'nalar_generation_tokens_total{model="draft"}'}, 10,
   'generation tokens per model (draft)');
is($m->{'nalar_prompt_tokens_total{model="kjv"}'} > 0, 1, 'prompt tokens');
is($m->{'nalar_inter_token_latency_seconds_count{model="kjv"}'}, 18,
   'inter-token latency: 9 gaps per 10-token request');

# buckets are cumulative and end at the count
my @b = map { $m->{$_} }
        sort { my ($x) = $a =~ /le="([^"]+)"/; my ($y) = $b =~ /le="([^"]+)"/;
               ($x eq '+Inf' ? 1e99 : $x) <=> ($y eq '+Inf' ? 1e99 : $y) }
        grep { /^nalar_time_to_first_token_seconds_bucket\{model="kjv"/ }
        keys %$m;
my $mono = 1;
$mono &&= $b[$_] >= $b[$_ - 1] for 1 .. $#b;
ok($mono, 'histogram buckets are cumulative');
is($b[-1], $m->{'nalar_time_to_first_token_seconds_count{model="kjv"}'},
   '+Inf bucket equals the count');

$r = $t->request('POST', '/metrics', body => 'x');
is($r->{status}, 405, 'metrics: POST is not allowed');

$t->check_log;
done_testing;

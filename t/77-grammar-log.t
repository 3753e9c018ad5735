#!/usr/bin/perl
# The per-request grammar variables in an access log: a response_format
# request logs its compile time (0 on a grammar cache hit), its mask time
# and the forced tokens proposed; a request without a grammar logs "-".
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

    log_format g '$request_uri $status c=$nalar_grammar_compile_ms '
                 'm=$nalar_grammar_mask_ms f=$nalar_grammar_forced_tokens';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/g.log g;
        location /v1/ { nalar_api; }
    }
}
CONF

my $schema = {
    type => 'object',
    properties => {
        the_long_fixed_key_name_of_the_answer => { type => 'boolean' },
    },
    required => [ 'the_long_fixed_key_name_of_the_answer' ],
    additionalProperties => JSON::PP::false,
};
my $rf = { type => 'json_schema',
           json_schema => { name => 'a', schema => $schema,
                            strict => JSON::PP::true } };

sub line {
    my ($n, $re) = @_;
    my ($log, @l) = ('');
    for (1 .. 600 * $NalarTest::SLOW) {
        $log = $t->read_file('g.log');
        @l = grep { /$re/ } split /\n/, $log;
        last if @l >= $n;
        select(undef, undef, undef, 0.05);
    }
    diag($log) if @l < $n;
    return $l[$n - 1] // '';
}

for my $i (1, 2) {
    my $r = $t->post_json("/v1/completions?g$i",
                          { model => 'kjv', prompt => 'Answer:',
                            max_tokens => 40, temperature => 0,
                            response_format => $rf });
    is($r->{status}, 200, "response_format request $i") or diag($r->{body});
}
my $r = $t->post_json('/v1/completions?plain',
                      { model => 'kjv', prompt => 'Answer:', max_tokens => 4,
                        temperature => 0 });
is($r->{status}, 200, 'plain request');

my $l1 = line(1, qr/^\S+\?g1 /);
like($l1, qr/^\S+ 200 c=[\d.]+ m=[\d.]+ f=(\d+)$/,
     'grammar request: compile ms, mask ms, forced tokens logged');
my ($m1, $f1) = $l1 =~ /m=([\d.]+) f=(\d+)$/;
ok(($f1 // 0) > 0, "forced tokens proposed ($l1)");
ok(($m1 // 0) > 0, 'mask time counted');

like(line(1, qr/^\S+\?g2 /), qr/ c=0\.000 m=[\d.]+ f=[1-9]\d*$/,
     'the same schema again: a cache hit compiles in 0 ms');
like(line(1, qr/^\S+\?plain /), qr/ 200 c=- m=- f=-$/,
     'no grammar: the variables are empty');

done_testing;

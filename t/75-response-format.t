#!/usr/bin/perl
# response_format through nginx: json_schema and json_object on completions
# and chat, streamed and not; 200 sampled outputs for each of the ten test
# schemas (t/data/grammar/schemas.json; `n` = 16 choices a request), every
# one validated by python3-jsonschema, and 16 for each of the five keyword
# schemas (t/data/grammar/keywords.json: bounds, lengths, patterns,
# formats); bad schemas and unsupported keywords are 400s that name them;
# the grammar metrics.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use File::Temp qw(tempdir);
use NalarTest;

my $t = NalarTest->new->has_model->has_program('python3');
NalarTest::missing('python3-jsonschema missing')
    if system('python3 -c "import jsonschema" 2>/dev/null') != 0;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 2;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location /plain/ { nalar_api; nalar_speculative off; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $J = NalarTest::json();
my $root = NalarTest::root();
my $schemas = $J->decode($t->read_file("$root/t/data/grammar/schemas.json"));
my $PER = $ENV{GRAMMAR_NGINX_SAMPLES} || 200;
my $dir = tempdir(CLEANUP => 1);
open my $out, '>', "$dir/outputs.jsonl" or die;

sub rf {
    my ($s) = @_;
    return { type => 'json_schema',
             json_schema => { name => $s->{name}, schema => $s->{schema},
                              strict => JSON::PP::true } };
}

# --- bad requests: 400, param response_format, the keyword named ----------

my @bad = (
    [ { type => 'json_schema', json_schema => { name => 'x', schema =>
        { type => 'string', pattern => '(?=a)' } } },
      qr/lookahead '\(\?=' in 'pattern'/ ],
    [ { type => 'json_schema', json_schema => { name => 'x', schema =>
        { type => 'object', properties => { a => { minimum => 1 } } } } },
      qr/'minimum' at #\/properties\/a needs a 'type'/ ],
    [ { type => 'json_schema', json_schema => { name => 'x', schema =>
        { oneOf => [ { type => 'string' } ] } } }, qr/'oneOf'/ ],
    [ { type => 'json_schema', json_schema => { name => 'x', schema =>
        { '$ref' => '#/$defs/nope' } } }, qr/points nowhere/ ],
    [ { type => 'json_schema', json_schema => { schema => {} } },
      qr/name/ ],
    [ { type => 'json_schema' }, qr/json_schema/ ],
    [ { type => 'xml' }, qr/`xml`/ ],
    [ 'json', qr/type/ ],
);
for my $chat (0, 1) {
    for my $b (@bad) {
        my $body = { model => 'kjv', max_tokens => 4,
                     response_format => $b->[0],
                     $chat ? (messages => [ { role => 'user',
                                              content => 'Hi' } ])
                           : (prompt => 'Hi') };
        my $r = $t->post_json($chat ? '/v1/chat/completions'
                                    : '/v1/completions', $body);
        my $e = $r->{json}{error} || {};
        ok($r->{status} == 400 && ($e->{type} // '') eq 'invalid_request_error'
           && ($e->{param} // '') eq 'response_format'
           && ($e->{message} // '') =~ $b->[1],
           ($chat ? 'chat' : 'completions') . ": 400 naming $b->[1]")
            or diag($r->{status} . ' ' . ($r->{body} // ''));
    }
}

# --- json_object, both endpoints, streamed and not ------------------------

for my $chat (0, 1) {
    for my $stream (0, 1) {
        my $body = { model => 'kjv', max_tokens => 400, temperature => 0,
                     response_format => { type => 'json_object' },
                     $stream ? (stream => JSON::PP::true) : (),
                     $chat ? (messages => [ { role => 'user',
                                              content => 'A wise man' } ])
                           : (prompt => 'JSON:') };
        my $path = $chat ? '/v1/chat/completions' : '/v1/completions';
        my $r = $t->post_json($path, $body);
        my ($text, $finish);
        if ($stream) {
            my @ev = NalarTest::sse_events($r->{body});
            pop @ev if @ev && $ev[-1] eq '[DONE]';
            $text = join '', map { $chat ? ($_->{choices}[0]{delta}{content}
                                            // '')
                                         : ($_->{choices}[0]{text} // '') }
                             grep { @{ $_->{choices} || [] } } @ev;
            ($finish) = grep { defined } map { $_->{choices}[0]{finish_reason} }
                        grep { @{ $_->{choices} || [] } } @ev;
        } else {
            my $c = $r->{json}{choices}[0] || {};
            $text = $chat ? $c->{message}{content} : $c->{text};
            $finish = $c->{finish_reason};
        }
        my $v = eval { $J->decode($text // '') };
        my $what = ($chat ? 'chat' : 'completions')
                   . ($stream ? ', streamed' : '');
        ok(ref $v eq 'HASH', "json_object ($what): an object")
            or diag(substr($r->{body} // '', 0, 2000));
        is($finish, 'stop', "json_object ($what): finish_reason stop");
    }
}

# --- 200 sampled outputs per schema --------------------------------------

my ($n_out, $n_stop) = (0, 0);
for my $s (@$schemas) {
    my $k = 0;
    while ($k < $PER) {
        my $n = $PER - $k < 16 ? $PER - $k : 16;
        my $chat = $k % 32 == 16;
        my $body = { model => 'kjv', max_tokens => 400, temperature => 1.0,
                     n => $n, seed => 1000 + $k, response_format => rf($s),
                     $chat ? (messages => [ { role => 'user',
                                              content => 'A wise man' } ])
                           : (prompt => 'A wise man') };
        # some requests where speculation (and so forced proposals) is off
        my $path = ($k % 64 == 48 ? '/plain/v1' : '/v1')
                   . ($chat ? '/chat/completions' : '/completions');
        my $r = $t->post_json($path, $body);
        if ($r->{status} != 200) {
            fail("$s->{name}: status $r->{status}: $r->{body}");
            last;
        }
        for my $c (@{ $r->{json}{choices} }) {
            my $text = $chat ? $c->{message}{content} : $c->{text};
            $n_out++;
            $n_stop++ if ($c->{finish_reason} // '') eq 'stop';
            print $out $J->encode({ schema => $s->{name}, output => $text,
                                    finish => $c->{finish_reason} }), "\n";
        }
        $k += $n;
    }
}
close $out;
is($n_out, 10 * $PER, "$n_out sampled outputs");
is($n_stop, $n_out, 'every one finished with stop (a complete value)');
my $res = `python3 $root/t/lib/validate_json.py $root/t/data/grammar/schemas.json $dir/outputs.jsonl`;
like($res, qr/^checked $n_out invalid 0$/m,
     'every output valid under python3-jsonschema') or diag($res);

# --- metrics --------------------------------------------------------------

my $m = $t->metrics;
ok(($m->{'nalar_grammar_requests_total{model="kjv"}'} // 0) > 0,
   'nalar_grammar_requests_total');
is($m->{'nalar_grammar_compiles_total{model="kjv"}'}, 11,
   'ten schemas and json_object compiled once each');
ok(($m->{'nalar_grammar_compile_seconds_total{model="kjv"}'} // 0) > 0,
   'nalar_grammar_compile_seconds_total');
ok(($m->{'nalar_grammar_masks_total{model="kjv"}'} // 0) > 0
   && defined $m->{'nalar_grammar_mask_seconds_total{model="kjv"}'},
   'nalar_grammar_masks_total and mask seconds');
ok(($m->{'nalar_grammar_forced_accepted_tokens_total{model="kjv"}'} // 0)
   > 0, 'forced tokens accepted');

# --- the keywords real schemas use, through nginx -------------------------
# bounds, counts, lengths, patterns and formats (t/data/grammar/
# keywords.json): 16 sampled outputs each, valid with formats asserted

my $kw = $J->decode(do { local $/;
    open(my $fh, '<', "$root/t/data/grammar/keywords.json") or die; <$fh> });
open(my $kout, '>', "$dir/keywords.jsonl") or die;
my ($kw_out, $kw_stop) = (0, 0);
for my $s (@$kw) {
    my $r = $t->post_json('/v1/completions',
        { model => 'kjv', max_tokens => 400, temperature => 1.0, n => 16,
          seed => 77, prompt => 'A wise man', response_format => rf($s) });
    is($r->{status}, 200, "$s->{name}: 200") or diag($r->{body});
    for my $c (@{ $r->{json}{choices} || [] }) {
        $kw_out++;
        $kw_stop++ if ($c->{finish_reason} // '') eq 'stop';
        print $kout $J->encode({ schema => $s->{name}, output => $c->{text} }),
                    "\n";
    }
}
close $kout;
is($kw_out, 80, 'keyword schemas: 80 sampled outputs');
is($kw_stop, 80, 'every one finished with stop');
$res = `python3 $root/t/lib/validate_json.py $root/t/data/grammar/keywords.json $dir/keywords.jsonl`;
like($res, qr/^checked 80 invalid 0$/m,
     'every one valid under python3-jsonschema, formats asserted')
    or diag($res);

$t->check_log;
done_testing();

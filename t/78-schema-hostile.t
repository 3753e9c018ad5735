#!/usr/bin/perl
# Hostile schemas through nginx, as response_format and as tool parameters
# (tool_choice "required" and named): deep nesting, 200 enum entries, a
# type list of 1000 "null"s, an anyOf chain with 2^18 paths, 10k required
# properties, 100 tools, left recursion ({"anyOf":[{"$ref":"#"},
# {"$ref":"#"}]}, a -> b -> a), a bare {"$ref":"#"} and recursion that
# never ends.  Each gets a 400 with an OpenAI-shaped error or a valid
# answer; while it is in flight, a small ordinary request on the same
# engine is answered; no worker exits, nothing is logged at [alert] or
# above, and /v1/health and a last request still answer.  The time from
# sending each to its answer is measured and printed (diag), and held to a
# generous backstop only: the tests gate on what happened, not on speed.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use IO::Select;
use Time::HiRes qw(time);
use NalarTest;

my $t = NalarTest->new->has_cli;
my $root = NalarTest::root();
my $dir = $t->dir;

my $mk = `$root/build/nalar mkmodel --dim 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 --vocab 1024 --ctx 16384 --seed 3 --bpe --pre qwen2 --chatml -o $dir/m.gguf 2>&1`;
is($?, 0, 'mkmodel: a ChatML model') or diag($mk);

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%PREFIX%%/m.gguf;
    nalar_threads 1;
    client_max_body_size 16m;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $J = NalarTest::json();
my $BACKSTOP = 60;     # seconds: a hang, not a speed limit
my @times;

sub nested {
    my ($depth, $leaf) = @_;
    my $s = $leaf // { type => 'integer' };
    $s = { type => 'object', properties => { a => $s }, required => ['a'] }
        for 1 .. $depth;
    return $s;
}

my %defs = map { ("d$_" => { anyOf => [ { '$ref' => '#/$defs/d' . ($_ + 1) },
                                        { '$ref' => '#/$defs/d' . ($_ + 1) } ]
                            }) } 0 .. 17;
$defs{d18} = { type => 'integer' };
my $chain = { '$defs' => \%defs, '$ref' => '#/$defs/d0' };
my @enum = map { "s$_" } 0 .. 199;
my $big = { type => 'object',
            properties => { map { ("p$_" => { type => 'boolean' }) }
                            0 .. 9999 },
            required => [ map { "p$_" } 0 .. 9999 ] };
my $left = { anyOf => [ { '$ref' => '#' }, { '$ref' => '#' } ] };
my $aba = { '$defs' => { a => { '$ref' => '#/$defs/b' },
                         b => { anyOf => [ { type => 'null' },
                                           { '$ref' => '#/$defs/a' } ] } },
            '$ref' => '#/$defs/a' };
my $endless = { type => 'object', properties => { a => { '$ref' => '#' } },
                required => ['a'] };

# name, schema, expected: 'valid' (with a check of the value) or a regex
# the 400's message matches
my @cases = (
    [ 'nested 20', nested(20), sub { depth($_[0]) == 20 } ],
    [ 'nested 24', nested(24), sub { depth($_[0]) == 24 } ],
    [ 'nested 32', nested(32), sub { depth($_[0]) == 32 } ],
    [ 'enum of 200', { enum => \@enum },
      sub { my $v = shift; !ref $v && grep { $_ eq $v } @enum } ],
    [ 'type null x 1000', { type => [ ('null') x 1000 ] },
      sub { !defined $_[0] } ],
    [ 'anyOf chain of 2^18 paths', $chain, sub { $_[0] =~ /^-?\d+$/ } ],
    [ '10k required properties', $big, 'long' ],
    [ 'anyOf [$ref #, $ref #]', $left, qr/left recursion/ ],
    [ '$ref #', { '$ref' => '#' }, qr/left recursion/ ],
    [ 'a -> b -> a', $aba, qr/left recursion through \$ref/ ],
    [ 'an object that requires itself', $endless, qr/without end/ ],
);

sub depth {
    my ($v) = @_;
    my $d = 0;
    while (ref $v eq 'HASH') { $v = $v->{a}; $d++ }
    return $d;
}

# Sends $body; while it is in flight, a small request; then reads the
# hostile one's answer.  Returns (its response, seconds to it, the small
# one's response).
sub hostile {
    my ($body) = @_;
    my $t0 = time;
    my $s = $t->post_socket('/v1/chat/completions', $J->encode($body));
    my $small = $t->post_json('/v1/chat/completions',
                              { model => 'kjv', max_tokens => 4,
                                messages => [ { role => 'user',
                                                content => 'Hi' } ] });
    $small->{dt} = time - $t0;
    my ($raw, $sel) = ('', IO::Select->new($s));
    while ($sel->can_read($t0 + $BACKSTOP - time)) {
        my $n = $s->sysread(my $buf, 65536);
        last unless $n;
        $raw .= $buf;
    }
    my $dt = time - $t0;
    close $s;
    my $r = NalarTest::parse_response($raw);
    $r->{json} = eval { $J->decode($r->{body} // '') };
    return ($r, $dt, $small);
}

sub is_400 {
    my ($r, $param, $re) = @_;
    my $e = ($r->{json} // {})->{error} // {};
    return $r->{status} == 400
           && ($e->{type} // '') eq 'invalid_request_error'
           && ($e->{param} // '') eq $param
           && ($e->{message} // '') =~ $re;
}

my $question = [ { role => 'user', content => 'And it came to pass' } ];

for my $c (@cases) {
    my ($name, $schema, $want) = @$c;

    # response_format
    my ($r, $dt, $small) = hostile(
        { model => 'kjv', messages => $question, temperature => 1,
          seed => 5, max_tokens => $want eq 'long' ? 32 : 800,
          response_format => { type => 'json_schema',
                               json_schema => { name => 'h',
                                                schema => $schema } } });
    push @times, [ "response_format: $name", $dt ];
    diag(sprintf "response_format %s: %d in %.2f s (the small one: %.2f s)",
         $name, $r->{status}, $dt, $small->{dt});
    is($small->{status}, 200, "response_format $name: a small request "
       . "answered meanwhile");
    ok($r->{status} != 0 && $dt < $BACKSTOP, "response_format $name: "
       . "answered");
    if (ref $want eq 'Regexp') {
        ok(is_400($r, 'response_format', $want), "response_format $name: "
           . "400 naming $want") or diag($r->{body});
    } elsif ($want eq 'long') {
        my $ch = (($r->{json} // {})->{choices} // [])->[0] // {};
        ok($r->{status} == 200 && ($ch->{finish_reason} // '') eq 'length'
           && ($ch->{message}{content} // '') =~ /^\{"p0": (true|false), /,
           "response_format $name: compiled, and the answer follows it "
           . "until max_tokens") or diag(substr $r->{body} // '', 0, 400);
    } else {
        my $ch = (($r->{json} // {})->{choices} // [])->[0] // {};
        my $v = eval { $J->decode('[' . ($ch->{message}{content} // '')
                                  . ']')->[0] };
        ok($r->{status} == 200 && ($ch->{finish_reason} // '') eq 'stop'
           && !$@ && $want->($v), "response_format $name: a valid answer")
            or diag(substr $r->{body} // '', 0, 600);
    }

    # the same schema as a tool's parameters (objects only), tool_choice
    # "required"
    next unless ref $schema eq 'HASH'
                && (($schema->{type} // '') eq 'object'
                    || exists $schema->{anyOf} || exists $schema->{'$ref'});
    ($r, $dt, $small) = hostile(
        { model => 'kjv', messages => $question, temperature => 1,
          seed => 5, max_tokens => $want eq 'long' ? 32 : 800,
          tool_choice => 'required',
          tools => [ { type => 'function',
                       function => { name => 'h', parameters => $schema } } ]
        });
    push @times, [ "tools: $name", $dt ];
    diag(sprintf "tools %s: %d in %.2f s (the small one: %.2f s)", $name,
         $r->{status}, $dt, $small->{dt});
    is($small->{status}, 200, "tools $name: a small request answered "
       . "meanwhile");
    ok($r->{status} != 0 && $dt < $BACKSTOP, "tools $name: answered");
    if (ref $want eq 'Regexp') {
        ok(is_400($r, 'tools', $want), "tools $name: 400 naming $want")
            or diag($r->{body});
    } elsif ($want eq 'long') {
        # its 270 KB of parameters are rendered into the prompt too: past
        # the context that is the usual 400
        ok($r->{status} == 200
           || is_400($r, 'messages', qr/maximum context length/),
           "tools $name: answered, or a 400 for the prompt's length")
            or diag(substr $r->{body} // '', 0, 400);
    } else {
        my $ch = (($r->{json} // {})->{choices} // [])->[0] // {};
        my $call = ($ch->{message}{tool_calls} // [])->[0] // {};
        my $v = eval { $J->decode($call->{function}{arguments} // '') };
        ok($r->{status} == 200
           && ($ch->{finish_reason} // '') eq 'tool_calls'
           && ($call->{function}{name} // '') eq 'h' && !$@ && $want->($v),
           "tools $name: a valid call") or diag(substr $r->{body} // '', 0,
                                                600);
    }
}

# 100 tools: "required" calls one of them; named, the 100th
{
    my @tools = map { { type => 'function',
                        function => { name => "tool_$_",
                                      parameters => { type => 'object',
                                          properties => { x => {
                                              type => 'integer' } },
                                          required => ['x'] } } } } 0 .. 99;
    for my $choice ('required', 'tool_99', 'tool_64') {
        my ($r, $dt, $small) = hostile(
            { model => 'kjv', messages => $question, temperature => 1,
              seed => 9, max_tokens => 200, tools => \@tools,
              tool_choice => $choice eq 'required' ? 'required'
                  : { type => 'function', function => { name => $choice } }
            });
        push @times, [ "100 tools, $choice", $dt ];
        diag(sprintf "100 tools, %s: %d in %.2f s (the small one: %.2f s)",
             $choice, $r->{status}, $dt, $small->{dt});
        is($small->{status}, 200, "100 tools, $choice: a small request "
           . "answered meanwhile");
        my $ch = (($r->{json} // {})->{choices} // [])->[0] // {};
        my $call = ($ch->{message}{tool_calls} // [])->[0] // {};
        my $nm = $call->{function}{name} // '';
        my $v = eval { $J->decode($call->{function}{arguments} // '') };
        ok($r->{status} == 200 && ($ch->{finish_reason} // '') eq 'tool_calls'
           && ($choice eq 'required' ? $nm =~ /^tool_\d+$/ : $nm eq $choice)
           && ref $v eq 'HASH' && ($v->{x} // '') =~ /^-?\d+$/,
           "100 tools, $choice: a valid call ($nm)")
            or diag(substr $r->{body} // '', 0, 600);
    }
}

my ($worst) = sort { $b->[1] <=> $a->[1] } @times;
diag(sprintf "slowest answer: %s, %.2f s", @$worst) if $worst;

is($t->get('/v1/health')->{status}, 200, '/v1/health answers');
my $last = $t->post_json('/v1/chat/completions',
                         { model => 'kjv', max_tokens => 4,
                           messages => [ { role => 'user',
                                           content => 'Hi' } ] });
is($last->{status}, 200, 'a last request is answered');

$t->stop;
my $log = $t->read_file('error.log');
unlike($log, qr/exited on signal/, 'no worker exited on a signal');
$t->check_log;
done_testing();

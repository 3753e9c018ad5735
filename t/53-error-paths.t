#!/usr/bin/perl
# A request that fails after it was accepted: without a stream the client
# gets the JSON error with its status (the header was not sent yet); a
# stream, whose header is out, ends with an SSE error event and [DONE].
# Either way the keep-alive connection carries on: a request pipelined
# behind the failed one gets its answer, and error.log holds no [alert]
# (no "header already sent").
#
# The failure: `nalar_test_fault_forward 4` makes each engine's 4th forward
# pass fail, after the prompt's pass and two decode steps, as an engine
# error mid-generation would.  Each case has its own model (its own engine),
# so each fails exactly once, and the request pipelined behind it runs.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(time sleep);
use NalarTest 'hooks';    # nalar_test_*: the test build of the module

my $t = NalarTest->new->has_model;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model e1 %%MODEL%%;
    nalar_model e1s %%MODEL%%;
    nalar_model e3 %%MODEL%%;
    nalar_model e3s %%MODEL%%;
    nalar_threads 1;
    nalar_kv_cache 4m;
    # a fixed budget: the prompt is one pass however slow the machine is
    # (with the default ITL target a slow machine chunks it, and the 4th
    # pass would fail before any token)
    nalar_max_batch_tokens 512;
    nalar_test_fault_forward 4;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $json = NalarTest::json();
my $prompt = join ' ',
    ('And God said, Let there be light: and there was light.') x 7;

# Requests on one connection, written at once (pipelined); the last one
# closes it.  Returns the parsed responses in order.
sub pipelined {
    my (@bodies) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $t->port, Proto => 'tcp',
                                  Timeout => 10) or die "connect: $!";
    my $req = '';
    for my $k (0 .. $#bodies) {
        my $b = $json->encode($bodies[$k]);
        $req .= "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
              . ($k == $#bodies ? "Connection: close\r\n" : '')
              . "Content-Type: application/json\r\n"
              . 'Content-Length: ' . length($b) . "\r\n\r\n$b";
    }
    $s->syswrite($req);

    my $raw = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + 120 * $NalarTest::SLOW;
    while (time < $deadline) {
        last unless $sel->can_read($deadline - time);
        my $n = $s->sysread(my $buf, 65536);
        last unless $n;
        $raw .= $buf;
    }
    close $s;

    my @res;
    while (length $raw) {
        my ($r, $rest) = parse_one($raw);
        last unless $r;
        push @res, $r;
        $raw = $rest;
    }
    return @res;
}

# One HTTP/1.1 response off the front of a buffer: (response, the rest).
sub parse_one {
    my ($buf) = @_;
    my $i = index($buf, "\r\n\r\n");
    return () if $i < 0;
    my $head = substr($buf, 0, $i);
    my $rest = substr($buf, $i + 4);
    my ($status) = $head =~ m{^HTTP/1\.1 (\d+)};
    my %h;
    for (split /\r\n/, $head) {
        $h{lc $1} = $2 if /^([^:]+):\s*(.*)$/;
    }
    my $body = '';
    if (($h{'transfer-encoding'} // '') =~ /chunked/) {
        while ($rest =~ s/^([0-9a-fA-F]+)\r\n//) {
            my $len = hex $1;
            $body .= substr($rest, 0, $len, '');
            $rest =~ s/^\r\n//;
            last if $len == 0;
        }
    } else {
        $body = substr($rest, 0, $h{'content-length'} // 0, '');
    }
    return ({ status => $status, headers => \%h, body => $body }, $rest);
}

my %fail = (prompt => $prompt, max_tokens => 50, ignore_eos => \1,
            temperature => 0);
my %small = (prompt => 'In the beginning', max_tokens => 3,
             temperature => 0);

sub is_error_shape {
    my ($e, $what) = @_;
    ok(ref $e eq 'HASH' && defined $e->{message} && length $e->{message}
       && exists $e->{type} && exists $e->{param} && exists $e->{code},
       "$what: OpenAI's error shape")
        or diag($json->encode($e // {}));
}

# every model's KV blocks free, nothing running
sub kv_back {
    my $deadline = time + 60 * $NalarTest::SLOW;
    my $m;
    while (time < $deadline) {
        $m = $t->metrics;
        my @free = grep { /^nalar_kv_blocks_free\{/ } keys %$m;
        my $back = @free == 4;
        for my $k (@free) {
            (my $cap = $k) =~ s/^nalar_kv_blocks_free/nalar_kv_blocks_capacity/;
            $back &&= defined $m->{$cap} && $m->{$k} == $m->{$cap};
        }
        for my $k (grep { /^nalar_requests_running\{/ } keys %$m) {
            $back &&= !$m->{$k};
        }
        return 1 if $back;
        sleep 0.05;
    }
    diag(join ' ', map { "$_=$m->{$_}" } grep { /kv_blocks|running/ } keys %$m);
    return 0;
}

# The request pipelined behind a failed one: answered on the same
# connection, by the same engine, in full.
sub follow_up {
    my ($r, $what) = @_;
    ok($r && $r->{status}, "$what: the pipelined request is answered");
    my $k = eval { $json->decode($r->{body}) } || {};
    is($r->{status}, 200, "$what: the pipelined request succeeds")
        or diag($r->{body});
    is($k->{usage}{completion_tokens}, 3, "$what: with its tokens");
    ok(kv_back(), "$what: every KV block is back");
}

for my $n (1, 3) {
    # not streamed: the status and the JSON error, then the next request

    my @r = pipelined({ %fail, n => $n, model => "e$n" },
                      { %small, model => "e$n" });
    is(scalar @r, 2, "n=$n: two answers on the connection");
    is($r[0]{status}, 500, "n=$n: the failed request answers 500");
    like($r[0]{headers}{'content-type'} // '', qr{^application/json},
         "n=$n: as JSON");
    my $j = eval { $json->decode($r[0]{body}) } || {};
    is_error_shape($j->{error}, "n=$n");
    is($j->{error}{type}, 'server_error', "n=$n: server_error");
    like($j->{error}{message} // '', qr/injected failure/, "n=$n: says why");
    follow_up($r[1], "n=$n");

    # streamed: text, an error event, [DONE]; then the next request

    @r = pipelined({ %fail, n => $n, model => "e${n}s", stream => \1,
                     stream_options => { include_usage => \1 } },
                   { %small, model => "e${n}s" });
    is(scalar @r, 2, "n=$n stream: two answers on the connection");
    is($r[0]{status}, 200, "n=$n stream: the header said 200");
    like($r[0]{headers}{'content-type'} // '', qr{^text/event-stream},
         "n=$n stream: an event stream");
    my @ev = NalarTest::sse_events($r[0]{body});
    ok(@ev >= 3, "n=$n stream: events");
    is($ev[-1], '[DONE]', "n=$n stream: ends with [DONE]");
    my @err = grep { ref $_ && $_->{error} } @ev;
    is(scalar @err, 1, "n=$n stream: one error event");
    is_error_shape($err[0]{error}, "n=$n stream");
    is($err[0]{error}{type}, 'server_error', "n=$n stream: server_error");
    ok(@ev >= 2 && ref $ev[-2] && $ev[-2]{error},
       "n=$n stream: the error event is the last before [DONE]");
    ok((grep { ref $_ && !$_->{error} && ($_->{choices}[0]{text} // '') ne '' }
        @ev), "n=$n stream: text came before the error");
    ok(!(grep { ref $_ && $_->{choices} && !@{ $_->{choices} } } @ev),
       "n=$n stream: no usage chunk after the error");
    follow_up($r[1], "n=$n stream");
}

unlike($t->read_file('error.log'), qr/header already sent/,
       'no "header already sent"');

$t->check_log;

done_testing;

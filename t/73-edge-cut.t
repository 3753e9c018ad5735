#!/usr/bin/perl
# An edge passes a node's stream on in whole events, and a stream its node
# cuts off ends with the error event and [DONE] after the last whole event,
# never after part of one.  The node here is a script on a socket, so that
# it can die at any byte: mid-event, between an event's two line feeds, at
# an event's end, inside a chunk; with events ending in "\n\n" or
# "\r\n\r\n".  A stream in odd pieces that ends as it should comes out byte
# for byte; an event longer than the edge holds back passes as it comes.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(sleep);

my $t = NalarTest->new;
my $json = $t->json;

my @ev = map {
    'data: ' . $json->encode({ id => "chatcmpl-$_",
                               object => 'chat.completion.chunk',
                               choices => [ { index => 0,
                                              delta => { content => "w$_ " },
                                              finish_reason => undef } ] })
    . "\n\n"
} 0 .. 3;
my @crlf = map { (my $e = $_) =~ s/\n/\r\n/g; $e } @ev;
my $done = "data: [DONE]\n\n";
my $error = 'data: {"error":{"message":"The engine node serving this stream '
          . 'went away before it finished","type":"server_error",'
          . "\"param\":null,\"code\":\"node_failed\"}}\n\ndata: [DONE]\n\n";
my $long = 'data: "' . ('x' x (1100 * 1024)) . "\"\n\n";

sub chunk { sprintf("%x\r\n%s\r\n", length $_[0], $_[0]) }

# name => [ the node's writes (chunk framing included), what the client
# gets after the response header ]; a stream without "0\r\n\r\n" at the
# end is cut: the node closes its connection after the last write
my @cases = (
    [ 'cut mid-event',
      [ chunk($ev[0] . substr($ev[1], 0, 40)) ],
      $ev[0] . $error ],
    [ 'cut mid-event, its beginning in earlier reads',
      [ chunk($ev[0]), chunk(substr($ev[1], 0, 10)),
        chunk(substr($ev[1], 10, 20)),
        chunk(substr($ev[1], 30, -1)) ],
      $ev[0] . $error ],
    [ 'cut between the two line feeds',
      [ chunk($ev[0] . $ev[1] . substr($ev[2], 0, -1)) ],
      $ev[0] . $ev[1] . $error ],
    [ 'cut at an event\'s end',
      [ chunk($ev[0]), chunk($ev[1]) ],
      $ev[0] . $ev[1] . $error ],
    [ 'cut inside a chunk',
      [ chunk($ev[0]),
        sprintf("%x\r\n", length $ev[1]) . substr($ev[1], 0, 50) ],
      $ev[0] . $error ],
    [ 'cut mid-event, events ending in CRLF',
      [ chunk($crlf[0]), chunk($crlf[1] . substr($crlf[2], 0, 20)) ],
      $crlf[0] . $crlf[1] . $error ],
    [ 'a whole stream in 7-byte pieces',
      [ (map { chunk($_) } unpack '(a7)*', join '', @ev, $done),
        "0\r\n\r\n" ],
      join('', @ev, $done) ],
    [ 'an event longer than the edge holds back',
      [ chunk($ev[0]), chunk(substr($long, 0, 600 * 1024)),
        chunk(substr($long, 600 * 1024)), chunk($done), "0\r\n\r\n" ],
      $ev[0] . $long . $done ],
);

# the node: one connection at a time, the case named in X-Case
my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                   LocalPort => $t->port(1), Proto => 'tcp',
                                   Listen => 16, ReuseAddr => 1)
    or die "listen: $!";

my $node = fork // die "fork: $!";
if ($node == 0) {
    while (my $c = $listen->accept) {
        setsockopt($c, IPPROTO_TCP, TCP_NODELAY, 1);
        my $req = '';
        while ($req !~ /\r\n\r\n/) {
            $c->sysread($req, 65536, length $req) or last;
        }
        my ($len) = $req =~ /^Content-Length: (\d+)/mi;
        my ($head, $body) = split /\r\n\r\n/, $req, 2;
        $body //= '';
        while (length $body < ($len // 0)) {
            $c->sysread($body, 65536, length $body) or last;
        }
        my ($case) = $head =~ /^X-Case: (\d+)/mi;
        $c->syswrite("HTTP/1.1 200 OK\r\n"
                     . "Content-Type: text/event-stream\r\n"
                     . "Transfer-Encoding: chunked\r\n"
                     . "Connection: close\r\n\r\n");
        for my $w (@{ $cases[$case // 0][1] }) {
            # pieces apart, so that they tend to arrive in separate reads;
            # where they do not, the same bytes must come out
            sleep 0.02;
            my $off = 0;
            while ($off < length $w) {
                my $n = $c->syswrite($w, length($w) - $off, $off);
                last unless $n;
                $off += $n;
            }
        }
        close $c;
    }
    POSIX::_exit(0);
}
close $listen;

END { kill 'KILL', $node if $node; }

$t->write_conf(<<'CONF')->run(health => '/ping');
http {
    %%NALAR_HTTP%%

    server {
        listen 127.0.0.1:%%PORT%%;

        location /v1/ {
            nalar_route_prefix 2k;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_pass http://127.0.0.1:%%PORT2%%;
        }

        location = /ping { return 200; }
    }
}
CONF

my $req = { model => 'kjv', stream => JSON::PP::true,
            messages => [ { role => 'user', content => 'In the beginning' } ] };

for my $i (0 .. $#cases) {
    my ($name, undef, $want) = @{ $cases[$i] };
    my $r = $t->post_json('/v1/chat/completions', $req,
                          headers => { 'X-Case' => $i });
    is($r->{status}, 200, "$name: 200");
    like($r->{raw}, qr/\r\n0\r\n\r\n\z/, "$name: a whole chunked response");
    ok($r->{body} eq $want, "$name: "
       . ($want =~ /node_failed/ ? 'the whole events, then the error event '
                                   . 'and [DONE]'
                                 : 'the stream as the node sent it'))
        or diag(length($r->{body}) > 4096
                ? 'got ' . length($r->{body}) . ' bytes, want '
                  . length($want)
                : "got:\n$r->{body}\nwant:\n$want");
    (my $lf = $r->{body}) =~ s/\r\n/\n/g;
    my @events = eval { NalarTest::sse_events($lf) };
    ok(!$@ && @events && $events[-1] eq '[DONE]',
       "$name: every event is JSON, the last [DONE]") or diag($@);
}

like($t->read_file('error.log'), qr/event is longer than \d+ bytes; the stream passes as it comes/,
     'the long event is logged');
is(() = $t->read_file('error.log') =~ /node went away before it finished/g,
   6, 'each cut stream is logged once');

$t->check_log;

done_testing;

#!/usr/bin/perl
# A request body sent with Transfer-Encoding: chunked (its terminating
# empty chunk leaves an empty buffer in the body chain) is read whole: the
# answer equals the same request sent with Content-Length, and error.log
# holds no sanitizer report (run it with NALAR_ASAN=1).
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(time);
use NalarTest;

my $t = NalarTest->new->has_model;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $req = { prompt => 'In the beginning', max_tokens => 8, temperature => 0,
            ignore_eos => JSON::PP::true };
my $plain = $t->post_json('/v1/completions', $req);
is($plain->{status}, 200, 'with Content-Length: 200');
my $want = $plain->{json}{choices}[0]{text};

# the body in chunks of the given sizes, then the empty chunk; each chunk
# is its own write (with an extension on the first: it is ignored)
sub chunked {
    my (@sizes) = @_;
    my $body = NalarTest->json->encode($req);
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $t->port, Proto => 'tcp',
                                  Timeout => 10) or die "connect: $!";
    $s->syswrite("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                 . "Connection: close\r\nContent-Type: application/json\r\n"
                 . "Transfer-Encoding: chunked\r\n\r\n");
    my $first = 1;
    while (length $body) {
        my $n = @sizes ? shift @sizes : length $body;
        my $part = substr($body, 0, $n, '');
        $s->syswrite(sprintf("%x%s\r\n%s\r\n", length $part,
                             $first ? ';ext=1' : '', $part));
        $first = 0;
    }
    $s->syswrite("0\r\n\r\n");

    my ($raw, $sel) = ('', IO::Select->new($s));
    my $deadline = time + 60 * $NalarTest::SLOW;
    while (time < $deadline) {
        last unless $sel->can_read($deadline - time);
        last unless $s->sysread(my $buf, 65536);
        $raw .= $buf;
    }
    close $s;
    my $r = NalarTest::parse_response($raw);
    $r->{json} = eval { NalarTest->json->decode($r->{body}) };
    return $r;
}

for my $case ([ 'one chunk', () ], [ 'three chunks', 5, 17 ],
              [ 'one byte, then the rest', 1 ]) {
    my ($what, @sizes) = @$case;
    my $r = chunked(@sizes);
    is($r->{status}, 200, "chunked, $what: 200");
    is($r->{json} && $r->{json}{choices}[0]{text}, $want,
       "chunked, $what: the same answer");
}

$t->check_log;
done_testing;

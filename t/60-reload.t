#!/usr/bin/perl
# `nginx -s reload` and `-s quit` under streaming load: every stream that
# was running finishes with all its tokens and [DONE], new requests are
# served by the new workers, old workers exit, and nothing is logged as
# an alert (no descriptor left open).
#
# Nothing here races the engine: the clients send their requests but read
# nothing until the test has signalled (so every stream certainly ends
# after the signal), and the signal comes once /metrics shows streams both
# running and waiting in the engine.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Time::HiRes;
use NalarTest;

my $t = NalarTest->new->has_model;
my $dir = $t->dir;

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_max_running 2;    # 2 run, 6 wait: the signal finds both kinds
    send_timeout 600s;      # the clients read only after the signal

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 450;

# Streams that record (status, completion tokens, saw [DONE]) in a file;
# each reads its response only once the file go-$tag exists.
sub start_streams {
    my ($tag, $n) = @_;
    my @pids;
    my $body = NalarTest::json()->encode({
        prompt => 'And it came to pass', max_tokens => $N,
        ignore_eos => JSON::PP::true, temperature => 0,
        stream => JSON::PP::true,
        stream_options => { include_usage => JSON::PP::true } });
    for my $k (1 .. $n) {
        push @pids, NalarTest::fork_client(sub {
            my $s = $t->post_socket('/v1/completions', $body);
            Time::HiRes::sleep(0.02) until -e "$dir/go-$tag";
            my $raw = '';
            while ($s->sysread(my $buf, 65536)) { $raw .= $buf; }
            close $s;
            my $r = NalarTest::parse_response($raw);
            my @ev = eval { NalarTest::sse_events($r->{body}) };
            my ($usage) = map { $_->{usage} } grep { ref && $_->{usage} } @ev;
            open my $fh, '>', "$dir/$tag$k" or die;
            print $fh join(' ', $r->{status},
                           $usage ? $usage->{completion_tokens} : -1,
                           (@ev && $ev[-1] eq '[DONE]') ? 'done' : 'cut',
                           Time::HiRes::time());
            close $fh;
        });
    }
    return @pids;
}

# Wait until n streams are running in the engine and at least one more
# waits: a client whose request nginx has not read yet when the signal
# comes is an idle connection, and nginx closes idle connections on a
# graceful shutdown (its own behaviour, not what this test is about).
sub wait_running {
    my ($n) = @_;
    my $deadline = Time::HiRes::time() + 120 * $NalarTest::SLOW;
    while (Time::HiRes::time() < $deadline) {
        my $m = $t->metrics;
        my ($run) = map { $m->{$_} } grep { /^nalar_requests_running/ } keys %$m;
        my ($wait) = map { $m->{$_} } grep { /^nalar_requests_waiting/ } keys %$m;
        return 1 if ($run // 0) >= $n && ($wait // 0) >= 1;
        select(undef, undef, undef, 0.025);
    }
    return 0;
}

# Streams that got everything, and ended after the signal at $since.
sub results {
    my ($tag, $n, $since) = @_;
    return grep { /^200 $N done ([\d.]+)$/ && $1 > $since }
           map { $t->read_file("$tag$_") } 1 .. $n;
}

# Every stream that nginx accepted got all its tokens and [DONE], and the
# signal really came while they were open (each ended after it).
sub check_streams {
    my ($tag, $since, $what) = @_;
    my @all = map { $t->read_file("$tag$_") } 1 .. 8;
    my @accepted = grep { /^200 / } @all;
    my @complete = grep { /^200 $N done / } @all;
    ok(@accepted >= 3 && @complete == @accepted,
       "every stream accepted before the $what got all tokens and [DONE]")
        or diag(join "\n", @all);
    ok(scalar results($tag, 8, $since) == @accepted,
       "every accepted stream finished after the $what")
        or diag(join "\n", @all);
}

sub workers {
    my $master = $t->pid;
    my @w = grep { /^\s*\d+\s+$master\s/ } `ps -eo pid,ppid,args`;
    return scalar @w;
}

# reload while 8 streams run

my @pids = start_streams('r', 8);
ok(wait_running(2), 'streams running (and waiting) before the reload');
my $hup = Time::HiRes::time();
$t->signal('HUP');

# the new worker is up while the old one still holds the unread streams
my $w;
my $deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
do { select(undef, undef, undef, 0.05); $w = workers() }
    while $w < 2 && Time::HiRes::time() < $deadline;
is($w, 2, 'a new worker beside the old one');

# once the old worker has stopped accepting (it logs that it is shutting
# down) and the new one's model is loaded, a new request is the new one's
$deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
select(undef, undef, undef, 0.05)
    until $t->read_file('error.log') =~ /gracefully shutting down/
          || Time::HiRes::time() > $deadline;
my $r;
$deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
do { $r = $t->get('/v1/health') }
    while $r->{status} != 200 && Time::HiRes::time() < $deadline;

$r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                         max_tokens => 4 });
is($r->{status}, 200, 'a new request during the reload is served')
    or diag("$r->{status} $r->{body}");

$t->write_file('go-r', '');
waitpid $_, 0 for @pids;
check_streams('r', $hup, 'reload');

# the old worker goes once its streams are done

$deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
while (Time::HiRes::time() < $deadline) {
    $w = workers();
    last if $w == 1;
    select(undef, undef, undef, 0.05);
}
is($w, 1, 'the old worker exited, one worker left');

like($t->read_file('error.log'), qr/gracefully shutting down/,
     'the old worker shut down gracefully');

# quit while 8 streams run: the master waits for them

@pids = start_streams('q', 8);
ok(wait_running(2), 'streams running (and waiting) before the quit');
my $master = $t->pid;
my $quit = Time::HiRes::time();
$t->signal('QUIT');
$t->write_file('go-q', '');

waitpid $_, 0 for @pids;
check_streams('q', $quit, 'quit');

$deadline = Time::HiRes::time() + 60 * $NalarTest::SLOW;
while (Time::HiRes::time() < $deadline) {
    last unless kill 0, $master;
    select(undef, undef, undef, 0.05);
}
ok(!kill(0, $master), 'nginx exited after the streams');

unlike($t->read_file('error.log'), qr/open socket .* left in connection/,
       'no descriptor left open');

$t->check_log;
done_testing;

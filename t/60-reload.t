#!/usr/bin/perl
# `nginx -s reload` and `-s quit` under streaming load: every stream that
# was running finishes with all its tokens and [DONE], new requests are
# served by the new workers, old workers exit, and nothing is logged as
# an alert (no descriptor left open).
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

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
CONF

my $N = 450;

# Streams that record (status, completion tokens, saw [DONE]) in a file.
sub start_streams {
    my ($tag, $n) = @_;
    my @pids;
    for my $k (1 .. $n) {
        push @pids, NalarTest::fork_client(sub {
            my $r = $t->request('POST', '/v1/completions',
                json => { prompt => 'And it came to pass', max_tokens => $N,
                          ignore_eos => JSON::PP::true, temperature => 0,
                          stream => JSON::PP::true,
                          stream_options => { include_usage =>
                                              JSON::PP::true } });
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

# Wait until n streams are running in the engine: a client whose request
# nginx has not read yet when the signal comes is an idle connection, and
# nginx closes idle connections on a graceful shutdown (its own behaviour,
# not what this test is about).
sub wait_running {
    my ($n) = @_;
    for (1 .. 400) {
        my $m = $t->metrics;
        my ($k) = grep { /^nalar_requests_running/ } keys %$m;
        return 1 if $k && $m->{$k} >= $n;
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
# signal really came while streams were running (some ended after it).
sub check_streams {
    my ($tag, $since, $what) = @_;
    my @all = map { $t->read_file("$tag$_") } 1 .. 8;
    my @accepted = grep { /^200 / } @all;
    my @complete = grep { /^200 $N done / } @all;
    ok(@accepted >= 2 && @complete == @accepted,
       "every stream accepted before the $what got all tokens and [DONE]")
        or diag(join "\n", @all);
    ok(scalar results($tag, 8, $since) >= 1,
       "streams were running at the $what and finished after it")
        or diag(join "\n", @all);
}

sub workers {
    my $master = $t->pid;
    my @w = grep { /^\s*\d+\s+$master\s/ } `ps -eo pid,ppid,args`;
    return scalar @w;
}

# reload while 8 streams run

my @pids = start_streams('r', 8);
ok(wait_running(2), 'streams running before the reload');
my $hup = Time::HiRes::time();
$t->signal('HUP');
select(undef, undef, undef, 0.3);

my $r = $t->post_json('/v1/completions', { prompt => 'A wise man',
                                            max_tokens => 4 });
is($r->{status}, 200, 'a new request during the reload is served');

waitpid $_, 0 for @pids;
check_streams('r', $hup, 'reload');

# the old worker goes once its streams are done

my $w;
for (1 .. 100) {
    $w = workers();
    last if $w == 1;
    select(undef, undef, undef, 0.05);
}
is($w, 1, 'the old worker exited, one worker left');

like($t->read_file('error.log'), qr/gracefully shutting down/,
     'the old worker shut down gracefully');

# quit while 8 streams run: the master waits for them

@pids = start_streams('q', 8);
ok(wait_running(2), 'streams running before the quit');
my $master = $t->pid;
my $quit = Time::HiRes::time();
$t->signal('QUIT');

waitpid $_, 0 for @pids;
check_streams('q', $quit, 'quit');

for (1 .. 200) {
    last unless kill 0, $master;
    select(undef, undef, undef, 0.05);
}
ok(!kill(0, $master), 'nginx exited after the streams');

unlike($t->read_file('error.log'), qr/open socket .* left in connection/,
       'no descriptor left open');

$t->check_log;
done_testing;

#!/usr/bin/perl
# The model loads off the event loop after the worker starts: meanwhile
# /v1/health and the API answer 503 with Retry-After (the other endpoints
# keep working), then the same requests succeed.  A model the engine cannot
# load is reported by /v1/health and the API, and nginx keeps running.
#
# The loading state is held open, not raced: the model path is
# /proc/self/cwd/model.gguf, which the master (validating the
# configuration) resolves in the directory nginx was started from, and a
# worker in its working_directory.  The worker's copy carries a write lease
# (fcntl F_SETLEASE) taken by this test, so the worker's open() blocks, and
# the engine stays loading, until the test lets go of it.
use strict;
use warnings;
use lib 't/lib';
use Cwd qw(getcwd);
use Fcntl qw(F_WRLCK F_UNLCK);
use File::Copy qw(copy);
use Test::More;
use Time::HiRes qw(sleep time);
use NalarTest;

use constant F_SETLEASE => 1024;    # Linux, <fcntl.h>

my $t = NalarTest->new->has_model;
my $dir = $t->dir;

# the worker's open() of a leased file breaks the lease: SIGIO comes here
$SIG{IO} = 'IGNORE';

# starts nginx from $dir (the master's cwd), workers in $dir/w
sub start {
    my ($t, $conf) = @_;
    my $cwd = getcwd();
    $t->write_conf($conf) if defined $conf;
    chdir $t->dir or die "chdir: $!";
    $t->run(health => 0);
    chdir $cwd or die "chdir: $!";
}

mkdir "$dir/w" or die "mkdir: $!";
copy($NalarTest::MODEL, "$dir/model.gguf") or die "copy: $!";
copy($NalarTest::MODEL, "$dir/w/model.gguf") or die "copy: $!";

open my $lease, '<', "$dir/w/model.gguf" or die "open: $!";
fcntl($lease, F_SETLEASE, F_WRLCK)
    or die "F_SETLEASE on $dir/w/model.gguf: $!";

start($t, <<'CONF');
working_directory %%PREFIX%%/w;
http {
    %%NALAR_HTTP%%
    nalar_model kjv /proc/self/cwd/model.gguf;
    nalar_threads 1;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $h = $t->get('/v1/health');
is($h->{status}, 503, 'health: 503 while loading');
is($h->{headers}{'retry-after'}, '1', 'health: Retry-After');
like($h->{body}, qr/"status":"loading"/, 'health says loading');

my $c = $t->post_json('/v1/completions', { prompt => 'x', max_tokens => 1 });
is($c->{status}, 503, 'a completion while loading: 503');
is($c->{json}{error}{code}, 'model_loading', 'code model_loading');
is($c->{headers}{'retry-after'}, '1', 'with Retry-After');

my $models = $t->get('/v1/models');
is($models->{status}, 200, '/v1/models answers while loading');

# let the worker open the file: the model loads

fcntl($lease, F_SETLEASE, F_UNLCK) or die "F_UNLCK: $!";
close $lease;

my $deadline = time + 30 * $NalarTest::SLOW;
do { sleep 0.05; $h = $t->get('/v1/health') }
    while $h->{status} != 200 && time < $deadline;
is($h->{status}, 200, 'health: 200 once loaded');

$c = $t->post_json('/v1/completions', { prompt => 'x', max_tokens => 3,
                                        ignore_eos => JSON::PP::true });
is($c->{status}, 200, 'the same completion request succeeds');
is($c->{json}{usage}{completion_tokens}, 3, 'and generates');

$t->check_log;

# an engine that cannot load: nginx -t passes (the master validates the
# good copy), the worker's copy is cut short, so its engine fails; the
# worker reports the failure instead of dying

my $t2 = NalarTest->new;
my $dir2 = $t2->dir;
mkdir "$dir2/w" or die "mkdir: $!";
copy($NalarTest::MODEL, "$dir2/model.gguf") or die "copy: $!";
truncate_copy($NalarTest::MODEL, "$dir2/w/model.gguf", 4096);

sub truncate_copy {
    my ($from, $to, $n) = @_;
    open my $in, '<:raw', $from or die "$from: $!";
    read($in, my $buf, $n) == $n or die "read $from: $!";
    open my $out, '>:raw', $to or die "$to: $!";
    print $out $buf;
    close $out or die "$to: $!";
}

my ($rc, $out) = do {
    $t2->write_conf(<<'CONF');
working_directory %%PREFIX%%/w;
http {
    %%NALAR_HTTP%%
    nalar_model kjv /proc/self/cwd/model.gguf;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF
    my $cwd = getcwd();
    chdir $dir2 or die "chdir: $!";
    my @r = $t2->test_conf;
    chdir $cwd or die "chdir: $!";
    @r;
};
is($rc, 0, 'nginx -t passes (the file it checks is whole)') or diag($out);

start($t2);

$deadline = time + 10 * $NalarTest::SLOW;
do { sleep 0.05; $h = $t2->get('/v1/health') }
    while $h->{body} !~ /failed|ready/ && time < $deadline;

is($h->{status}, 503, 'a model that failed to load: health 503');
like($h->{body}, qr/"status":"failed".*"error":"[^"]*truncated/,
     'with the reason') or diag($h->{body});
$c = $t2->post_json('/v1/completions', { prompt => 'x' });
is($c->{status}, 503, 'the API answers 503');
is($c->{json}{error}{code}, 'model_failed', 'and says why');
$t2->check_log;

done_testing;

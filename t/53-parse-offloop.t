#!/usr/bin/perl
# A large request body is parsed off the event loop: while its parse is
# held (nalar_test_hold_parse), a small request on the same worker is
# answered, and so is one of 100 KB (the second parse thread takes bodies
# up to 256 KiB); the large one is answered as it would be alone; bad JSON
# in a large body gets the 400 a small one gets; a client that leaves
# during the parse, a reload and a fast shutdown with a parse in flight
# leave no alert and no sanitizer report.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use Time::HiRes qw(sleep time);
use NalarTest 'hooks';    # nalar_test_*: the test build of the module

my $t = NalarTest->new->has_model;
my $dir = $t->dir;
my $release = "$dir/release";
my $held = "$release.held";

$t->write_conf(<<'CONF')->run;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_threads 1;
    nalar_test_hold_parse %%PREFIX%%/release;
    client_max_body_size 64m;
    log_format st '$request_uri $status';

    server {
        listen 127.0.0.1:%%PORT%%;
        access_log st.log st;
        location /v1/ { nalar_api; }
    }
}
CONF

my $json = NalarTest::json();
my $small = { prompt => 'In the beginning', max_tokens => 4,
              temperature => 0 };
# the same request, a large body (the user field is checked, then unused)
my $big = { %$small, user => 'x' x (2 << 20) };

sub wait_for {
    my ($what, $cond) = @_;
    my $deadline = time + 60 * $NalarTest::SLOW;
    while (time < $deadline) {
        return 1 if $cond->();
        sleep 0.02;
    }
    diag("timed out waiting for $what");
    return 0;
}

sub read_all {
    my ($s) = @_;
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
    return NalarTest::parse_response($raw);
}

sub touch { open my $fh, '>', $_[0] or die "$_[0]: $!"; close $fh }
sub rearm { unlink $release, $held }

my $alone = $t->post_json('/v1/completions', $small, timeout => 60);
is($alone->{status}, 200, 'the small request alone');
my $text = $alone->{json}{choices}[0]{text};

# 1. the loop is free while a large body is parsed

rearm();
my $s = $t->post_socket('/v1/completions', $json->encode($big));
ok(wait_for('the parse to be held', sub { -e $held }),
   'the large body\'s parse is held');

my $r = $t->post_json('/v1/completions', $small, timeout => 30);
is($r->{status}, 200, 'a small request is answered while the parse is held');
is($r->{json}{choices}[0]{text}, $text, '... with its text');

touch($release);
$r = read_all($s);
is($r->{status}, 200, 'the large body is answered once released');
my $j = eval { $json->decode($r->{body}) } || {};
is($j->{choices}[0]{text}, $text, '... as the small one alone');
is($j->{usage}{prompt_tokens}, $alone->{json}{usage}{prompt_tokens},
   '... with the same prompt tokens');

# 1b. a body of kilobytes is not parsed behind one of megabytes

rearm();
$s = $t->post_socket('/v1/completions', $json->encode($big));
ok(wait_for('the parse to be held', sub { -e $held }),
   'a 2 MiB body\'s parse is held');
$r = $t->post_json('/v1/completions', { %$small, user => 'x' x 100000 },
                   timeout => 30);
is($r->{status}, 200, 'a 100 KB body is answered meanwhile');
is($r->{json}{choices}[0]{text}, $text, '... with its text');
touch($release);
is(read_all($s)->{status}, 200, 'the 2 MiB body is answered once released');

# 2. bad JSON: the same error whatever the body's size

for my $case (['{"prompt": "a", ', 'truncated'],
              ['[1, 2, 3]', 'not an object'],
              ['{"prompt": "a", "prompt": "b"}', 'duplicate key'],
              ['{"prompt": "a", "n": "x"}', 'a bad field']) {
    my ($body, $name) = @$case;
    my $pad = ' ' x (1 << 20);
    my $bigbody = $body =~ /^\{/ ? "{$pad" . substr($body, 1)
                                 : "$pad$body";
    my $a = $t->request('POST', '/v1/completions', body => $body,
                        headers => { 'Content-Type' => 'application/json' });
    my $b = $t->request('POST', '/v1/completions', body => $bigbody,
                        headers => { 'Content-Type' => 'application/json' });
    my $ea = (eval { $json->decode($a->{body}) } || {})->{error} || {};
    my $eb = (eval { $json->decode($b->{body}) } || {})->{error} || {};
    is($a->{status}, 400, "$name: small body 400");
    is_deeply([ $b->{status}, @$eb{qw(type code param)} ],
              [ $a->{status}, @$ea{qw(type code param)} ],
              "$name: a large body gets the same status, type, code, param");
}

# 3. a client that leaves during the parse

rearm();
$s = $t->post_socket('/v1/completions', $json->encode($big));
ok(wait_for('the parse to be held', sub { -e $held }), 'held again');
close $s;
ok(wait_for('the 499', sub { $t->read_file('st.log') =~ m{ 499$}m }),
   'the request that left is logged 499');
touch($release);
ok(wait_for('the parse result', sub {
       $t->read_file('error.log') =~ /a request left while its body of \d+ bytes was parsed/
   }), 'its parse result is dropped');
$r = $t->post_json('/v1/completions', $small, timeout => 60);
is($r->{status}, 200, 'the worker serves on');

# 4. a reload with a parse in flight: the old worker answers it

rearm();
$s = $t->post_socket('/v1/completions', $json->encode($big));
ok(wait_for('the parse to be held', sub { -e $held }), 'held before reload');
$t->signal('HUP');
ok(wait_for('the reload', sub {
       $t->read_file('error.log') =~ /gracefully shutting down/
   }), 'the old worker is shutting down');
touch($release);
$r = read_all($s);
is($r->{status}, 200, 'the parse in flight is answered across the reload');
$j = eval { $json->decode($r->{body}) } || {};
is($j->{choices}[0]{text}, $text, '... with its text');

# 5. a fast shutdown with a parse in flight

rearm();
ok(wait_for('the new worker', sub {
       $t->post_json('/v1/completions', $small, timeout => 60)->{status} == 200
   }), 'the new worker serves');
$s = $t->post_socket('/v1/completions', $json->encode($big));
ok(wait_for('the parse to be held', sub { -e $held }), 'held before stop');
my $pid = $t->pid;
$t->signal('TERM');
ok(wait_for('nginx to exit', sub { !kill 0, $pid }), 'nginx exits');
$t->{running} = 0;
close $s;

$t->check_log;

done_testing();

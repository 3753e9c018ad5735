package NalarTest;

# A small harness for the nginx module tests: starts Debian's /usr/sbin/nginx
# with an inline configuration on a free loopback port (prefix in a temporary
# directory, the module loaded with load_module), talks HTTP to it with
# IO::Socket, and at the end checks that error.log holds no [alert], no
# [emerg] and no sanitizer report.
#
#   my $t = NalarTest->new->has_model->write_conf(<<'EOF')->run;
#   http {
#       %%NALAR_HTTP%%
#       server {
#           listen 127.0.0.1:%%PORT%%;
#           location /v1/ { nalar_api; }
#       }
#   }
#   EOF
#   my $r = $t->post_json('/v1/completions', {prompt => 'In the beginning'});
#
# Placeholders: %%PORT%%, %%PORT2%% (a second free port), %%ROOT%% (the
# repository), %%MODEL%% (the demo target model), %%DRAFT%%, %%PREFIX%%,
# %%NALAR_HTTP%% (the usual http-level lines: model, temp paths, types).

use strict;
use warnings;

use Cwd qw(abs_path);
use Fcntl qw(:flock);
use File::Spec;
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Socket ();
use IO::Select;
use JSON::PP;
use POSIX qw(WNOHANG);
use Scalar::Util qw(refaddr weaken);
use Test::More;
use Time::HiRes qw(sleep time);

our $ROOT = abs_path(dirname(__FILE__) . '/../..');

# The servers still running, to stop at exit.  A test file whose object
# outlives the main program (a named sub that uses it keeps it to global
# destruction) would otherwise reach DESTROY after File::Temp's END has
# removed its directory, pid file included, and leave nginx running.
# END blocks run last-compiled first, so this one runs before File::Temp's.
my %LIVE;

END {
    local $?;
    for my $t (values %LIVE) {
        $t->stop if defined $t && $t->{running};
    }
}
our $NGINX = $ENV{NALAR_NGINX} || '/usr/sbin/nginx';
our $MODULE = "$ROOT/build/module/ngx_nalar_module.so";

# NALAR_ASAN=1: the test build of the module (make module-asan: ASan,
# UBSan and the test hooks), with libasan preloaded into nginx; reports go
# to stderr, which nginx points at error.log, which check_log reads.
our $ENV_PREFIX = '';
our $SLOW = 1;          # time factor for waits: sanitized engines are slower
our $TEST_BUILD = 0;

sub use_test_build {
    return if $TEST_BUILD++;
    $SLOW = 10;
    $MODULE = "$ROOT/build/asan/module/ngx_nalar_module.so";
    my $asan = `gcc -print-file-name=libasan.so`;
    chomp $asan;
    $ENV_PREFIX = "LD_PRELOAD=$asan "
        . "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 "
        . "UBSAN_OPTIONS=print_stacktrace=1 ";
}

use_test_build() if $ENV{NALAR_ASAN};

# `use NalarTest 'hooks';`: the file configures a nalar_test_* directive,
# which only the test build of the module has (the production module
# rejects it as an unknown directive), so it runs with that build whatever
# NALAR_ASAN says.
sub import {
    my ($class, @what) = @_;
    for my $w (@what) {
        die "NalarTest: unknown import '$w'\n" unless $w eq 'hooks';
        use_test_build();
    }
}
our $MODEL = "$ROOT/models/nalar-kjv-target-f32.gguf";
our $DRAFT = "$ROOT/models/nalar-kjv-draft-f32.gguf";
our $JSON = JSON::PP->new->utf8->canonical->allow_nonref;

# A piece the file needs is missing.  Under CI=true it fails the file;
# so does a missing required piece (nginx, the module, the CLI, the demo
# model) wherever the build ran (build/ exists).  Otherwise the file is
# skipped: an optional program (optional => 1) on a developer's machine,
# or anything in a checkout that was never built.
sub missing {
    my ($what, %o) = @_;
    my $ci = ($ENV{CI} // '') eq 'true';

    plan(skip_all => $what)
        unless $ci || (!$o{optional} && -d "$ROOT/build");

    my $tb = Test::More->builder;
    plan(tests => 1) unless $tb->has_plan;
    fail("missing: $what");
    diag($ci ? 'CI=true: a missing piece fails'
             : "$ROOT/build exists: the build ran, so this must be there");
    exit 1;
}

sub new {
    my ($class, %opts) = @_;

    missing("$NGINX not found") unless -x $NGINX;
    missing("$MODULE not built (make module"
            . ($TEST_BUILD ? '-asan)' : ')')) unless -f $MODULE;

    my $dir = tempdir('nalar-test-XXXXXX', TMPDIR => 1,
                      CLEANUP => !$ENV{NALAR_TEST_KEEP});
    my $self = bless { dir => $dir, ports => [ free_port(), free_port() ],
                       %opts }, $class;
    diag("prefix $dir") if $ENV{NALAR_TEST_KEEP};
    return $self;
}

sub dir { $_[0]{dir} }
sub port { $_[0]{ports}[$_[1] // 0] }
sub root { $ROOT }

# Skips the whole file unless the demo model is there.
sub has_model {
    my ($self) = @_;
    missing("$MODEL missing") unless -f $MODEL;
    return $self;
}

# Skips unless a program is installed.
sub has_program {
    my ($self, $prog) = @_;
    my $found = grep { -x "$_/$prog" } split /:/, $ENV{PATH};
    missing("$prog not installed", optional => 1) unless $found;
    return $self;
}

# A self-signed certificate for localhost in the prefix (cert.pem,
# key.pem), for `ssl_certificate %%PREFIX%%/cert.pem`; skips the test
# where openssl cannot make one.
sub has_tls_cert {
    my ($self) = @_;
    $self->has_program('openssl');
    system("openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
           . "-subj /CN=localhost -keyout $self->{dir}/key.pem "
           . "-out $self->{dir}/cert.pem >/dev/null 2>&1") == 0
        or missing('openssl cannot make a certificate', optional => 1);
    return $self;
}

# Certificates of a test's own (mutual TLS): openssl commands run in the
# prefix, and the test is skipped where one fails.
sub openssl {
    my ($self, $cmd) = @_;
    system("cd $self->{dir} && ($cmd) >/dev/null 2>&1") == 0
        or missing("openssl failed: $cmd", optional => 1);
    return $self;
}

# A self-signed certificate NAME.pem, its key NAME.key, of subject SUBJ
# ("/CN=localhost"): a CA, a server, or a client no CA signed.
sub tls_self_signed {
    my ($self, $name, $subj) = @_;
    return $self->openssl("openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
                          . "-subj $subj -keyout $name.key -out $name.pem");
}

# A client certificate NAME.pem, its key NAME.key, of subject SUBJ, signed
# by the CA CA.pem (key CA.key).
sub tls_client_cert {
    my ($self, $name, $subj, $ca) = @_;
    return $self->openssl("openssl req -newkey rsa:2048 -nodes -subj $subj "
                          . "-keyout $name.key -out $name.csr && openssl x509 "
                          . "-req -in $name.csr -CA $ca.pem -CAkey $ca.key "
                          . "-CAcreateserial -days 2 -out $name.pem");
}

# A port nothing listens on, that no other test process holds: each port
# handed out is locked (flock on TMPDIR/nalar-test-ports/PORT) until this
# process ends, so that test files run in parallel (prove -j) never both
# take a port between choosing it and their nginx binding it.
my %PORT_LOCK;

sub free_port {
    my $dir = File::Spec->tmpdir . '/nalar-test-ports';
    mkdir $dir, 01777;

    for (1 .. 100) {
        my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                      LocalPort => 0, Proto => 'tcp',
                                      Listen => 1, ReuseAddr => 1)
            or die "cannot find a free port: $!";
        my $port = $s->sockport;
        close $s;
        next if $PORT_LOCK{$port};
        open my $fh, '>>', "$dir/$port" or die "$dir/$port: $!";
        if (flock($fh, LOCK_EX | LOCK_NB)) {
            $PORT_LOCK{$port} = $fh;
            return $port;
        }
        close $fh;
    }
    die "cannot find a free port: every one tried is held by another test";
}

sub nalar_http_lines {
    my ($self) = @_;
    return <<"EOF";
    client_body_temp_path  client_body_temp;
    proxy_temp_path        proxy_temp;
    fastcgi_temp_path      fastcgi_temp;
    uwsgi_temp_path        uwsgi_temp;
    scgi_temp_path         scgi_temp;
    access_log             access.log;
    default_type           application/octet-stream;
EOF
}

# Writes nginx.conf: the main-level lines every test needs, then the given
# text (an events block is added when the text has none).
sub write_conf {
    my ($self, $conf) = @_;
    my $dir = $self->{dir};

    my $main = <<"EOF";
load_module $MODULE;
daemon on;
master_process on;
worker_processes 1;
error_log $dir/error.log debug;
pid $dir/nginx.pid;
EOF

    # root can only serve as nobody: keep the demo model readable
    $main .= "user root;\n" if $> == 0;

    # a test may ask for more workers
    $main =~ s/^worker_processes 1;\n//m
        if $conf =~ /^\s*worker_processes\b/m;

    $main .= "events { worker_connections 4096; }\n"
        unless $conf =~ /^\s*events\b/m;

    $conf = $main . $conf;

    my %sub = (
        PORT => $self->port(0), PORT2 => $self->port(1), ROOT => $ROOT,
        MODEL => $MODEL, DRAFT => $DRAFT, PREFIX => $dir,
        NALAR_HTTP => $self->nalar_http_lines,
    );
    $conf =~ s/%%(\w+)%%/exists $sub{$1} ? $sub{$1} : die "unknown %%$1%%"/ge;

    $self->write_file('nginx.conf', $conf);
    $self->{conf} = $conf;
    return $self;
}

sub write_file {
    my ($self, $name, $data) = @_;
    open my $fh, '>', "$self->{dir}/$name" or die "$name: $!";
    print $fh $data;
    close $fh;
    return "$self->{dir}/$name";
}

sub read_file {
    my ($self, $name) = @_;
    my $path = $name =~ m{^/} ? $name : "$self->{dir}/$name";
    open my $fh, '<', $path or return '';
    local $/;
    my $data = <$fh>;
    close $fh;
    return $data;
}

# nginx -t with this configuration: (exit status, output).
sub test_conf {
    my ($self) = @_;
    my $out = `$ENV_PREFIX$NGINX -t -p $self->{dir}/ -c $self->{dir}/nginx.conf 2>&1`;
    return ($? >> 8, $out);
}

# Starts nginx and waits until it answers (and, unless told otherwise,
# until /v1/health says the models are ready); a server that never gets
# there fails the file, with the end of error.log.
sub run {
    my ($self, %opts) = @_;
    my $dir = $self->{dir};

    my $out = `$ENV_PREFIX$NGINX -p $dir/ -c $dir/nginx.conf 2>&1`;
    die "nginx failed to start: $out" if $?;

    $self->{running} = 1;
    $LIVE{refaddr $self} = $self;
    weaken($LIVE{refaddr $self});
    $self->wait_port($self->port(0));

    if (!exists $opts{health} || $opts{health}) {
        my $path = $opts{health} || '/v1/health';
        my $deadline = time + 30 * $SLOW;
        my $r;
        while (time < $deadline) {
            $r = $self->request('GET', $path);
            return $self if $r->{status} == 200;
            sleep 0.05;
        }
        $self->fail_file("$path did not answer 200 in " . 30 * $SLOW
                         . " s (last: $r->{status} "
                         . ($r->{body} // '') . ')');
    }
    return $self;
}

# Ends the file with a failure, naming the last lines of error.log.
sub fail_file {
    my ($self, $why) = @_;
    my @log = grep { /\[(emerg|alert|crit|error|warn|notice)\]/ }
              split /\n/, $self->read_file('error.log');
    splice @log, 0, @log - 20 if @log > 20;
    my $tb = Test::More->builder;
    plan(tests => 1) unless $tb->has_plan;
    fail($why);
    diag("error.log ends:\n" . join("\n", @log));
    $self->stop;
    exit 1;
}

sub wait_port {
    my ($self, $port) = @_;
    my $deadline = time + 10;
    while (time < $deadline) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                      PeerPort => $port, Proto => 'tcp');
        if ($s) { close $s; return 1; }
        sleep 0.02;
    }
    die "nginx is not listening on $port";
}

sub pid {
    my ($self) = @_;
    my $pid = $self->read_file('nginx.pid');
    chomp $pid;
    $self->{pid} = $pid if $pid;
    return $pid;
}

# Sends a signal to the master ("QUIT", "HUP", ...).
sub signal {
    my ($self, $sig) = @_;
    my $pid = $self->pid or return;
    kill $sig, $pid;
}

# Stops nginx gracefully and waits for the master to exit.
sub stop {
    my ($self) = @_;
    return $self unless $self->{running};
    delete $LIVE{refaddr $self};
    my $pid = $self->pid || $self->{pid};
    if ($pid) {
        kill 'QUIT', $pid;
        my $deadline = time + 30;
        while (time < $deadline && kill(0, $pid)) {
            sleep 0.05;
        }
        if (kill 0, $pid) {
            diag("nginx did not quit in 30 s; killing it");
            kill 'KILL', $pid;
        }
    }
    $self->{running} = 0;
    return $self;
}

# Kills the master and its workers with SIGKILL, as a crashed machine
# would go, and waits until none is left.
sub kill_hard {
    my ($self) = @_;
    my $master = $self->pid or return $self;
    my @pids = ($master);
    for my $stat (glob '/proc/[0-9]*/stat') {
        open my $fh, '<', $stat or next;
        my $line = <$fh> // '';
        close $fh;
        my ($pid, $ppid) = $line =~ /^(\d+) \(.*\) \S+ (\d+)/ or next;
        push @pids, $pid if $ppid == $master;
    }
    kill 'KILL', @pids;
    # gone, or a zombie nobody reaped yet, with every thread: a process
    # whose first thread is a zombie still holds its sockets while its
    # other threads exit
    my $alive = sub {
        for my $task (glob "/proc/$_[0]/task/*/stat") {
            open my $fh, '<', $task or next;
            my $line = <$fh> // '';
            return 1 if $line !~ /^\d+ \(.*\) [ZX]/;
        }
        return 0;
    };
    my $deadline = time + 30;
    while (time < $deadline && grep { $alive->($_) } @pids) {
        sleep 0.02;
    }
    $self->{running} = 0;
    return $self;
}

# The error log must hold no [alert], no [emerg] and no sanitizer report.
sub check_log {
    my ($self) = @_;
    $self->stop;
    my $log = $self->read_file('error.log');
    my @bad = grep { /\[(alert|emerg|crit)\]|AddressSanitizer|LeakSanitizer|runtime error:/ }
              split /\n/, $log;
    ok(!@bad, 'error.log: no alert, emerg, crit or sanitizer report')
        or diag(join "\n", @bad[0 .. ($#bad < 20 ? $#bad : 20)]);
}

sub DESTROY {
    my ($self) = @_;
    local $?;
    $self->stop if $self->{running};
}

# --- HTTP ---------------------------------------------------------------

# One request on its own connection.  Returns
#   { status, headers => { lowercase name => value }, body, raw }.
# Options: body, headers => {..}, json => ref (sent as JSON), port,
# timeout, on_data => sub { my ($chunk_so_far) = @_; return 0 to stop },
# local_addr (the address to connect from, e.g. '127.0.0.2').
sub request {
    my ($self, $method, $path, %o) = @_;
    my $port = $o{port} || $self->port(0);

    my $body = $o{body};
    my %h = (%{ $o{headers} || {} });
    if (exists $o{json}) {
        $body = ref $o{json} ? $JSON->encode($o{json}) : $o{json};
        $h{'Content-Type'} //= 'application/json';
    }

    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp', Timeout => 10,
                                  $o{local_addr}
                                  ? (LocalAddr => $o{local_addr}) : ())
        or return { status => 0, error => "connect: $!" };

    my $req = "$method $path HTTP/1.1\r\nHost: localhost\r\n"
            . "Connection: close\r\n";
    $req .= "$_: $h{$_}\r\n" for sort keys %h;
    $req .= "Content-Length: " . length($body) . "\r\n" if defined $body;
    $req .= "\r\n";
    $req .= $body if defined $body;

    $s->syswrite($req);

    my $raw = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + ($o{timeout} || 600);   # a backstop, not a bound
    while (time < $deadline) {
        last unless $sel->can_read($deadline - time);
        my $n = $s->sysread(my $buf, 65536);
        last unless $n;
        $raw .= $buf;
        if ($o{on_data} && !$o{on_data}->($raw)) {
            close $s;
            return { status => 0, aborted => 1, raw => $raw };
        }
    }
    close $s;

    return parse_response($raw);
}

# A socket on which `body` (JSON) was POSTed to `path` with Connection:
# close, for tests that read a response at their own pace or hang up
# mid-way.  rcvbuf => bytes: a small receive buffer, set before
# connecting so that the TCP window is negotiated with it.
sub post_socket {
    my ($self, $path, $body, %o) = @_;
    my $s = IO::Socket::INET->new(Proto => 'tcp') or die "socket: $!";
    if ($o{rcvbuf}) {
        setsockopt($s, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(),
                   pack('i', $o{rcvbuf})) or die "setsockopt: $!";
    }
    $s->connect(Socket::pack_sockaddr_in($self->port,
                                         Socket::inet_aton('127.0.0.1')))
        or die "connect: $!";
    $s->syswrite("POST $path HTTP/1.1\r\nHost: localhost\r\n"
                 . "Connection: close\r\nContent-Type: application/json\r\n"
                 . 'Content-Length: ' . length($body) . "\r\n\r\n$body");
    return $s;
}

sub parse_response {
    my ($raw) = @_;
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    return { status => 0, raw => $raw } unless defined $head;

    my ($status_line, @lines) = split /\r\n/, $head;
    my ($status) = $status_line =~ m{^HTTP/\d\.\d (\d+)};
    my %h;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
        $k = lc $k;
        $h{$k} = exists $h{$k} ? "$h{$k}, $v" : $v;
    }

    $body //= '';
    if (($h{'transfer-encoding'} || '') =~ /chunked/i) {
        my $out = '';
        while ($body =~ s/^([0-9a-fA-F]+)[^\r\n]*\r\n//) {
            my $len = hex $1;
            last if $len == 0;
            $out .= substr($body, 0, $len, '');
            $body =~ s/^\r\n//;
        }
        $body = $out;
    }

    return { status => $status || 0, headers => \%h, body => $body,
             raw => $raw };
}

sub get {
    my ($self, $path, %o) = @_;
    return $self->request('GET', $path, %o);
}

# POST a Perl structure as JSON; ->{json} holds the decoded answer.
sub post_json {
    my ($self, $path, $data, %o) = @_;
    my $r = $self->request('POST', $path, json => $data, %o);
    $r->{json} = eval { $JSON->decode($r->{body}) } if $r->{body};
    return $r;
}

# The data: events of an SSE body: decoded JSON objects and the literal
# "[DONE]"; comments are counted in ->{comments} of the list's owner.
sub sse_events {
    my ($body) = @_;
    my @ev;
    for my $block (split /\n\n/, $body) {
        next if $block =~ /^:/;
        my ($data) = $block =~ /^data: (.*)$/s or next;
        push @ev, $data eq '[DONE]' ? $data : $JSON->decode($data);
    }
    return @ev;
}

# The text of a completion stream's first choice: its SSE body's events
# joined, or undef unless the stream ended with [DONE].
sub stream_text {
    my ($body) = @_;
    my @ev = sse_events($body // '');
    return undef unless @ev && $ev[-1] eq '[DONE]';
    return join '', map { $_->{choices}[0]{text} // '' } @ev[0 .. $#ev - 1];
}

# the same, from a raw HTTP/1.1 response carrying the stream
sub raw_stream_text { stream_text(parse_response($_[0])->{body}) }

sub json { $JSON }

# Prometheus text to { 'name{labels}' => value }.
sub metrics {
    my ($self, $path) = @_;
    my $r = $self->get($path || '/metrics');
    my %m;
    for (split /\n/, $r->{body} || '') {
        next if /^#/;
        my ($k, $v) = /^(\S+)\s+(\S+)$/ or next;
        $m{$k} = $v;
    }
    return \%m;
}

# --- references from the CLI ----------------------------------------------

# Greedy ids of `nalar generate` for a prompt (the oracle the server must
# equal token for token); kv_type => 'f16' names the KV cache's type.
sub reference_ids {
    my ($self, $prompt, $n, %o) = @_;
    my $model = $o{model} || $MODEL;
    my $cli = "$ROOT/build/nalar";
    die "$cli not built" unless -x $cli;
    my @cmd = ($cli, 'generate', '-m', $model, '-p', $prompt, '-n', $n,
               '--temp', '0', '--ids');
    push @cmd, '--ignore-eos' if $o{ignore_eos};
    push @cmd, '--kv-type', $o{kv_type} if $o{kv_type};
    open my $fh, '-|', @cmd or die "$cli: $!";
    local $/;
    my $out = <$fh>;
    close $fh;
    return [ split ' ', $out ];
}

sub reference_text {
    my ($self, $prompt, $n, %o) = @_;
    my $model = $o{model} || $MODEL;
    my $cli = "$ROOT/build/nalar";
    my @cmd = ($cli, 'generate', '-m', $model, '-p', $prompt, '-n', $n,
               '--temp', '0');
    push @cmd, '--ignore-eos' if $o{ignore_eos};
    push @cmd, '--stop', $_ for @{ $o{stop} || [] };
    open my $fh, '-|', @cmd or die "$cli: $!";
    local $/;
    my $out = <$fh>;
    close $fh;
    $out =~ s/\n\z//;
    return $out;
}

# `nalar tokenize --special`: ids with control tokens parsed, BOS added.
sub tokenize_special {
    my ($self, $text) = @_;
    open my $fh, '-|', "$ROOT/build/nalar", 'tokenize', '-m', $MODEL,
        '--special', $text or die "nalar tokenize: $!";
    local $/;
    my $out = <$fh>;
    close $fh;
    return [ map { 0 + $_ } split ' ', $out ];
}

sub has_cli {
    my ($self) = @_;
    missing("$ROOT/build/nalar not built") unless -x "$ROOT/build/nalar";
    return $self;
}

# Runs a sub in a child process; returns the pid (for concurrent clients).
sub fork_client {
    my ($code) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my $rc = eval { $code->(); 1 } ? 0 : 1;
        print STDERR "# $@" if $rc;
        POSIX::_exit($rc);
    }
    return $pid;
}

1;

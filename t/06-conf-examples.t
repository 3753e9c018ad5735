#!/usr/bin/perl
# The shipped configurations load: `nginx -t` accepts conf.example (what
# `make run` serves), and conf.example.node and conf.example.cluster (what
# `make run-cluster` serves), with the module built here and each file's
# relative paths resolved as the run scripts resolve them (prefixes under
# build/, models beside the file, the cluster's edge key made as `make
# run-cluster` makes it when absent).  A directive renamed or dropped in
# the module without the example following it fails here.  The run
# scripts' copies with PORT substituted load too.
use strict;
use warnings;
use Test::More;
use File::Path qw(make_path remove_tree);
use Cwd qw(getcwd);
use lib 't/lib';
use NalarTest;

my $root = getcwd();
NalarTest::missing('build/module/ngx_nalar_module.so not built')
    unless -f "$root/build/module/ngx_nalar_module.so";
NalarTest::missing('models/ missing')
    unless -f "$root/models/nalar-kjv-target-f32.gguf";

my $nginx = $NalarTest::NGINX;

# the key conf.example.cluster and conf.example.node share, as
# scripts/run-cluster.sh makes it
my $key = "$root/build/cluster/edge.key";
unless (-f $key) {
    make_path("$root/build/cluster");
    system("umask 077 && openssl rand -hex 32 > $key.new && mv $key.new $key")
        == 0 or die "openssl rand: $?";
}
my $base = "$root/build/conf-examples";
remove_tree($base);

# conf.example loads ../module/... from its prefix (build/run/ in `make
# run`); the cluster files load ../../module/... (build/cluster/NAME/)
my @cases = (
    [ 'conf.example',         "$root/build/conf-examples-run" ],
    [ 'conf.example.node',    "$base/node" ],
    [ 'conf.example.cluster', "$base/edge" ],
);

for my $case (@cases) {
    my ($conf, $prefix) = @$case;
    remove_tree($prefix);
    make_path("$prefix/logs");
    symlink("$root/html", "$prefix/html");
    my $out = `$nginx -t -p $prefix/ -c $root/$conf 2>&1`;
    my $rc = $? >> 8;
    is($rc, 0, "nginx -t accepts $conf") or diag($out);
    like($out, qr/test is successful/, "$conf: nginx says the test is "
         . 'successful');
    unlike($out, qr/\[(?:emerg|alert|crit)\]/, "$conf: no emerg, alert or "
           . 'crit') or diag($out);
    remove_tree($prefix);
}
remove_tree($base);

# PORT=N: the run scripts serve copies of the examples with the ports
# substituted (the edge on N, the nodes on N+1..N+3), which nginx -t
# accepts (it binds nothing), and leave the tracked files as they were
sub slurp { open my $fh, '<', $_[0] or return ''; local $/; <$fh> }
my %before = map { $_ => slurp("$root/$_") }
             qw(conf.example conf.example.node conf.example.cluster);
my $port = 9090;
my $out = `PORT=$port sh $root/scripts/run.sh --check 2>&1`;
is($? >> 8, 0, "PORT=$port scripts/run.sh --check passes") or diag($out);
my $conf = slurp("$root/build/run/nginx.conf");
like($conf, qr/^\s*listen\s+127\.0\.0\.1:$port;/m,
     "run.sh: build/run/nginx.conf listens on $port");
unlike($conf, qr/:8080\b/, 'run.sh: ... and nowhere on 8080');

$out = `PORT=$port sh $root/scripts/run-cluster.sh --check 2>&1`;
is($? >> 8, 0, "PORT=$port scripts/run-cluster.sh --check passes")
    or diag($out);
$conf = slurp("$root/build/cluster/edge/nginx.conf");
like($conf, qr/^\s*listen\s+127\.0\.0\.1:$port;/m,
     "run-cluster.sh: the edge listens on $port");
is(join(',', $conf =~ /^\s*server\s+127\.0\.0\.1:(\d+)/mg),
   join(',', map { $port + $_ } 1 .. 3),
   'run-cluster.sh: the edge routes to the nodes on PORT+1..PORT+3');
for my $n (1 .. 3) {
    like(slurp("$root/build/cluster/node$n/nginx.conf"),
         qr/^\s*listen\s+127\.0\.0\.1:@{[$port + $n]};/m,
         "run-cluster.sh: node$n listens on " . ($port + $n));
}
is_deeply({ map { $_ => slurp("$root/$_") } keys %before }, \%before,
          'the tracked conf.example* files are unchanged');
$out = `PORT=80x sh $root/scripts/run.sh --check 2>&1`;
ok($? >> 8 == 2 && $out =~ /PORT must be a number/,
   "run.sh refuses PORT=80x: $out");

done_testing();

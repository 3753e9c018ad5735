#!/usr/bin/perl
# The shipped configurations load: `nginx -t` accepts conf.example (what
# `make run` serves), and conf.example.node and conf.example.cluster (what
# `make run-cluster` serves), with the module built here and each file's
# relative paths resolved as the run scripts resolve them (prefixes under
# build/, models beside the file, the cluster's edge key made as `make
# run-cluster` makes it when absent).  A directive renamed or dropped in
# the module without the example following it fails here.
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

done_testing();

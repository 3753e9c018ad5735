#!/usr/bin/perl
# README.md's minimal nginx.conf (the block between the "minimal
# nginx.conf: begin" and "end" markers) is a whole configuration that
# `nginx -t` accepts once its two paths point at the module built here and
# the demo model: a newcomer who copies it gets a server that starts.
use strict;
use warnings;
use Test::More;
use File::Path qw(make_path remove_tree);
use File::Temp qw(tempdir);
use Cwd qw(getcwd);
use lib 't/lib';
use NalarTest;

my $root = getcwd();
my $module = "$root/build/module/ngx_nalar_module.so";
my $model = "$root/models/nalar-kjv-target-f32.gguf";
NalarTest::missing('build/module/ngx_nalar_module.so not built')
    unless -f $module;

open(my $fh, '<', 'README.md') or die "README.md: $!";
my $readme = do { local $/; <$fh> };
close $fh;

my ($conf) = $readme =~ m{<!-- minimal nginx\.conf: begin -->\n```nginx\n(.*?)```\n<!-- minimal nginx\.conf: end -->}s;
ok(defined $conf, 'README.md has the delimited minimal nginx.conf')
    or BAIL_OUT('no minimal nginx.conf in README.md');

my $n = ($conf =~ s{/path/to/ngx_nalar_module\.so}{$module}g)
      + ($conf =~ s{/path/to/nalar-kjv-target-f32\.gguf}{$model}g);
is($n, 2, 'the two paths to fill in are the module and the model');

my $dir = tempdir('nalar-readme-conf-XXXXXX', TMPDIR => 1, CLEANUP => 1);
make_path("$dir/logs");
open(my $out, '>', "$dir/nginx.conf") or die "$dir/nginx.conf: $!";
print $out $conf;
close $out;

my $res = `$NalarTest::NGINX -t -p $dir/ -c $dir/nginx.conf 2>&1`;
is($? >> 8, 0, 'nginx -t accepts the minimal nginx.conf') or diag($res);
unlike($res, qr/\[(?:emerg|alert|crit)\]/, 'no emerg, alert or crit')
    or diag($res);

done_testing();

#!/usr/bin/perl
# The layers: calls and includes go one way (glue -> api -> engine), and
# the glue's files call each other without a cycle (scripts/layers.pl).
# The checker is first shown trees that break each rule, so that a checker
# that no longer sees a violation fails here too.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);
use File::Path qw(make_path);

my $script = 'scripts/layers.pl';

sub tree {
    my (%files) = @_;
    my $dir = tempdir(CLEANUP => 1);
    for my $f (keys %files) {
        my ($d) = $f =~ m{^(.*)/[^/]+$};
        make_path("$dir/$d") if defined $d;
        open(my $fh, '>', "$dir/$f") or die "$dir/$f: $!";
        print $fh $files{$f};
        close $fh;
    }
    return $dir;
}

sub check {
    my ($dir) = @_;
    my $out = `perl $script $dir 2>&1`;
    return ($? >> 8, $out);
}

# a clean tree passes
my ($rc, $out) = check(tree(
    'ngx_nalar_module.c' => "#include \"ngx_nalar_module.h\"\n"
                            . "static int\nf(void)\n{\n    return ngx_a();\n}\n",
    'nginx/ngx_nalar_module.h' => "int ngx_a(void);\n",
    'nginx/ngx_nalar_a.c' => "int\nngx_a(void)\n{\n    return api_b();\n}\n",
    'api/b.h' => "int api_b(void);\n",
    'api/b.c' => "#include \"b.h\"\n#include \"engine.h\"\n"
                 . "int api_b(void)\n{\n    return eng_c();\n}\n",
    'src/engine.h' => "int eng_c(void);\n",
    'src/engine.c' => "#include \"engine.h\"\nint eng_c(void)\n{\n    return 0;\n}\n",
));
is($rc, 0, 'a tree whose calls go down passes') or diag($out);

# the engine includes a protocol header
($rc, $out) = check(tree(
    'api/b.h' => "int api_b(void);\n",
    'src/engine.c' => "#include \"b.h\"\nint eng_c(void)\n{\n    return 0;\n}\n",
));
is($rc, 1, 'src/ including an api/ header fails');
like($out, qr/src\/engine\.c \(engine\) includes b\.h \(api\)/, '... and says so');

# the engine calls the protocol layer (a word in a comment does not count)
($rc, $out) = check(tree(
    'api/b.c' => "int\napi_b(void)\n{\n    return 0;\n}\n",
    'src/engine.c' => "/* api_b */\nint\neng_c(void)\n{\n    return api_b();\n}\n",
));
is($rc, 1, 'src/ calling api/ fails');
like($out, qr/src\/engine\.c \(engine\) names api_b in api\/b\.c \(api\)/,
     '... and says so');
($rc, $out) = check(tree(
    'api/b.c' => "int\napi_b(void)\n{\n    return 0;\n}\n",
    'src/engine.c' => "/* api_b */\nint\neng_c(void)\n{\n    return 0;\n}\n",
));
is($rc, 0, 'a name in a comment is not a call') or diag($out);

# the protocol layer includes nginx
($rc, $out) = check(tree(
    'api/b.c' => "#include <ngx_core.h>\nint\napi_b(void)\n{\n    return 0;\n}\n",
));
is($rc, 1, 'api/ including an ngx_* header fails');
like($out, qr/api\/b\.c \(api\) includes ngx_core\.h \(glue\)/, '... and says so');

# the glue reads a field of the model
($rc, $out) = check(tree(
    'nginx/ngx_nalar_a.c' => "int\nngx_a(nalar_model *m)\n{\n"
                             . "    return m->cfg.n_ctx;\n}\n",
));
is($rc, 1, 'the glue reading the model\'s fields fails');
like($out, qr/ngx_nalar_a\.c \(glue\) reads the model's field cfg/,
     '... and says so');

# a cycle in the glue: a -> b -> c -> a
($rc, $out) = check(tree(
    'nginx/ngx_nalar_a.c' => "int\nngx_a(void)\n{\n    return ngx_b();\n}\n",
    'nginx/ngx_nalar_b.c' => "int\nngx_b(void)\n{\n    return ngx_c();\n}\n",
    'nginx/ngx_nalar_c.c' => "int\nngx_c(void)\n{\n    return ngx_a();\n}\n",
));
is($rc, 1, 'a cycle in the glue fails');
like($out, qr/cycle: nginx\/ngx_nalar_a\.c nginx\/ngx_nalar_b\.c nginx\/ngx_nalar_c\.c/,
     '... and names its files');

# a static function of the same name elsewhere is no edge
($rc, $out) = check(tree(
    'nginx/ngx_nalar_a.c' => "int\nngx_a(void)\n{\n    return ngx_b();\n}\n",
    'nginx/ngx_nalar_b.c' => "int\nngx_b(void)\n{\n    return 0;\n}\n"
                             . "static int\nngx_a(void)\n{\n    return 1;\n}\n",
));
is($rc, 0, 'a file-local function is not a call into the file') or diag($out);

# this tree
($rc, $out) = check('.');
is($rc, 0, 'Nalar keeps its layers, and its glue has no cycle')
    or diag($out);

done_testing();

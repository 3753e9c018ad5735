#!/usr/bin/perl
# The layers of Nalar, checked over the sources:
#
#   glue    ngx_nalar_module.c, nginx/      (nginx)
#   api     api/                            (the protocol layer, no nginx)
#   engine  src/ and kernels/               (the engine and its backends,
#                                            which implement src/backend.h)
#
# Calls and includes go one way, down that list.  A file of a lower layer
# that includes a header of a higher one (src/ including api/ or ngx_*
# headers, api/ including ngx_* headers) or names a function defined in a
# higher one is a violation; so is the glue reading the model's fields
# (->gguf, ->cfg, ->tok) where src/model.h has functions for them.
# Inside the glue, the files' call graph (file A names a function that
# file B defines) must have no cycle: a lower file reaches a higher one
# only through a pointer the higher one hands it.
#
#   perl scripts/layers.pl [-v] [ROOT]
#
# prints each violation and each cycle (with -v, the glue's call graph
# too) and exits 1 if there is any, 0 otherwise.  t/07-layers.t runs it.
use strict;
use warnings;

my $verbose = 0;
if (@ARGV && $ARGV[0] eq '-v') {
    $verbose = 1;
    shift @ARGV;
}
my $root = shift(@ARGV) // '.';
chdir $root or die "$root: $!\n";

my %rank = (engine => 1, api => 2, glue => 3);

sub layer {
    my ($f) = @_;
    return 'glue' if $f eq 'ngx_nalar_module.c' || $f =~ m{^nginx/};
    return 'api' if $f =~ m{^api/};
    return 'engine' if $f =~ m{^src/} || $f =~ m{^kernels/};
    return undef;
}

my @files = grep { -f $_ } ('ngx_nalar_module.c',
    glob('nginx/*.[ch]'), glob('api/*.[ch]'), glob('src/*.[ch]'),
    glob('kernels/*/*.[ch]'), glob('kernels/*/*.cu'),
    glob('kernels/*/*.cuh'));

# the text of a file without comments, string and character literals
sub code {
    my ($f) = @_;
    open(my $fh, '<', $f) or die "$f: $!\n";
    local $/;
    my $s = <$fh>;
    close $fh;
    $s =~ s{(/\*.*?\*/)|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'}
           { defined $1 ? ' ' : ($& =~ m{^/} ? '' : '""') }gse;
    return $s;
}

# the functions each file defines, with external linkage (a static one
# cannot be named from another file)
my (%defined_in, %local, %code);
for my $f (@files) {
    my $text = code($f);
    $code{$f} = $text;
    next unless $f =~ /\.c$|\.cu$/;
    # a definition: a name and its parameters followed by a body, at file
    # scope; nginx puts the name at the start of its line, the engine
    # after its type
    while ($text =~ m{^((?:[A-Za-z_][\w \t\*]*?[\s\*])?)([A-Za-z_]\w*)
                      \s*\([^;{}]*\)\s*\{}gmx) {
        my ($type, $name) = ($1, $2);
        next if $name =~ /^(if|for|while|switch|return|sizeof)$/;
        my $start = $-[0];
        my $before = substr($text, 0, $start);
        # nginx style: the type on the line above
        my ($prev) = $before =~ /([^\n]*)\n\z/;
        $prev //= '';
        my $static = ($type =~ /\bstatic\b/ || $prev =~ /^\s*static\b/);
        if ($static) {
            $local{$f}{$name} = 1;
            next;
        }
        $defined_in{$name} //= $f;
    }
}

my (@violations, %edges);

for my $f (@files) {
    my $lf = layer($f);
    my $text = $code{$f};

    # includes (from the file itself, before comments were dropped)
    open(my $fh, '<', $f) or die "$f: $!\n";
    while (my $line = <$fh>) {
        next unless $line =~ /^\s*#\s*include\s*[<"]([^>"]+)[>"]/;
        my $h = $1;
        my $lh;
        if ($h =~ /^ngx_/) {
            $lh = 'glue';
        } elsif (-f "api/$h") {
            $lh = 'api';
        } elsif (-f "src/$h") {
            $lh = 'engine';
        }
        next unless defined $lh;
        # a header found in several layers counts as the lowest
        if ($lh ne 'engine' && -f "src/$h") {
            $lh = 'engine';
        }
        if ($rank{$lh} > $rank{$lf}) {
            push @violations, "$f ($lf) includes $h ($lh)";
        }
    }
    close $fh;

    # the model's fields, read through src/model.h's functions instead
    if ($lf eq 'glue') {
        while ($text =~ /->(gguf|cfg|tok)\b/g) {
            push @violations, "$f ($lf) reads the model's field $1";
        }
    }

    # names of functions defined elsewhere
    my %seen;
    while ($text =~ /\b([A-Za-z_]\w*)\b/g) {
        my $name = $1;
        my $g = $defined_in{$name};
        next unless defined $g && $g ne $f && !$local{$f}{$name}
                    && !$seen{$name}++;
        my $lg = layer($g);
        if ($rank{$lg} > $rank{$lf}) {
            push @violations, "$f ($lf) names $name in $g ($lg)";
        }
        if ($lf eq 'glue' && $lg eq 'glue' && $f =~ /\.c$/) {
            $edges{$f}{$g}{$name} = 1;
        }
    }
}

# Tarjan's strongly connected components over the glue's call graph
my @nodes = sort keys %{{ map { $_ => 1 } keys %edges,
                                  map { keys %$_ } values %edges }};
my ($index, @stack, %on, %idx, %low, @sccs) = (0);

sub strong {
    my ($v) = @_;
    $idx{$v} = $low{$v} = $index++;
    push @stack, $v;
    $on{$v} = 1;
    for my $w (sort keys %{ $edges{$v} // {} }) {
        if (!defined $idx{$w}) {
            strong($w);
            $low{$v} = $low{$w} if $low{$w} < $low{$v};
        } elsif ($on{$w}) {
            $low{$v} = $idx{$w} if $idx{$w} < $low{$v};
        }
    }
    if ($low{$v} == $idx{$v}) {
        my @c;
        my $w;
        do {
            $w = pop @stack;
            $on{$w} = 0;
            push @c, $w;
        } while ($w ne $v);
        push @sccs, [sort @c] if @c > 1;
    }
}

for my $v (@nodes) {
    strong($v) unless defined $idx{$v};
}

if ($verbose) {
    print "glue call graph (file -> file: functions named)\n";
    for my $f (sort keys %edges) {
        for my $g (sort keys %{ $edges{$f} }) {
            print "  $f -> $g: ", join(' ', sort keys %{ $edges{$f}{$g} }),
                  "\n";
        }
    }
}

for my $v (@violations) {
    print "layer: $v\n";
}
for my $c (@sccs) {
    my %in = map { $_ => 1 } @$c;
    print "cycle: ", join(' ', @$c), "\n";
    for my $f (@$c) {
        for my $g (sort keys %{ $edges{$f} }) {
            next unless $in{$g};
            print "  $f -> $g: ", join(' ', sort keys %{ $edges{$f}{$g} }),
                  "\n";
        }
    }
}
printf "%d layer violations, %d cycles in the glue\n",
       scalar(@violations), scalar(@sccs);
exit((@violations || @sccs) ? 1 : 0);

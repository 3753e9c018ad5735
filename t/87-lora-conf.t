#!/usr/bin/perl
# The LoRA directives' mistakes fail `nginx -t`, each with an emerg naming
# the directive, the adapter, the file where one is read and the reason:
# an unknown or missing base, a name already taken, a missing file, an
# adapter made for another model's shapes, a truncated file, a GGUF that
# is not an adapter, a bad scale or parameter, and nalar_lora_allow's
# mistakes.  A good configuration passes.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model->has_cli;
my $dir = $t->dir;
my $cli = $t->root . '/build/nalar';

sub mk {
    my ($name, $base, $seed) = @_;
    my $out = `$cli mkmodel --lora-of $base --rank 4 --seed $seed -o $dir/$name 2>&1`;
    $? == 0 or BAIL_OUT("nalar mkmodel --lora-of failed: $out");
}

mk('good.gguf', $NalarTest::MODEL, 1);
mk('draft.gguf', $NalarTest::DRAFT, 2);    # the draft's shapes, not kjv's

# the good adapter cut in the middle of its tensors' bytes
my $good = $t->read_file('good.gguf');
$t->write_file('truncated.gguf', substr($good, 0, int(length($good) / 2)));

sub conf {
    my ($lines, $loc) = @_;
    $loc //= '';
    $t->write_conf(<<"CONF");
http {
    %%NALAR_HTTP%%
    $lines
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { $loc nalar_api; }
    }
}
CONF
    return $t->test_conf;
}

my ($rc, $out) = conf("nalar_model kjv %%MODEL%%;\n"
                      . "    nalar_lora good good.gguf base=kjv scale=0.5;\n"
                      . "    nalar_lora good2 %%PREFIX%%/good.gguf;",
                      'nalar_lora_allow good; nalar_adapter $arg_a;');
is($rc, 0, 'nginx -t passes a good configuration') or diag($out);

# two bases, each with adapters given in turn: each checked against its
# own base (each base is opened once for all of its adapters)
($rc, $out) = conf("nalar_model kjv %%MODEL%%;\n"
                   . "    nalar_model d %%DRAFT%%;\n"
                   . "    nalar_lora a good.gguf base=kjv;\n"
                   . "    nalar_lora b draft.gguf base=d;\n"
                   . "    nalar_lora c good.gguf base=kjv;\n"
                   . "    nalar_lora e draft.gguf base=d;");
is($rc, 0, 'nginx -t passes adapters of two bases, interleaved')
    or diag($out);

my @cases = (
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf base=nope;",
      qr/\[emerg\].*nalar_lora "a": unknown base model "nope"/,
      'an unknown base model' ],
    [ "nalar_lora a good.gguf;\n    nalar_model kjv %%MODEL%%;",
      qr/\[emerg\].*nalar_lora "a": no nalar_model is configured before it/,
      'no base model configured before it' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf;\n"
      . "    nalar_lora a good.gguf;",
      qr/\[emerg\].*"a" is already the name of a nalar_lora/,
      'a duplicate adapter name' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora kjv good.gguf;",
      qr/\[emerg\].*"kjv" is already the name of a nalar_model/,
      'an adapter named as a model' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf;\n"
      . "    nalar_model a %%MODEL%%;",
      qr/\[emerg\].*"a" is already the name of a nalar_lora/,
      'a model named as an adapter' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a missing.gguf;",
      qr/\[emerg\].*nalar_lora "a" \(base "kjv"\): \S*missing\.gguf: No such file/,
      'a missing file' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a draft.gguf;",
      qr/\[emerg\].*nalar_lora "a" \(base "kjv"\): \S*draft\.gguf: .*base matrix/,
      'an adapter made for another model\'s shapes' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf;\n"
      . "    nalar_lora b draft.gguf;",
      qr/\[emerg\].*nalar_lora "b" \(base "kjv"\): \S*draft\.gguf: .*base matrix/,
      'a second adapter of a base, made for another model' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a truncated.gguf;",
      qr/\[emerg\].*nalar_lora "a" \(base "kjv"\): \S*truncated\.gguf: .*(end of file|truncated)/,
      'a truncated adapter' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a %%MODEL%%;",
      qr/\[emerg\].*nalar_lora "a" \(base "kjv"\): \S*nalar-kjv-target\S*: general\.type/,
      'a GGUF that is not an adapter (the model itself)' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf scale=0;",
      qr/\[emerg\].*nalar_lora "a": invalid "scale=0"/, 'scale 0' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf scale=-1;",
      qr/\[emerg\].*nalar_lora "a": invalid "scale=-1"/, 'a negative scale' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf scale=inf;",
      qr/\[emerg\].*nalar_lora "a": invalid "scale=inf"/, 'an infinite scale' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf scale=1e39;",
      qr/\[emerg\].*nalar_lora "a": invalid "scale=1e39"/,
      'a scale no float holds' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf scale=1e-50;",
      qr/\[emerg\].*nalar_lora "a": invalid "scale=1e-50"/,
      'a scale a float rounds to 0' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora all good.gguf;",
      qr/\[emerg\].*nalar_lora "all": "all" and "none" are nalar_lora_allow/,
      'an adapter named all' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora none good.gguf;",
      qr/\[emerg\].*nalar_lora "none": "all" and "none" are nalar_lora_allow/,
      'an adapter named none' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf scale=1x;",
      qr/\[emerg\].*nalar_lora "a": invalid "scale=1x"/, 'a scale with junk' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora 'a\"b' good.gguf;",
      qr/\[emerg\].*nalar_lora "a"b": a name may not hold quotes/,
      'a name with a quote' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf;\n"
      . "    nalar_backend cuda;",
      qr/\[emerg\].*"nalar_lora" needs "nalar_backend cpu": the cuda backend/,
      'an adapter on the CUDA backend' ],
    [ "nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf rank=2;",
      qr/\[emerg\].*nalar_lora "a": invalid parameter "rank=2"/,
      'an unknown parameter' ],
);

for my $c (@cases) {
    ($rc, $out) = conf($c->[0]);
    isnt($rc, 0, "nginx -t fails: $c->[2]");
    like($out, $c->[1], "... and says why: $c->[2]") or diag($out);
}

my @allow = (
    [ 'nalar_lora_allow b;', qr/\[emerg\].*nalar_lora_allow: "b" is not a nalar_lora/,
      'nalar_lora_allow naming no adapter' ],
    [ 'nalar_lora_allow all a;', qr/\[emerg\].*nalar_lora_allow: "all" stands alone/,
      'nalar_lora_allow all with a name' ],
    [ 'nalar_lora_allow a a;', qr/\[emerg\].*nalar_lora_allow: "a" is named twice/,
      'nalar_lora_allow naming one twice' ],
    [ 'nalar_lora_allow a; nalar_lora_allow all;',
      qr/\[emerg\].*"nalar_lora_allow" directive is duplicate/,
      'nalar_lora_allow twice' ],
);

($rc, $out) = conf("nalar_model kjv %%MODEL%%;", 'nalar_lora_allow b;');
isnt($rc, 0, 'nginx -t fails: nalar_lora_allow naming one where none exists');
like($out, qr/\[emerg\].*nalar_lora_allow: "b" is not a nalar_lora/,
     '... and says why');
($rc, $out) = conf("nalar_model kjv %%MODEL%%;", 'nalar_lora_allow all;');
is($rc, 0, 'nalar_lora_allow all without adapters passes') or diag($out);

for my $c (@allow) {
    ($rc, $out) = conf("nalar_model kjv %%MODEL%%;\n    nalar_lora a good.gguf;",
                       $c->[0]);
    isnt($rc, 0, "nginx -t fails: $c->[2]");
    like($out, $c->[1], "... and says why: $c->[2]") or diag($out);
}

done_testing;

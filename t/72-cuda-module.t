#!/usr/bin/perl
# The CUDA backend from nginx: nalar_backend cuda, nalar_device and
# nalar_gpu_memory are validated by nginx -t (and nalar_kv_cache's dtype=
# against the backend); every worker starts its own
# engine on its GPU (worker i on GPU i mod count unless nalar_device says),
# and without a GPU each worker reports why through /v1/health and the API
# instead of dying.  With a GPU, the answers equal the CPU backend's.
use strict;
use warnings;
use lib 't/lib';
use Test::More;
use NalarTest;

my $t = NalarTest->new->has_model;
my $so = "$NalarTest::MODULE";
my $cuda = `nm -D $so 2>/dev/null` =~ /\bnalar_cuda_backend_create\b/;

sub conf_with {
    my ($lines) = @_;
    $t->write_conf(<<"CONF");
http {
    nalar_model kjv %%MODEL%%;
    $lines
}
CONF
    return $t->test_conf;
}

# nalar_kv_cache dtype=: the CPU backend keeps f32, f16 and bf16; another
# type is refused, naming it
{
    my ($rc, $out);
    for my $l ('nalar_kv_cache 64m dtype=f32;', 'nalar_kv_cache dtype=f32;',
               'nalar_kv_cache 64m;', 'nalar_kv_cache 64m dtype=f16;',
               'nalar_kv_cache dtype=f16;', 'nalar_kv_cache 64m dtype=bf16;',
               'nalar_kv_cache dtype=bf16 64m;')
    {
        ($rc, $out) = conf_with($l);
        is($rc, 0, "nginx -t accepts: $l") or diag($out);
    }
    ($rc, $out) = conf_with('nalar_kv_cache 64m dtype=q8_0;');
    isnt($rc, 0, 'nginx -t refuses dtype=q8_0');
    like($out, qr/invalid KV cache type "dtype=q8_0": "dtype=f32", "dtype=f16" or "dtype=bf16" expected/,
         '  naming it and the types') or diag($out);
    ($rc, $out) = conf_with('nalar_kv_cache 64m 32m;');
    isnt($rc, 0, 'nginx -t refuses two sizes');
}

if (!$cuda) {
    my ($rc, $out) = conf_with('nalar_backend cuda;');
    isnt($rc, 0, 'a module built without CUDA refuses nalar_backend cuda');
    like($out, qr/built without CUDA/, 'and says so') or diag($out);
    done_testing;
    exit 0;
}

# nginx -t: what is accepted and what is refused, with the reason

my @good = (
    'nalar_backend cuda;',
    'nalar_backend cuda; nalar_device 0;',
    'nalar_backend cuda; nalar_device 3; nalar_gpu_memory 0.85;',
    'nalar_backend cuda; nalar_gpu_memory 1.0;',
    'nalar_backend cuda; nalar_gpu_memory 24g;',
    'nalar_backend cuda; nalar_gpu_memory 512m;',
    'nalar_backend cuda; nalar_kv_cache 64m dtype=bf16;',
    'nalar_backend cuda; nalar_kv_cache dtype=bf16;',
);
for my $l (@good) {
    my ($rc, $out) = conf_with($l);
    is($rc, 0, "nginx -t accepts: $l") or diag($out);
}

my @bad = (
    [ 'nalar_backend cuda; nalar_gpu_memory 1.5;', qr/fraction in \(0, 1\]/ ],
    [ 'nalar_backend cuda; nalar_gpu_memory 0.0;', qr/fraction in \(0, 1\]/ ],
    [ 'nalar_backend cuda; nalar_gpu_memory lots;', qr/invalid value "lots"/ ],
    [ 'nalar_backend cuda; nalar_gpu_memory 0.5; nalar_gpu_memory 0.6;',
      qr/is duplicate/ ],
    [ 'nalar_backend cuda; nalar_device -1;', qr/invalid number|must be/ ],
    [ 'nalar_device 0;', qr/need "nalar_backend cuda"/ ],
    [ 'nalar_gpu_memory 0.9;', qr/need "nalar_backend cuda"/ ],
    [ 'nalar_backend tpu;', qr/invalid nalar_backend "tpu"/ ],
    [ 'nalar_backend cuda; nalar_kv_cache 64m dtype=f16;',
      qr/"nalar_kv_cache dtype=f16" needs "nalar_backend cpu": the cuda backend keeps its KV cache in f32 or bf16/ ],
);
for my $b (@bad) {
    my ($rc, $out) = conf_with($b->[0]);
    isnt($rc, 0, "nginx -t refuses: $b->[0]");
    like($out, $b->[1], '  with the reason') or diag($out);
}

# two workers, each with its own engine on the CUDA backend

my $gpus = 0;
my $probe = `./build/nalar generate -m $NalarTest::MODEL -p x -n 1 --backend cuda 2>&1`;
$gpus = 1 if $? == 0;

$t->write_conf(<<'CONF')->run(health => 0);
worker_processes 2;
http {
    %%NALAR_HTTP%%
    nalar_model kjv %%MODEL%%;
    nalar_backend cuda;
    nalar_gpu_memory 0.5;
    nalar_kv_cache 64m;

    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { nalar_api; }
    }
}
CONF

my $deadline = time + 30 * $NalarTest::SLOW;
my $h;
do { sleep 0.1; $h = $t->get('/v1/health') }
    while $h->{body} !~ /failed|ready/ && time < $deadline;

if ($gpus) {
    is($h->{status}, 200, 'with a GPU: the engine is ready');
    my $body = { model => 'kjv', prompt => 'In the beginning',
                 max_tokens => 16, temperature => 0 };
    my $c = $t->post_json('/v1/completions', $body);
    my $want = NalarTest::reference_text('In the beginning', 16);
    is($c->{json}{choices}[0]{text}, $want,
       'greedy completion on the GPU equals the CPU reference');
} else {
    is($h->{status}, 503, 'no GPU here: health 503');
    like($h->{body}, qr/"status":"failed".*no device is visible/,
         'with the reason from the CUDA backend') or diag($h->{body});
    my $c = $t->post_json('/v1/completions', { prompt => 'x' });
    is($c->{status}, 503, 'a completion: 503');
    is($c->{json}{error}{code}, 'model_failed', 'the API says why');
    # health answered from one worker; the other may still be failing
    my ($log, %seen);
    $deadline = time + 10 * $NalarTest::SLOW;
    for (;;) {
        $log = $t->read_file('error.log');
        %seen = map { $_ => 1 }
                $log =~ /\[error\] (\d+)#\d+: .*no device is visible/g;
        last if keys %seen >= 2 || time >= $deadline;
        sleep 0.05;
    }
    is(scalar keys %seen, 2, 'each of the 2 workers reported it in error.log')
        or diag(join "\n", grep { /no device/ } split /\n/, $log);
    unlike($log, qr/\[(alert|emerg|crit)\]/, 'and no worker crashed');
}

$t->stop;
done_testing;

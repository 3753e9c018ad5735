#!/bin/sh
# Quantized weights against F16 on the CPU: a Llama shape of about 1.1B
# made by `nalar mkmodel` in F16, Q8_0 and Q4_K_M (random weights, larger
# than the caches), each run by `nalar bench` (prefill of 32 tokens, then
# 16 tokens decoded at batch 1, 2 threads), the types interleaved, ROUNDS
# times.  Prints the medians, the median of the per-round ratios to F16
# (each round's runs are next to each other, so they share the machine's
# state), the memory-read limit `nalar bench` measures in the same
# process, and resident memory.  Q8_0 and Q4_K_M run twice: with exact F32
# activations (--cpu-activations f32) and with i16, the default (the "i16"
# columns).  Then the products alone (bench/quant_kernels.c: one token,
# one thread, a matrix in cache and one streamed from memory).  Writes
# bench/results/quant.md.
#   sh bench/quant.sh [ROUNDS] [MODEL_DIR]
set -e
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
DIR=${2:-${TMPDIR:-/tmp}/nalar-quant}
make -j2 NALAR_CUDA=0 build/nalar >/dev/null
make -f bench/bench.mk build/bench/quant_kernels >/dev/null
mkdir -p "$DIR" bench/results
for t in f16 q8_0 q4_k_m; do
    [ -s "$DIR/L1B-$t.gguf" ] && continue
    build/nalar mkmodel --dim 2048 --layers 16 --heads 32 --kv-heads 8 \
        --ffn 8192 --vocab 32000 --ctx 1024 --type $t \
        -o "$DIR/L1B-$t.gguf" >/dev/null
done
RAW="$DIR/raw.txt"
: > "$RAW"
r=1
while [ $r -le "$ROUNDS" ]; do
    for t in f16 q8_0 q8_0-i16 q4_k_m q4_k_m-i16; do
        act=f32
        case $t in *-i16) act=i16 ;; esac
        build/nalar bench -m "$DIR/L1B-${t%-i16}.gguf" -p 32 -n 16 -b 1 \
            -t 2 --cpu-activations $act 2>&1 | sed "s/^/$r $t /" >> "$RAW"
    done
    r=$((r + 1))
done
python3 - "$RAW" "$(uptime)" <<'EOF' | tee bench/results/quant.md
import re, statistics, sys
raw, up = sys.argv[1], sys.argv[2]
runs = {}
for line in open(raw):
    rnd, t, rest = line.split(' ', 2)
    d = runs.setdefault((int(rnd), t), {})
    m = re.search(r'prefill \d+ tokens: ([\d.]+) tokens/s', rest)
    if m: d['prefill'] = float(m.group(1))
    m = re.search(r'decode \d+ tokens, batch 1: ([\d.]+) tokens/s', rest)
    if m: d['decode'] = float(m.group(1))
    m = re.search(r'memory-read limit ([\d.]+) tokens/s \((\d+) weight', rest)
    if m: d['limit'], d['bytes'] = float(m.group(1)), int(m.group(2))
    m = re.search(r'resident after load: (\d+) bytes \(file (\d+)', rest)
    if m: d['rss'], d['file'] = int(m.group(1)), int(m.group(2))
types = ['f16', 'q8_0', 'q8_0-i16', 'q4_k_m', 'q4_k_m-i16']
rounds = sorted({r for r, _ in runs})
med = statistics.median
def col(t, k): return [runs[(r, t)][k] for r in rounds if k in runs.get((r, t), {})]
def ratio(t, k, inv=False):
    v = [runs[(r, t)][k] / runs[(r, 'f16')][k] for r in rounds
         if k in runs.get((r, t), {}) and k in runs.get((r, 'f16'), {})]
    v = [1 / x for x in v] if inv else v
    return '%.2fx (%.2f-%.2f)' % (med(v), min(v), max(v)) if v else '-'
print('1.1B Llama shape, 2 threads, %d rounds; %s\n' % (len(rounds), up.strip()))
print('| | F16 | Q8_0 | Q8_0 i16 | Q4_K_M | Q4_K_M i16 |')
print('|---|---:|---:|---:|---:|---:|')
print('| weight bytes per token | ' + ' | '.join('%.2f GB' % (col(t, 'bytes')[0] / 1e9) for t in types) + ' |')
print('| decode, batch 1 (tokens/s) | ' + ' | '.join('%.1f' % med(col(t, 'decode')) for t in types) + ' |')
print('| decode, same-round ratio to F16 | 1 | ' + ' | '.join(ratio(t, 'decode') for t in types[1:]) + ' |')
print('| decode, share of the memory-read limit | ' + ' | '.join(
    '%.0f%%' % (100 * med([runs[(r, t)]['decode'] / runs[(r, t)]['limit'] for r in rounds])) for t in types) + ' |')
print('| prefill 32 tokens (tokens/s) | ' + ' | '.join('%.1f' % med(col(t, 'prefill')) for t in types) + ' |')
print('| prefill time, same-round ratio to F16 | 1 | ' + ' | '.join(ratio(t, 'prefill', inv=True) for t in types[1:]) + ' |')
print('| resident after load / file | ' + ' | '.join(
    '%.0f / %.0f MB' % (col(t, 'rss')[0] / 1e6, col(t, 'file')[0] / 1e6) for t in types) + ' |')
EOF
printf '\nThe products alone, one token, one thread (bench/quant_kernels.c),\n2048 columns, medians of 5 calls:\n\n' \
    | tee -a bench/results/quant.md
build/bench/quant_kernels | tee -a bench/results/quant.md

#!/bin/sh
# Nalar against llama.cpp on the CPU, in the same run: the ~1.1B Llama
# shape of bench/quant.sh (random weights from `nalar mkmodel`, one file
# per type, made when missing), each type run by llama.cpp's llama-bench
# and by `nalar bench` in alternated rounds, so that each ratio compares
# two runs that were next to each other on the machine.
#
#   sh bench/quant-peer.sh LLAMA_BUILD_DIR [MODEL_DIR]
#
# LLAMA_BUILD_DIR holds bin/llama-bench (and bin/llama-batched-bench for
# the 16-sequence decode): a llama.cpp build made outside this tree.
# Environment (defaults in brackets):
#   ROUNDS  rounds [5]          TYPES  [f16 q8_0 q4_0 q4_k_m q5_k_m q6_k]
#   ACTS    nalar's --cpu-activations modes for quantized types, any of f32
#           i16 q8 pairs [f32 i16 q8]
#   THREADS [2]   P  prefill tokens [128]   N  decode tokens [32]
#   REPS    llama-bench repetitions [3]
#   SUMMARY 1: no runs, only the table from MODEL_DIR/peer-raw.txt [0]
#   B16     1: also 16 sequences' aggregate decode against
#           llama-batched-bench (-npp 16 -ntg N -npl 16) [1]
# What each side measures:
#   llama-bench -t THREADS -mmp 0 -p P -n N -r 3 -o json: prefill is the
#     best of its 3 pp samples (nalar bench reports the best of 5 passes),
#     decode the mean of its tg samples (N tokens from an empty context);
#   nalar bench -t THREADS -p P -n N -b 16: prefill best of 5 passes,
#     decode N tokens after the prompt, and 16 sequences with 16-token
#     contexts stepping N tokens together.
# The share of the memory-read limit: tokens/s x weight bytes per token
# / the read bandwidth nalar bench measures in the same process (both
# programs read the same weight bytes per token).
# Prints a table of medians and the medians (range) of the same-round
# ratios, nalar / llama.cpp, and the instruction sets each side ran on;
# raw lines in MODEL_DIR/peer-raw.txt, the table in
# bench/results/quant-peer.md.
set -e
cd "$(dirname "$0")/.."
LB=${1:?usage: sh bench/quant-peer.sh LLAMA_BUILD_DIR [MODEL_DIR]}
DIR=${2:-${TMPDIR:-/tmp}/nalar-quant}
ROUNDS=${ROUNDS:-5}
TYPES=${TYPES:-f16 q8_0 q4_0 q4_k_m q5_k_m q6_k}
ACTS=${ACTS:-f32 i16 q8}
THREADS=${THREADS:-2}
P=${P:-128}
N=${N:-32}
B16=${B16:-1}
RAW="$DIR/peer-raw.txt"
if [ "${SUMMARY:-0}" != 1 ]; then
[ -x "$LB/bin/llama-bench" ] || { echo "no $LB/bin/llama-bench" >&2; exit 2; }
[ "$B16" = 1 ] && [ ! -x "$LB/bin/llama-batched-bench" ] && B16=0
make -j2 NALAR_CUDA=0 build/nalar >/dev/null
mkdir -p "$DIR" bench/results
for t in $TYPES; do
    [ -s "$DIR/L1B-$t.gguf" ] && continue
    build/nalar mkmodel --dim 2048 --layers 16 --heads 32 --kv-heads 8 \
        --ffn 8192 --vocab 32000 --ctx 1024 --type $t \
        -o "$DIR/L1B-$t.gguf" >/dev/null
done
: > "$RAW"
# the instruction sets: the flags llama.cpp's CPU backend was built with
# (GGML_NATIVE: this CPU's), and this CPU's vector extensions
LISA="ggml-cpu built with $(grep -ho -- '-march=[^ ]*' \
        "$LB"/ggml/src/CMakeFiles/ggml-cpu*.dir/flags.make 2>/dev/null \
        | sort -u | tr '\n' ' ')on a CPU with $(grep -o -w -E \
        'avx2|avx512f|avx512bw|avx512_vnni|avx_vnni|avx512_bf16' \
        /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "llama_isa $LISA" >> "$RAW"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for t in $TYPES; do
        m="$DIR/L1B-$t.gguf"
        "$LB/bin/llama-bench" -m "$m" -t "$THREADS" -mmp 0 -p "$P" -n "$N" \
            -r "${REPS:-3}" -o json 2>/dev/null | tr -d '\n' \
            | sed "s/^/$r $t llama json /" >> "$RAW"
        echo >> "$RAW"
        acts=$ACTS
        [ "$t" = f16 ] && acts=f32
        for a in $acts; do
            b=
            [ "$B16" = 1 ] && b="-b 16"
            build/nalar bench -m "$m" -p "$P" -n "$N" -t "$THREADS" \
                ${b:--b 1} --cpu-activations "$a" 2>&1 \
                | sed "s/^/$r $t nalar-$a /" >> "$RAW"
        done
        if [ "$B16" = 1 ]; then
            "$LB/bin/llama-batched-bench" -m "$m" -t "$THREADS" --no-mmap \
                -c 2048 -npp 16 -ntg "$N" -npl 16 2>/dev/null \
                | grep '^|' | sed "s/^/$r $t llamab /" >> "$RAW"
        fi
    done
    r=$((r + 1))
done
fi
python3 - "$RAW" "$(uptime)" "$P" "$N" "$THREADS" <<'EOF' | tee bench/results/quant-peer.md
import json, re, statistics, sys
raw, up, P, N, T = sys.argv[1:6]
runs, lisa, nisa = {}, '', set()
for line in open(raw):
    if line.startswith('llama_isa '):
        lisa = line[10:].strip()
        continue
    parts = line.rstrip('\n').split(' ', 3)
    if len(parts) < 4:
        continue
    rnd, t, who, rest = int(parts[0]), parts[1], parts[2], parts[3]
    if who == 'llama' and rest.startswith('json '):
        try:
            tests = json.loads(rest[5:])
        except ValueError:
            continue
        d = runs.setdefault((rnd, t, 'llama'), {})
        for x in tests:
            if x.get('n_prompt', 0) > 0 and x.get('n_gen', 0) == 0:
                d['prefill'] = max(x['samples_ts'])
            elif x.get('n_gen', 0) > 0 and x.get('n_prompt', 0) == 0:
                d['decode'] = x['avg_ts']
        continue
    if who == 'llamab':
        c = [s.strip() for s in rest.strip().strip('|').split('|')]
        if len(c) >= 8 and c[2] == '16' and re.match(r'^[\d.]+$', c[7]):
            runs.setdefault((rnd, t, 'llama'), {})['b16'] = float(c[7])
        continue
    d = runs.setdefault((rnd, t, who), {})
    m = re.search(r'prefill \d+ tokens: ([\d.]+) tokens/s', rest)
    if m: d['prefill'] = float(m.group(1))
    m = re.search(r'decode \d+ tokens, batch 1: ([\d.]+) tokens/s', rest)
    if m: d['decode'] = float(m.group(1))
    m = re.search(r'memory read: ([\d.]+) GB/s.*\((\d+) weight', rest)
    if m: d['bw'], d['bytes'] = float(m.group(1)) * 1e9, int(m.group(2))
    m = re.search(r'decode batch 16: ([\d.]+) tokens/s', rest)
    if m: d['b16'] = float(m.group(1))
    m = re.search(r'isa: ([^;]*)', rest)
    if m: nisa.add(m.group(1).strip())
med = statistics.median
rounds = sorted({k[0] for k in runs})
types = []
for k in runs:
    if k[1] not in types:
        types.append(k[1])
whos = sorted({k[2] for k in runs if k[2] != 'llama'})
def vals(t, who, key):
    return [runs[(r, t, who)][key] for r in rounds
            if key in runs.get((r, t, who), {})]
def ratio(t, who, key):
    v = [runs[(r, t, who)][key] / runs[(r, t, 'llama')][key] for r in rounds
         if key in runs.get((r, t, who), {})
         and key in runs.get((r, t, 'llama'), {})]
    return '%.2fx (%.2f-%.2f)' % (med(v), min(v), max(v)) if v else '-'
def share(t, who):
    v = []
    for r in rounds:
        # the read bandwidth of the round's first nalar run that measured
        # it (f32's where the round has one)
        d = runs.get((r, t, who), {})
        n = next((runs[(r, t, w)] for w in ['nalar-f32'] + sorted(
                      w for (r2, t2, w) in runs if r2 == r and t2 == t)
                  if 'bw' in runs.get((r, t, w), {})), {})
        if 'decode' in d and 'bw' in n:
            v.append(d['decode'] * n['bytes'] / n['bw'])
    return '%.0f%%' % (100 * med(v)) if v else '-'
def m1(t, who, key):
    v = vals(t, who, key)
    return '%.1f' % med(v) if v else '-'
print('1.1B Llama shape (bench/quant.sh), %s threads, prefill %s, decode %s '
      'tokens; %d alternated rounds; %s\n' % (T, P, N, len(rounds), up.strip()))
print('llama.cpp CPU backend: %s' % (lisa or '?'))
print('nalar: %s\n' % ('; '.join(sorted(nisa)) or '?'))
print('| type | who | decode tok/s | ratio | share of read limit '
      '| prefill tok/s | ratio | 16 seqs tok/s | ratio |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|')
for t in types:
    print('| %s | llama.cpp | %s | 1 | %s | %s | 1 | %s | %s |' % (
        t, m1(t, 'llama', 'decode'), share(t, 'llama'),
        m1(t, 'llama', 'prefill'), m1(t, 'llama', 'b16'),
        '1' if vals(t, 'llama', 'b16') else '-'))
    for who in whos:
        if not vals(t, who, 'decode'):
            continue
        print('| %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (
            t, who.replace('nalar-', 'nalar '), m1(t, who, 'decode'),
            ratio(t, who, 'decode'), share(t, who), m1(t, who, 'prefill'),
            ratio(t, who, 'prefill'), m1(t, who, 'b16'),
            ratio(t, who, 'b16')))
EOF

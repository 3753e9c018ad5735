#!/bin/sh
# Prefix cache benchmark: TTFT against the reuse rate of a 1,500-token
# prompt (cache on vs off) on a random-weights model with a 4k context, the
# cost of hashing, and a multi-tenant workload (8 tenants, a shared system
# prompt, per-tenant histories) with shared prefixes declared or not.
# Writes bench/results/prefix.txt and bench/prefix.png.
# Usage: sh bench/prefix.sh [REPS] [THREADS]
. "$(dirname "$0")/setup.sh"
M=build/bench/llama-4k-f16.gguf
[ -f $M ] || build/nalar mkmodel --dim 256 --layers 4 --heads 8 --kv-heads 4 \
    --ffn 768 --vocab 8000 --ctx 4096 --type f16 -o $M
build/nalar prefix-bench -m $M -p 1500 --reps "$REPS" -t "$THREADS" \
    | tee bench/results/prefix.txt
if command -v gnuplot >/dev/null; then
    grep '^| [0-9]' bench/results/prefix.txt | tr -d '|%' \
        | awk '{print $1, $3, $4}' > bench/results/prefix.dat
    gnuplot <<'GP'
set terminal pngcairo size 800,500
set output 'bench/prefix.png'
set title 'TTFT of a 1,500-token prompt against prefix reuse'
set xlabel 'reuse L_hit / L_in (%)'
set ylabel 'TTFT (ms)'
set grid
set key left bottom
plot 'bench/results/prefix.dat' using 1:2 with linespoints title 'cache on', \
     '' using 1:3 with linespoints title 'cache off'
GP
fi

#!/bin/sh
# auto with a draft that never proposes the target's token (random weights
# sharing the demo vocabulary): whether n-gram lookup stands in for it.
# That is the step gate's call from measured step times, so it is measured
# here, not asserted by a test.  Each of REPS rounds runs the draft alone
# and auto (greedy, 96 tokens, k auto, one stream) and prints the tokens
# each confirmed; on an idle machine auto confirms 99-124 (the lookup pays
# on the demo model's repetitive text) and the draft alone 0-2.  A build
# that never lets the lookup stand in confirms under 40 with auto.
# Writes bench/results/spec-standin.txt.
# Usage: sh bench/spec-standin.sh [REPS] [THREADS]
. "$(dirname "$0")/setup.sh"
BAD=build/bench/random-draft.gguf
[ -f $BAD ] || build/nalar mkmodel --dim 64 --layers 1 --ffn 128 \
    --vocab-from models/nalar-kjv-target-f32.gguf --seed 7 -o $BAD >/dev/null
{
    echo "| round | proposer | accepted | proposed | speedup |"
    echo "|---:|---|---:|---:|---:|"
    i=1
    while [ "$i" -le "$REPS" ]; do
        for p in draft auto; do
            build/nalar spec-bench -m models/nalar-kjv-target-f32.gguf \
                --draft $BAD --only $p -b 1 -k auto -n 96 --reps 2 \
                -t "$THREADS" --json \
            | sed -n 's/.*"speedup": \([0-9.]*\).*"accepted": \([0-9]*\), "proposed": \([0-9]*\).*/\2 \3 \1/p' \
            | while read -r acc prop sp; do
                echo "| $i | $p | $acc | $prop | $sp |"
            done
        done
        i=$((i + 1))
    done
} | tee bench/results/spec-standin.txt

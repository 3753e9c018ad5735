#!/bin/sh
# CPU engine benchmark: `nalar bench` on the demo models and a 134M-parameter
# F16 Llama (the shape `nalar mkmodel` writes below), alternating runs,
# medians.  Prints a markdown table and writes bench/results/cpu.json and
# bench/cpu.png.  Usage: sh bench/cpu.sh [REPS] [THREADS]
. "$(dirname "$0")/setup.sh"
M134=build/bench/llama-134m-f16.gguf
[ -f $M134 ] || build/nalar mkmodel --dim 768 --layers 12 --heads 12 \
    --kv-heads 12 --ffn 2048 --vocab 32000 --ctx 1024 --type f16 -o $M134

OUT=bench/results/cpu.jsonl
: > $OUT
i=0
while [ $i -lt "$REPS" ]; do
    for m in models/nalar-kjv-target-f32.gguf models/nalar-kjv-target-f16.gguf \
             models/nalar-kjv-draft-f32.gguf; do
        r=$(build/nalar bench -m $m -p 128 -n 128 -b 1,4,8,16,32 \
            -t "$THREADS" --json)
        echo "{\"model\": \"$(basename $m)\", \"run\": $r}" >> $OUT
    done
    r=$(build/nalar bench -m $M134 -p 128 -n 32 -b 1,4,16 -t "$THREADS" --json)
    echo "{\"model\": \"llama-134m-f16.gguf\", \"run\": $r}" >> $OUT
    i=$((i + 1))
done
python3 bench/summarize_cpu.py $OUT

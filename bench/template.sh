#!/bin/sh
# A chat template's cost on the engine thread: rendering a conversation
# with tools (Hermes 2 Pro's tool-use template, and Qwen2.5's) and
# tokenizing it, against the prefill of the same prompt, on a model of the
# demo model's shape and vocabulary with an 8k context (the demo model's
# own is 512 tokens; random weights cost what trained ones do).
#   sh bench/template.sh [TOKENS] [ROUNDS]
set -e
cd "$(dirname "$0")/.."
make -j2 NALAR_CUDA=0 build/libnalar.a build/libnalar_api.a build/nalar \
    >/dev/null
make -f bench/bench.mk build/bench/template >/dev/null
mkdir -p build/bench bench/results
m=build/bench/demo-8k.gguf
[ -f $m ] || build/nalar mkmodel --dim 128 --layers 6 --heads 4 \
    --kv-heads 2 --ffn 384 --ctx 8192 --seed 1 \
    --vocab-from models/nalar-kjv-target-f32.gguf -o $m >/dev/null
for t in NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use \
         Qwen-Qwen2.5-7B-Instruct; do
    echo "$t"
    build/bench/template $m t/data/templates/$t.jinja "${1:-4096}" \
        "${2:-9}"
done | tee bench/results/template.md

#!/bin/sh
# Batched decode with LoRA adapters on the CPU: 16 sequences decoded
# together, spread over 4 rank-16 adapters (F16, every attention and FFN
# matrix), against the same 16 sequences base-only, in the same process,
# the two alternating ROUNDS times (bench/lora.c).  Run on the demo model
# (models/nalar-kjv-target-f16.gguf) and on a Llama shape of about 1.1B in
# F16 made by `nalar mkmodel` (bench/quant.sh's; kept in MODEL_DIR).
# Writes bench/results/lora.md.
#   sh bench/lora.sh [ROUNDS] [MODEL_DIR] [THREADS]
set -e
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
DIR=${2:-${TMPDIR:-/tmp}/nalar-quant}
THREADS=${3:-2}
make -j2 build/libnalar.a >/dev/null
make -f bench/bench.mk build/bench/lora >/dev/null
mkdir -p "$DIR" bench/results
if [ ! -s "$DIR/L1B-f16.gguf" ]; then
    make -j2 NALAR_CUDA=0 build/nalar >/dev/null
    build/nalar mkmodel --dim 2048 --layers 16 --heads 32 --kv-heads 8 \
        --ffn 8192 --vocab 32000 --ctx 1024 --type f16 \
        -o "$DIR/L1B-f16.gguf" >/dev/null
fi
{
    echo "Decode, 16 sequences: 4 rank-16 adapters vs base-only" \
         "(bench/lora.sh, $ROUNDS rounds, $THREADS threads; $(date -u +%F))"
    echo
    # passes per round: about a second of decode on the 2-core machine
    for run in "models/nalar-kjv-target-f16.gguf 200" "$DIR/L1B-f16.gguf 8"
    do
        set -- $run
        echo '```'
        build/bench/lora "$1" "$THREADS" "$ROUNDS" "$2"
        echo '```'
    done
} | tee bench/results/lora.md

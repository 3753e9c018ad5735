#!/bin/sh
# Structured output: compile times, the grammar's share of a decode step at
# batch 1 and 16, forced-token speculation against none (bench/grammar.c).
#   sh bench/grammar.sh [ROUNDS]
set -e
cd "$(dirname "$0")/.."
make -j2 NALAR_CUDA=0 build/libnalar.a >/dev/null
make -f bench/bench.mk build/bench/grammar >/dev/null
mkdir -p bench/results
build/bench/grammar models/nalar-kjv-target-f32.gguf \
    t/data/grammar/schemas.json "${1:-5}" | tee bench/results/grammar.md

#!/bin/sh
# gpu-check: the CUDA backend on a machine with an NVIDIA GPU, in one run
# (under 8 minutes on an H200):
#   1. build with CUDA (kernels -Werror, sm_90 + PTX for older cards)
#   2. build/nalar-cuda-check: every op against a CPU reference on random
#      and awkward shapes (outputs poisoned), then greedy generation on the
#      kjv demo models equal to the CPU backend token for token
#   3. build/nalar bench --synthetic llama3-8b (random BF16 weights made in
#      device memory): HBM copy bandwidth, batch-1 decode and its fraction
#      of that bandwidth, batched decode at 8/32/128 streams, prefill of a
#      2048-token prompt, paged-attention bandwidth at 8k context
# and prints a table last.  Exit status non-zero when anything fails (the
# performance goals are reported, not enforced).
#
#   sh bench/gpu-check.sh            (from anywhere; logs in build/gpu-check)
#
# Needs what `make` needs (OpenSSL's headers among them); where they are not
# installed, CC may carry the paths: CC="cc -I/x/include -L/x/lib" sh ...
set -u
cd "$(dirname "$0")/.." || exit 1
log=build/gpu-check
mkdir -p "$log"
t0=$(date +%s)
fail=0
status_build=FAIL status_check=FAIL status_bench=FAIL

# line-buffered output, so a run cut short by its timeout keeps its lines
lines=
command -v stdbuf >/dev/null 2>&1 && lines="stdbuf -oL -eL"

say() { printf '== %s (%ss)\n' "$1" "$(( $(date +%s) - t0 ))"; }

say "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory \
    --format=csv,noheader 2>/dev/null || echo "nvidia-smi not available"

say "build"
if make -j"$(nproc)" NALAR_CUDA=1 build/libnalar_cuda.a build/nalar \
        build/nalar-cuda-check >"$log/build.log" 2>&1; then
    status_build=ok
else
    tail -n 40 "$log/build.log"
    echo "gpu-check: FAILED: the build"
    exit 1
fi

say "op checks and greedy equality"
if timeout 150 $lines ./build/nalar-cuda-check --require-gpu \
        >"$log/check.log" 2>&1
then
    status_check=ok
else
    fail=1
fi
grep -E '^(FAIL|WARN)|^#' "$log/check.log" | head -n 60
tail -n 1 "$log/check.log"

say "bench: synthetic llama3-8b, BF16"
if timeout 210 $lines ./build/nalar bench --synthetic llama3-8b \
        >"$log/bench.txt" 2>&1; then
    status_bench=ok
else
    fail=1
    cat "$log/bench.txt"
fi

say "done"
echo
echo "================ gpu-check: $(nvidia-smi --query-gpu=name \
    --format=csv,noheader 2>/dev/null | head -n 1) ================"
printf '%-34s %s\n' "build (nvcc -Werror)" "$status_build"
printf '%-34s %s  (%s)\n' "op checks + greedy equality" "$status_check" \
    "$(tail -n 1 "$log/check.log" | sed 's/^nalar-cuda-check: //')"
printf '%-34s %s\n' "bench" "$status_bench"
if [ "$status_bench" = ok ]; then
    cat "$log/bench.txt"
    # the goals: reported, not enforced
    awk '
        /^decode batch 1 /    { for (i = 1; i <= NF; i++) if ($i ~ /%$/) dec = $i + 0; b1 = $4 }
        /^decode batch 128 /  { b128 = $4 }
        /^paged attention/    { for (i = 1; i <= NF; i++) if ($i ~ /%$/) att = $i + 0 }
        END {
            printf "%-34s %5.1f%% of copy bandwidth (goal >= 85%%): %s\n",
                "goal: batch-1 decode", dec, (dec >= 85 ? "met" : "not met")
            if (b1 > 0)
                printf "%-34s %5.1fx batch 1 (goal >= 20x): %s\n",
                    "goal: 128 streams", b128 / b1, (b128 / b1 >= 20 ? "met" : "not met")
            printf "%-34s %5.1f%% of copy bandwidth (goal >= 80%%): %s\n",
                "goal: paged attention 8k", att, (att >= 80 ? "met" : "not met")
        }' "$log/bench.txt"
fi
echo "total $(( $(date +%s) - t0 )) s; logs in $log/"
if [ "$fail" -ne 0 ]; then
    echo "gpu-check: FAILED"
    exit 1
fi
echo "gpu-check: all checks passed"

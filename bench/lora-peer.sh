#!/bin/sh
# Our LoRA adapters against llama.cpp's own reading of them: does
# llama.cpp apply a file that `nalar mkmodel --lora-of` writes as nalar
# does (alpha / rank x the user's scale, A and B the same way round, the
# same tensor names)?
#
#   sh bench/lora-peer.sh LLAMA_BUILD [DIR]
#
# LLAMA_BUILD: a llama.cpp build made outside this tree, with
# bin/llama-export-lora and bin/llama-perplexity (cmake --build LLAMA_BUILD
# --target llama-export-lora llama-perplexity).  DIR keeps the files
# [${TMPDIR:-/tmp}/nalar-lora-peer].  Environment: SCALE, the user's scale
# [0.7]; BASES, conformance files [llama-F16 llama-Q4_K_M].
#
# For each base, two adapters: F16 at rank 8 with alpha 4, and Q8_0 at
# rank 32 with alpha 12 (alpha is not the rank, so alpha / rank counts).
#  1. Merged files: `nalar mkmodel --merge` (adapted matrices in F32)
#     against llama-export-lora --lora-scaled (F16 adapters only: it
#     refuses quantized ones), tensor by tensor (build/bench/lora_diff):
#     the largest difference of the merged weights, and the same once
#     ours is rounded to F16, the type llama.cpp writes them in (ulp).
#  2. Logits through nalar (nalar eval, every logit of 48 positions):
#     the base with the adapter at run time against our merged file and
#     against llama.cpp's merged file.
#  3. llama.cpp at run time: llama-perplexity with --lora-scaled over
#     a text, its KL divergence from our merged file (read by llama.cpp
#     too) -- and, for scale, the KL divergence of the base alone from
#     it, which is what a misread adapter (wrong alpha, A and B swapped,
#     a tensor skipped) comes near.
# Prints one block per base and adapter.
set -e
cd "$(dirname "$0")/.."
LB=${1:?usage: sh bench/lora-peer.sh LLAMA_BUILD [DIR]}
DIR=${2:-${TMPDIR:-/tmp}/nalar-lora-peer}
SCALE=${SCALE:-0.7}
BASES=${BASES:-llama-F16 llama-Q4_K_M}
EXPORT=$LB/bin/llama-export-lora
PPL=$LB/bin/llama-perplexity
for p in "$EXPORT" "$PPL"; do
    [ -x "$p" ] || { echo "no $p (cmake --build $LB --target" \
                          "llama-export-lora llama-perplexity)" >&2; exit 2; }
done
make -j2 build/nalar build/libnalar.a >/dev/null
make -f bench/bench.mk build/bench/lora_diff >/dev/null
mkdir -p "$DIR"

# 48 token ids of the kit's text, and the text repeated for perplexity
IDS=$(python3 -c 'import json,sys
d = json.load(open("t/data/conformance/llama-F16.ref.json"))
print(" ".join(str(i) for i in d["sequences"][0]["ids"][:48]))')
python3 -c 'import json
d = json.load(open("t/data/conformance/llama-F16.ref.json"))
print(" ".join([d["sequences"][0]["text"]] * 12))' > "$DIR/text.txt"

# the largest |logit| difference between two `nalar eval --top V` runs
logit_diff() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
d = 0.0
for x, y in zip(a, b):
    ya = dict((i, v) for i, v in y["top"])
    for i, v in x["top"]:
        d = max(d, abs(v - ya[i]))
    d = max(d, abs(x["logsumexp"] - y["logsumexp"]))
print("%.4g over %d positions" % (d, len(a)))
EOF
}

# KL divergence lines of llama-perplexity against saved logits
kld() {
    "$PPL" -m "$1" $2 -f "$DIR/text.txt" -c 64 -b 64 -t 2 \
        --kl-divergence-base "$3" --kl-divergence 2>&1 \
        | grep -E '^(Mean    KLD|Maximum KLD|Same top p)' | tr -s ' ' \
        | tr '\n' ';'
    echo
}

for b in $BASES; do
    base=t/data/conformance/$b.gguf
    for ad in "f16 8 4" "q8_0 32 12"; do
        set -- $ad
        t=$1; rank=$2; alpha=$3
        a="$DIR/$b-$t.lora.gguf"
        ours="$DIR/$b-$t.nalar-merged.gguf"
        peer="$DIR/$b-$t.llama-merged.gguf"
        build/nalar mkmodel --lora-of "$base" --rank "$rank" --alpha "$alpha" \
            --type "$t" --seed 7 -o "$a" >/dev/null
        build/nalar mkmodel --merge "$base" --lora "$a" --scale "$SCALE" \
            -o "$ours" >/dev/null
        echo "== $b, $t adapter (rank $rank, alpha $alpha), scale $SCALE"
        build/nalar eval -m "$base" --lora "$a:$SCALE" --ids "$IDS" \
            --top 100000 -t 2 > "$DIR/rt.jsonl"
        build/nalar eval -m "$ours" --ids "$IDS" --top 100000 -t 2 \
            > "$DIR/ours.jsonl"
        build/nalar eval -m "$base" --ids "$IDS" --top 100000 -t 2 \
            > "$DIR/base.jsonl"
        echo "nalar logits, run time vs our merged file:   " \
             "$(logit_diff "$DIR/rt.jsonl" "$DIR/ours.jsonl")"
        echo "nalar logits, base alone vs our merged file: " \
             "$(logit_diff "$DIR/base.jsonl" "$DIR/ours.jsonl")"
        if "$EXPORT" -m "$base" --lora-scaled "$a" "$SCALE" -o "$peer" \
                -t 2 > "$DIR/export.log" 2>&1
        then
            build/bench/lora_diff "$ours" "$peer" > "$DIR/diff.txt" || true
            echo "merged weights, ours vs llama.cpp's: $(tail -n 1 \
                  "$DIR/diff.txt")"
            build/nalar eval -m "$peer" --ids "$IDS" --top 100000 -t 2 \
                > "$DIR/peer.jsonl"
            echo "nalar logits, run time vs llama.cpp's merged file: " \
                 "$(logit_diff "$DIR/rt.jsonl" "$DIR/peer.jsonl")"
        else
            echo "llama-export-lora: $(grep -m1 -i -E 'error|exception|not supported' \
                  "$DIR/export.log")"
        fi
        "$PPL" -m "$ours" -f "$DIR/text.txt" -c 64 -b 64 -t 2 \
            --kl-divergence-base "$DIR/ours.kld" >/dev/null 2>&1
        echo "llama.cpp run time adapter vs our merged file: " \
             "$(kld "$base" "--lora-scaled $a $SCALE" "$DIR/ours.kld")"
        echo "llama.cpp base alone vs our merged file:       " \
             "$(kld "$base" "" "$DIR/ours.kld")"
    done
done

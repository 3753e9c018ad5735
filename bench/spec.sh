#!/bin/sh
# Speculative decoding benchmark: tokens/s with and without speculation for
# the demo target + draft, `auto` (the draft, and n-gram lookup where the
# gate holds the draft back or measures it slower), n-gram lookup, and the client's prediction on
# an editing task (90% of the output predicted: one token in ten changed,
# the changes as phrases, or recurring tokens renamed throughout as an
# identifier is in code), at 1, 4 and 16 streams and
# k = auto (cost model and step gate), fixed 1, 2, 4, 8, and 0 (a plain
# against plain control).  Alternating runs on the same engine, the
# baseline's requests with speculation off; tokens/s are medians, the
# speedup the median of paired ratios (REPS pairs; 2 REPS, at most 15, for
# the auto and control rows).  Then the cost of one verification
# pass against its size (nalar verify-bench).  Writes bench/results/spec.md,
# bench/results/spec.jsonl, bench/results/verify.md and bench/spec.png.
# Usage: sh bench/spec.sh [REPS] [THREADS]
. "$(dirname "$0")/setup.sh"
T=models/nalar-kjv-target-f32.gguf
D=models/nalar-kjv-draft-f32.gguf
# the rows a goal is judged on (auto, and the plain-against-plain control
# that shows the comparison's noise) get twice the repetitions, at most 15:
# at 7, one run's control medians spanned 0.97-1.05x, and a 16-stream
# draft auto row read 0.94x where 15 repetitions read 0.99-1.01x
AREPS=$((REPS * 2 > 15 ? 15 : REPS * 2))
# spec_rows TASK STREAMS FIXED_KS [--draft FILE]: a task's control and auto
# rows, then its fixed-k rows
spec_rows() {
    task=$1 b=$2 ks=$3
    shift 3
    build/nalar spec-bench -m $T --task "$task" -b "$b" -n 256 \
        -t "$THREADS" --json -k 0,auto --reps "$AREPS" "$@"
    build/nalar spec-bench -m $T --task "$task" -b "$b" -n 256 \
        -t "$THREADS" --json -k "$ks" --reps "$REPS" "$@"
}
{
    spec_rows prompts 1,4,16 1,2,4,8 --draft $D
    spec_rows edit 1,4,16 2,4,6,8
    spec_rows edit-spans 1 4,6,8
    spec_rows edit-rename 1 4,6,8
} > bench/results/spec.jsonl
# one thread and the run's threads: how well the threads share a pass
# (on a small VM the second vCPU may sit far from the first, and then a
# pass barely gains from it: bench/README.md)
{
    build/nalar verify-bench -m $T -t 1
    echo
    build/nalar verify-bench -m $T -t "$THREADS"
} > bench/results/verify.md
cat bench/results/verify.md
python3 - <<'PY'
import json, shutil, subprocess
rows = [json.loads(l) for l in open("bench/results/spec.jsonl") if l.strip()]
# each proposer's rows by streams, then control, auto and fixed k (the
# control and auto rows were run apart, with more repetitions)
first = {}
for i, r in enumerate(rows):
    first.setdefault(r["proposer"], i)
rank = lambda k: -2 if k == "off (control)" else -1 if k == "auto" else int(k)
rows.sort(key=lambda r: (first[r["proposer"]], r["streams"], rank(r["k"])))
out = ["| proposer | streams | k | tokens/s | plain tokens/s | speedup | "
       "acceptance | accepted per step | draft ms/token | verify ms/token |",
       "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    out.append("| %s | %d | %s | %.0f | %.0f | %.2fx | %.2f | %.2f | %.4f | %.4f |"
               % (r["proposer"], r["streams"], r["k"], r["tokens_per_s"],
                  r["plain_tokens_per_s"], r["speedup"], r["acceptance"],
                  r["accepted_per_step"], r["draft_ms_per_token"],
                  r["verify_ms_per_token"]))
open("bench/results/spec.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
if shutil.which("gnuplot"):
    with open("bench/results/spec.dat", "w") as f:
        for prop in ("draft", "ngram", "prediction", "prediction-spans",
                     "prediction-rename"):
            for s in (1, 4, 16):
                pts = [r for r in rows if r["proposer"] == prop
                       and r["streams"] == s and r["k"] not in ("auto", "off (control)")]
                if not pts:
                    continue
                f.write("# %s %d\n" % (prop, s))
                for r in pts:
                    f.write("%s %.3f\n" % (r["k"], r["speedup"]))
                f.write("\n\n")
    blocks = [l[2:].strip() for l in open("bench/results/spec.dat") if l.startswith("# ")]
    plot = ", ".join("'bench/results/spec.dat' index %d with linespoints title '%s streams'"
                     % (i, b.replace(" ", ", ")) for i, b in enumerate(blocks))
    subprocess.run(["gnuplot"], input="""
set terminal pngcairo size 800,500
set output 'bench/spec.png'
set title 'Speculative decoding speedup against k (demo target, greedy)'
set xlabel 'k (proposals per step)'
set ylabel 'speedup over plain decoding'
set logscale x 2
set grid
set key outside right
plot %s, 1 with lines dashtype 2 title 'plain'
""" % plot, text=True, check=True)
PY

#!/usr/bin/env python3
"""Medians of bench/cpu.sh runs, against quoted llama.cpp anchors
(llama.cpp CPU build of early 2025, 2 threads, on a 2-vCPU machine; quoted,
not measured by this script).  Writes a markdown table to
stdout, bench/results/cpu.json and, when gnuplot is installed, bench/cpu.png.
"""
import json, shutil, statistics, subprocess, sys

runs = {}
for line in open(sys.argv[1]):
    if line.strip():
        rec = json.loads(line)
        runs.setdefault(rec["model"], []).append(rec["run"])

def med(name, key, sub=None):
    vals = [(r[key][sub] if sub else r[key]) for r in runs[name]]
    return statistics.median(vals)

anchor = {  # tokens/s
    ("nalar-kjv-target-f32.gguf", "decode"): 4300,
    ("nalar-kjv-target-f32.gguf", "prefill"): 22000,
    ("nalar-kjv-target-f32.gguf", "16"): 4700,
    ("llama-134m-f16.gguf", "decode"): 136,
    ("llama-134m-f16.gguf", "prefill"): 870,
}
rows = []
print("| model | measure | nalar (median of %d) | llama.cpp anchor | ratio |"
      % len(next(iter(runs.values()))))
print("|---|---|---:|---:|---:|")
summary = {}
for name in runs:
    s = {"prefill": med(name, "prefill_tokens_per_s"),
         "decode": med(name, "decode_tokens_per_s")}
    for b in runs[name][0]["batched"]:
        s["batch " + b] = med(name, "batched", b)
    s["weight GB/s"] = med(name, "weight_bytes_per_s") / 1e9
    summary[name] = s
    for k, v in s.items():
        a = anchor.get((name, k.replace("batch ", "")))
        if k == "batch 16":
            a = anchor.get((name, "16"))
        print("| %s | %s | %.1f | %s | %s |" % (
            name, k + ("" if "GB" in k else " tok/s"), v,
            "%d" % a if a else "", "%.2fx" % (v / a) if a else ""))
json.dump(summary, open("bench/results/cpu.json", "w"), indent=1)

if shutil.which("gnuplot"):
    data = "bench/results/cpu-batched.dat"
    with open(data, "w") as f:
        for name in ("nalar-kjv-target-f32.gguf", "nalar-kjv-target-f16.gguf",
                     "nalar-kjv-draft-f32.gguf"):
            f.write("# %s\n" % name)
            for b in sorted(runs[name][0]["batched"], key=int):
                f.write("%s %.1f\n" % (b, summary[name]["batch " + b]))
            f.write("\n\n")
    subprocess.run(["gnuplot"], input=f"""
set terminal pngcairo size 800,500
set output 'bench/cpu.png'
set title 'Aggregate decode throughput, 2 CPU threads'
set xlabel 'sequences decoding together'
set ylabel 'tokens/s'
set logscale x 2
set key left top
set grid
plot '{data}' index 0 with linespoints title 'demo target F32', \\
     '' index 1 with linespoints title 'demo target F16', \\
     '' index 2 with linespoints title 'demo draft F32', \\
     4700 with lines dashtype 2 title 'llama.cpp anchor, target F32, 16 seqs'
""", text=True, check=True)

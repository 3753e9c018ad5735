#!/usr/bin/env python3
"""bench/itl.sh's table: per workload and budget, the medians over rounds of
tokens/s, ITL p50/p99 and TTFT p50, the ITL p99 of every gap of every round
pooled, and the same-run ratios to fixed 512 (each round's ratio, then the
median).  usage: itl_summary.py itl.jsonl RUN_DIR"""
import glob
import json
import statistics
import sys

NAMES = {"fixed512": "fixed 512", "fixed128": "fixed 128",
         "auto100": "auto, target 100 ms", "auto1000": "auto, target 1 s"}


def pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    runs, machine = [], {}
    for line in open(sys.argv[1]):
        j = json.loads(line)
        if j.get("phase") == "machine":
            machine = j
        elif "run" in j:
            runs.append(j)
    rounds = sorted({r["round"] for r in runs})
    loads = [r["load1"] for r in runs]
    print("Step budget through nginx: %d rounds, the budgets in "
          "rotating order within each; %s cores, nalar_threads %s; 1-minute "
          "load average %.1f-%.1f during the runs (the machine is shared "
          "with other work)." % (len(rounds), machine.get("cores"),
                                 machine.get("threads"), min(loads),
                                 max(loads)))
    print()
    print("| workload | budget | tokens/s | ITL p50 ms | ITL p99 ms "
          "| ITL p99 pooled ms | TTFT p50 ms | tok/s vs 512 | ITL p99 vs "
          "512 | TTFT p50 vs 512 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: |")
    for w in ("plain", "shared"):
        base = {r["round"]: r["run"] for r in runs
                if r["workload"] == w and r["conf"] == "fixed512"}
        for c in NAMES:
            rs = [r for r in runs if r["workload"] == w and r["conf"] == c]
            if not rs:
                continue
            med = lambda f: statistics.median(f(r["run"]) for r in rs)
            ratio = lambda f: statistics.median(
                f(r["run"]) / f(base[r["round"]]) for r in rs
                if r["round"] in base and f(base[r["round"]]) > 0)
            gaps = []
            for path in glob.glob("%s/itl-%s-%s-*.txt" % (sys.argv[2], w, c)):
                gaps += [float(x) for x in open(path) if x.strip()]
            tps = lambda j: j["tokens_per_s"]
            p99 = lambda j: j["itl_ms"]["p99"]
            ttft = lambda j: j["ttft_ms"]["p50"]
            print("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.2f | "
                  "%.2f | %.2f |" % (
                      w, NAMES[c], med(tps), med(lambda j: j["itl_ms"]["p50"]),
                      med(p99), pct(gaps, 0.99), med(ttft), ratio(tps),
                      ratio(p99), ratio(ttft)))
    print()


main()

#!/usr/bin/env python3
"""bench/itl.sh's table: per workload and budget, the medians over rounds of
tokens/s, ITL p50/p99 and TTFT p50, the ITL p99 of every gap of every round
pooled, and the same-run ratios to fixed 512 (each round's ratio, then the
median; a budget with a KV suffix, auto45-f16, to the fixed 512 of its KV
type where the run has one); with llama-server in the runs, the same-run
ratios to it as well.
usage: itl_summary.py itl.jsonl RUN_DIR"""
import glob
import json
import statistics
import sys

NAMES = {"fixed512": "fixed 512", "fixed128": "fixed 128",
         "auto100": "auto, target 100 ms", "auto1000": "auto, target 1 s",
         "llama": "llama-server", "llama1": "llama-server, 1 thread"}


KV_SUFFIXES = ("-f32", "-f16", "-bf16")


def split_kv(c):
    """a budget and its KV suffix (itl.sh's CONFS="auto50-f16"), or ''"""
    for k in KV_SUFFIXES:
        if c.endswith(k):
            return c[:-len(k)], k
    return c, ""


def name_of(c):
    """a budget's label; autoN is a target of N ms, -f16 a KV cache type"""
    b, k = split_kv(c)
    kv = ", KV %s" % k[1:] if k else ""
    if b in NAMES:
        return NAMES[b] + kv
    if b.startswith("auto") and b[4:].isdigit():
        return "auto, target %s ms%s" % (b[4:], kv)
    return c


def fixed_ref(c, confs):
    """the fixed-512 run a budget's ratios are to: the one with its KV
    type where the run has it, else plain fixed512"""
    ref = "fixed512" + split_kv(c)[1]
    if ref in confs:
        return ref
    # llama-server, or a type the run has no fixed 512 of: the first one
    return next((x for x in sorted(confs) if split_kv(x)[0] == "fixed512"),
                "fixed512")


def pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(q * len(v)))]


def fmt(x):
    """a ratio: 2 decimals, 3 where it is under 0.1"""
    return "%.2f" % x if x >= 0.1 or x != x else "%.3f" % x


def ratio_to(rs, runs, w, ref, f):
    """the median over rounds of f(run) / f(ref's run in that round)"""
    base = {r["round"]: r["run"] for r in runs
            if r["workload"] == w and r["conf"] == ref}
    v = [f(r["run"]) / f(base[r["round"]]) for r in rs
         if r["round"] in base and f(base[r["round"]]) > 0]
    return statistics.median(v) if v else float("nan")


def main():
    runs, failed, machine = [], [], {}
    for line in open(sys.argv[1]):
        j = json.loads(line)
        if j.get("phase") == "machine":
            machine = j
        elif "run" in j:
            runs.append(j)
        elif j.get("failed"):
            failed.append("round %d %s %s: failed or timed out" % (
                j["round"], j["workload"], j["conf"]))
    rounds = sorted({r["round"] for r in runs})
    loads = [r["load1"] for r in runs]
    print("Step budget through nginx: %d rounds, the budgets in "
          "rotating order within each; %s cores, nalar_threads %s, KV cache "
          "%s; 1-minute load average %.1f-%.1f during the runs."
          % (len(rounds), machine.get("cores"), machine.get("threads"),
             machine.get("kv", "f32"), min(loads), max(loads)))
    if machine.get("peer"):
        print()
        ran = {r["conf"] for r in runs}
        how = (["`llama-server` -t %s -tb %s" % (machine.get("threads"),
                                                 machine.get("threads"))]
               * ("llama" in ran)
               + ["`llama-server, 1 thread` -t 1 -tb 1"] * ("llama1" in ran))
        print("Beside %s (-np 16 -cb -c 12288; %s) on the same model, "
              "loaded by the same client in the same rotation."
              % (machine["peer"], ", ".join(how)))
    print()
    peer = any(r["conf"] == "llama" for r in runs)
    peers = any(r["conf"].startswith("llama") for r in runs)
    print("| workload | budget | tokens/s | ITL p50 ms | ITL p99 ms "
          "| ITL p99 pooled ms | TTFT p50 ms | tok/s vs 512 | ITL p99 vs "
          "512 | TTFT p50 vs 512 |" + (" tok/s vs llama | ITL p99 vs llama "
                                      "| TTFT p50 vs llama |" if peer else ""))
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: |" + " ---: | ---: | ---: |" * peer)
    # fixed budgets, then targets from the loosest, then the peer
    confs = {r["conf"] for r in runs}
    # each KV type's fixed budgets, then its targets from the loosest
    order = []
    for k in ("",) + KV_SUFFIXES:
        autos = sorted((c for c in confs if split_kv(c)[1] == k
                        and split_kv(c)[0].startswith("auto")),
                       key=lambda c: -int(split_kv(c)[0][4:])
                       if split_kv(c)[0][4:].isdigit() else 0)
        order += ["fixed512" + k, "fixed128" + k] + autos
    order += ["llama", "llama1"]
    present = [c for c in order if any(r["conf"] == c for r in runs)]
    for w in ("plain", "shared"):
        for c in present:
            rs = [r for r in runs if r["workload"] == w and r["conf"] == c]
            if not rs:
                continue
            med = lambda f: statistics.median(f(r["run"]) for r in rs)
            ratio = lambda f, ref=fixed_ref(c, confs): ratio_to(
                rs, runs, w, ref, f)
            gaps = []
            for path in glob.glob("%s/itl-%s-%s-*.txt" % (sys.argv[2], w, c)):
                gaps += [float(x) for x in open(path) if x.strip()]
            tps = lambda j: j["tokens_per_s"]
            p99 = lambda j: j["itl_ms"]["p99"]
            ttft = lambda j: j["ttft_ms"]["p50"]
            line = ("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %s | "
                    "%s | %s |" % (
                        w, name_of(c), med(tps),
                        med(lambda j: j["itl_ms"]["p50"]), med(p99),
                        pct(gaps, 0.99), med(ttft), fmt(ratio(tps)),
                        fmt(ratio(p99)), fmt(ratio(ttft))))
            if peer:
                line += " %s | %s | %s |" % (
                    fmt(ratio(tps, "llama")), fmt(ratio(p99, "llama")),
                    fmt(ratio(ttft, "llama")))
            print(line)
    print()
    short = ["round %d %s %s: %d requests, %d errors" % (
                 r["round"], r["workload"], r["conf"], r["run"]["requests"],
                 r["run"]["errors"]) for r in runs
             if r["run"]["requests"] != machine.get("requests", 48)
             or r["run"]["errors"]]
    if short or failed:
        print("Incomplete runs: " + "; ".join(short + failed) + ".")
        print()
    if peers:
        print("Tokens counted per event: Nalar's from their ids in the stream "
              "(`logprobs`, `return_tokens_as_token_ids`), llama-server's "
              "from the growth of `timings.predicted_n` (`timings_per_token`)"
              "; tokens per event: %s." % ", ".join(
                  "%s %.3f" % (name_of(c), statistics.median(
                      r["run"]["tokens_per_event"] for r in runs
                      if r["conf"] == c))
                  for c in present))
        print()


main()

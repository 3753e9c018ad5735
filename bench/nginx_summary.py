#!/usr/bin/env python3
"""Tables and plot of bench/nginx.sh: reads bench/results/nginx.jsonl, writes
bench/results/nginx.md (and prints it) and, with gnuplot, bench/nginx.png."""
import json
import os
import shutil
import statistics
import subprocess
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/nginx.jsonl"
rows = [json.loads(l) for l in open(path) if l.strip()]
out = []
emit = out.append

machine = next((r for r in rows if r["phase"] == "machine"), {})
end = next((r for r in rows if r["phase"] == "machine_end"), {})
emit("# nginx path: Nalar module in /usr/sbin/nginx vs the engine in-process\n")
emit(f"Machine: {machine.get('cores', '?')} cores, load average "
     f"{machine.get('load1', '?')} at the start"
     + (f" and {end['load1']} at the end ({end['seconds']} s)" if end else "")
     + f", {machine.get('date', '')}; "
     f"engine threads {machine.get('threads', '?')}; demo model "
     "nalar-kjv-target-f32 (1.7M parameters, context 512); one nginx worker; "
     "prefix cache off; prompts are distinct token-id arrays.\n")

# --- (a) overhead ------------------------------------------------------------

ov = [r for r in rows if r["phase"] == "overhead"]
if ov:
    reps = max(r["rep"] for r in ov)
    emit(f"## Per-token latency: nginx path vs in-process (median of {reps} "
         "alternating runs)\n")
    emit("Greedy streams of 128 tokens (16-token prompts, ignore_eos), back "
         "to back on each stream. ms/token = (last token - request sent) / "
         "completion tokens, median over the requests of a run, then median "
         "over runs. In-process = the same engine (same threads, budget, "
         "KV pool) driven by `nginx_load engine` through the module's own "
         "pattern: engine thread, notify, eventfd, take.\n")
    emit("| nalar_threads | streams | in-process ms/token | nginx ms/token | "
         "overhead | in-process tokens/s | nginx tokens/s | "
         "in-process TTFT p50 ms | nginx TTFT p50 ms | nginx tokens/event |")
    emit("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for th in sorted({r.get("threads", 0) for r in ov}, reverse=True):
        for c in sorted({r["run"]["streams"] for r in ov}):
            def med(mode, f):
                v = [f(r["run"]) for r in ov
                     if r["run"]["streams"] == c and r.get("threads", 0) == th
                     and r["run"]["mode"] == mode]
                return statistics.median(v) if v else float("nan")
            e = med("engine", lambda x: x["ms_per_token"]["p50"])
            h = med("http", lambda x: x["ms_per_token"]["p50"])
            emit(f"| {th} | {c} | {e:.4f} | {h:.4f} | "
                 f"{100 * (h / e - 1):+.1f}% | "
                 f"{med('engine', lambda x: x['tokens_per_s']):.0f} | "
                 f"{med('http', lambda x: x['tokens_per_s']):.0f} | "
                 f"{med('engine', lambda x: x['ttft_ms']['p50']):.2f} | "
                 f"{med('http', lambda x: x['ttft_ms']['p50']):.2f} | "
                 f"{med('http', lambda x: x['tokens_per_event']):.2f} |")
    emit("\nGoal: overhead <= 5%.\n")

# --- (b) latency -------------------------------------------------------------

lat = [r for r in rows if r["phase"] == "latency"]
if lat:
    emit("## TTFT and inter-token latency, with and without a long-prompt "
         "prefill alongside\n")
    emit("Streams of 128 tokens with `logprobs: 0` and "
         "`return_tokens_as_token_ids` so that every event's tokens are "
         "counted: ITL = gap between events / tokens in the event. "
         "Interference: one more connection sends 480-token prompts "
         "(max_tokens 1) over and over; its TTFT is the long prefill's.\n")
    emit("| max_batch_tokens | streams | long prefill | requests | "
         "TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tokens/s | "
         "tokens/event | long prompts | long-prompt TTFT p50 / p99 ms |")
    emit("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in lat:
        x = r["run"]
        it = (f"{x['interfere_ttft_ms']['p50']:.1f} / "
              f"{x['interfere_ttft_ms']['p99']:.1f}"
              if x["interfere"] else "")
        emit(f"| {r['batch_tokens']} | {x['streams']} | "
             f"{'480 tokens' if x['interfere'] else 'none'} | "
             f"{x['requests']} | {x['ttft_ms']['p50']:.2f} | {x['ttft_ms']['p99']:.2f} | "
             f"{x['itl_ms']['p50']:.3f} | {x['itl_ms']['p99']:.3f} | "
             f"{x['tokens_per_s']:.0f} | {x['tokens_per_event']:.2f} | "
             f"{x.get('interfere_requests', '')} | {it} |")
    emit("")

# --- (c) idle streams --------------------------------------------------------

idle = [r for r in rows if r["phase"] == "idle"]
if idle:
    x = idle[-1]["run"]
    rss0 = x["rss0_kb"]
    emit("## Idle SSE streams held by one worker\n")
    emit("Streaming requests that stay queued (`nalar_max_running 1`: one "
         "runs, the rest wait and get `: keep-alive` every second; a stream "
         "that ends is replaced on its connection). Worker VmRSS from "
         f"/proc after each step; {rss0 / 1024:.1f} MiB before the first "
         "stream (model and 64 MiB KV pool).\n")
    emit("| streams open | answered (200) | waiting | running | worker RSS "
         "MiB | + KiB since 0 | KiB/stream overall | KiB/stream this step |")
    emit("|---:|---:|---:|---:|---:|---:|---:|---:|")
    prev_n, prev_rss = 0, rss0
    for lv in x["levels"]:
        n, rss = lv["open"], lv["rss_kb"]
        step = (rss - prev_rss) / (n - prev_n) if n != prev_n else 0
        emit(f"| {n} | {lv['answered']} | {lv['waiting']} | "
             f"{lv['running']} | {rss / 1024:.1f} | {rss - rss0} | "
             f"{(rss - rss0) / n:.2f} | {step:.2f} |")
        prev_n, prev_rss = n, rss
    a = x["after_close"]
    emit(f"\nAfter all {x['levels'][-1]['open']} clients hung up: waiting "
         f"{a['waiting']}, running {a['running']}, worker RSS "
         f"{a['rss_kb'] / 1024:.1f} MiB. Streams that finished and were "
         f"replaced during the run: {x['restarts']}; errors: "
         f"{x['errors']}.\n")

md = "\n".join(out)
os.makedirs("bench/results", exist_ok=True)
open("bench/results/nginx.md", "w").write(md + "\n")
print(md)

# --- plot --------------------------------------------------------------------

if lat and shutil.which("gnuplot"):
    series = []
    for bt in sorted({r["batch_tokens"] for r in lat}, reverse=True):
        for inter in (0, 1):
            pts = [(r["run"]["streams"], r["run"]["itl_ms"]["p99"],
                    r["run"]["ttft_ms"]["p99"]) for r in lat
                   if r["batch_tokens"] == bt
                   and bool(r["run"]["interfere"]) == bool(inter)]
            if pts:
                label = (f"budget {bt}, "
                         + ("with 480-token prefills" if inter else "alone"))
                series.append((label, sorted(pts)))
    data = ""
    for label, pts in series:
        data += "".join(f"{c} {i} {t}\n" for c, i, t in pts) + "\n\n"
    dat = "bench/results/nginx_latency.dat"
    open(dat, "w").write(data)

    def plot(col):
        return ", ".join(
            f"'{dat}' index {k} using 1:{col} with linespoints lw 2 "
            f"title '{label}'" for k, (label, _) in enumerate(series))
    subprocess.run(["gnuplot"], input=f"""
set terminal pngcairo size 1000,520
set output 'bench/nginx.png'
set multiplot layout 1,2 title 'nginx path, demo model, {machine.get("cores", "?")} cores'
set logscale y
set xlabel 'concurrent streams'
set xtics (1, 8, 32)
set key below font ',9'
set grid
set ylabel 'ms'
set title 'inter-token latency p99'
plot {plot(2)}
set title 'time to first token p99'
plot {plot(3)}
unset multiplot
""", text=True, check=True)

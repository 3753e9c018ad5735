#!/usr/bin/env python3
"""A model of bench/itl.sh's plain workload, to reason about the step budget.

Not a measurement: the engine's steps replaced by a cost line, t(n) = A + B n
seconds for a step of n batch tokens (times a normal noise of NOISE), and the
scheduler by what engine_step.c does -- decodes first, then prompt tokens in
admission order up to the step's allowance (a fixed number, or what fits the
target, at least the 16-token minimum chunk).  16 closed-loop clients, 48
requests of a 128-token prompt and 64 tokens, each client sending its next
request when the last one ends (plus LAT seconds).  No speculation, no
prefix cache, no event loop.

What it shows (Little's law): each client's cycle is TTFT + 63 x ITL =
16 x 64 / (tokens/s).  Every step of a target T holds D decodes and P
prompt tokens with P / D = 128 / 63, so D = (T - A) / (3.03 B): a tighter
target leaves fewer clients decoding and more waiting for their prompt.

    python3 bench/itl_model.py                 # A=9 ms, B=1.05 ms (the CPU
                                               # of bench/README.md)
    python3 bench/itl_model.py --a 6 --targets 50,45,40
    python3 bench/itl_model.py --share lifo    # newest prompt first
"""
import argparse
import random
import statistics


def pct(v, p):
    v = sorted(v)
    k = (len(v) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def run(o, target, seed):
    """One run: target None is a fixed max_batch_tokens (o.cap)."""
    rnd = random.Random(seed)
    a, b, P, N = o.a / 1e3, o.b / 1e3, o.prompt, o.tokens
    t, sent, pending, running = 0.0, 0, [], []
    ttft, itl, toks = [], [], 0
    for c in range(o.clients):
        pending.append(rnd.random() * 0.01)
        sent += 1
    while pending or running:
        for p in [p for p in pending if p <= t]:
            pending.remove(p)
            running.append({"sub": p, "done": 0, "gen": 0, "last": 0.0})
        if not running:
            t = min(pending)
            continue
        d = sum(1 for r in running if r["done"] >= P)
        if target is None:
            allow = o.cap - d
        else:
            fit = int((target / 1e3 - a) / b + 1e-6) - d
            allow = max(16, min(fit, o.cap - d))
        waiting = [r for r in running if r["done"] < P]
        if o.share == "lifo":
            waiting.reverse()
        batch = []
        if o.share == "rr":
            # an equal share each, what is left to the oldest
            each = allow // len(waiting) if waiting else 0
            for r in waiting:
                n = min(P - r["done"], each)
                batch.append([r, n])
                allow -= n
        for r in waiting:
            if allow <= 0:
                break
            have = sum(n for q, n in batch if q is r)
            n = min(P - r["done"] - have, allow)
            if n > 0:
                batch.append([r, n])
                allow -= n
        n_tok = d + sum(n for _, n in batch)
        t += (a + b * n_tok) * max(0.5, 1 + o.noise * rnd.gauss(0, 1))
        done = []
        for r in running:
            if r["done"] >= P:
                r["gen"] += 1
                toks += 1
                itl.append(t - r["last"])
                r["last"] = t
                if r["gen"] >= N:
                    done.append(r)
        for r, n in batch:
            r["done"] += n
            if r["done"] >= P and r["gen"] == 0:
                r["gen"] = 1
                toks += 1
                ttft.append(t - r["sub"])
                r["last"] = t
        for r in done:
            running.remove(r)
            if sent < o.requests:
                pending.append(t + o.lat / 1e3)
                sent += 1
    return {"tps": toks / t, "ttft": pct(ttft, 50) * 1e3,
            "p50": pct(itl, 50) * 1e3, "p99": pct(itl, 99) * 1e3}


def median_of(o, target):
    runs = [run(o, target, s) for s in range(o.seeds)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=float, default=9.0, help="ms per step")
    ap.add_argument("--b", type=float, default=1.05, help="ms per token")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--targets", default="100,50,47,45,40")
    ap.add_argument("--share", choices=("fcfs", "lifo", "rr"),
                    default="fcfs")
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--lat", type=float, default=3.0, help="ms")
    ap.add_argument("--seeds", type=int, default=15)
    o = ap.parse_args()

    base = median_of(o, None)
    print("| budget | tokens/s | ITL p50 ms | ITL p99 ms | TTFT p50 ms "
          "| tok/s vs fixed | TTFT p50 vs fixed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [("fixed %d" % o.cap, base)]
    for tg in o.targets.split(","):
        rows.append(("auto, target %s ms" % tg, median_of(o, float(tg))))
    for name, r in rows:
        print("| %s | %.0f | %.1f | %.1f | %.0f | %.2f | %.2f |" % (
            name, r["tps"], r["p50"], r["p99"], r["ttft"],
            r["tps"] / base["tps"], r["ttft"] / base["ttft"]))


if __name__ == "__main__":
    main()

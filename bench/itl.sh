#!/bin/sh
# The step budget against an ITL target, through nginx (Debian's
# /usr/sbin/nginx with the module, one worker, nalar_threads 2, 127.0.0.1):
# three servers at once on the same model --
#     fixed 512   nalar_max_batch_tokens 512
#     fixed 128   nalar_max_batch_tokens 128
#     auto        nalar_max_batch_tokens auto; nalar_itl_target 100ms
#                 (CONFS may name autoN: a target of N ms)
# -- loaded in turn (the order rotating each round, so that a slow spell of
# the busy machine falls on all alike), ROUNDS rounds of two workloads:
#     plain    16 streams, 48 requests of 64 tokens, 128-token prompts,
#              each distinct (a new seed each round: no prefix-cache hits;
#              every budget of a round gets the same prompts)
#     shared   the same with a shared 512-token prefix (about 400 words)
#              before 16 distinct tokens (the prefix cache holds it)
# Each run: ITL p50/p99, TTFT p50, tokens/s (build/bench/nginx_load http
# -r 48 --logprobs: each token's gap counted exactly).
#
# The peer, optional: CONFS naming `llama` adds llama.cpp's llama-server
# (built outside this tree: LLAMA_SERVER=path/to/llama-server, or
# LLAMA_BUILD=dir holding bin/llama-server) on the same GGUF, in the same
# rotation, loaded by the same client: THREADS threads (-t, -tb), 16
# slots with continuous batching (-np 16 -cb), a context of 16 x 768
# tokens (-c 12288: each slot holds a 528-token prompt and its 64 tokens),
# its prompt cache as it comes (per slot, and --cache-ram's default).  The
# client runs with --peer: each token counted from the stream's
# timings.predicted_n (see bench/nginx_load.c).  `llama1`: the same
# llama-server with 1 thread (-t 1 -tb 1), a control: its threads never
# wait for each other at a barrier.
#
# Each run stops sending new requests after DURATION seconds [900] and is
# abandoned after RUN_TIMEOUT [600] (recorded as failed, the rest goes on).
#
# KV [f32]: the Nalar servers' KV cache type (nalar_kv_cache 768m
# dtype=$KV: f32, f16 or bf16), recorded in the output's machine line.  A
# budget in CONFS may end in -f32, -f16 or -bf16 to give that server its
# own type, so two types run side by side in the same rounds
# (CONFS="fixed512 auto45 fixed512-f16 auto45-f16"); its ratios "vs 512"
# are then to the fixed 512 of its own type, where the run has one.
#
# The model: a random-weight Llama of about 108M parameters in F16 (dim
# 576, 30 layers, 9 heads, 3 KV heads, ffn 1536: SmolLM-135M's shape with
# the demo's 2,048-token vocabulary), made once with `nalar mkmodel` into
# build/bench/.  Writes bench/results/itl.jsonl (raw), bench/results/itl.md
# (medians and same-run ratios to fixed 512) and bench/itl.png (the ITL
# distribution, plain workload, every round).
#
#   sh bench/itl.sh                  # ROUNDS=3 PORT=18490
#   CONFS="fixed512 auto1000" WORKLOADS=plain OUT=/tmp/itl-1s.jsonl \
#       PNG=/tmp/itl-1s.png sh bench/itl.sh   # other budgets (auto1000: 1 s)
#   PLOT_ONLY=1 sh bench/itl.sh      # the plot again from the last run
#   ROUNDS=1 REQUESTS=16 OUT=/tmp/itl.jsonl PNG=/tmp/itl.png \
#       sh bench/itl.sh              # a smoke run (requests per run)
#   CONFS="fixed512 auto100 llama" LLAMA_BUILD=/path/to/llama.cpp/build \
#       sh bench/itl.sh              # beside llama-server
#   CONFS="fixed512 auto45 fixed512-f16 auto45-f16" WORKLOADS=plain \
#       OUT=/tmp/itl-f16.jsonl PNG=/tmp/itl-f16.png sh bench/itl.sh
#                                    # a half-size KV cache beside F32
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18490}
THREADS=${THREADS:-2}
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
MODEL=$ROOT/build/bench/itl-108m-f16.gguf
LOAD=$ROOT/build/bench/nginx_load
P=$ROOT/build/bench-itl
OUT=${OUT:-bench/results/itl.jsonl}
CONFS=${CONFS:-fixed512 fixed128 auto100}
WORKLOADS=${WORKLOADS:-plain shared}
REQUESTS=${REQUESTS:-48}
DURATION=${DURATION:-900}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
KV=${KV:-f32}
case $KV in f32 | f16 | bf16) ;; *) echo "itl.sh: KV=f32|f16|bf16" >&2; exit 2 ;; esac
LLAMA_SERVER=${LLAMA_SERVER:-${LLAMA_BUILD:+$LLAMA_BUILD/bin/llama-server}}
PEERS=

log() { echo "itl.sh: $*" >&2; }

# the ITL distribution (plain workload, every round) of each budget
plot() {
    command -v gnuplot >/dev/null || { log "gnuplot missing: no plot"; return 0; }
    ls "$P"/itl-plain-*.txt >/dev/null 2>&1 || { log "no plain runs: no plot"; return 0; }
    curves=
    for c in $CONFS; do
        cat "$P"/itl-plain-$c-*.txt | sort -n \
            | awk '{ v[NR] = $1 } END { for (i = 1; i <= NR; i++) print v[i], i / NR }' \
            > "$P/cdf-$c.dat"
        curves="$curves${curves:+, }\"$P/cdf-$c.dat\" using 1:2 with lines lw 2 title \"$(name_of $c)\""
    done
    gnuplot <<EOF
set terminal pngcairo size 900,560 font ",11"
set output "${PNG:-bench/itl.png}"
set title "Inter-token latency, 16 streams, $REQUESTS x 64 tokens, 128-token prompts\n(CPU, $THREADS threads; load average at the end $(cut -d" " -f1-3 /proc/loadavg))"
set xlabel "inter-token gap (ms, log scale)"
set ylabel "share of gaps <= x"
set logscale x
set key bottom right
set grid
set yrange [0:1.0]
plot $curves
EOF
    log "wrote ${PNG:-bench/itl.png}"
}

# a Nalar budget may end in -f32, -f16 or -bf16: that server's KV cache
# type (else $KV), so one run can set KV types side by side
# (CONFS="auto50 auto50-f16")
kv_of() {
    case $1 in *-f32 | *-f16 | *-bf16) echo "${1##*-}" ;; *) echo "$KV" ;; esac
}
base_of() {
    case $1 in *-f32 | *-f16 | *-bf16) echo "${1%-*}" ;; *) echo "$1" ;; esac
}

name_of() {
    case $1 in *-f32 | *-f16 | *-bf16) k=", KV $(kv_of $1)" ;; *) k= ;; esac
    case $(base_of $1) in fixed512) echo "fixed 512$k" ;;
    fixed128) echo "fixed 128$k" ;;
    auto1000) echo "auto, target 1 s$k" ;;
    auto*) b=$(base_of $1); echo "auto, target ${b#auto} ms$k" ;;
    llama) echo "llama-server" ;; llama1) echo "llama-server, 1 thread" ;;
    esac
}

if [ "${PLOT_ONLY:-}" = 1 ]; then
    plot
    exit 0
fi

case " $CONFS " in
*" llama "* | *" llama1 "*)
    [ -n "$LLAMA_SERVER" ] && [ -x "$LLAMA_SERVER" ] || {
        log "CONFS names llama-server: set LLAMA_SERVER=path/to/llama-server or LLAMA_BUILD=dir (bin/llama-server)"
        exit 2
    }
    # its shared libraries are beside it in a build tree
    LD_LIBRARY_PATH=$(dirname "$LLAMA_SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
    ;;
esac

make -s build/nalar module >/dev/null
make -s -f bench/bench.mk build/bench/nginx_load >/dev/null
[ -f "$MODEL" ] || ./build/nalar mkmodel --dim 576 --layers 30 --heads 9 \
    --kv-heads 3 --ffn 1536 --ctx 2048 --type f16 \
    --vocab-from models/nalar-kjv-target-f32.gguf -o "$MODEL" >/dev/null

rm -rf "$P"
mkdir -p "$P" bench/results
cp build/module/ngx_nalar_module.so "$P/ngx_nalar_module.so"

budget() {
    case $(base_of $1) in
    fixed512) echo "nalar_max_batch_tokens 512;" ;;
    fixed128) echo "nalar_max_batch_tokens 128;" ;;
    auto*)    b=$(base_of $1)
              echo "nalar_max_batch_tokens auto; nalar_itl_target ${b#auto}ms;" ;;
    esac
}

port_of() {
    # a KV suffix moves the port by 1000-3000
    case $1 in *-f32) o=1000 ;; *-f16) o=2000 ;; *-bf16) o=3000 ;; *) o=0 ;; esac
    b=$(base_of $1)
    case $b in fixed512) echo $((PORT + o)) ;; fixed128) echo $((PORT + o + 1)) ;;
    auto100) echo $((PORT + o + 2)) ;; auto1000) echo $((PORT + o + 3)) ;;
    llama) echo $((PORT + 4)) ;; llama1) echo $((PORT + 5)) ;;
    auto*) echo $((PORT + o + 6 + ${b#auto} % 1000)) ;; esac
}

is_peer() {
    case $1 in llama | llama1) return 0 ;; *) return 1 ;; esac
}

# llama-server answers /health; Nalar /v1/health
health_of() {
    if is_peer "$1"; then echo /health; else echo /v1/health; fi
}

# the load client's flags for a server: the peer's tokens are counted
# from its timings (nginx_load --peer)
peer_of() {
    if is_peer "$1"; then echo --peer; fi
}

MASTERS=
stop_all() {
    for m in $MASTERS; do kill -QUIT "$m" 2>/dev/null || true; done
    for m in $PEERS; do kill -TERM "$m" 2>/dev/null || true; done
    for m in $MASTERS $PEERS; do
        i=0
        while kill -0 "$m" 2>/dev/null && [ $i -lt 100 ]; do
            sleep 0.1; i=$((i + 1))
        done
        kill -KILL "$m" 2>/dev/null || true
    done
    MASTERS=
    PEERS=
}
trap stop_all EXIT
trap 'exit 1' INT TERM HUP

for c in $CONFS; do
    d=$P/$c
    mkdir -p "$d/logs"
    if is_peer "$c"; then
        t=$THREADS
        [ "$c" = llama ] || t=1
        "$LLAMA_SERVER" -m "$MODEL" -t "$t" -tb "$t" -np 16 -cb -c 12288 \
            --host 127.0.0.1 --port "$(port_of $c)" \
            > "$d/logs/server.log" 2>&1 &
        PEERS="$PEERS $!"
        eval "PID_$c=$!"
        continue
    fi
    cat > "$d/nginx.conf" <<EOF
load_module $P/ngx_nalar_module.so;
worker_processes 1;
error_log $d/logs/error.log notice;
pid $d/nginx.pid;
$([ "$(id -u)" = 0 ] && echo "user root;")
events { worker_connections 1024; }
http {
    nalar_model             m $MODEL;
    nalar_threads           $THREADS;
    nalar_kv_cache          768m dtype=$(kv_of $c);
    $(budget $c)
    access_log              off;
    client_body_temp_path   $d/client_body_temp;
    server {
        listen 127.0.0.1:$(port_of $c);
        location /v1/ { nalar_api; }
        location = /metrics { nalar_metrics; }
    }
}
EOF
    "$NGINX" -t -q -p "$d/" -c "$d/nginx.conf"
    "$NGINX" -p "$d/" -c "$d/nginx.conf"
    i=0
    while [ ! -s "$d/nginx.pid" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    MASTERS="$MASTERS $(cat "$d/nginx.pid")"
done
for c in $CONFS; do
    i=0
    until curl -sf --max-time 2 "http://127.0.0.1:$(port_of $c)$(health_of $c)" >/dev/null; do
        i=$((i + 1))
        [ $i -lt 300 ] || { log "$c did not become ready"; tail "$P/$c/logs/"*.log >&2; exit 1; }
        sleep 0.2
    done
done
log "servers ready: $CONFS"

: > "$OUT"
peer=
[ -z "$PEERS" ] || peer=", \"peer\": \"llama-server $("$LLAMA_SERVER" --version 2>&1 | sed -n 's/^version: //p')\""
echo "{\"phase\": \"machine\", \"cores\": $(nproc), \"load1\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"threads\": $THREADS, \"kv\": \"$KV\", \"requests\": $REQUESTS, \"date\": \"$(date -u +%FT%TZ)\"$peer}" >> "$OUT"

# the shared prefix once into each server's cache (and the weights warm)
for c in $CONFS; do
    "$LOAD" http --port "$(port_of $c)" -c 4 -r 4 -n 4 -p 528 --shared 512 \
        --vocab 2048 -d 600 --seed 999 $(peer_of $c) >/dev/null
done

for round in $(seq 1 "$ROUNDS"); do
    # rotate the order: round 1 512,128,auto; round 2 128,auto,512; ...
    set -- $CONFS
    k=$(( (round - 1) % $# ))
    while [ $k -gt 0 ]; do x=$1; shift; set -- "$@" "$x"; k=$((k - 1)); done
    for w in $WORKLOADS; do
        for c in "$@"; do
            # every budget gets the same prompts in a round, so the same
            # greedy tokens and as much for speculation to find; a new
            # set each round and workload, so no server's cache holds them
            case $w in
            plain)  wl="-p 128"; seed=$((round * 10 + 1)) ;;
            shared) wl="-p 528 --shared 512"; seed=$((round * 10 + 2)) ;;
            esac
            load1=$(cut -d' ' -f1 /proc/loadavg)
            if ! r=$(timeout "$RUN_TIMEOUT" "$LOAD" http --port "$(port_of $c)" \
                -c 16 -r "$REQUESTS" -n 64 $wl --vocab 2048 --logprobs \
                -d "$DURATION" --seed $seed $(peer_of $c) \
                --itl-out "$P/itl-$w-$c-$round.txt")
            then
                log "round $round $w $c: failed or over ${RUN_TIMEOUT}s"
                rm -f "$P/itl-$w-$c-$round.txt"
                echo "{\"round\": $round, \"workload\": \"$w\", \"conf\": \"$c\", \"load1\": $load1, \"failed\": true}" >> "$OUT"
                continue
            fi
            echo "{\"round\": $round, \"workload\": \"$w\", \"conf\": \"$c\", \"load1\": $load1, \"run\": $r}" >> "$OUT"
            log "round $round $w $c: $(echo "$r" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.1f tok/s, itl p50 %.1f p99 %.1f ms, ttft p50 %.0f ms" % (j["tokens_per_s"], j["itl_ms"]["p50"], j["itl_ms"]["p99"], j["ttft_ms"]["p50"]))')"
        done
    done
done

for c in $CONFS; do
    if is_peer "$c"; then
        eval "pid=\$PID_$c"
        kill -0 "$pid" 2>/dev/null || { log "$c: llama-server exited"; exit 1; }
        continue
    fi
    if grep -q "exited on signal\|\[alert\]\|\[emerg\]" "$P/$c/logs/error.log"; then
        log "$c: nginx reported trouble"
        grep "exited on signal\|\[alert\]\|\[emerg\]" "$P/$c/logs/error.log" | head >&2
        exit 1
    fi
    curl -s "http://127.0.0.1:$(port_of $c)/metrics" \
        | grep -E '^nalar_(steps_over_target_total|step_duration_seconds_count|step_prefill_budget_tokens)' \
        | sed "s/^/$c: /" >> "$P/metrics.txt"
done
stop_all

MD=${OUT%.jsonl}.md
python3 bench/itl_summary.py "$OUT" "$P" > "$MD"
cat "$P/metrics.txt" >> "$MD"
cat "$MD"
plot

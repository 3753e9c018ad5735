#!/bin/sh
# nginx-path benchmark: Debian's /usr/sbin/nginx with the
# module, one worker, the demo model, nalar_threads 2, on 127.0.0.1 only.
#
#   (a) per-token latency through nginx vs the same engine driven in-process
#       (build/bench/nginx_load engine: engine thread -> eventfd -> take, as
#       the module does), 1 and 16 streams, alternating runs, medians;
#   (b) TTFT and inter-token latency p50/p99 at 1, 8, 32 streams, with and
#       without a 480-token prompt sent over and over alongside (chunked-
#       prefill interference), at nalar_max_batch_tokens 512 and 64;
#   (c) 2,000 concurrent idle SSE streams (queued: nalar_max_running 1) in
#       one worker, its RSS after every 250.
#
# Writes bench/results/nginx.jsonl (raw), bench/results/nginx.md (tables)
# and bench/nginx.png (ITL p99 and TTFT p99 vs streams).  nginx is stopped
# at the end, on failure too.  Everything is bounded: the whole script stays
# under 10 minutes (phases are skipped when time runs out, and say so).
#
#   sh bench/nginx.sh              # REPS=5 DUR=2 IDLE=2000 PORT=18480
#   REPS=3 DUR=1 sh bench/nginx.sh # quicker
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-5}             # alternating repetitions of (a)
DUR=${DUR:-2}               # seconds of load per run
IDLE=${IDLE:-2000}          # idle streams in (c)
STEP=${STEP:-250}
PORT=${PORT:-18480}
THREADS=${THREADS:-2}       # nalar_threads of (b) and (c)
OVERHEAD_THREADS=${OVERHEAD_THREADS:-2 1}   # nalar_threads of the (a) runs
BUDGET=${BUDGET:-480}       # seconds; later phases are skipped past it
MODEL=$ROOT/models/nalar-kjv-target-f32.gguf
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
P=$ROOT/build/bench-nginx
LOAD=$ROOT/build/bench/nginx_load
OUT=bench/results/nginx.jsonl
T0=$(date +%s)

log() { echo "nginx.sh: $*" >&2; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }

# --- build ---------------------------------------------------------------

if ! make -s all >/dev/null; then
    log "make all failed; building only build/nalar and the module"
    make -s build/nalar module >/dev/null
fi
make -s -f bench/bench.mk >/dev/null
[ -f build/module/ngx_nalar_module.so ] || { log "the module was not built"; exit 1; }
command -v gnuplot >/dev/null || { [ "$(id -u)" = 0 ] && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox \
    >/dev/null 2>&1; } || log "gnuplot missing: no plot"
command -v curl >/dev/null || { log "curl is needed"; exit 1; }

# 2,000 streams need ~2,000 descriptors on each side
ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge $((IDLE + 64)) ] || { log "ulimit -n $(ulimit -n) < $IDLE streams"; exit 1; }

# a private copy of the module: a rebuild of build/module/ while nginx runs
# would rewrite the mapped library under the worker
rm -rf "$P"
mkdir -p "$P/logs" bench/results
cp build/module/ngx_nalar_module.so "$P/ngx_nalar_module.so"

rc=0; curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/" || rc=$?
if [ $rc != 7 ]; then
    log "127.0.0.1:$PORT is in use; set PORT"
    exit 1
fi

# --- nginx ---------------------------------------------------------------

MASTER=
WORKER=

stop() {
    [ -n "$MASTER" ] || return 0
    kill -QUIT "$MASTER" 2>/dev/null || true
    i=0
    while kill -0 "$MASTER" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1; i=$((i + 1))
    done
    kill -KILL "$MASTER" 2>/dev/null || true
    MASTER=
}
trap stop EXIT
trap 'exit 1' INT TERM HUP

# conf BATCH_TOKENS MAX_RUNNING KEEPALIVE THREADS
conf() {
    cat > "$P/nginx.conf" <<EOF
load_module $P/ngx_nalar_module.so;
worker_processes 1;
worker_rlimit_nofile 16384;
error_log $P/logs/error.log notice;
pid $P/nginx.pid;
$([ "$(id -u)" = 0 ] && echo "user root;")
events { worker_connections 8192; }
http {
    nalar_model             kjv $MODEL;
    nalar_threads           $4;
    nalar_kv_cache          64m;
    nalar_max_batch_tokens  $1;
    nalar_max_running       $2;
    nalar_max_queue         4096;
    nalar_prefix_cache      off;
    access_log              off;
    keepalive_requests      1000000;
    keepalive_timeout       120s;
    client_body_temp_path   $P/client_body_temp;
    proxy_temp_path         $P/proxy_temp;
    fastcgi_temp_path       $P/fastcgi_temp;
    uwsgi_temp_path         $P/uwsgi_temp;
    scgi_temp_path          $P/scgi_temp;
    server {
        listen 127.0.0.1:$PORT backlog=4096;
        location /v1/ { nalar_api; nalar_stream_keepalive $3; }
        location = /metrics { nalar_metrics; }
    }
}
EOF
}

# start BATCH_TOKENS MAX_RUNNING KEEPALIVE THREADS: a fresh nginx, ready to serve
start() {
    stop
    conf "$@"
    "$NGINX" -t -q -p "$P/" -c "$P/nginx.conf"
    "$NGINX" -p "$P/" -c "$P/nginx.conf"
    i=0
    while [ ! -s "$P/nginx.pid" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    MASTER=$(cat "$P/nginx.pid")
    i=0
    until curl -sf --max-time 2 "http://127.0.0.1:$PORT/v1/health" >/dev/null; do
        i=$((i + 1))
        [ $i -lt 150 ] || { log "nginx did not become ready"; tail "$P/logs/error.log" >&2; exit 1; }
        sleep 0.2
    done
    WORKER=$(cat "/proc/$MASTER/task/$MASTER/children" | tr -d ' ')
    case "$WORKER" in *[!0-9]*|"") log "expected one worker, got '$WORKER'"; exit 1;; esac
    log "nginx $MASTER (worker $WORKER): max_batch_tokens $1, max_running $2, threads $4"
}

healthy() {
    if grep -q "exited on signal\|\[alert\]\|\[emerg\]" "$P/logs/error.log"; then
        log "nginx reported trouble:"
        grep "exited on signal\|\[alert\]\|\[emerg\]" "$P/logs/error.log" | head >&2
        exit 1
    fi
}

# record PHASE EXTRA-JSON COMMAND...: one JSON line into $OUT; each run is
# cut at 120 s or at what is left of the budget
record() {
    phase=$1; extra=$2; shift 2
    t=$(left); [ "$t" -gt 120 ] && t=120; [ "$t" -lt 10 ] && t=10
    r=$(timeout "$t" "$@") || { log "failed or cut at ${t}s: $*"; echo "$r" >&2; healthy; exit 1; }
    echo "{\"phase\": \"$phase\", $extra\"run\": $r}" >> "$OUT"
}

: > "$OUT"
echo "{\"phase\": \"machine\", \"cores\": $(nproc), \"load1\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"threads\": $THREADS, \"date\": \"$(date -u +%FT%TZ)\"}" >> "$OUT"

# --- (a) nginx path vs in-process ----------------------------------------

# nalar_threads 2 (the configuration asked for) and 1 (a core left to nginx
# and the client: on a 2-core machine 2 engine threads, the worker and the
# client contend for the CPUs)
for th in $OVERHEAD_THREADS; do
    start 512 64 15s $th
    "$LOAD" http --port "$PORT" -c 16 -d 1 >/dev/null     # warm-up
    rep=1
    while [ $rep -le "$REPS" ] && [ "$(left)" -gt 300 ]; do
        for c in 1 16; do
            e="\"rep\": $rep, \"threads\": $th, \"batch_tokens\": 512, "
            eng="$LOAD engine -m $MODEL -t $th -c $c -d $DUR"
            htp="$LOAD http --port $PORT -c $c -d $DUR"
            if [ $((rep % 2)) = 1 ]; then
                record overhead "$e" $eng; record overhead "$e" $htp
            else
                record overhead "$e" $htp; record overhead "$e" $eng
            fi
        done
        log "(a) threads $th rep $rep done"
        rep=$((rep + 1))
    done
done
healthy

# --- (b) latency percentiles, chunked-prefill interference ---------------

for bt in 512 64; do
    [ "$(left)" -gt 150 ] || { log "(b) batch_tokens $bt skipped: out of time"; continue; }
    start $bt 64 15s "$THREADS"
    "$LOAD" http --port "$PORT" -c 8 -d 0.5 --logprobs >/dev/null
    for c in 1 8 32; do
        for lp in 0 480; do
            record latency "\"batch_tokens\": $bt, " \
                "$LOAD" http --port "$PORT" -c $c -d "$DUR" --logprobs --interfere $lp
        done
    done
    log "(b) batch_tokens $bt done"
    healthy
done

# --- (c) idle streams ----------------------------------------------------

if [ "$(left)" -gt 60 ]; then
    start 512 1 1s "$THREADS"
    record idle "" "$LOAD" idle --port "$PORT" --pid "$WORKER" -c "$IDLE" --step "$STEP"
    healthy
else
    log "(c) skipped: out of time"
fi
stop

echo "{\"phase\": \"machine_end\", \"load1\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"seconds\": $(($(date +%s) - T0))}" >> "$OUT"
log "done in $(($(date +%s) - T0)) s"
python3 bench/nginx_summary.py "$OUT"

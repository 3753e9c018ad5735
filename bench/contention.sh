#!/bin/sh
# Decode under contention: `nalar bench` on the demo target (2 threads,
# -p 128 -n N -b 1,16) alternately on the machine as it is ("idle") and
# with a busy loop pinned to CPU 1 (its own session, as another program
# would be), medians of REPS runs of each; then the CPU an idle engine
# uses: nginx with the module and the demo model, after one request, the
# worker's CPU time over IDLE_S seconds.
#
#   sh bench/contention.sh [REPS]          # REPS=5 N=128 IDLE_S=10
#   BASE=/tmp/old-nalar sh bench/contention.sh 3
#       also runs BASE (another build's build/nalar) in the same rounds,
#       alternating with this one
#
# Writes bench/results/contention.txt (raw lines) and prints a table.
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${1:-5}
N=${N:-128}
IDLE_S=${IDLE_S:-10}
PORT=${PORT:-18520}
BASE=${BASE:-}
LIMIT=${LIMIT:-300}             # seconds per `nalar bench` run (0s: did not finish)
MODEL=$ROOT/models/nalar-kjv-target-f32.gguf
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
OUT=bench/results/contention.txt
P=$ROOT/build/contention

log() { echo "contention.sh: $*" >&2; }

make -s build/nalar module >/dev/null
mkdir -p bench/results
[ "$(nproc)" -ge 2 ] || { log "needs 2 CPUs"; exit 1; }

HOG=
MASTER=
cleanup() {
    [ -z "$HOG" ] || kill "$HOG" 2>/dev/null || true
    HOG=
    if [ -n "$MASTER" ]; then
        kill -QUIT "$MASTER" 2>/dev/null || true
        sleep 1
        kill -KILL "$MASTER" 2>/dev/null || true
        MASTER=
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# one run: BIN LOAD -> "label load decode b1 b16"
one() {
    if [ "$2" = busy ]; then
        setsid taskset -c 1 sh -c 'while :; do :; done' &
        HOG=$!
        sleep 0.2
    fi
    j=$(timeout "$LIMIT" "$1" bench -m "$MODEL" -p 128 -n "$N" -b 1,16 -t 2 \
        --json || echo '{}')
    if [ -n "$HOG" ]; then
        kill "$HOG" 2>/dev/null || true
        HOG=
    fi
    echo "$j" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read() or "{}")
b = d.get("batched", {})
print(d.get("decode_tokens_per_s", 0), b.get("1", 0), b.get("16", 0))'
}

: > "$OUT"
for r in $(seq "$REPS"); do
    for bin in build/nalar $BASE; do
        for load in idle busy; do
            echo "$bin $load $(one "$bin" $load) $(cut -d' ' -f1 /proc/loadavg)" \
                | tee -a "$OUT"
        done
    done
done

python3 - "$OUT" <<'EOF'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
print("\n| binary | measure | idle (median) | busy loop on CPU 1 | kept |")
print("|---|---|---:|---:|---:|")
for b in dict.fromkeys(r[0] for r in rows):
    for i, name in ((2, "decode batch 1 (128-token context)"),
                    (3, "batch 1 (16-token context)"), (4, "batch 16")):
        med = {}
        for load in ("idle", "busy"):
            v = [float(r[i]) for r in rows if r[0] == b and r[1] == load]
            med[load] = st.median(v) if v else 0
        kept = med["busy"] / med["idle"] if med["idle"] else 0
        print(f"| {b} | {name} | {med['idle']:.0f} | {med['busy']:.0f} | "
              f"{kept:.0%} |")
print("\nload averages during the runs: "
      + " ".join(r[5] for r in rows if len(r) > 5))
EOF

# --- an idle engine's CPU ---
rm -rf "$P"
mkdir -p "$P/logs"
cp build/module/ngx_nalar_module.so "$P/ngx_nalar_module.so"
cat > "$P/nginx.conf" <<EOF
load_module $P/ngx_nalar_module.so;
worker_processes 1;
error_log $P/logs/error.log notice;
pid $P/nginx.pid;
$([ "$(id -u)" = 0 ] && echo "user root;")
events { worker_connections 64; }
http {
    nalar_model   kjv $MODEL;
    nalar_threads 2;
    access_log    off;
    client_body_temp_path $P/client_body_temp;
    proxy_temp_path       $P/proxy_temp;
    fastcgi_temp_path     $P/fastcgi_temp;
    uwsgi_temp_path       $P/uwsgi_temp;
    scgi_temp_path        $P/scgi_temp;
    server {
        listen 127.0.0.1:$PORT;
        location /v1/ { nalar_api; }
    }
}
EOF
"$NGINX" -p "$P" -c "$P/nginx.conf"
i=0
while [ ! -s "$P/nginx.pid" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
MASTER=$(cat "$P/nginx.pid")
i=0
until curl -sf -o /dev/null --max-time 30 "http://127.0.0.1:$PORT/v1/completions" \
        -d '{"prompt": "In the beginning", "max_tokens": 32}'
do
    i=$((i + 1))
    [ $i -lt 300 ] || { log "nginx never answered"; exit 1; }
    sleep 0.2
done
W=$(pgrep -P "$MASTER" | head -1)
HZ=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$W/stat"; }
sleep 1
t0=$(ticks)
sleep "$IDLE_S"
t1=$(ticks)
echo "idle engine (nginx worker, 2 engine threads, after one request):" \
     "$((t1 - t0)) ticks of $HZ/s in $IDLE_S s =" \
     "$(python3 -c "print(f'{100 * ($t1 - $t0) / $HZ / $IDLE_S:.2f}')")% of one CPU" \
    | tee -a "$OUT"

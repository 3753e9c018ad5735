#!/bin/sh
# Event-loop benchmark: what big prompts cost the other requests of an nginx
# worker.  Debian's /usr/sbin/nginx with the module, one worker, the demo
# model, nalar_threads 1, on 127.0.0.1 only; bench/eventloop.py is the client.
#
#   (a) a 2-token request's latency (p50, p99) idle, then while 4 clients
#       send ~1 MB prompts (conf.example's client_max_body_size 1m) over and
#       over, each refused as longer than the context;
#   (b) the same probe while one 10 MB prompt goes to a location with
#       client_max_body_size 64m (3 times): its latencies from the big
#       body's first byte to the big answer.
#
# Goals: (a) p99 within 3x of idle; (b) the probe delayed < 50 ms.
# Then (a) and (b) again with GET /v1/health as the probe, which the event
# loop answers without the engine: the loop's own delay.
# Writes bench/results/eventloop.jsonl.
#
#   sh bench/eventloop.sh            # DUR=10 PORT=18490
#   MODULE=path/to/other.so sh bench/eventloop.sh   # another build
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
DUR=${DUR:-10}
PORT=${PORT:-18490}
MODEL=$ROOT/models/nalar-kjv-target-f32.gguf
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
P=$ROOT/build/bench-eventloop
OUT=bench/results/eventloop.jsonl

if [ -z "${MODULE:-}" ]; then
    make -s build/nalar module >/dev/null
    MODULE=build/module/ngx_nalar_module.so
fi
rm -rf "$P"
mkdir -p "$P/logs" bench/results
# a private copy: a rebuild must not rewrite the library under the worker
cp "$MODULE" "$P/ngx_nalar_module.so"

cat > "$P/nginx.conf" <<CONF
load_module $P/ngx_nalar_module.so;
worker_processes 1;
error_log $P/logs/error.log notice;
pid $P/nginx.pid;
$([ "$(id -u)" = 0 ] && echo "user root;")
events { worker_connections 1024; }
http {
    nalar_model            kjv $MODEL;
    nalar_threads          1;
    access_log             off;
    client_body_temp_path  $P/client_body_temp;
    client_max_body_size   1m;
    server {
        listen 127.0.0.1:$PORT;
        location /v1/ { nalar_api; }
        location /big/v1/ { nalar_api; client_max_body_size 64m; }
    }
}
CONF

stop() { [ -f "$P/nginx.pid" ] && kill -QUIT "$(cat "$P/nginx.pid")" 2>/dev/null; sleep 1; }
trap stop EXIT
"$NGINX" -p "$P/" -c "$P/nginx.conf"
i=0
until curl -sf "http://127.0.0.1:$PORT/v1/health" >/dev/null; do
    i=$((i + 1)); [ $i -lt 300 ] || { echo "not ready" >&2; exit 1; }
    sleep 0.1
done

: > "$OUT"
python3 bench/eventloop.py --port "$PORT" idle --dur "$DUR" | tee -a "$OUT"
python3 bench/eventloop.py --port "$PORT" flood --dur "$DUR" | tee -a "$OUT"
python3 bench/eventloop.py --port "$PORT" idle --dur "$DUR" | tee -a "$OUT"
python3 bench/eventloop.py --port "$PORT" big --mb 10 --reps 3 | tee -a "$OUT"
# the same with a probe the event loop answers alone (no engine)
python3 bench/eventloop.py --port "$PORT" idle --dur "$DUR" --probe health \
    | tee -a "$OUT"
python3 bench/eventloop.py --port "$PORT" flood --dur "$DUR" --probe health \
    | tee -a "$OUT"
python3 bench/eventloop.py --port "$PORT" big --mb 10 --reps 3 --probe health \
    | tee -a "$OUT"

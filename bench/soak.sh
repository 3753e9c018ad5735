#!/bin/sh
# Soak (a benchmark, not a test): MINUTES of mixed traffic on 127.0.0.1
# against Debian's /usr/sbin/nginx with the module built here, then a
# report.
#
#   sh bench/soak.sh MINUTES            # e.g. 30
#   RELOAD_S=60 sh bench/soak.sh 2      # a short smoke with a reload
#
# nginx: one worker, the demo model with its draft (speculation on:
# `nalar_speculative draft`), a small KV cache (preemption under load), the
# prefix cache scoped by three tenants (`nalar_tenant $http_x_tenant`),
# HTTP/1.1 and HTTP/2 (prior knowledge) listeners.  Traffic
# (bench/soak.mjs): streams and plain requests, completions and chat,
# streams abandoned after a few events (HTTP/1.1 disconnects, HTTP/2
# RST_STREAM CANCEL), sampled requests, and greedy requests whose answers
# are compared with the same requests run alone first; in cycles of BUSY_S
# seconds of traffic and IDLE_S of none.  `nginx -s reload` every RELOAD_S
# seconds.  Every 10 s the current worker's RSS, its open fds and
# /metrics' KV free, KV total and running requests go to
# bench/results/soak.dat, plotted to bench/soak.png.
#
# The report (stdout and bench/results/soak.md): RSS and fds at the
# first and last idle sample of each worker, KV back to total at every
# idle point, [alert]/[crit]/[emerg] lines and crashed workers in
# error.log, and answers that differ from the reference.  Exit status 1
# when any of these fails.  Bounded: traffic stops after MINUTES, nginx is
# stopped at the end, on failure too.
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
MIN=${1:-30}
PORT=${PORT:-18500}
PORT2=$((PORT + 1))
RELOAD_S=${RELOAD_S:-300}
LOOPS=${LOOPS:-6}
BUSY_S=${BUSY_S:-45}
IDLE_S=${IDLE_S:-15}
THREADS=${THREADS:-2}
MODEL=$ROOT/models/nalar-kjv-target-f32.gguf
DRAFT=$ROOT/models/nalar-kjv-draft-f32.gguf
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
P=$ROOT/build/soak
DAT=bench/results/soak.dat
MD=bench/results/soak.md

log() { echo "soak.sh: $*" >&2; }

case $MIN in
    ''|*[!0-9]*) log "usage: sh bench/soak.sh MINUTES"; exit 2 ;;
esac
[ "$MIN" -ge 1 ] || { log "MINUTES must be 1 or more"; exit 2; }
command -v node >/dev/null || { log "node is needed (HTTP/2 client)"; exit 1; }
command -v curl >/dev/null || { log "curl is needed"; exit 1; }
if ! command -v gnuplot >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        log "installing gnuplot-nox for the plot"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox \
            >/dev/null 2>&1 || true
    fi
    command -v gnuplot >/dev/null \
        || log "gnuplot missing (apt-get install gnuplot-nox): no plot"
fi

make -s build/nalar module >/dev/null
[ -f build/module/ngx_nalar_module.so ] || { log "the module was not built"; exit 1; }

for port in $PORT $PORT2; do
    rc=0; curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/" || rc=$?
    [ $rc = 7 ] || { log "127.0.0.1:$port is in use; set PORT"; exit 1; }
done

# a private copy of the module: a rebuild of build/module/ while nginx
# runs would rewrite the mapped library under the worker
rm -rf "$P"
mkdir -p "$P/logs" bench/results
cp build/module/ngx_nalar_module.so "$P/ngx_nalar_module.so"

cat > "$P/nginx.conf" <<EOF
load_module $P/ngx_nalar_module.so;
worker_processes 1;
error_log $P/logs/error.log notice;
pid $P/nginx.pid;
$([ "$(id -u)" = 0 ] && echo "user root;")
events { worker_connections 4096; }
http {
    nalar_model             kjv $MODEL draft=$DRAFT;
    nalar_speculative       draft;
    nalar_threads           $THREADS;
    nalar_kv_cache          4m;
    nalar_max_batch_tokens  256;
    nalar_max_queue         1024;
    access_log              off;
    client_body_temp_path   $P/client_body_temp;
    proxy_temp_path         $P/proxy_temp;
    fastcgi_temp_path       $P/fastcgi_temp;
    uwsgi_temp_path         $P/uwsgi_temp;
    scgi_temp_path          $P/scgi_temp;
    server {
        listen 127.0.0.1:$PORT;
        listen 127.0.0.1:$PORT2 http2;
        location /v1/ {
            nalar_api;
            nalar_tenant \$http_x_tenant;
        }
        location = /metrics { nalar_metrics; }
    }
}
EOF

MASTER=
SAMPLER=
RELOADER=

stop() {
    for pid in $SAMPLER $RELOADER; do
        kill "$pid" 2>/dev/null || true
    done
    SAMPLER= RELOADER=
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

"$NGINX" -p "$P" -c "$P/nginx.conf" -t -q || { log "nginx -t failed"; exit 1; }
"$NGINX" -p "$P" -c "$P/nginx.conf"
i=0
while [ ! -s "$P/nginx.pid" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
MASTER=$(cat "$P/nginx.pid")

# the worker that serves now: the master's child not shutting down
worker() {
    for w in $(pgrep -P "$MASTER" 2>/dev/null); do
        case "$(cat /proc/$w/cmdline 2>/dev/null | tr '\0' ' ')" in
            *"worker process is shutting down"*) ;;
            *"worker process"*) echo "$w"; return ;;
        esac
    done
}

H1=http://127.0.0.1:$PORT
H2=http://127.0.0.1:$PORT2

log "collecting the reference answers (each request alone)"
node bench/soak.mjs ref "$H1" "$H2" kjv "$P/ref.json"

# --- sampler: every 10 s ---
T0=$(date +%s)
echo "# t_s worker_pid rss_kb fds kv_free kv_total running" > "$DAT"
(
    while :; do
        w=$(worker)
        rss=$(awk '/^VmRSS/ { print $2 }' /proc/$w/status 2>/dev/null || echo NaN)
        fds=$(ls /proc/$w/fd 2>/dev/null | wc -l)
        m=$(curl -s --max-time 5 "$H1/metrics" || true)
        get() { echo "$m" | awk -v n="$1" '$1 == n "{model=\"kjv\"}" { print $2 }'; }
        echo "$(( $(date +%s) - T0 )) ${w:-0} ${rss:-NaN} $fds" \
             "$(get nalar_kv_blocks_free) $(get nalar_kv_blocks_capacity)" \
             "$(get nalar_requests_running)" >> "$DAT"
        sleep 10
    done
) &
SAMPLER=$!

# --- reloader: every RELOAD_S seconds, the first 25 s early so that it
# lands in a busy phase ---
(
    sleep $((RELOAD_S > 50 ? RELOAD_S - 25 : RELOAD_S))
    while :; do
        echo "$(( $(date +%s) - T0 ))" >> "$P/reloads"
        "$NGINX" -p "$P" -c "$P/nginx.conf" -s reload 2>>"$P/reload.err" \
            || echo "reload failed" >> "$P/reload.err"
        sleep "$RELOAD_S"
    done
) &
RELOADER=$!

log "traffic for $MIN minutes ($LOOPS loops, ${BUSY_S}s busy / ${IDLE_S}s idle, reload every ${RELOAD_S}s)"
rc=0
node bench/soak.mjs run "$H1" "$H2" kjv "$P/ref.json" $((MIN * 60)) \
    "$LOOPS" "$BUSY_S" "$IDLE_S" > "$P/summary.json" || rc=$?
[ $rc = 0 ] || log "the traffic generator exited with $rc"
sleep 1
kill "$SAMPLER" "$RELOADER" 2>/dev/null || true
SAMPLER= RELOADER=
stop

# --- plot ---
if command -v gnuplot >/dev/null; then
    gnuplot <<EOF || log "gnuplot failed"
set terminal pngcairo size 1000,700 noenhanced
set output 'bench/soak.png'
set multiplot layout 2,1 title 'soak: $MIN min, reload every ${RELOAD_S}s'
set xlabel 'seconds'
set ylabel 'worker RSS (MB)'
set y2label 'open fds'
set ytics nomirror
set y2tics
set key top left
plot '$DAT' using 1:(\$3/1024) with linespoints title 'RSS', \
     '' using 1:4 axes x1y2 with linespoints title 'fds'
set ylabel 'KV blocks'
set y2label 'running requests'
plot '$DAT' using 1:5 with linespoints title 'KV free', \
     '' using 1:6 with lines dashtype 2 title 'KV total', \
     '' using 1:7 axes x1y2 with linespoints title 'running'
unset multiplot
EOF
fi

# --- report ---
python3 - "$P" "$DAT" "$MIN" "$RELOAD_S" > "$MD" <<'EOF' || rc=1
import json, re, sys
p, dat, mins, reload_s = sys.argv[1:]
s = json.load(open(p + '/summary.json'))
log = open(p + '/logs/error.log', errors='replace').read()
bad = [l for l in log.splitlines()
       if re.search(r'\[(alert|crit|emerg)\]', l)
       or 'exited on signal' in l]
try:
    reloads = open(p + '/reloads').read().split()
except OSError:
    reloads = []
rows = [l.split() for l in open(dat) if not l.startswith('#')]
by = {}
for r in rows:
    if r[1] != '0' and r[2] != 'NaN':
        by.setdefault(r[1], []).append(r)
idle = s['idle_points']
idle_bad = [pt for pt in idle if not pt['ok']]
fail = bool(bad or idle_bad or s['mismatches'] or s.get('hard_stop'))
print(f"# Soak: {mins} min, reload every {reload_s} s "
      f"({len(reloads)} reloads, at {', '.join(reloads) or '-'} s)\n")
print(f"requests {s['requests']}: greedy {s['greedy']} "
      f"(compared {s['greedy_checked']}), abandoned streams "
      f"{s['aborted']}, sampled {s['sampled']}; over HTTP/2 "
      f"{s['h2_requests']} ({s['h2_cancels']} cancelled); status "
      f"{json.dumps(s['status'])}; connection errors "
      f"{json.dumps(s['errors'])}\n")
print("| worker | samples | RSS first -> last (MB) | RSS max | "
      "fds first -> last | fds max |")
print("|---|---:|---:|---:|---:|---:|")
for w, rs in by.items():
    rss = [int(r[2]) / 1024 for r in rs]
    fds = [int(r[3]) for r in rs]
    print(f"| {w} | {len(rs)} | {rss[0]:.1f} -> {rss[-1]:.1f} | "
          f"{max(rss):.1f} | {fds[0]} -> {fds[-1]} | {max(fds)} |")
print()
print(f"idle points: {len(idle)}, KV back to total at "
      f"{len(idle) - len(idle_bad)} of them"
      + (f"; NOT at: {json.dumps(idle_bad)}" if idle_bad else ""))
print(f"error.log: {len(bad)} [alert]/[crit]/[emerg] or crash lines"
      + ("".join("\n    " + l for l in bad[:10])))
print(f"answers that differ from the same request alone: "
      f"{len(s['mismatches'])}")
for m in s['mismatches'][:5]:
    print("    " + json.dumps(m))
if s.get('hard_stop'):
    print("the traffic generator hit its hard stop")
print("\nresult: " + ("FAIL" if fail else "ok"))
sys.exit(1 if fail else 0)
EOF
cat "$MD"
exit $rc

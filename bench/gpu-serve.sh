#!/bin/sh
# gpu-serve: the server end to end on a GPU, in one run (well under 10
# minutes on one H200):
#   1. build with CUDA: build/nalar, the nginx module, the load client
#      (bench/nginx_load.c) linked with the CUDA backend
#   2. nalar mkmodel: a Llama-3-8B-shaped random BF16 GGUF and a
#      Llama-3.2-1B-shaped draft with the same vocabulary (kept in
#      build/gpu-serve/ for the next run)
#   3. nginx with `nalar_backend cuda`, one model with its draft and three
#      locations: /v1/ (speculation off), /auto/v1/ (auto), /draft/v1/
#   4. the load client against it:
#      - 1/8/32/128 concurrent streams: output tok/s, TTFT and ITL p50/p99
#      - prefix reuse: 2048-token prompts sharing 95% against distinct ones
#      - Predicted Outputs: each stream's prediction is its own greedy
#        answer with 10% of its tokens altered, against plain decoding on
#        the same prompts, alternating, at 1 stream
#      - auto (the draft) against plain at 32 streams, alternating; the
#        draft's cost per proposal and what the cost model chose, from
#        /metrics
#      - the nginx overhead: the same load on the same engine in-process
#        (the client's engine mode), per token
# and prints the tables last.  Exit status non-zero when a build, nginx or
# any request failed (the performance goals are reported, not enforced).
#
#   sh bench/gpu-serve.sh                       (logs in build/gpu-serve)
#   BACKEND=cpu SMALL=1 sh bench/gpu-serve.sh   (CPU backend, small models)
#
# Knobs: BACKEND cuda|cpu; SMALL=1 small models and short runs; DUR seconds
# per run; REPS alternations; STREAMS the concurrency levels; KV_DTYPE=bf16
# a BF16 KV cache (nalar_kv_cache ... dtype=bf16); BUILD=0 uses
# what is built; PORT; LOG the directory for logs and models; BUDGET
# seconds after which later phases are skipped (and say so); NALAR_NGINX.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
BACKEND=${BACKEND:-cuda}
SMALL=${SMALL:-0}
BUILD=${BUILD:-1}
PORT=${PORT:-18580}
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
LOG=${LOG:-$ROOT/build/gpu-serve}
P=$LOG/nginx
OUT=$LOG/serve.jsonl
T0=$(date +%s)

if [ "$SMALL" = 1 ]; then
    # a small Llama for the CPU: the same phases in a minute or two
    TGT_ARGS="--dim 256 --layers 4 --heads 8 --kv-heads 2 --ffn 768"
    DRAFT_ARGS="--dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 384"
    VOCAB=${VOCAB:-4096}
    CTX=4096
    TAG=small
    DUR=${DUR:-1}
    REPS=${REPS:-1}
    NTOK=${NTOK:-32}
    PRED_NTOK=${PRED_NTOK:-64}
    KV=${KV:-256m}
    BATCH_TOKENS=512
    PREFIX_LEN=256          # prefix reuse: prompt tokens ...
    PREFIX_SHARED=243       # ... of which shared (95%)
    STREAMS=${STREAMS:-1 8 32 128}
    BUDGET=${BUDGET:-300}
else
    TGT_ARGS="--dim 4096 --layers 32 --heads 32 --kv-heads 8 --ffn 14336"
    DRAFT_ARGS="--dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192"
    VOCAB=${VOCAB:-128256}
    CTX=8192
    TAG=8b
    DUR=${DUR:-5}
    REPS=${REPS:-3}
    NTOK=${NTOK:-128}
    PRED_NTOK=${PRED_NTOK:-256}
    KV=${KV:-16g}
    BATCH_TOKENS=2048
    PREFIX_LEN=2048
    PREFIX_SHARED=1946
    STREAMS=${STREAMS:-1 8 32 128}
    BUDGET=${BUDGET:-540}
fi
PROMPT=64                   # prompt tokens of the stream runs
THREADS=${THREADS:-2}       # nalar_threads (CPU backend)
TGT=$LOG/target-$TAG-bf16.gguf
DRAFT=$LOG/draft-$TAG-bf16.gguf

mkdir -p "$LOG"
say() { printf '== %s (%ss)\n' "$1" "$(( $(date +%s) - T0 ))"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
die() { echo "gpu-serve: FAILED: $*"; exit 1; }
kvbytes() {
    case "$1" in
    *g) echo $(( ${1%g} * 1073741824 ));;
    *m) echo $(( ${1%m} * 1048576 ));;
    *)  echo "$1";;
    esac
}

# --- build ---------------------------------------------------------------

say "device"
if [ "$BACKEND" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version \
        --format=csv,noheader 2>/dev/null || echo "nvidia-smi not available"
    LOAD=$ROOT/build/bench/nginx_load_cuda
    CUDA=1
else
    echo "backend $BACKEND, $(nproc) cores"
    LOAD=$ROOT/build/bench/nginx_load
    CUDA=0
fi

if [ "$BUILD" = 1 ]; then
    say "build"
    if ! make -j"$(nproc)" NALAR_CUDA=$CUDA build/nalar module \
            >"$LOG/build.log" 2>&1; then
        tail -n 40 "$LOG/build.log"
        die "the build"
    fi
fi
make -s -f bench/bench.mk "build/bench/$(basename "$LOAD")" \
        >>"$LOG/build.log" 2>&1 \
    || { tail -n 20 "$LOG/build.log"; die "the load client"; }
[ -f build/module/ngx_nalar_module.so ] || die "the module was not built"
command -v curl >/dev/null || die "curl is needed"
ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# --- models --------------------------------------------------------------

say "models"
if [ ! -s "$TGT" ] || [ "$(cat "$TGT.args" 2>/dev/null)" != "$TGT_ARGS $VOCAB" ]
then
    rm -f "$TGT" "$TGT.args" "$DRAFT" "$DRAFT.args"
    ./build/nalar mkmodel $TGT_ARGS --vocab "$VOCAB" --ctx $CTX --type bf16 \
        -o "$TGT" >"$LOG/mkmodel.log" 2>&1 \
        || { cat "$LOG/mkmodel.log"; die "mkmodel (target)"; }
    echo "$TGT_ARGS $VOCAB" > "$TGT.args"
fi
if [ ! -s "$DRAFT" ] || [ "$(cat "$DRAFT.args" 2>/dev/null)" != "$DRAFT_ARGS" ]
then
    ./build/nalar mkmodel $DRAFT_ARGS --vocab-from "$TGT" --ctx $CTX \
        --type bf16 -o "$DRAFT" >>"$LOG/mkmodel.log" 2>&1 \
        || { cat "$LOG/mkmodel.log"; die "mkmodel (draft)"; }
    echo "$DRAFT_ARGS" > "$DRAFT.args"
fi
ls -l "$TGT" "$DRAFT" | awk '{ printf "%s %.2f GB\n", $NF, $5 / 1e9 }'

# --- nginx ---------------------------------------------------------------

rm -rf "$P"
mkdir -p "$P/logs"
cp build/module/ngx_nalar_module.so "$P/ngx_nalar_module.so"
rc=0; curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/" || rc=$?
[ $rc = 7 ] || die "127.0.0.1:$PORT is in use; set PORT"

cat > "$P/nginx.conf" <<EOF
load_module $P/ngx_nalar_module.so;
worker_processes 1;
worker_rlimit_nofile 16384;
error_log $P/logs/error.log notice;
pid $P/nginx.pid;
$([ "$(id -u)" = 0 ] && echo "user root;")
events { worker_connections 8192; }
http {
    nalar_backend           $BACKEND;
    nalar_model             m $TGT draft=$DRAFT;
    nalar_threads           $THREADS;
    nalar_kv_cache          $KV${KV_DTYPE:+ dtype=$KV_DTYPE};
    nalar_max_batch_tokens  $BATCH_TOKENS;
    nalar_max_running       256;
    nalar_max_queue         4096;
    nalar_prefix_cache      on;
    access_log              off;
    keepalive_requests      1000000;
    client_max_body_size    4m;
    client_body_temp_path   $P/client_body_temp;
    proxy_temp_path         $P/proxy_temp;
    fastcgi_temp_path       $P/fastcgi_temp;
    uwsgi_temp_path         $P/uwsgi_temp;
    scgi_temp_path          $P/scgi_temp;
    server {
        listen 127.0.0.1:$PORT backlog=4096;
        location /v1/       { nalar_api; nalar_speculative off; }
        location /auto/v1/  { nalar_api; nalar_speculative auto; }
        location /draft/v1/ { nalar_api; nalar_speculative draft; }
        location = /metrics { nalar_metrics; }
    }
}
EOF

MASTER=
stop() {
    [ -n "$MASTER" ] || return 0
    kill -QUIT "$MASTER" 2>/dev/null || true
    i=0
    while kill -0 "$MASTER" 2>/dev/null && [ $i -lt 150 ]; do
        sleep 0.1; i=$((i + 1))
    done
    kill -KILL "$MASTER" 2>/dev/null || true
    MASTER=
}
trap stop EXIT
trap 'exit 1' INT TERM HUP

healthy() {
    if grep -q "exited on signal\|\[alert\]\|\[emerg\]" "$P/logs/error.log"
    then
        grep "exited on signal\|\[alert\]\|\[emerg\]" "$P/logs/error.log" \
            | head
        die "nginx reported trouble"
    fi
}

say "nginx ($BACKEND)"
"$NGINX" -t -q -p "$P/" -c "$P/nginx.conf" || die "nginx -t"
"$NGINX" -p "$P/" -c "$P/nginx.conf" || die "nginx did not start"
i=0
while [ ! -s "$P/nginx.pid" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
MASTER=$(cat "$P/nginx.pid")
i=0
until curl -sf --max-time 2 "http://127.0.0.1:$PORT/v1/health" >/dev/null; do
    i=$((i + 1))
    [ $i -lt 900 ] || { tail "$P/logs/error.log"; die "nginx not ready"; }
    sleep 0.2
done
healthy

# --- load ----------------------------------------------------------------

FAILED=
: > "$OUT"
# run PHASE ARGS...: one client run, its JSON lines tagged into $OUT
run() {
    phase=$1; shift
    t=$(left); [ "$t" -gt 180 ] && t=180; [ "$t" -lt 20 ] && t=20
    if ! timeout "$t" "$LOAD" "$@" --vocab "$VOCAB" > "$LOG/run.out" \
            2>>"$LOG/client.log"; then
        FAILED="$FAILED $phase"
        echo "gpu-serve: $phase failed: $LOAD $*" >&2
    fi
    sed "s/^{/{\"phase\": \"$phase\", /" "$LOG/run.out" >> "$OUT"
    healthy
}
# metrics: the model's counters, "name value" lines
metrics() {
    curl -sf --max-time 10 "http://127.0.0.1:$PORT/metrics" \
        | awk '/^nalar_(spec_decode|generation_tokens|prefix_cache)[a-z_]*\{model="m"\}/ {
                   sub(/\{model="m"\}/, ""); print }'
}
skip() { echo "gpu-serve: $1 skipped: out of time" >&2; FAILED="$FAILED $1"; }

say "warm-up"
run warmup http --port "$PORT" -c 8 -d 0.5 -n 16 -p "$PROMPT" --logprobs

say "streams: $STREAMS"
for c in $STREAMS; do
    [ "$(left)" -gt 60 ] || { skip "streams-$c"; continue; }
    run streams http --port "$PORT" -c "$c" -d "$DUR" -n "$NTOK" \
        -p "$PROMPT" --logprobs
done

say "prefix reuse: $PREFIX_LEN-token prompts, $PREFIX_SHARED shared"
for rep in $(seq "$REPS"); do
    [ "$(left)" -gt 60 ] || { skip prefix; break; }
    for c in 1 8; do
        run prefix-cold http --port "$PORT" -c $c -d "$DUR" -n 8 \
            -p $PREFIX_LEN --shared 0
        run prefix-shared http --port "$PORT" -c $c -d "$DUR" -n 8 \
            -p $PREFIX_LEN --shared $PREFIX_SHARED
    done
done

say "predicted outputs: 1 stream, 10% of the answer altered"
if [ "$(left)" -gt 60 ]; then
    run predict predict --port "$PORT" -c 1 -d "$DUR" -n "$PRED_NTOK" \
        -p "$PROMPT" --alter 10 --reps "$REPS" --path /v1 \
        --pred-path /auto/v1
else
    skip predict
fi

say "draft: auto against plain at 32 streams, forced draft at 1"
if [ "$(left)" -gt 60 ]; then
    metrics > "$LOG/m0.txt"
    for rep in $(seq "$REPS"); do
        run auto-plain http --port "$PORT" -c 32 -d "$DUR" -n "$NTOK" \
            -p "$PROMPT" --path /v1
        run auto http --port "$PORT" -c 32 -d "$DUR" -n "$NTOK" \
            -p "$PROMPT" --path /auto/v1
    done
    metrics > "$LOG/m1.txt"
    run draft-1 http --port "$PORT" -c 1 -d "$DUR" -n "$NTOK" -p "$PROMPT" \
        --path /draft/v1
    metrics > "$LOG/m2.txt"
else
    skip draft
fi

say "nginx against the engine in-process"
for c in 1 32; do
    [ "$(left)" -gt 60 ] || { skip "overhead-$c"; continue; }
    run overhead-http http --port "$PORT" -c $c -d "$DUR" -n "$NTOK" \
        -p "$PROMPT"
    run overhead-engine engine -m "$TGT" --backend "$BACKEND" -t "$THREADS" \
        --kv "$(kvbytes "$KV")" ${KV_DTYPE:+--kv-dtype $KV_DTYPE} \
        --batch-tokens $BATCH_TOKENS -c $c \
        -d "$DUR" -n "$NTOK" -p "$PROMPT"
done
healthy
stop

# --- tables --------------------------------------------------------------

say "done"
echo
echo "================ gpu-serve: backend $BACKEND, $(basename "$TGT")," \
     "draft $(basename "$DRAFT") ================"
awk -v m0="$LOG/m0.txt" -v m1="$LOG/m1.txt" -v m2="$LOG/m2.txt" '
function num(key,   r) {        # "key": number
    if (match($0, "\"" key "\": -?[0-9.e+]+")) {
        r = substr($0, RSTART, RLENGTH); sub(/.*: /, "", r); return r + 0
    }
    return -1
}
function pct(key, q,   r) {     # "key": {"p50": x, "p99": y ...}
    if (match($0, "\"" key "\": \\{\"p50\": -?[0-9.e+]+, \"p99\": -?[0-9.e+]+")) {
        r = substr($0, RSTART, RLENGTH)
        if (q == 50) { sub(/, "p99.*/, "", r); sub(/.*"p50": /, "", r) }
        else sub(/.*"p99": /, "", r)
        return r + 0
    }
    return -1
}
function str(key,   r) {
    if (match($0, "\"" key "\": \"[^\"]*\"")) {
        r = substr($0, RSTART, RLENGTH); sub(/.*: "/, "", r); sub(/"$/, "", r)
        return r
    }
    return ""
}
function med(a, n,   i, j, t) {     # median of a[1..n] (sorts a)
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n ? (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : -1
}
function readm(f, arr,   line, k) {
    while ((getline line < f) > 0) { split(line, k, " "); arr[k[1]] = k[2] }
}
{
    ph = str("phase")
    reqs += (num("requests") > 0 ? num("requests") : 0)
    errs += (num("errors") > 0 ? num("errors") : 0)
}
ph == "streams" {
    ns++
    srow[ns] = sprintf("%7d %10.1f %9.1f %9.1f %8.2f %8.2f %8d",
        num("streams"), num("tokens_per_s"), pct("ttft_ms", 50),
        pct("ttft_ms", 99), pct("itl_ms", 50), pct("itl_ms", 99),
        num("requests"))
}
ph == "prefix-cold" || ph == "prefix-shared" {
    c = num("streams"); k = ph "," c
    pn[k]++; pv[k, pn[k]] = pct("ttft_ms", 50); pq[k, pn[k]] = pct("ttft_ms", 99)
    pstreams[c] = 1
}
ph == "predict" && str("mode") == "predicted" {
    acc += num("accepted_prediction"); rej += num("rejected_prediction")
}
ph == "predict" && str("mode") == "predict_summary" {
    pred_med = num("speedup_median"); pred_min = num("speedup_min")
    pred_max = num("speedup_max"); pred_alt = num("altered_tokens")
    pred_tok = num("answer_tokens")
}
ph == "predict" && str("mode") == "plain" { npp++; ppl[npp] = num("tokens_per_s") }
ph == "predict" && str("mode") == "predicted" { npd++; ppd[npd] = num("tokens_per_s") }
ph == "auto-plain" { nap++; apl[nap] = num("tokens_per_s") }
ph == "auto" { nau++; aut[nau] = num("tokens_per_s"); if (nap >= nau && apl[nau] > 0) ar[nau] = aut[nau] / apl[nau] }
ph == "draft-1" { d1 = num("tokens_per_s") }
ph == "overhead-http" { oh[num("streams")] = pct("ms_per_token", 50) }
ph == "overhead-engine" { oe[num("streams")] = pct("ms_per_token", 50) }
END {
    print "## streams (prompt " '"$PROMPT"' " tokens, " '"$NTOK"' " generated, greedy, via nginx)"
    printf "%7s %10s %9s %9s %8s %8s %8s\n", "streams", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "requests"
    printf "%7s %10s %9s %9s %8s %8s %8s\n", "", "", "ms", "ms", "ms", "ms", ""
    for (i = 1; i <= ns; i++) print srow[i]
    print ""
    print "## prefix reuse: " '"$PREFIX_LEN"' "-token prompts, " '"$PREFIX_SHARED"' " shared (95%) against distinct (cold)"
    printf "%7s %14s %14s %14s %14s %8s\n", "streams", "cold TTFT p50", "shared p50", "cold p99", "shared p99", "ratio"
    for (c = 1; c <= 128; c++) if (c in pstreams) {
        kc = "prefix-cold," c; ks = "prefix-shared," c
        for (i = 1; i <= pn[kc]; i++) { a1[i] = pv[kc, i]; a3[i] = pq[kc, i] }
        for (i = 1; i <= pn[ks]; i++) { a2[i] = pv[ks, i]; a4[i] = pq[ks, i] }
        x = med(a1, pn[kc]); y = med(a2, pn[ks])
        printf "%7d %11.1f ms %11.1f ms %11.1f ms %11.1f ms %7.1f%%  (goal <= 10%%: %s)\n", c, x,
            y, med(a3, pn[kc]), med(a4, pn[ks]), (x > 0 ? 100 * y / x : -1),
            (x > 0 && y / x <= 0.10) ? "met" : "not met"
    }
    print ""
    print "## speculation"
    if (pred_med != "") {
        printf "Predicted Outputs, 1 stream: plain %.1f tok/s, predicted %.1f tok/s (medians);\n", med(ppl, npp), med(ppd, npd)
        printf "  speedup %.2fx (median of %d paired runs, %.2f-%.2f; goal >= 2.5x: %s)\n", pred_med, npd, pred_min, pred_max, (pred_med >= 2.5 ? "met" : "not met")
        printf "  prediction: %d answer tokens, %d altered; accepted %d, rejected %d prediction tokens\n", pred_tok, pred_alt, acc, rej
    }
    if (nau > 0) {
        for (i = 1; i <= nau; i++) rr[i] = ar[i]
        printf "auto with the draft, 32 streams: plain %.1f tok/s, auto %.1f tok/s; ratio %.3f (median of %d; goal >= 0.97: %s)\n",
            med(apl, nap), med(aut, nau), med(rr, nau), nau, (med(rr, nau) >= 0.97 ? "met" : "not met")
    }
    readm(m0, M0); readm(m1, M1); readm(m2, M2)
    if ("nalar_spec_decode_num_drafts_total" in M1) {
        dr = M1["nalar_spec_decode_num_drafts_total"] - M0["nalar_spec_decode_num_drafts_total"]
        dt = M1["nalar_spec_decode_num_draft_tokens_total"] - M0["nalar_spec_decode_num_draft_tokens_total"]
        da = M1["nalar_spec_decode_num_accepted_tokens_total"] - M0["nalar_spec_decode_num_accepted_tokens_total"]
        ds = M1["nalar_spec_decode_draft_seconds_total"] - M0["nalar_spec_decode_draft_seconds_total"]
        gt = M1["nalar_generation_tokens_total"] - M0["nalar_generation_tokens_total"]
        printf "  cost model under auto: %d verification steps carrying %d proposals (k %.2f a step), %d accepted (%.1f%%),\n", dr, dt, (dr > 0 ? dt / dr : 0), da, (dt > 0 ? 100 * da / dt : 0)
        printf "    over %d generated tokens of both locations; draft time %.3f s%s\n", gt, ds, (dt > 0 ? sprintf(", %.3f ms per proposal", 1e3 * ds / dt) : "")
    }
    if ("nalar_spec_decode_num_drafts_total" in M2) {
        dr = M2["nalar_spec_decode_num_drafts_total"] - M1["nalar_spec_decode_num_drafts_total"]
        dt = M2["nalar_spec_decode_num_draft_tokens_total"] - M1["nalar_spec_decode_num_draft_tokens_total"]
        da = M2["nalar_spec_decode_num_accepted_tokens_total"] - M1["nalar_spec_decode_num_accepted_tokens_total"]
        ds = M2["nalar_spec_decode_draft_seconds_total"] - M1["nalar_spec_decode_draft_seconds_total"]
        vs = M2["nalar_spec_decode_verify_seconds_total"] - M1["nalar_spec_decode_verify_seconds_total"]
        printf "draft forced, 1 stream: %.1f tok/s; %d steps, k %.2f a step, %d of %d accepted;\n", d1, dr, (dr > 0 ? dt / dr : 0), da, dt
        printf "  draft %.3f ms per proposal, verification %.3f ms per step\n", (dt > 0 ? 1e3 * ds / dt : 0), (dr > 0 ? 1e3 * vs / dr : 0)
    }
    print ""
    print "## nginx against the engine in-process (same load, ms per token p50)"
    printf "%7s %10s %10s %9s\n", "streams", "nginx", "engine", "overhead"
    for (c = 1; c <= 128; c++) if (c in oh)
        printf "%7d %10.3f %10.3f %8.1f%%  (goal <= 5%%: %s)\n", c, oh[c], oe[c],
            (oe[c] > 0 ? 100 * (oh[c] / oe[c] - 1) : -1),
            (oe[c] > 0 && oh[c] / oe[c] <= 1.05) ? "met" : "not met"
    print ""
    printf "requests %d, errors %d\n", reqs, errs
}' "$OUT"

echo "total $(( $(date +%s) - T0 )) s; raw results in $OUT"
if [ -n "$FAILED" ]; then
    echo "gpu-serve: FAILED:$FAILED"
    exit 1
fi
echo "gpu-serve: all phases ran, every request succeeded"

#!/bin/sh
# Runs the cluster demo on this machine: three engine nodes
# (conf.example.node on 127.0.0.1:8081-8083, prefixes build/cluster/nodeN/)
# and the edge (conf.example.cluster on 127.0.0.1:8080, prefix
# build/cluster/edge/) in the foreground; Ctrl-C stops all four.
# PORT=N moves the edge to N and the nodes to N+1..N+3 (PORT=9090 make
# run-cluster): the configurations are copied under build/cluster/ with
# the ports substituted, and the tracked files are not changed.
# `make run-cluster` builds what serving needs first.  --check: only
# `nginx -t` the copies.
set -e
cd "$(dirname "$0")/.."
ROOT=$PWD
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}
PORT=${PORT:-8080}

case $PORT in
    ''|*[!0-9]*)
        echo "run-cluster: PORT must be a number, not '$PORT'" >&2; exit 2 ;;
esac
if [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65532 ]; then
    echo "run-cluster: PORT must be 1-65532 (the nodes take PORT+1..PORT+3)" >&2
    exit 2
fi

if [ ! -f build/module/ngx_nalar_module.so ]; then
    echo "run-cluster: build/module/ngx_nalar_module.so is missing;" \
         "run 'make run-cluster'" >&2
    exit 1
fi

# the edge connects to the nodes from 127.0.0.2 (proxy_bind)
if ! python3 -c 'import socket; socket.socket().bind(("127.0.0.2", 0))' \
     2> /dev/null
then
    echo "run-cluster: 127.0.0.2 cannot be bound (Linux routes all of" \
         "127.0.0.0/8 to lo; elsewhere: add it to the loopback" \
         "interface)" >&2
    exit 1
fi

# the key the edge signs identities with and the nodes verify them with,
# made once and kept (readable by this user only)
KEY=build/cluster/edge.key
if [ ! -f "$KEY" ]; then
    if ! command -v openssl > /dev/null 2>&1; then
        echo "run-cluster: openssl is needed to make $KEY" \
             "(apt-get install openssl)" >&2
        exit 1
    fi
    mkdir -p build/cluster
    (umask 077 && openssl rand -hex 32 > "$KEY.new")
    mv "$KEY.new" "$KEY"
    echo "nalar: made the edge key $KEY"
fi

# conf.example.node as node N, on port PORT+N, paths made absolute
node_conf() {
    sed -e "s/127\.0\.0\.1:8081/127.0.0.1:$((PORT + $1))/" \
        -e "s/X-Node  node1/X-Node  node$1/" \
        -e "s#models/#$ROOT/models/#" \
        -e "s#build/cluster/edge\.key#$ROOT/$KEY#" \
        conf.example.node
}

# conf.example.cluster with the edge on PORT and the nodes on PORT+1..3
# (each address becomes a placeholder first, so that a new port is never
# taken for an old one)
edge_conf() {
    sed -e "s/127\.0\.0\.1:808\([0-3]\)\([ ;]\)/127.0.0.1:@\1@\2/" \
        -e "s/@0@/$PORT/" -e "s/@1@/$((PORT + 1))/" \
        -e "s/@2@/$((PORT + 2))/" -e "s/@3@/$((PORT + 3))/" \
        -e "s#build/cluster/edge\.key#$ROOT/$KEY#" \
        conf.example.cluster
}

for n in 1 2 3; do
    mkdir -p "build/cluster/node$n/logs"
    node_conf $n > "build/cluster/node$n/nginx.conf"
    "$NGINX" -t -q -p "$ROOT/build/cluster/node$n/" \
        -c "$ROOT/build/cluster/node$n/nginx.conf"
done
mkdir -p build/cluster/edge/logs
edge_conf > build/cluster/edge/nginx.conf
"$NGINX" -t -q -p "$ROOT/build/cluster/edge/" \
    -c "$ROOT/build/cluster/edge/nginx.conf"
[ "${1:-}" = --check ] && exit 0

PIDS=
stop() {
    trap - INT TERM EXIT
    for pid in $PIDS; do
        kill -QUIT "$pid" 2> /dev/null || true
    done
    wait
}
trap stop INT TERM EXIT

for n in 1 2 3; do
    dir=build/cluster/node$n
    "$NGINX" -p "$ROOT/$dir/" -c "$ROOT/$dir/nginx.conf" \
        -g 'daemon off;' &
    PIDS="$PIDS $!"
done

"$NGINX" -p "$ROOT/build/cluster/edge/" \
    -c "$ROOT/build/cluster/edge/nginx.conf" -g 'daemon off;' &
PIDS="$PIDS $!"

echo "nalar: edge        http://127.0.0.1:$PORT/v1/chat/completions"
echo "nalar: nodes       127.0.0.1:$((PORT + 1)) $((PORT + 2)) $((PORT + 3))" \
     "(from the edge only)"
echo "nalar: edge status http://127.0.0.1:$PORT/health" \
     "http://127.0.0.1:$PORT/metrics"
echo "nalar: logs        build/cluster/*/logs/"
echo "nalar: try         curl -s -H 'X-Tenant: acme' -H 'Content-Type:" \
     "application/json' -d '{\"messages\":[{\"role\":\"user\"," \
     "\"content\":\"In the beginning\"}],\"max_tokens\":16}'" \
     "-i http://127.0.0.1:$PORT/v1/chat/completions"
echo "nalar: Ctrl-C stops the cluster"

wait

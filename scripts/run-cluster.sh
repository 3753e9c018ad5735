#!/bin/sh
# Runs the cluster demo on this machine: three engine nodes
# (conf.example.node on 127.0.0.1:8081-8083, prefixes build/cluster/nodeN/)
# and the edge (conf.example.cluster on 127.0.0.1:8080, prefix
# build/cluster/edge/) in the foreground; Ctrl-C stops all four.
# `make run-cluster` builds everything first.
set -e
cd "$(dirname "$0")/.."
ROOT=$PWD
NGINX=${NALAR_NGINX:-/usr/sbin/nginx}

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
    mkdir -p "$dir/logs"
    # the same node, with its own port and name; paths made absolute
    sed -e "s/127\.0\.0\.1:8081/127.0.0.1:808$n/" \
        -e "s/X-Node  node1/X-Node  node$n/" \
        -e "s#models/#$ROOT/models/#" \
        -e "s#build/cluster/edge\.key#$ROOT/$KEY#" \
        conf.example.node > "$dir/nginx.conf"
    "$NGINX" -t -q -p "$ROOT/$dir/" -c "$ROOT/$dir/nginx.conf"
    "$NGINX" -p "$ROOT/$dir/" -c "$ROOT/$dir/nginx.conf" \
        -g 'daemon off;' &
    PIDS="$PIDS $!"
done

mkdir -p build/cluster/edge/logs
"$NGINX" -t -q -p "$ROOT/build/cluster/edge/" -c "$ROOT/conf.example.cluster"
"$NGINX" -p "$ROOT/build/cluster/edge/" -c "$ROOT/conf.example.cluster" \
    -g 'daemon off;' &
PIDS="$PIDS $!"

echo "nalar: edge        http://127.0.0.1:8080/v1/chat/completions"
echo "nalar: nodes       127.0.0.1:8081 8082 8083 (from the edge only)"
echo "nalar: edge status http://127.0.0.1:8080/health" \
     "http://127.0.0.1:8080/metrics"
echo "nalar: logs        build/cluster/*/logs/"
echo "nalar: try         curl -s -H 'X-Tenant: acme' -H 'Content-Type:" \
     "application/json' -d '{\"messages\":[{\"role\":\"user\"," \
     "\"content\":\"In the beginning\"}],\"max_tokens\":16}'" \
     "-i http://127.0.0.1:8080/v1/chat/completions"
echo "nalar: Ctrl-C stops the cluster"

wait

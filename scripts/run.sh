#!/bin/sh
# Runs Debian's nginx in the foreground with conf.example on 127.0.0.1:8080
# (prefix build/run/); `make run` builds everything first.
set -e
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ ! -f build/module/ngx_nalar_module.so ]; then
    echo "run: build/module/ngx_nalar_module.so is missing; run 'make run'" >&2
    exit 1
fi

mkdir -p build/run/logs
ln -sfn "$ROOT/html" build/run/html

/usr/sbin/nginx -t -q -p "$ROOT/build/run/" -c "$ROOT/conf.example"

echo "nalar: playground  http://127.0.0.1:8080/"
echo "nalar: API         http://127.0.0.1:8080/v1/completions"
echo "nalar: metrics     http://127.0.0.1:8080/metrics"
echo "nalar: Ctrl-C stops nginx"

exec /usr/sbin/nginx -p "$ROOT/build/run/" -c "$ROOT/conf.example" \
    -g 'daemon off;'

#!/bin/sh
# Runs Debian's nginx in the foreground with conf.example on 127.0.0.1:8080,
# or on PORT (PORT=9090 make run), with prefix build/run/; `make run` builds
# what serving needs first.  conf.example is copied to build/run/nginx.conf
# with the port and the model's path substituted; the tracked file is not
# changed.  --check: only `nginx -t` that copy.
set -e
cd "$(dirname "$0")/.."
ROOT=$PWD
PORT=${PORT:-8080}

case $PORT in
    ''|*[!0-9]*) echo "run: PORT must be a number, not '$PORT'" >&2; exit 2 ;;
esac

if [ ! -f build/module/ngx_nalar_module.so ]; then
    echo "run: build/module/ngx_nalar_module.so is missing; run 'make run'" >&2
    exit 1
fi

mkdir -p build/run/logs
ln -sfn "$ROOT/html" build/run/html
# the model path is relative to the configuration's directory: made
# absolute, since the copy lives elsewhere
sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$PORT/" \
    -e "s#models/#$ROOT/models/#" \
    conf.example > build/run/nginx.conf

/usr/sbin/nginx -t -q -p "$ROOT/build/run/" -c "$ROOT/build/run/nginx.conf"
[ "${1:-}" = --check ] && exit 0

echo "nalar: playground  http://127.0.0.1:$PORT/"
echo "nalar: API         http://127.0.0.1:$PORT/v1/completions"
echo "nalar: metrics     http://127.0.0.1:$PORT/metrics"
echo "nalar: Ctrl-C stops nginx"

exec /usr/sbin/nginx -p "$ROOT/build/run/" -c "$ROOT/build/run/nginx.conf" \
    -g 'daemon off;'

#!/bin/sh
# Runs `make test` N times on a clean clone of the committed HEAD while a
# busy loop occupies every core, and reports how many runs were green.
# The busy loops end with the script (trap), however it ends.
#
# Usage: sh scripts/stress-test.sh N
#   STRESS_TARGET=target  what to run instead of `make test` (e.g. a
#                         single quick target, to try the script itself)
#   STRESS_KEEP=1         keep the clone and the logs
#   NALAR_FUZZ_SECONDS=N  how long t/15-fuzz.t runs each fuzzer (20 here;
#                         `make test` alone runs them 3 s each)
set -eu
NALAR_FUZZ_SECONDS=${NALAR_FUZZ_SECONDS:-20}
export NALAR_FUZZ_SECONDS

N=${1:?usage: sh scripts/stress-test.sh N}
case $N in
    ''|*[!0-9]*) echo "stress-test: N must be a number, not '$N'" >&2; exit 2 ;;
esac
TARGET=${STRESS_TARGET:-test}

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
head=$(git -C "$repo" rev-parse HEAD)
work=$(mktemp -d "${TMPDIR:-/tmp}/nalar-stress-XXXXXX")
pids=""

cleanup() {
    for p in $pids; do
        kill "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [ "${STRESS_KEEP:-0}" = 1 ]; then
        echo "stress-test: kept $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

git clone -q --no-local "$repo" "$work/nalar"
git -C "$work/nalar" checkout -q "$head"

cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
i=0
while [ "$i" -lt "$cores" ]; do
    sh -c 'while :; do :; done' &
    pids="$pids $!"
    i=$((i + 1))
done
echo "stress-test: $head, $cores busy loops, $N runs of make $TARGET"

green=0
run=1
while [ "$run" -le "$N" ]; do
    log="$work/run-$run.log"
    if (cd "$work/nalar" && make "$TARGET") >"$log" 2>&1; then
        green=$((green + 1))
        echo "stress-test: run $run green"
    else
        echo "stress-test: run $run FAILED; its end:"
        grep -E '^(not ok|t/.*(Wstat|Failed)|Result:|make: \*\*\*)' "$log" \
            | tail -n 30 || tail -n 30 "$log"
        cp "$log" "${TMPDIR:-/tmp}/nalar-stress-run-$run.log"
        echo "stress-test: the whole log: ${TMPDIR:-/tmp}/nalar-stress-run-$run.log"
    fi
    run=$((run + 1))
done

echo "stress-test: $green of $N green"
[ "$green" -eq "$N" ]

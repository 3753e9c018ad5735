#!/bin/sh
# Runs the libFuzzer targets one after another for SECONDS each:
#   sh scripts/fuzz.sh SECONDS [NAME...]     (NAME: gguf, jwt, ...)
# (`make fuzz FUZZ_SECONDS=300 FUZZ_ONLY="jwt chat"` builds, then runs
# this.)  Each target starts from its seed corpus fuzz/corpus/NAME plus what
# earlier runs found in build/fuzz-corpus/NAME, adds its new inputs there,
# and writes a crashing input to build/fuzz-crash/NAME-*.  The log of each
# run is build/fuzz-NAME.log.  Stops at the first target that fails.
set -e
secs=${1:?usage: scripts/fuzz.sh SECONDS [NAME...]}
shift
names=$*
if [ -z "$names" ]; then
    names=$(ls fuzz/fuzz_*.c | sed 's,^fuzz/fuzz_\(.*\)\.c$,\1,')
fi
mkdir -p build/fuzz-crash
for n in $names; do
    mkdir -p "build/fuzz-corpus/$n"
    echo "fuzz_$n: $secs s"
    if ! "./build/fuzz_$n" -max_total_time="$secs" -timeout=10 \
            -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="build/fuzz-crash/$n-" \
            "build/fuzz-corpus/$n" "fuzz/corpus/$n" \
            >"build/fuzz-$n.log" 2>&1
    then
        tail -n 60 "build/fuzz-$n.log"
        echo "fuzz_$n FAILED (log: build/fuzz-$n.log)"
        exit 1
    fi
    grep -E '^stat::(number_of_executed_units|peak_rss_mb|new_units_added)' \
        "build/fuzz-$n.log" | sed "s/^/  /"
    grep -E 'cov: [0-9]+' "build/fuzz-$n.log" | tail -n 1 | sed "s/^/  /"
done

# Sourced by the bench scripts (sh): from the project root, build the
# nalar tool, install gnuplot for the plots when running as root and it is
# missing (no plot otherwise), and make the output folders.
# REPS and THREADS come from the script's first two arguments.
set -eu
cd "$(dirname "$0")/.."
REPS=${1:-5}
THREADS=${2:-2}
make -s build/nalar
command -v gnuplot >/dev/null || { [ "$(id -u)" = 0 ] && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox \
    >/dev/null; } || true
mkdir -p bench/results build/bench

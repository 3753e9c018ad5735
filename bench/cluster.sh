#!/bin/sh
# Cluster routing benchmark: prefix cache hit rate and TTFT p50/p99 of a
# multi-tenant chat workload through an edge over three engine nodes,
# routed by $nalar_route_key, round-robin and $nalar_tenant, against a
# single node (see bench/cluster.pl).  Writes bench/results/cluster.txt.
# Usage: sh bench/cluster.sh [USERS] [TURNS] [CONC]
set -eu
cd "$(dirname "$0")/.."
[ -f build/module/ngx_nalar_module.so ] || make -s module
mkdir -p bench/results
perl bench/cluster.pl "$@" | tee bench/results/cluster.txt

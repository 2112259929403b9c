#!/usr/bin/env bash
# ps.sh — `make bench-ps`: the parameter server against dtrain's own data
# parallelism, PyTorch 1.13's RPC parameter server, a cgroup-throttled
# straggler, the sparse ratings workload and a server's SIGKILL with
# replicas (bench/ps_bench.py says what each part measures). Environment:
# REPS (default 3), BUILD (default build/release), PARTS (default
# speed,rpc,straggler,sparse,failover; also breakdown, rereplicate, rejoin, workers), RATINGS (sparse: default 2000000),
# STRAGGLER_SERVERS (the straggler part's deployments, a comma list: 0
# colocated servers, S: S separate, unthrottled server processes; default
# 0,1: both, each with its own verdict).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/release}
cmake --build "$BUILD" -j"$(nproc)" --target dtrain >/dev/null
/usr/bin/python3 bench/ps_bench.py --build "$BUILD" --reps "${REPS:-3}" --parts "${PARTS:-speed,rpc,straggler,sparse,failover}" --ratings "${RATINGS:-2000000}" \
  --straggler-servers "${STRAGGLER_SERVERS:-0,1}"

#!/usr/bin/env bash
# test_cli_det_cpu.sh — deterministic mode does not depend on which kernels
# OpenBLAS picks for this CPU, and hosts that would compute differently are
# refused at start.
#  (a) `dtrain train --set dist.deterministic=true` (MLP, 3000 images, 1
#      epoch) gives the same params_sha256 with OPENBLAS_CORETYPE unset,
#      =Haswell and =SkylakeX (its last layer, N = 10, used to go through
#      OpenBLAS, whose Haswell kernels gave another hash); skipped (77) when
#      this OpenBLAS accepts fewer than two of them (OPENBLAS_VERBOSE=2 says
#      which core it uses).
#  (b) with the portable kernel (DTRAIN_GEMM=blas: none of our AVX-512 /
#      AVX2 kernels, and deterministic mode still never calls OpenBLAS) 1
#      and 2 workers agree; so do they with our kernels (the default on a
#      CPU with AVX-512 or AVX2 + FMA).
#  (c) on a CPU with our kernels (AVX-512, or AVX2 + FMA), a 2-node job
#      (`dtrain launch`, loopback) whose second node computes with the
#      portable kernel is refused (both nodes exit non-zero, like any config
#      mismatch) with a message naming rank 1, before any training step.
# Each run is bounded (timeout) and every process stopped by pid.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
ARGS=(--set train.epochs=1 --set data.limit_train=3000 --set data.limit_test=1000 --set dist.deterministic=true)

hash_of() { # hash_of NAME WORKERS [env assignments...]
  local name=$1 n=$2
  shift 2
  env "$@" timeout 300 "$DTRAIN" train "$CFG" "${ARGS[@]}" --workers "$n" --out "$T/$name" \
    >"$T/$name.log" 2>&1 </dev/null || { echo "exit $?: $(tail -1 "$T/$name.log")"; return; }
  json_str "$T/$name/summary.json" params_sha256
}
core_of() { OPENBLAS_VERBOSE=2 env "$@" "$DTRAIN" --version 2>&1 | sed -n 's/^Core: //p' | head -1; }

# ---- (a) OPENBLAS_CORETYPE ---------------------------------------------------
cores="$(core_of -u OPENBLAS_CORETYPE) $(core_of OPENBLAS_CORETYPE=Haswell) $(core_of OPENBLAS_CORETYPE=SkylakeX)"
distinct=$(tr ' ' '\n' <<<"$cores" | sort -u | grep -c .)
if [ "$distinct" -ge 2 ]; then
  echo "# OpenBLAS cores: $cores"
  ref=$(hash_of unset 1 -u OPENBLAS_CORETYPE)
  [[ $ref =~ ^[0-9a-f]{64}$ ]] && pass || fail "OPENBLAS_CORETYPE unset: no hash: $ref"
  echo "# unset: $ref"
  for ct in Haswell SkylakeX; do
    h=$(hash_of "ct_$ct" 1 OPENBLAS_CORETYPE=$ct)
    echo "# $ct: $h"
    [ "$h" = "$ref" ] && pass || fail "OPENBLAS_CORETYPE=$ct: params_sha256 $h differs from $ref (unset)"
  done
else
  echo "SKIP (a): this OpenBLAS uses one kernel family for every OPENBLAS_CORETYPE tried ($cores)"
  SKIPS=$((SKIPS + 1))
fi

# ---- (b) the portable kernel: worker counts agree ----------------------------
p1=$(hash_of port1 1 DTRAIN_GEMM=blas)
p2=$(hash_of port2 2 DTRAIN_GEMM=blas)
[[ $p1 =~ ^[0-9a-f]{64}$ ]] && [ "$p1" = "$p2" ] && pass || fail "portable kernel: 1 worker $p1, 2 workers $p2"

ours=0
if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo &&
  grep -qw avx512vl /proc/cpuinfo; then
  ours=avx512
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  ours=avx2
fi
if [ "$ours" != 0 ]; then
  o1=$(hash_of own1 1 -u DTRAIN_GEMM)
  o2=$(hash_of own2 2 -u DTRAIN_GEMM)
  echo "# $ours kernels: $o1, portable: $p1"
  [[ $o1 =~ ^[0-9a-f]{64}$ ]] && [ "$o1" = "$o2" ] && pass || fail "$ours kernels: 1 worker $o1, 2 workers $o2"
fi

# ---- (c) a host that computes differently is refused --------------------------
if [ "$ours" != 0 ]; then
  export DTRAIN_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  P=$(free_port)
  L=(launch --nnodes 2 --rdzv "127.0.0.1:$P" --nproc-per-node 1)
  timeout 120 "$DTRAIN" "${L[@]}" --node-rank 0 -- train "$CFG" "${ARGS[@]}" --out "$T/mix0" \
    >"$T/mix0.log" 2>&1 </dev/null &
  pid0=$!
  DTRAIN_GEMM=blas timeout 120 "$DTRAIN" "${L[@]}" --node-rank 1 -- train "$CFG" "${ARGS[@]}" --out "$T/mix1" \
    >"$T/mix1.log" 2>&1 </dev/null &
  pid1=$!
  wait $pid0; rc0=$?
  wait $pid1; rc1=$?
  msg='deterministic mode: rank 1 computes floating point differently from rank 0'
  if [ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && [ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] && grep -q "$msg" "$T/mix0.log" &&
    [ ! -e "$T/mix0/summary.json" ]; then
    pass
  else
    fail "mixed kernels: node 0 exit $rc0, node 1 exit $rc1: $(grep -h dtrain: "$T/mix0.log" "$T/mix1.log" | tail -3)"
  fi
else
  echo "SKIP (c): neither AVX-512 nor AVX2 + FMA here, so every host uses the portable kernel"
  SKIPS=$((SKIPS + 1))
fi
finish

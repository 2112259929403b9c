#!/usr/bin/env bash
# test_cli_deterministic.sh — `dtrain train --set dist.deterministic=true`
# (the MLP, 3000 Fashion-MNIST images, 1 epoch): 1, 2 and 3 workers end with
# the same params_sha256, test accuracy and test loss (bit for bit, as
# printed by cJSON), and so does a second 1-worker run, 2 workers over tcp
# and 3 workers with the ring algorithm forced (DTRAIN_ALGO), and — when
# mpirun is there and dtrain was built with MPI — `mpirun -n 2` and `-n 3`
# with dist.transport=mpi (each bounded to 120 s, stopped by pid); normal
# mode with 2 workers does not (float sums differ); a bad dist.micro_batch
# is refused with exit 2 naming the key.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

run() { # run NAME WORKERS [--set ...]
  local name=$1 n=$2
  shift 2
  "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --set train.epochs=1 --set data.limit_train=3000 \
    --set data.limit_test=1000 --workers "$n" "$@" --out "$T/$name" >"$T/$name.log" 2>&1 </dev/null ||
    { fail "$name: exit $?: $(tail -2 "$T/$name.log")"; return; }
  local S="$T/$name/summary.json"
  echo "$(json_str "$S" params_sha256) $(json_num "$S" test_accuracy) $(json_num "$S" test_loss)"
}
det=(--set dist.deterministic=true)
ref=$(run w1 1 "${det[@]}")
[[ $ref =~ ^[0-9a-f]{64}\ 0\.[0-9]+\  ]] && pass || fail "1 worker: no hash/accuracy: '$ref'"
echo "# 1 worker: $ref"
check() { # check NAME LINE
  [ "$2" = "$ref" ] && pass || fail "$1: '$2' differs from 1 worker's '$ref'"
}
check "1 worker again" "$(run w1b 1 "${det[@]}")"
check "2 workers" "$(run w2 2 "${det[@]}")"
check "3 workers" "$(run w3 3 "${det[@]}")"
check "2 workers over tcp" "$(DTRAIN_TRANSPORT=tcp run w2tcp 2 "${det[@]}")"
check "3 workers, ring" "$(DTRAIN_ALGO=ring run w3ring 3 "${det[@]}")"
[ "$(json_num "$T/w3/summary.json" steps)" = 47 ] && pass || fail "3 workers: steps, want ceil(3000/64)=47"
[ "$(json_num "$T/w3/summary.json" workers)" = 3 ] && pass || fail "3 workers: summary workers"
# ---- mpirun (ranks started by Open MPI, transport mpi) ------------------------
# Open MPI leaks in its dlopen'ed components; LeakSanitizer would blame dtrain.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPIPID=""
trap '[ -n "$MPIPID" ] && kill -9 $MPIPID 2>/dev/null; rm -rf "$T"' EXIT
run_mpi() { # run_mpi N: mpirun -n N dtrain train ... (deadline 120 s)
  local n=$1 out="$T/mpi$1" t=0
  mpirun --allow-run-as-root --oversubscribe -n "$n" "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" \
    --set train.epochs=1 --set data.limit_train=3000 --set data.limit_test=1000 --set dist.transport=mpi \
    "${det[@]}" --out "$out" >"$out.log" 2>&1 </dev/null &
  MPIPID=$!
  while kill -0 $MPIPID 2>/dev/null; do
    if [ $t -ge 1200 ]; then
      kill -TERM $MPIPID 2>/dev/null; sleep 2; kill -KILL $MPIPID 2>/dev/null
      wait $MPIPID 2>/dev/null
      MPIPID=""
      return 124
    fi
    sleep 0.1; t=$((t + 1))
  done
  wait $MPIPID
  local rc=$?
  MPIPID=""
  return $rc
}
if ! command -v mpirun >/dev/null 2>&1; then
  skip_part "mpirun part" "mpirun not found"
else
  for n in 2 3; do
    run_mpi $n
    rc=$?
    if grep -q "transport 'mpi' unknown or not built" "$T/mpi$n.log"; then
      skip_part "mpirun part" "dtrain was built without MPI"
      break
    fi
    [ $rc = 0 ] || { fail "mpirun -n $n: exit $rc: $(tail -3 "$T/mpi$n.log")"; continue; }
    S="$T/mpi$n/summary.json"
    [ "$(json_str "$S" transport)" = mpi ] && pass || fail "mpirun -n $n: transport $(json_str "$S" transport)"
    [ "$(json_num "$S" workers)" = $n ] && pass || fail "mpirun -n $n: workers $(json_num "$S" workers)"
    check "mpirun -n $n" "$(json_str "$S" params_sha256) $(json_num "$S" test_accuracy) $(json_num "$S" test_loss)"
  done
fi
normal=$(run n2 2)
[ -n "$normal" ] && [ "${normal%% *}" != "${ref%% *}" ] && pass ||
  fail "normal mode, 2 workers: same hash as deterministic mode ($normal)"
expect_bad micro '^dtrain: .*micro_batch' train "$SRC/examples/fashion_mlp.ini" "${det[@]}" --set dist.micro_batch=0
finish

#!/usr/bin/env bash
# test_pipeline_launch.sh — hybrid data x pipeline (2 replicas x 2 stages)
# started three ways, in deterministic mode so each must end with the
# params_sha256 of one ddp_det worker:
#  (a) dtrain launch --nproc-per-node 4 on this host;
#  (b) mpirun -n 4 with dist.transport=mpi (skipped without mpirun or MPI);
#  (c) two "hosts" in network namespaces (tools/netns.sh), 2 ranks each, so
#      each replica's stages share a host (shm) and the stage allreduce goes
#      over tcp between the hosts (skipped where namespaces cannot be made).
# Every process it starts is waited for with a deadline and stopped by pid.
netns_inner() {
  . "$(dirname "$0")/../cli/netns_nodes.sh"
  launch_two_nodes 29611 150 "${ARGS[@]}"
}

D=(--set data.limit_train=600 --set data.limit_test=200 --set train.epochs=1 --set train.batch=48
   --set dist.deterministic=true --set dist.micro_batch=8
   --set "model.layers=flatten linear(32) relu dropout(0.3) linear(24) batchnorm relu linear(10)")
H=(--set dist.pipeline_stages=2 --set dist.micro_batches=3)
if [ "${1:-}" = netns_inner ]; then
  ARGS=("${D[@]}" "${H[@]}")
  netns_inner
  exit $?
fi

. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
sha() { json_str "$1" params_sha256; }
json_str() { grep -Eo "\"$2\":[[:space:]]*\"[^\"]*\"" "$1" | head -1 | sed -E 's/.*"([^"]*)"$/\1/'; }
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

"$DTRAIN" train "${D[@]}" --out "$T/ref" >/dev/null 2>"$T/ref.err" || fail "reference: $(cat "$T/ref.err")"
REF=$(sha "$T/ref/summary.json")

# (a) dtrain launch, one node of 4
if timeout 150 "$DTRAIN" launch --nproc-per-node 4 -- train "${D[@]}" "${H[@]}" --out "$T/l4" \
    >"$T/l4.out" 2>"$T/l4.err" </dev/null; then
  [ "$(sha "$T/l4/summary.json")" = "$REF" ] && pass || fail "(a) launch 4: params_sha256 differs"
else
  fail "(a) launch --nproc-per-node 4: $(tail -3 "$T/l4.err")"
fi

# (b) mpirun
if ! command -v mpirun >/dev/null 2>&1; then
  skip_part b "mpirun not found"
else
  mkdir -p "$T/rdzv"
  # Open MPI's own allocations are reported as leaks under ASan (as in
  # test_cli_mpirun.sh)
  timeout 150 env DTRAIN_RDZV_DIR="$T/rdzv" ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    mpirun --allow-run-as-root --oversubscribe -x DTRAIN_RDZV_DIR -x ASAN_OPTIONS -n 4 "$DTRAIN" train "${D[@]}" "${H[@]}" --set dist.transport=mpi \
    --out "$T/mpi" >"$T/mpi.out" 2>"$T/mpi.err" </dev/null
  rc=$?
  if grep -q "transport 'mpi' unknown or not built" "$T/mpi.err"; then
    skip_part b "dtrain was built without MPI"
  elif [ $rc = 0 ]; then
    [ "$(sha "$T/mpi/summary.json")" = "$REF" ] && pass || fail "(b) mpirun: params_sha256 differs"
  else
    fail "(b) mpirun -n 4: exit $rc: $(tail -3 "$T/mpi.err")"
  fi
fi

# (c) two hosts in namespaces
"$SRC/tools/netns.sh" check >"$T/netns_check" 2>&1
nrc=$?
if [ $nrc = 77 ]; then
  skip_part c "network namespaces unavailable: $(cat "$T/netns_check")"
elif [ $nrc != 0 ]; then
  fail "(c) netns.sh check: exit $nrc: $(cat "$T/netns_check")"
else
  T="$T" DTRAIN="$DTRAIN" DTRAIN_JOB_TOKEN="$TOKEN" "$SRC/tools/netns.sh" run -p "dtp$$" -n 2 -- \
    bash "$0" netns_inner >"$T/netns.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    [ "$(sha "$T/nn/summary.json")" = "$REF" ] && pass || fail "(c) 2 hosts: params_sha256 differs"
    grep -q 'ranks 2-3 over tcp' "$T/nn0.out" && pass || fail "(c) comm line: $(grep '^comm' "$T/nn0.out")"
  else
    fail "(c) 2 hosts x 2: exit $rc: $(cat "$T/netns.log" "$T"/nn?.err 2>/dev/null | head -20)"
  fi
  ip netns list 2>/dev/null | grep -q "dtp$$" && fail "(c) namespaces left behind" || pass
fi
finish

#!/usr/bin/env bash
# test_cli_ps.sh — `dtrain train --workers 2 --servers S` (docs/ps.md):
#  - the key-range map is printed at start, the run succeeds, and bsp ends
#    with the same params_sha256 as data parallelism with 2 workers (the
#    same sums and optimizer arithmetic), run to run, with 1 or 2 separate
#    servers and with colocated servers;
#  - under mpirun (-n 3, ps.servers = 1, transport mpi) the last rank
#    serves and bsp ends with the same params_sha256 again (skipped without
#    mpirun or MPI);
#  - asp and ssp runs succeed (every worker ends with the same parameters:
#    the run_end check);
#  - bad ps settings are refused naming the key;
#  - a server SIGKILLed mid-run ends the job (deadline 30 s on a loaded
#    machine; the measured time is printed) with a non-zero status, a
#    message naming the server, its rank and its key ranges, no summary.json
#    and no process left.
# Every process this test starts is killed and reaped by pid on exit.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -e "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

MLP="$SRC/examples/fashion_mlp.ini"
Q="--set train.epochs=1 --set data.limit_train=1280 --set data.limit_test=500"

run() { # NAME ARGS...
  local name=$1
  shift
  "$DTRAIN" train "$MLP" $Q "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" </dev/null
  local rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$T/$name/summary.json" ]; then
    fail "$name: exit $rc: $(head -c 400 "$T/$name.err")"
    return 1
  fi
  pass
}
sha() { json_str "$T/$1/summary.json" params_sha256; }

run ddp --workers 2
run ps1 --workers 2 --servers 1 &&
  { grep -q '^ps: server 0: 235146 floats' "$T/ps1.out" && pass || fail "ps1: no map line: $(cat "$T/ps1.out")"; }
run ps1b --workers 2 --servers 1
run ps2 --workers 2 --servers 2 &&
  { grep -q '^ps: server 1: ' "$T/ps2.out" && pass || fail "ps2: no line for server 1"; }
run psc --workers 2 --set ps.colocate=true
# a trace's start barrier right after the colocated start (it hung there:
# a worker left for it while the other still waited for its server)
run psct --workers 2 --set ps.colocate=true --set obs.trace=true &&
  { [ -s "$T/psct/trace.json" ] && pass || fail "psct: no trace.json"; }
ref=$(sha ddp)
for r in ps1 ps1b ps2 psc psct; do
  [ -n "$ref" ] && [ "$(sha $r)" = "$ref" ] && pass || fail "$r: params_sha256 $(sha $r) differs from ddp's $ref"
done
if command -v mpirun >/dev/null 2>&1; then
  rdir="$T/rdzv"
  mkdir -p "$rdir"
  timeout 120 env DTRAIN_RDZV_DIR="$rdir" mpirun --allow-run-as-root --oversubscribe -x DTRAIN_RDZV_DIR \
    -n 3 "$DTRAIN" train "$MLP" $Q --set ps.servers=1 --set dist.transport=mpi --out "$T/mpi" \
    >"$T/mpi.out" 2>"$T/mpi.err" </dev/null
  rc=$?
  if grep -q "transport 'mpi' unknown or not built" "$T/mpi.err"; then
    skip_part "mpirun" "dtrain was built without MPI"
  elif [ $rc = 0 ] && [ "$(sha mpi)" = "$ref" ]; then
    pass
  else
    fail "mpirun -n 3 ps.servers=1: exit $rc, params_sha256 $(sha mpi) (ddp $ref): $(tail -3 "$T/mpi.err")"
  fi
else
  skip_part "mpirun" "mpirun not found"
fi
run asp --workers 2 --servers 2 --set ps.consistency=asp
run ssp --workers 2 --set ps.colocate=true --set ps.consistency=ssp --set ps.staleness=2
run bk --workers 3 --servers 1 --set ps.backup_workers=1

expect_bad both "ps.colocate: .*choose one" train "$MLP" --workers 2 --servers 1 --set ps.colocate=true
expect_bad bkasp "ps.backup_workers: only with ps.consistency = bsp" train "$MLP" --workers 2 --servers 1 --set ps.consistency=asp --set ps.backup_workers=1
expect_bad bkall "ps.backup_workers: must be below dist.workers" train "$MLP" --workers 2 --servers 1 --set ps.backup_workers=2
expect_bad stale "ps.staleness: only with ps.consistency = ssp" train "$MLP" --workers 2 --servers 1 --set ps.staleness=2
expect_bad cons "ps.consistency" train "$MLP" --workers 2 --servers 1 --set ps.consistency=eventual
expect_bad nserv "--servers 'x'" train "$MLP" --workers 2 --servers x

# a server killed mid-run
out="$T/kill"
"$DTRAIN" train "$MLP" --workers 2 --servers 1 --set train.epochs=100000 \
  --set data.limit_train=1000 --set data.limit_test=200 --out "$out" >"$T/kill.out" 2>"$T/kill.err" </dev/null &
parent=$!
PIDS="$PIDS $parent"
t0=$(now)
ok=0
while elapsed_ok "$t0" "$(now)" 60; do
  if [ -s "$out/events.jsonl" ] && grep -q '^workers:' "$T/kill.out"; then ok=1; break; fi
  kill -0 "$parent" 2>/dev/null || break
  sleep 0.05
done
if [ $ok = 1 ]; then
  pass
  spid=$(grep -m1 '^workers:' "$T/kill.out" | sed -nE 's/.*rank 2 pid ([0-9]+).*/\1/p')
  wpids=$(grep -m1 '^workers:' "$T/kill.out" | sed -nE 's/.*rank 0 pid ([0-9]+), rank 1 pid ([0-9]+).*/\1 \2/p')
  t0=$(now)
  kill -9 "$spid"
  while kill -0 "$parent" 2>/dev/null && elapsed_ok "$t0" "$(now)" 30; do sleep 0.05; done
  t1=$(now)
  if kill -0 "$parent" 2>/dev/null; then
    fail "server killed: job still running after 30 s"
  else
    wait "$parent"
    rc=$?
    echo "server SIGKILL: job ended after $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}') s, status $rc"
    [ $rc -ne 0 ] && pass || fail "server killed: exit 0"
    grep -q 'waiting for server 0 (rank 2, keys 0-2, floats \[0, 235146))' "$T/kill.err" && pass ||
      fail "server killed: no message naming server 0 and its keys: $(cat "$T/kill.err")"
    [ ! -e "$out/summary.json" ] && pass || fail "server killed: summary.json written"
    for p in $wpids; do
      kill -0 "$p" 2>/dev/null && fail "worker pid $p still running" || pass
    done
  fi
else
  fail "server kill: no epoch record within 60 s: $(cat "$T/kill.err")"
fi
finish

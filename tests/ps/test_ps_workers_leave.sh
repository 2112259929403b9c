#!/usr/bin/env bash
# test_ps_workers_leave.sh — elastic workers in a parameter-server job
# (dist.min_workers with separate servers, docs/ps.md "Workers leaving"):
#  - bsp, 3 workers, 1 server: worker 2 SIGKILLed by pid after the first
#    epoch record; the job goes on and exits 0, the server names the lost
#    worker and its rank and takes it out of the clocks, the survivors
#    re-form as generation 1 of 2 workers, summary.json says 2 workers,
#    the run ends within a deadline (no hang on the lost worker's clock)
#    and the test accuracy is that of a trained model;
#  - ssp (s = 2), 3 workers, 2 servers: the same (the bound counts the
#    live workers only), and no read missed more than s clocks;
#  - the same bsp kill over tcp (a closed connection is the loss);
#  - without dist.min_workers a lost worker still ends the job, within a
#    deadline, naming it;
#  - refused with one line naming the key: colocated servers (a server
#    dies with its worker) and spare workers (joining a ps job is not
#    built).
# Every process this test starts is killed and reaped by pid on exit.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -e "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

MLP="$SRC/examples/fashion_mlp.ini"
# 12 epochs of 20 steps (3 workers): long enough to kill a worker mid-run
Q="--set train.epochs=12 --set data.limit_train=1280 --set data.limit_test=200 --workers 3"
. "$(dirname "$0")/kill_lib.sh"

# leave NAME SERVERS ARGS... — kills worker 2 after the first epoch record
leave() {
  local name=$1 servers=$2
  shift 2
  start "$name" --servers "$servers" --set dist.min_workers=2 "$@" || return 1
  local wpid
  wpid=$(pid_of "$name" 2)
  [ -n "$wpid" ] || { fail "$name: no pid for rank 2"; return 1; }
  kill -9 "$wpid"
  wait_end "$name" 40
  if [ $rc = 124 ]; then
    fail "$name: still running 40 s after worker 2's SIGKILL: $(tail -3 "$T/$name.err")"
    return 1
  fi
  [ $rc = 0 ] && pass || { fail "$name: exit $rc: $(head -c 800 "$T/$name.err")"; return 1; }
  grep -Eq "ps server 0: worker 2 \(rank 2\) lost after [0-9]+ pushed clocks: removed from the clocks.*2 of 3 workers go on" "$T/$name.err" &&
    pass || fail "$name: the server did not name the lost worker: $(grep 'ps server' "$T/$name.err")"
  grep -q "elastic: generation 1: 2 workers, going on" "$T/$name.err" && pass ||
    fail "$name: the survivors did not re-form: $(grep elastic "$T/$name.err" | head -5)"
  [ "$(grep -Eo '"workers":[[:space:]]*[0-9]+' "$T/$name/summary.json" | grep -Eo '[0-9]+$')" = 2 ] &&
    pass || fail "$name: summary.json: $(grep -Eo '"workers":[^,]*' "$T/$name/summary.json")"
  acc=$(grep -Eo '"test_accuracy":[[:space:]]*[0-9.]+' "$T/$name/summary.json" | grep -Eo '[0-9.]+$')
  awk -v a="$acc" 'BEGIN{exit !(a >= 0.75)}' && pass || fail "$name: test accuracy $acc < 0.75"
  no_procs "$name" $((3 + servers))
}

leave bsp 1
leave ssp 2 --set ps.consistency=ssp --set ps.staleness=2 &&
  { grep -q "ps server 1: worker 2 (rank 2) lost" "$T/ssp.err" && pass ||
      fail "ssp: server 1 did not name the lost worker"; }
DTRAIN_TRANSPORT=tcp leave tcp 1 &&
  { grep -q "tcp: .*rank 2" "$T/tcp.err" && pass || fail "tcp: not over tcp: $(head -c 400 "$T/tcp.err")"; }

# without dist.min_workers: a lost worker ends the job, naming it
if start fixed --servers 1; then
  kill -9 "$(pid_of fixed 2)"
  wait_end fixed 30
  if [ $rc = 124 ]; then
    fail "fixed: still running 30 s after worker 2's SIGKILL"
  else
    [ $rc -ne 0 ] && pass || fail "fixed: exit 0"
    grep -q "rank 2 (pid [0-9]*) was killed by signal 9" "$T/fixed.err" && pass ||
      fail "fixed: the lost worker is not named: $(head -c 400 "$T/fixed.err")"
  fi
  no_procs fixed 4
fi

expect_bad coloc "dist.min_workers: .*colocated parameter servers" train "$MLP" --workers 2 \
  --set ps.colocate=true --set dist.min_workers=1
expect_bad spare "dist.min_workers: .*joining a ps job is not built" train "$MLP" --workers 2 \
  --servers 1 --set dist.min_workers=1 --set dist.standby=1
finish

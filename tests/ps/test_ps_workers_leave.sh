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
#    live workers only);
#  - the same bsp kill over tcp (a closed connection is the loss);
#  - joining: with --standby 1 the launcher wakes a spare when worker 2
#    dies; the server admits it into slot 2 at the members' clock, it
#    pulls the parameters, the job ends with 3 workers (and the end's
#    check that every worker holds the same parameters passes);
#  - dtrain launch --join: a job below dist.min_workers = 3 waits; a joiner
#    with another config is refused (exit 2, the key named) without
#    disturbing it; a good joiner takes the slot and the job ends with 3;
#  - a worker and a server lost (3 servers, ps.replicas = 2): both are
#    survived, the server's range gets its new copy, the job ends with 2;
#  - a server lost without a replica still ends an elastic job within a
#    deadline, every worker naming the server and its keys (no re-forming
#    loop); also when it dies between two workers' replies of an epoch's
#    last step or of the reads before evaluation (DTRAIN_TEST_PS_DIE), so
#    one worker is in a collective of the workers when the others fail;
#  - without dist.min_workers a lost worker still ends the job, within a
#    deadline, naming it;
#  - refused with one line naming the key: colocated servers (a server
#    dies with its worker).
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

# a worker and then a server: elastic workers and replicated shards together
if start both --servers 3 --set ps.replicas=2 --set dist.min_workers=2; then
  kill -9 "$(pid_of both 2)"
  sleep 0.2
  kill -9 "$(pid_of both 3)"
  wait_end both 40
  if [ $rc = 124 ]; then
    fail "both: still running 40 s after the kills"
  else
    [ $rc = 0 ] && pass || fail "both: exit $rc: $(grep -v 'go on' "$T/both.err" | head -c 800)"
    grep -q "ps server [12]: worker 2 (rank 2) lost" "$T/both.err" && pass ||
      fail "both: no server named the lost worker"
    grep -q "holds its copy of keys .* (server 0's range)" "$T/both.err" && pass ||
      fail "both: server 0's range got no new copy: $(grep 'ps server' "$T/both.err" | head -5)"
  fi
  no_procs both 6
fi

# a spare takes the lost worker's slot
if start spare --servers 1 --set dist.min_workers=2 --standby 1; then
  kill -9 "$(pid_of spare 2)"
  wait_end spare 40
  if [ $rc = 124 ]; then
    fail "spare: still running 40 s after worker 2's SIGKILL"
  else
    [ $rc = 0 ] && pass || fail "spare: exit $rc: $(head -c 800 "$T/spare.err")"
    grep -Eq "ps server 0: joiner 1 is worker 2 from clock [0-9]+ on; 3 of 3 workers" "$T/spare.err" &&
      pass || fail "spare: the server did not admit the spare: $(grep 'ps ' "$T/spare.err" | head -5)"
    grep -Eq "ps: joiner is worker 2 .* its parameters pulled from the servers" "$T/spare.err" &&
      pass || fail "spare: the spare did not say it joined"
    [ "$(grep -Eo '"workers":[[:space:]]*[0-9]+' "$T/spare/summary.json" | grep -Eo '[0-9]+$')" = 3 ] &&
      pass || fail "spare: summary.json: $(grep -Eo '"workers":[^,]*' "$T/spare/summary.json")"
  fi
  no_procs spare 4
fi

# dtrain launch --join: below min_workers the job waits; a bad joiner is
# refused, a good one brings it back to 3 workers
export DTRAIN_JOB_TOKEN=0123456789abcdef0123456789abcdef
P=$(free_port)
JB=("$MLP" --set train.epochs=4 --set data.limit_train=1920 --set data.limit_test=200
    --set ps.servers=1 --set dist.min_workers=3 --set dist.rejoin_timeout=60)
DTRAIN_TEST_KILL=2:20:forward "$DTRAIN" launch --rdzv 127.0.0.1:$P --nproc-per-node 4 -- \
  train "${JB[@]}" --out "$T/launch" >"$T/launch.log" 2>&1 </dev/null &
job=$!
PIDS="$PIDS $job"
t0=$(now)
while elapsed_ok "$t0" "$(now)" 30 && ! grep -q "waiting up to" "$T/launch.log"; do sleep 0.05; done
grep -q "waiting up to" "$T/launch.log" && pass ||
  fail "launch: the job did not wait below min_workers: $(tail -3 "$T/launch.log")"
run_bounded 40 "$DTRAIN" launch --join --rdzv 127.0.0.1:$P -- train "${JB[@]}" \
  --set train.batch=32 >"$T/badcfg.log" 2>&1 </dev/null
jrc=$?
[ $jrc = 2 ] && grep -q "joiner refused: .*train.batch = 32 here, 64 in the job" "$T/badcfg.log" &&
  pass || fail "badcfg: exit $jrc: $(tail -2 "$T/badcfg.log")"
run_bounded 40 "$DTRAIN" launch --join --rdzv 127.0.0.1:$P -- train "${JB[@]}" \
  >"$T/good.log" 2>&1 </dev/null
jrc=$?
[ $jrc = 0 ] && pass || fail "good joiner: exit $jrc: $(grep -v info "$T/good.log" | tail -3)"
parent=$job
wait_end launch 40
[ $rc = 0 ] && pass || fail "launch: exit $rc: $(grep -v info "$T/launch.log" | tail -3)"
grep -Eq "ps server 0: joiner [0-9]+ is worker 2 from clock [0-9]+ on" "$T/launch.log" && pass ||
  fail "launch: the server did not admit the joiner: $(grep 'ps ' "$T/launch.log" | head -5)"
[ "$(grep -Eo '"workers":[[:space:]]*[0-9]+' "$T/launch/summary.json" | grep -Eo '[0-9]+$')" = 3 ] &&
  pass || fail "launch: summary.json: $(grep -Eo '"workers":[^,]*' "$T/launch/summary.json" 2>&1)"
if grep -q "generation 2" "$T/launch.log"; then fail "launch: the refused joiner made a generation"; else pass; fi
unset DTRAIN_JOB_TOKEN

# elastic workers cannot survive a server without a replica: the job ends
if start srv --servers 1 --set dist.min_workers=2; then
  kill -9 "$(pid_of srv 3)"
  # usually over in ~1 s (the dead server is seen by pid). A CI dry run once
  # found rank 0 still running 30 s after the kill (2026-11-28): the kill
  # fell between two workers' replies, rank 0 went on into a collective of
  # the workers, the others failed naming the server, and rank 0 re-formed
  # below dist.min_workers, waiting dist.rejoin_timeout (30 s) for joiners.
  # The srvstep/srveval cases below place the kill there on purpose.
  wait_end srv 30
  if [ $rc = 124 ]; then
    fail "srv: still running 30 s after the server's SIGKILL: $(tail -5 "$T/srv.err")"
  else
    [ $rc -ne 0 ] && pass || fail "srv: exit 0"
    n=$(grep -o "ps worker [012]: waiting for server 0 (rank 3, keys 0-2" "$T/srv.err" | sort -u | wc -l)
    [ "$n" = 3 ] && pass || fail "srv: $n workers named the lost server: $(head -c 600 "$T/srv.err")"
    grep -q "re-forming\|generation 1" "$T/srv.err" && fail "srv: the workers re-formed" || pass
  fi
  no_procs srv 4
fi

# the same loss between two workers' replies (DTRAIN_TEST_PS_DIE: the
# server SIGKILLs itself once one worker has every key of clock 40, the
# last step of epoch 2, or with :final its reads before evaluation): that
# worker is in the epoch's (or the evaluation's) collective when the
# others fail; it must ask the servers and end naming the lost one, not
# re-form and wait dist.rejoin_timeout (30 s) below dist.min_workers
for die in ${DIES:-step:40 eval:40:final}; do
  name=srv${die%%:*}
  if DTRAIN_TEST_PS_DIE=${die#*:} start "$name" --servers 1 --set dist.min_workers=2; then
    wait_end "$name" 15
    if [ $rc = 124 ]; then
      fail "$name: still running 15 s after the server's planned death: $(grep -v info "$T/$name.err" | tail -4)"
      # stopped here, by pid, so the next case starts alone
      for r in 0 1 2 3; do p=$(pid_of "$name" $r); [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
      kill -9 "$parent" 2>/dev/null
      wait "$parent" 2>/dev/null
      continue
    else
      [ $rc -ne 0 ] && pass || fail "$name: exit 0"
      grep -q "DTRAIN_TEST_PS_DIE: SIGKILL after worker" "$T/$name.err" && pass ||
        fail "$name: the server did not die as planned: $(tail -3 "$T/$name.err")"
      n=$(grep -o "ps worker [012]: waiting for server 0 (rank 3, keys 0-2" "$T/$name.err" | sort -u | wc -l)
      [ "$n" = 3 ] && pass || fail "$name: $n workers named the lost server: $(grep '^dtrain: rank' "$T/$name.err" | head -c 900)"
      grep -q "waiting up to .* (dist.rejoin_timeout)\|generation 1" "$T/$name.err" &&
        fail "$name: a worker re-formed: $(grep elastic "$T/$name.err" | head -3)" || pass
    fi
    no_procs "$name" 4
  fi
done

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
finish

#!/usr/bin/env bash
# test_launch_kill.sh — failures in a 2-node x 2-worker `dtrain launch` job
# on loopback (two launchers on this machine; nodes talk tcp, workers of one
# node shm). Once training is under way:
#  1. worker rank 3 (node 1) is SIGKILLed: both launchers must exit non-zero
#     within 10 s, node 1 naming the killed rank, node 0's workers naming
#     rank 3 as lost; no summary.json; no worker left.
#  2. node 1's launcher itself is SIGKILLed (its workers die with it): node 0
#     must exit non-zero within 10 s naming a rank of node 1.
# Every process it starts is killed and reaped by pid on exit.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
export DTRAIN_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

# alive and not a zombie (workers of a killed launcher are reparented and may
# wait for a reaper that never comes; they are dead all the same)
alive() { [ -e "/proc/$1/stat" ] && ! awk '{exit !($3 == "Z")}' "/proc/$1/stat" 2>/dev/null; }
worker_pids() { grep -m1 '^workers:' "$1" | grep -oE 'pid [0-9]+' | cut -d' ' -f2; }

scenario() {
  local name=$1 port
  port=$(free_port)
  local out="$T/$name"
  for i in 1 0; do
    "$DTRAIN" launch --nnodes 2 --node-rank $i --nproc-per-node 2 --rdzv "127.0.0.1:$port" -- \
      train "$CFG" --set train.epochs=100000 --set data.limit_train=1000 --set data.limit_test=200 \
      --out "$out" >"$T/$name$i.out" 2>"$T/$name$i.err" </dev/null &
    eval "n$i=$!"
    PIDS="$PIDS $!"
  done
  local t0 ok=0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 40; do
    if [ -s "$out/events.jsonl" ] && grep -q '^workers:' "$T/${name}1.out"; then ok=1; break; fi
    kill -0 "$n0" 2>/dev/null && kill -0 "$n1" 2>/dev/null || break
    sleep 0.05
  done
  [ $ok = 1 ] && pass || { fail "$name: no epoch record within 40 s: $(cat "$T/$name"?.err)"; return 1; }
  local all
  all="$(worker_pids "$T/${name}0.out") $(worker_pids "$T/${name}1.out")"
  [ "$(echo $all | wc -w)" = 4 ] && pass || fail "$name: worker pids '$all'"
  local victim
  if [ "$name" = worker ]; then
    victim=$(grep -m1 '^workers:' "$T/${name}1.out" | sed -nE 's/.*rank 3 pid ([0-9]+).*/\1/p')
  else
    victim=$n1
  fi
  t0=$(now)
  kill -9 "$victim"
  while { kill -0 "$n0" 2>/dev/null || { [ "$name" = worker ] && kill -0 "$n1" 2>/dev/null; }; } &&
    elapsed_ok "$t0" "$(now)" 12; do sleep 0.05; done
  local t1
  t1=$(now)
  kill -0 "$n0" 2>/dev/null && { fail "$name: node 0 still running 12 s after the kill"; return 1; }
  wait "$n0"
  local rc0=$? rc1
  [ $rc0 -ne 0 ] && pass || fail "$name: node 0 exit status 0"
  if [ "$name" = worker ]; then
    kill -0 "$n1" 2>/dev/null && { fail "$name: node 1 still running 12 s after the kill"; return 1; }
    wait "$n1"
    rc1=$?
    [ $rc1 -ne 0 ] && pass || fail "$name: node 1 exit status 0"
    grep -q "worker rank 3 (pid $victim) was killed by signal 9" "$T/${name}1.err" && pass ||
      fail "$name: node 1 did not name the killed rank: $(cat "$T/${name}1.err")"
    grep -Eq "dtrain: rank [01]: .*rank 3" "$T/${name}0.err" && pass ||
      fail "$name: node 0's workers did not name rank 3: $(cat "$T/${name}0.err")"
  else
    wait "$n1" 2>/dev/null
    grep -Eq "dtrain: rank [01]: .*rank [23]" "$T/${name}0.err" && pass ||
      fail "$name: node 0's workers did not name a rank of node 1: $(cat "$T/${name}0.err")"
  fi
  elapsed_ok "$t0" "$t1" 10 && pass || fail "$name: took $(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}') s"
  [ ! -e "$out/summary.json" ] && pass || fail "$name: summary.json written"
  sleep 0.2
  for p in $all; do
    alive "$p" && { fail "$name: worker $p still running"; kill -9 "$p"; } || pass
  done
}

scenario worker
scenario node
finish

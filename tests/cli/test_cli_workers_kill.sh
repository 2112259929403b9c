#!/usr/bin/env bash
# test_cli_workers_kill.sh — `dtrain train --workers 2`, then one worker is
# SIGKILLed mid-training (after the first epoch record): the job must end
# within 10 s with a non-zero status, a message naming the lost rank, no
# summary.json and no worker left running. Done once killing rank 1 and once
# killing rank 0 (the one that writes files), with gradients reduced on the
# communication thread and on the compute thread. Every process this test starts
# is killed and reaped by pid on exit.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

one() {
  local victim=$1 out="$T/run$1"
  DTRAIN_DDP_OVERLAP=$3 "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 \
    --set train.epochs=100000 --set dist.bucket_bytes=$2 \
    --set data.limit_train=1000 --set data.limit_test=200 --out "$out" \
    >"$T/out$victim" 2>"$T/err$victim" </dev/null &
  local parent=$!
  PIDS="$PIDS $parent"
  # wait (bounded) for the first epoch record: training is under way
  local t0 ok=0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 40; do
    if [ -s "$out/events.jsonl" ] && grep -q '^workers:' "$T/out$victim"; then ok=1; break; fi
    kill -0 "$parent" 2>/dev/null || break
    sleep 0.05
  done
  [ $ok = 1 ] && pass || { fail "victim $victim: no epoch record within 40 s: $(cat "$T/err$victim")"; return; }
  local line pid0 pid1
  line=$(grep -m1 '^workers:' "$T/out$victim")
  pid0=$(echo "$line" | sed -nE 's/.*rank 0 pid ([0-9]+).*/\1/p')
  pid1=$(echo "$line" | sed -nE 's/.*rank 1 pid ([0-9]+).*/\1/p')
  [ -n "$pid0" ] && [ -n "$pid1" ] && pass || { fail "no worker pids in '$line'"; return; }
  local vpid=$pid0 other=$pid1
  [ "$victim" = 1 ] && vpid=$pid1 && other=$pid0
  t0=$(now)
  kill -9 "$vpid"
  # the parent must exit within 10 s (plus slack for a loaded machine: 12)
  while kill -0 "$parent" 2>/dev/null && elapsed_ok "$t0" "$(now)" 12; do sleep 0.05; done
  local t1
  t1=$(now)
  if kill -0 "$parent" 2>/dev/null; then
    fail "victim $victim: dtrain still running 12 s after the kill"
    return
  fi
  wait "$parent"
  local rc=$?
  [ $rc -ne 0 ] && pass || fail "victim $victim: exit status 0 after a worker was killed"
  elapsed_ok "$t0" "$t1" 10 && pass || fail "victim $victim: took $(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}') s"
  grep -q "worker rank $victim (pid $vpid) was killed by signal 9" "$T/err$victim" && pass ||
    fail "victim $victim: no message naming the killed rank: $(cat "$T/err$victim")"
  # the survivor noticed the lost peer itself (not killed by the launcher)
  local survivor=$((1 - victim))
  grep -q "dtrain: rank $survivor: .*rank $victim" "$T/err$victim" && pass ||
    fail "victim $victim: survivor rank $survivor did not report rank $victim: $(cat "$T/err$victim")"
  grep -q "did not exit within" "$T/err$victim" && fail "victim $victim: survivor had to be killed" || pass
  kill -0 "$other" 2>/dev/null && fail "victim $victim: worker $other still running" || pass
  [ ! -e "$out/summary.json" ] && pass || fail "victim $victim: summary.json written"
}

one 1 65536 1    # several buckets: the survivor is in the communication thread
one 0 1048576 0  # one bucket: reduced on the compute thread
finish

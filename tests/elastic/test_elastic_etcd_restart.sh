#!/usr/bin/env bash
# test_elastic_etcd_restart.sh — elastic membership in a real etcd that
# goes away (docs/elastic.md "etcd"): etcd on loopback (etcd_lib.sh); a
# 2-worker `dtrain launch --rdzv-backend etcd` job whose etcd is SIGKILLed
# once the first epoch is recorded and started again on its data
# directory, and which loses a worker at step 120 of 150, after etcd is
# back: status 0, 1 worker, visits exact.
# Then the leases: a worker
# frozen by SIGSTOP is found by its etcd lease's expiry ("lease expired"
# in the log), the others go on; after SIGCONT it finds itself left out
# and leaves. etcd and every job are stopped by pid. Exits 77 with a
# reason when etcd or curl is not installed or etcd does not start.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/etcd_lib.sh"
N=3200

# Two workers (min_workers 1): a 3-worker job is far slower on a loaded
# 2-core machine. A worker frozen at an arbitrary moment may leave its
# share of its last step without a record or with two (check_visits.py
# slack<=32: one step's share of one worker).

# etcd restarted mid-run (SIGKILLed after epoch 1, started again on its
# data directory), then a worker SIGKILLed at step 120 of 150: the job goes
# on through both. The CNN, so that on a quiet machine too the job is
# still training when etcd is back (~0.8 s an epoch of 1920 samples).
mkdir -p "$T/restart/v"
DTRAIN_TEST_VISITS="$T/restart/v" DTRAIN_TEST_KILL=1:120:forward "$DTRAIN" launch \
  --rdzv-backend etcd --rdzv "127.0.0.1:$C" --nproc-per-node 2 -- train \
  "$SRC/examples/fashion_cnn.ini" --set train.epochs=5 --set data.limit_train=1920 \
  --set data.limit_test=500 --set dist.min_workers=1 \
  --out "$T/restart/out" >"$T/restart/log" 2>&1 </dev/null &
job=$!
PIDS="$PIDS $job"
for _ in $(seq 1 1200); do [ -s "$T/restart/out/events.jsonl" ] && break; sleep 0.05; done
kill -9 "$E"; wait "$E" 2>/dev/null
sleep 0.3
start_etcd
etcd_up || fail "etcd restart: etcd did not come back: $(tail -2 "$T/etcd.log")"
if kill -0 $job 2>/dev/null; then
  guard 120 'kill -9 $job'
  wait $job
  RC=$?
  unguard
  s="$T/restart/out/summary.json"
  if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 1 ]; then
    fail "etcd restart: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/restart/log" | tail -3)"
  elif ! grep -q "generation 1" "$T/restart/log"; then fail "etcd restart: no generation 1 after the kill"
  elif ! $CHECK "$T/restart/v" 1920 5 >"$T/visits" 2>&1; then fail "etcd restart: visit record: $(cat "$T/visits")"
  else pass; fi
else
  wait $job
  skip_part restart_kill "the job ended (status $?) before etcd was back"
fi

# leases: a frozen worker's lease expires; it is left out, and leaves after SIGCONT
mkdir -p "$T/frozen/v"
DTRAIN_TEST_VISITS="$T/frozen/v" "$DTRAIN" launch --rdzv-backend etcd --rdzv "127.0.0.1:$C" \
  --nproc-per-node 2 -- train "$SRC/examples/fashion_mlp.ini" --set train.epochs=4 \
  --set data.limit_train=$N --set data.limit_test=500 --set dist.min_workers=1 \
  --set dist.heartbeat_timeout=1 --out "$T/frozen/out" >"$T/frozen/log" 2>&1 </dev/null &
job=$!
PIDS="$PIDS $job"
for _ in $(seq 1 1200); do [ -s "$T/frozen/out/events.jsonl" ] && break; sleep 0.05; done
victim=$(grep -o 'rank 1 pid [0-9]*' "$T/frozen/log" | awk '{print $4}')
guard 120 'kill -CONT $victim; kill -9 $job'
[ -n "$victim" ] && kill -STOP "$victim"
for _ in $(seq 1 1200); do grep -q "going on at epoch" "$T/frozen/log" && break; sleep 0.05; done
kill -CONT "$victim" 2>/dev/null
wait $job
RC=$?
unguard
s="$T/frozen/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 1 ]; then
  fail "etcd frozen: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/frozen/log" | tail -3)"
elif ! grep -q "member 1's etcd lease expired" "$T/frozen/log"; then
  fail "etcd frozen: not found by its lease: $(grep -v "info\|^epoch" "$T/frozen/log" | tail -3)"
elif ! grep -Eq "member 1 is not in generation|member 1: its etcd lease expired" "$T/frozen/log"; then
  fail "etcd frozen: the evicted worker did not say it leaves: $(grep -v "info\|^epoch" "$T/frozen/log" | tail -3)"
elif ! $CHECK "$T/frozen/v" $N 4 "slack<=32" >"$T/visits" 2>&1; then fail "etcd frozen: visit record: $(cat "$T/visits")"
else pass; fi

stop_etcd
for p in $(grep -ho 'pid [0-9]*' "$T"/*/log | awk '{print $2}' | sort -u); do
  if ls /dev/shm 2>/dev/null | grep -q -- "-$p-"; then fail "shared memory of pid $p left in /dev/shm"; fi
  if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then fail "worker $p still running"; fi
done
finish

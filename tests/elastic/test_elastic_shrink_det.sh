#!/usr/bin/env bash
# test_elastic_shrink_det.sh — one-host shrink cases of
# test_elastic_shrink.sh's family: deterministic mode must end with the
# params_sha256 of an uninterrupted run after a loss; below
# dist.min_workers the job waits dist.rejoin_timeout, then fails (status 1)
# naming dist.min_workers; a worker SIGKILLed from outside at an arbitrary
# moment; with DTRAIN_LONG=1 also a worker frozen by SIGSTOP, evicted after
# dist.heartbeat_timeout, which after SIGCONT leaves saying so while the
# others finish. No process or /dev/shm name is left behind.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/shrink_lib.sh"

# deterministic mode: the same bits as an uninterrupted run
run det_ref "" --set dist.deterministic=true
run det_kill 2:40:backward --set dist.deterministic=true --set dist.min_workers=2
shrunk det_kill 2
a=$(json_str "$T/det_ref/out/summary.json" params_sha256)
b=$(json_str "$T/det_kill/out/summary.json" params_sha256)
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass; else fail "deterministic: params_sha256 $b after a loss, $a without"; fi

# below min_workers: a bounded wait, then a clear failure
t0=$(date +%s)
run below 1:20:forward --set dist.min_workers=3 --set dist.rejoin_timeout=1
t1=$(date +%s)
if [ "$RC" -ne 1 ]; then fail "below: exit $RC, want 1"
elif ! grep -q "fewer than dist.min_workers = 3" "$T/below/log"; then fail "below: no message naming dist.min_workers: $(tail -3 "$T/below/log")"
elif [ -e "$T/below/out/summary.json" ] || [ ! -e "$T/below/out/failure.json" ]; then fail "below: summary.json written or failure.json missing"
elif [ $((t1 - t0)) -gt 60 ]; then fail "below: took $((t1 - t0)) s"
else pass; fi

# a SIGKILL from outside at an arbitrary moment of a longer run (the CNN,
# ~1 s an epoch on a quiet machine, so the kill lands while it trains)
mkdir -p "$T/outside"
"$DTRAIN" train "$SRC/examples/fashion_cnn.ini" --set train.epochs=3 --set data.limit_train=$N \
  --set data.limit_test=500 --workers 3 --set dist.min_workers=2 --out "$T/outside/out" \
  >"$T/outside/log" 2>&1 </dev/null &
job=$!
victim=""
for _ in $(seq 1 400); do
  victim=$(grep -o 'rank 1 pid [0-9]*' "$T/outside/log" 2>/dev/null | awk '{print $4}')
  [ -n "$victim" ] && [ -s "$T/outside/out/events.jsonl" ] && break
  sleep 0.05
done
[ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
guard 120 'kill -9 $job'
wait $job
RC=$?
unguard
s="$T/outside/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 2 ]; then
  fail "outside kill of pid $victim: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/outside/log" | tail -3)"
else pass; fi

# a frozen worker (SIGSTOP) is evicted after missed heartbeats; after SIGCONT
# it notices it was left out and leaves; the others finish (DTRAIN_LONG=1:
# on a loaded machine this case alone can take minutes)
if [ "${DTRAIN_LONG:-0}" = 1 ]; then
mkdir -p "$T/frozen"
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --set train.epochs=4 --set data.limit_train=$N \
  --set data.limit_test=500 --workers 3 --set dist.min_workers=2 \
  --set dist.heartbeat_timeout=1 --out "$T/frozen/out" >"$T/frozen/log" 2>&1 </dev/null &
job=$!
victim=""
for _ in $(seq 1 400); do
  victim=$(grep -o 'rank 2 pid [0-9]*' "$T/frozen/log" 2>/dev/null | awk '{print $4}')
  [ -n "$victim" ] && [ -s "$T/frozen/out/events.jsonl" ] && break
  sleep 0.05
done
guard 150 'kill -CONT $victim; kill -9 $job'
[ -n "$victim" ] && kill -STOP "$victim"
for _ in $(seq 1 1200); do
  grep -q "going on at epoch" "$T/frozen/log" && break
  sleep 0.05
done
kill -CONT "$victim" 2>/dev/null
wait $job
RC=$?
unguard
s="$T/frozen/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 2 ]; then
  fail "frozen pid $victim: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/frozen/log" | tail -3)"
elif ! grep -q "member 2 is not in generation" "$T/frozen/log"; then
  fail "frozen: the evicted worker did not say it leaves: $(grep -v info "$T/frozen/log" | tail -3)"
else pass; fi
fi

leftovers
finish

#!/usr/bin/env bash
# test_elastic_shrink.sh — elastic training on one host without a restart
# (docs/elastic.md): `dtrain train --workers 3 --set dist.min_workers=2`,
# a worker SIGKILLed at a named point (DTRAIN_TEST_KILL: during forward,
# during backward, with its gradients in flight in the allreduce, during
# evaluation; rank 0, which writes the records; two workers at once; one
# killed from outside at an arbitrary moment; over tcp too). Each time the
# job must finish with status 0 and a summary naming the smaller world, and
# the per-sample visit record (DTRAIN_TEST_VISITS) must show every sample
# of every epoch trained exactly once. Deterministic mode must end with the
# params_sha256 of an uninterrupted run. Below dist.min_workers the job
# waits dist.rejoin_timeout, then fails (status 1) naming dist.min_workers.
# A worker frozen by SIGSTOP is evicted after dist.heartbeat_timeout and,
# after SIGCONT, leaves saying so while the others finish.
# Every run has a time limit; no process or /dev/shm name is left behind.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CHECK="python3 $SRC/tests/elastic/check_visits.py"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

N=3200 # 50 steps of 64 per epoch
BASE=("$SRC/examples/fashion_mlp.ini" --set train.epochs=2 --set data.limit_train=$N
      --set data.limit_test=500)

# run NAME KILLSPEC ARGS... — trains with 3 workers and DTRAIN_TEST_KILL;
# sets RC, leaves $T/NAME/{out,v,log}
run() {
  local name=$1 kill=$2
  shift 2
  mkdir -p "$T/$name/v"
  DTRAIN_TEST_VISITS="$T/$name/v" DTRAIN_TEST_KILL="$kill" timeout -k 5 120 \
    "$DTRAIN" train "${BASE[@]}" --workers 3 "$@" --out "$T/$name/out" \
    >"$T/$name/log" 2>&1 </dev/null
  RC=$?
}

# shrunk NAME WORKERS — the run went on with WORKERS workers and every
# sample was trained exactly once per epoch
shrunk() {
  local name=$1 want=$2 s="$T/$1/out/summary.json"
  if [ "$RC" -ne 0 ]; then fail "$name: exit $RC: $(grep -v info "$T/$name/log" | tail -3)"; return; fi
  if [ ! -s "$s" ]; then fail "$name: no summary.json"; return; fi
  [ "$(json_num "$s" workers)" = "$want" ] || { fail "$name: summary says $(json_num "$s" workers) workers, want $want"; return; }
  grep -q "generation 1" "$T/$name/log" || { fail "$name: no generation 1 in the log"; return; }
  [ "$(wc -l <"$T/$name/out/events.jsonl")" -eq 2 ] || { fail "$name: events.jsonl has not 2 epochs"; return; }
  local acc
  acc=$(json_num "$s" test_accuracy)
  awk -v a="$acc" 'BEGIN{exit !(a > 0.7)}' || { fail "$name: test accuracy $acc"; return; }
  if ! $CHECK "$T/$name/v" $N 2 >"$T/$name/visits" 2>&1; then
    fail "$name: visit record: $(cat "$T/$name/visits")"
    return
  fi
  pass
}

# strategies without a membership change are refused up front (exit 2, the key named)
expect_bad with_zero "dist.min_workers.*dist.zero" train "${BASE[@]}" --workers 2 \
  --set dist.min_workers=1 --set dist.zero=1
expect_bad too_many "dist.min_workers.*more than dist.workers" train "${BASE[@]}" --workers 2 \
  --set dist.min_workers=3

run forward 2:20:forward --set dist.min_workers=2 && shrunk forward 2
run backward 1:20:backward --set dist.min_workers=2 && shrunk backward 2
run allreduce 2:33:allreduce --set dist.min_workers=2 && shrunk allreduce 2
run eval 1:50:eval --set dist.min_workers=2 && shrunk eval 2
run rank0 0:60:forward --set dist.min_workers=2 && shrunk rank0 2
run two "1:10:backward,2:10:backward" --set dist.min_workers=1 && shrunk two 1
run tcp 1:70:allreduce --set dist.min_workers=2 --set dist.transport=tcp && shrunk tcp 2

# deterministic mode: the same bits as an uninterrupted run
run det_ref "" --set dist.deterministic=true
run det_kill 2:40:backward --set dist.deterministic=true --set dist.min_workers=2
shrunk det_kill 2
a=$(json_str "$T/det_ref/out/summary.json" params_sha256)
b=$(json_str "$T/det_kill/out/summary.json" params_sha256)
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass; else fail "deterministic: params_sha256 $b after a loss, $a without"; fi

# below min_workers: a bounded wait, then a clear failure
t0=$(date +%s)
run below 1:30:forward --set dist.min_workers=3 --set dist.rejoin_timeout=1
t1=$(date +%s)
if [ "$RC" -ne 1 ]; then fail "below: exit $RC, want 1"
elif ! grep -q "fewer than dist.min_workers = 3" "$T/below/log"; then fail "below: no message naming dist.min_workers: $(tail -3 "$T/below/log")"
elif [ -e "$T/below/out/summary.json" ] || [ ! -e "$T/below/out/failure.json" ]; then fail "below: summary.json written or failure.json missing"
elif [ $((t1 - t0)) -gt 60 ]; then fail "below: took $((t1 - t0)) s"
else pass; fi

# a SIGKILL from outside at an arbitrary moment of a longer run
mkdir -p "$T/outside"
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --set train.epochs=6 --set data.limit_train=$N \
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
( sleep 120; kill -9 $job 2>/dev/null ) & guard=$!
wait $job
RC=$?
kill $guard 2>/dev/null; wait $guard 2>/dev/null
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
( sleep 150; kill -CONT "$victim" 2>/dev/null; kill -9 $job 2>/dev/null ) & guard=$!
[ -n "$victim" ] && kill -STOP "$victim"
for _ in $(seq 1 1200); do
  grep -q "going on at epoch" "$T/frozen/log" && break
  sleep 0.05
done
kill -CONT "$victim" 2>/dev/null
wait $job
RC=$?
kill $guard 2>/dev/null; wait $guard 2>/dev/null
s="$T/frozen/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 2 ]; then
  fail "frozen pid $victim: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/frozen/log" | tail -3)"
elif ! grep -q "member 2 is not in generation" "$T/frozen/log"; then
  fail "frozen: the evicted worker did not say it leaves: $(grep -v info "$T/frozen/log" | tail -3)"
else pass; fi
fi

# nothing left behind: no dtrain process of ours, no shared memory of ours
for d in "$T"/*/log; do
  for p in $(grep -o 'pid [0-9]*' "$d" | awk '{print $2}' | sort -u); do
    if ls /dev/shm 2>/dev/null | grep -q -- "-$p-"; then fail "shared memory of pid $p left in /dev/shm"; fi
    if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then fail "worker $p still running"; fi
  done
done
finish

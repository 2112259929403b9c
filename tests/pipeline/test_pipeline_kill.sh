#!/usr/bin/env bash
# test_pipeline_kill.sh — a stage process killed from outside (SIGKILL) in a
# running hybrid job (2 replicas x 2 stages, dtrain train --workers 4):
# every rank and the launcher exit within 10 s of the kill, non-zero, and
# the error names the killed stage and its rank (issue 14). The job is long
# enough (1000 epochs, minutes) that it cannot end by itself in the test's time.
. "$(dirname "$0")/../cli/lib.sh"

"$DTRAIN" train --set data.limit_train=2048 --set data.limit_test=200 --set train.epochs=1000 \
  --set train.batch=32 --set "model.layers=flatten linear(64) relu linear(32) relu linear(10)" \
  --workers 4 --set dist.pipeline_stages=2 --set dist.micro_batches=4 --out "$T/run" \
  >"$T/out" 2>"$T/err" </dev/null &
JOB=$!
PIDS="$PIDS $JOB"
# the launcher names its workers: "workers: rank 0 pid P, rank 1 pid Q, ..."
victim=""
for _ in $(seq 600); do
  victim=$(grep -Eo "rank 3 pid [0-9]+" "$T/out" | awk '{print $4}')
  [ -n "$victim" ] && grep -q "^epoch 1" "$T/out" "$T/err" 2>/dev/null && break
  kill -0 $JOB 2>/dev/null || break
  sleep 0.1
done
if [ -z "$victim" ] || ! kill -0 $JOB 2>/dev/null; then
  fail "the job did not start training: $(tail -3 "$T/err")"
  finish
  exit $?
fi
others=$(pgrep -P $JOB | grep -vx "$victim" | tr '\n' ' ')
t0=$(now)
kill -KILL "$victim"
ended=""
for _ in $(seq 150); do # 15 s at most
  alive=0
  for p in $JOB $others; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && { ended=$(now); break; }
  sleep 0.1
done
wait $JOB
rc=$?
if [ -z "$ended" ]; then
  fail "ranks still running 15 s after stage 1 of replica 1 (rank 3) was killed"
elif ! elapsed_ok "$t0" "$ended" 10; then
  fail "every rank exited, but $(awk -v a="$t0" -v b="$ended" 'BEGIN {print b - a}') s after the kill (limit 10 s)"
else
  pass
  echo "# every rank exited $(awk -v a="$t0" -v b="$ended" 'BEGIN {printf "%.2f", b - a}') s after the kill"
fi
[ $rc -ne 0 ] && pass || fail "the job exited 0 after a stage was killed"
# every surviving rank's error names the lost rank and its stage, whether
# it was waiting for a neighbour's gradients or in a collective
for r in 0 1 2; do
  if grep -E "rank $r:" "$T/err" | grep -q "rank 3 is pipeline stage 1 of replica 1"; then
    pass
  else
    fail "rank $r's error does not name the lost stage (rank 3, stage 1 of replica 1): $(grep -E "rank $r:" "$T/err" | tail -1)"
  fi
done
grep -E "rank [0-2]:" "$T/err" | tail -3 | sed 's/^/# /'
finish

#!/usr/bin/env bash
# test_engine_outdir.sh — what `dtrain train` leaves in its --out directory
# and says on stderr (issue 8):
#  (a) a diverging run (AdamW, lr 1e6) in a directory that holds an earlier
#      run's summary.json exits 1 naming the divergence, leaves no
#      summary.json (the stale success is gone) but a failure.json saying
#      "failed", and an events.jsonl of this run only;
#  (b) two jobs on one directory: the second is refused (non-zero exit)
#      naming the first's pid, the first goes on, events.jsonl stays valid;
#  (c) schedule.warmup_steps longer than the run: one warning (even with 2
#      workers) naming both numbers;
#  (d) summary.json has the seed as a JSON integer, exact above 2^53;
#  (e) an --out path of ~900 bytes that cannot be made: the message keeps
#      the reason (the path is shortened in the middle);
#  (f) a worker SIGKILLed while gradients are reduced on the compute
#      thread: the survivor's line does not repeat "gradient allreduce:".
# Every process it starts is stopped by pid; $T is removed on exit.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
MLP="$SRC/examples/fashion_mlp.ini"
small=(--set data.limit_train=640 --set data.limit_test=200)

# ---- (a) ----------------------------------------------------------------------------
D="$T/reused"
"$DTRAIN" train "$MLP" --set train.epochs=1 "${small[@]}" --out "$D" >/dev/null 2>"$T/a1.err" </dev/null &&
  [ -e "$D/summary.json" ] && pass || fail "(a) first run: $(cat "$T/a1.err")"
"$DTRAIN" train "$MLP" --set train.epochs=2 "${small[@]}" --set optim.name=adamw --set optim.lr=1e6 \
  --out "$D" >/dev/null 2>"$T/a2.err" </dev/null
rc=$?
[ $rc -eq 1 ] && pass || fail "(a) diverging run: exit $rc, want 1: $(cat "$T/a2.err")"
grep -q "training diverged" "$T/a2.err" && pass || fail "(a) no divergence message: $(cat "$T/a2.err")"
[ ! -e "$D/summary.json" ] && pass || fail "(a) a summary.json survived a failed run: $(cat "$D/summary.json")"
grep -Eq '"status":[[:space:]]*"failed"' "$D/failure.json" 2>/dev/null && pass ||
  fail "(a) no failure.json saying failed"
grep -q "diverged" "$D/failure.json" 2>/dev/null && pass || fail "(a) failure.json lacks the reason"
[ "$(grep -c . "$D/events.jsonl")" -le 1 ] && pass || fail "(a) events.jsonl holds the old run's records"

# ---- (b) ----------------------------------------------------------------------------
D="$T/shared"
"$DTRAIN" train "$MLP" --set train.epochs=100000 "${small[@]}" --out "$D" >"$T/b1.out" 2>"$T/b1.err" </dev/null &
first=$!
PIDS="$PIDS $first"
ok=0
for _ in $(seq 1 600); do # up to 60 s for the first epoch record
  if [ -s "$D/events.jsonl" ]; then ok=1; break; fi
  kill -0 $first 2>/dev/null || break
  sleep 0.1
done
[ $ok = 1 ] && pass || fail "(b) first job wrote no epoch record: $(cat "$T/b1.err")"
[ "$(cat "$D/.lock" 2>/dev/null)" = "$first" ] && pass || fail "(b) .lock does not hold pid $first"
"$DTRAIN" train "$MLP" --set train.epochs=1 "${small[@]}" --workers 2 --out "$D" >/dev/null 2>"$T/b2.err" </dev/null
rc=$?
[ $rc -ne 0 ] && pass || fail "(b) second job on the same --out exited 0"
grep -q "pid $first" "$T/b2.err" && pass || fail "(b) refusal does not name pid $first: $(cat "$T/b2.err")"
[ "$(wc -l <"$T/b2.err")" -eq 1 ] && pass || fail "(b) refusal is not one line: $(cat "$T/b2.err")"
kill -0 $first 2>/dev/null && pass || fail "(b) the first job died: $(cat "$T/b1.err")"
kill -9 $first 2>/dev/null
wait $first 2>/dev/null
bad=$(grep -vc '^{"epoch":[0-9]*,.*}$' "$D/events.jsonl")
[ "$bad" -eq 0 ] && pass || fail "(b) $bad malformed events.jsonl lines"

# ---- (c) ----------------------------------------------------------------------------
"$DTRAIN" train "$MLP" --set train.epochs=1 "${small[@]}" --set schedule.warmup_steps=1000 \
  --workers 2 --out "$T/warm" >/dev/null 2>"$T/c.err" </dev/null || fail "(c) run failed: $(cat "$T/c.err")"
n=$(grep -c "schedule.warmup_steps = 1000 is longer than the whole run (10 steps)" "$T/c.err")
[ "$n" -eq 1 ] && pass || fail "(c) $n warmup warnings, want 1: $(cat "$T/c.err")"

# ---- (d) ----------------------------------------------------------------------------
grep -Eq '"seed":[[:space:]]*42,' "$T/warm/summary.json" && pass || fail "(d) seed is not the number 42"
"$DTRAIN" train "$MLP" --set train.epochs=1 "${small[@]}" --set train.seed=18446744073709551615 \
  --out "$T/seed" >/dev/null 2>"$T/d.err" </dev/null || fail "(d) run failed: $(cat "$T/d.err")"
grep -Eq '"seed":[[:space:]]*18446744073709551615,' "$T/seed/summary.json" && pass ||
  fail "(d) seed 2^64-1 not exact: $(grep seed "$T/seed/summary.json")"

# ---- (e) ----------------------------------------------------------------------------
touch "$T/file"
long="$T/file/$(printf 'd%.0s' $(seq 1 880))"
"$DTRAIN" train "$MLP" --set train.epochs=1 "${small[@]}" --out "$long" >/dev/null 2>"$T/e.err" </dev/null
rc=$?
[ $rc -eq 2 ] && pass || fail "(e) exit $rc, want 2"
grep -q "Not a directory" "$T/e.err" && pass || fail "(e) the reason was cut: $(cat "$T/e.err")"
grep -q '\.\.\.' "$T/e.err" && pass || fail "(e) the path was not shortened: $(cat "$T/e.err")"

# ---- (f) ----------------------------------------------------------------------------
D="$T/kill"
DTRAIN_DDP_OVERLAP=0 "$DTRAIN" train "$MLP" --workers 2 --set train.epochs=100000 "${small[@]}" \
  --out "$D" >"$T/f.out" 2>"$T/f.err" </dev/null &
parent=$!
PIDS="$PIDS $parent"
ok=0
for _ in $(seq 1 600); do
  if [ -s "$D/events.jsonl" ] && grep -q '^workers:' "$T/f.out"; then ok=1; break; fi
  kill -0 $parent 2>/dev/null || break
  sleep 0.1
done
if [ $ok = 1 ]; then
  victim=$(grep -m1 '^workers:' "$T/f.out" | sed -nE 's/.*rank 1 pid ([0-9]+).*/\1/p')
  kill -9 "$victim"
  for _ in $(seq 1 300); do kill -0 $parent 2>/dev/null || break; sleep 0.1; done
  kill -9 $parent 2>/dev/null
  wait $parent 2>/dev/null
  line=$(grep "dtrain: rank 0:" "$T/f.err")
  [ -n "$line" ] && pass || fail "(f) rank 0 said nothing: $(cat "$T/f.err")"
  echo "$line" | grep -Eq '(gradient allreduce: ){2}' && fail "(f) repeated prefix: $line" || pass
  echo "$line" | grep -q "rank 1" && pass || fail "(f) the lost rank is not named: $line"
else
  fail "(f) no epoch record: $(cat "$T/f.err")"
fi
finish

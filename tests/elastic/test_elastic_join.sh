#!/usr/bin/env bash
# test_elastic_join.sh — elastic training grows back (docs/elastic.md):
# with dist.replace the local launcher wakes a spare (forked at start, data
# loaded) when a worker dies; it joins with the members' state by broadcast
# and the job ends with 3 workers, every sample trained exactly once per
# epoch (visit record). Deterministic mode: losing a worker and gaining a
# replacement ends with the uninterrupted run's params_sha256.
# `dtrain launch --join`: a job below dist.min_workers waits; a joiner with
# another config is refused (exit 2, the key named), one with a wrong job
# token is refused (exit 1), neither disturbs the job (no generation for
# them); a good joiner brings the job back to 3 workers and it finishes.
# Below min_workers with nobody joining, the job ends with a checkpoint that
# --resume continues from (deterministic: the uninterrupted bits).
# Every run has a time limit; no process or /dev/shm name is left behind.
. "$(dirname "$0")/../cli/lib.sh"
N=3200 # 50 steps of 64 per epoch
. "$(dirname "$0")/shrink_lib.sh" # BASE, run

# grown NAME EPOCHS — finished with 3 workers again, visits exact
grown() {
  local name=$1 epochs=$2 s="$T/$1/out/summary.json"
  if [ "$RC" -ne 0 ]; then fail "$name: exit $RC: $(grep -v info "$T/$name/log" | tail -3)"; return; fi
  if [ ! -s "$s" ]; then fail "$name: no summary.json"; return; fi
  [ "$(json_num "$s" workers)" = 3 ] || { fail "$name: summary says $(json_num "$s" workers) workers, want 3"; return; }
  grep -q "joiner [0-9]* is rank" "$T/$name/log" || { fail "$name: no joiner in the log"; return; }
  if ! $CHECK "$T/$name/v" $N "$epochs" >"$T/$name/visits" 2>&1; then
    fail "$name: visit record: $(cat "$T/$name/visits")"
    return
  fi
  pass
}

expect_bad replace_needs_min "dist.replace.*dist.min_workers" train "${BASE[@]}" --workers 2 \
  --set dist.replace=true

# the local launcher replaces a dead worker by a spare
run replace 1:20:forward --set dist.min_workers=2 --set dist.replace=true
grown replace 2
grep -q "takes the lost worker's place" "$T/replace/log" || fail "replace: the launcher did not say a spare took over"

# deterministic mode: lose one at step 40, gain one back: the same bits
run det_ref "" --set dist.deterministic=true
run det_replace 2:40:backward --set dist.deterministic=true --set dist.min_workers=2 \
  --set dist.replace=true
grown det_replace 2
a=$(json_str "$T/det_ref/out/summary.json" params_sha256)
b=$(json_str "$T/det_replace/out/summary.json" params_sha256)
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass; else fail "deterministic: params_sha256 $b after a loss and a join, $a without"; fi

# below min_workers, nobody joins: the job ends (status 1) with a checkpoint
# of the survivors' state, named in the message; --resume from it on 2
# workers ends with the uninterrupted run's bits (deterministic mode)
run below 1:30:forward --set dist.deterministic=true --set dist.min_workers=3 \
  --set dist.rejoin_timeout=1
ck=$(grep -o 'checkpoint of step 30 written: [^ ]*' "$T/below/log" | head -1 | awk '{print $NF}')
if [ "$RC" -ne 1 ] || ! grep -q "fewer than dist.min_workers = 3" "$T/below/log" || [ -z "$ck" ] || [ ! -d "$ck" ]; then
  fail "below: exit $RC, checkpoint '$ck': $(grep -v info "$T/below/log" | tail -3)"
else
  mkdir -p "$T/resumed"
  timeout -k 5 120 "$DTRAIN" train "${BASE[@]}" --workers 2 --set dist.deterministic=true \
    --resume "$T/below/out/ckpt" --out "$T/resumed/out" >"$T/resumed/log" 2>&1 </dev/null
  RC=$?
  c=$(json_str "$T/resumed/out/summary.json" params_sha256)
  if [ "$RC" -ne 0 ] || [ "$c" != "$a" ] || ! grep -q "resuming from .*(step 30)" "$T/resumed/log"; then
    fail "resume after giving up: exit $RC, params_sha256 $c, want $a: $(tail -3 "$T/resumed/log")"
  else pass; fi
fi

# dtrain launch --join: the job loses a worker, waits below min_workers;
# two bad joiners are refused, a good one brings it back
export DTRAIN_JOB_TOKEN=0123456789abcdef0123456789abcdef
P=$(free_port)
JB=("$SRC/examples/fashion_mlp.ini" --set train.epochs=3 --set data.limit_train=$N
    --set data.limit_test=500 --set dist.min_workers=3 --set dist.rejoin_timeout=90)
mkdir -p "$T/launch/v"
DTRAIN_TEST_VISITS="$T/launch/v" DTRAIN_TEST_KILL=1:20:forward timeout -k 5 150 \
  "$DTRAIN" launch --rdzv 127.0.0.1:$P --nproc-per-node 3 -- train "${JB[@]}" \
  --out "$T/launch/out" >"$T/launch/log" 2>&1 </dev/null &
job=$!
for _ in $(seq 1 1200); do
  grep -q "waiting up to" "$T/launch/log" && break
  sleep 0.05
done
grep -q "waiting up to" "$T/launch/log" || fail "launch: the job did not wait below min_workers: $(tail -3 "$T/launch/log")"
join() { # join NAME ARGS... — a joiner; sets JRC
  local name=$1
  shift
  DTRAIN_TEST_VISITS="$T/launch/v" timeout -k 5 90 "$DTRAIN" launch --join --rdzv 127.0.0.1:$P \
    -- train "${JB[@]}" "$@" >"$T/$name.log" 2>&1 </dev/null
  JRC=$?
}
join badcfg --set train.batch=32
if [ "$JRC" -ne 2 ] || ! grep -q "joiner refused: .*train.batch = 32 here, 64 in the job" "$T/badcfg.log"; then
  fail "badcfg: exit $JRC: $(tail -2 "$T/badcfg.log")"
else pass; fi
DTRAIN_JOB_TOKEN=ffffffffffffffffffffffffffffffff join badtoken
if [ "$JRC" -ne 1 ] || ! grep -q "joiner refused: .*rejected our job token" "$T/badtoken.log"; then
  fail "badtoken: exit $JRC: $(tail -2 "$T/badtoken.log")"
else pass; fi
join good
[ "$JRC" -eq 0 ] || fail "good joiner: exit $JRC: $(grep -v info "$T/good.log" | tail -3)"
wait $job
RC=$?
cat "$T/good.log" >>"$T/launch/log"
grown launch 3
if grep -q "generation 2" "$T/launch/log"; then fail "launch: a refused joiner made a generation"; fi

# nothing left behind: no dtrain process of ours, no shared memory of ours
for d in "$T"/*/log "$T"/*.log; do
  for p in $(grep -o 'pid [0-9]*' "$d" | awk '{print $2}' | sort -u); do
    if ls /dev/shm 2>/dev/null | grep -q -- "-$p-"; then fail "shared memory of pid $p left in /dev/shm"; fi
    if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then fail "process $p still running"; fi
  done
done
finish

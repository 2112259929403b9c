#!/usr/bin/env bash
# test_ps_rejoin.sh — a restarted server rejoins (docs/ps.md "A restarted
# server rejoins"): 2 workers, 2 separate servers, ps.replicas = 2 (no free
# server: after a loss every range runs on one copy), bsp, the MLP:
#  - server 0 SIGKILLed mid-run: both ranges run on server 1 alone;
#  - a new process with another model in server 0's slot is skipped by the
#    workers (another key-range map) and gives up at its deadline;
#  - a new process in server 0's slot (dtrain launch --join with
#    DTRAIN_PS_REJOIN=0) rejoins at the workers' next epoch end and takes a
#    copy of both ranges from server 1 ("holds its copy" twice);
#  - then server 1 is SIGKILLed: the workers fail over to the newcomer and
#    the job ends with status 0 and the same params_sha256 as the run
#    without kills (without the rejoin, losing server 1 loses every holder
#    of both ranges and the job ends with an error).
# Every process this test starts is killed and reaped by pid on exit
# (KEEP_LOGS=DIR keeps the logs). Sanitizer builds: REJOIN_EPOCHS (40)
# and TIME_SCALE (1, multiplies every limit), e.g. 12 and 8.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -e "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

MLP="$SRC/examples/fashion_mlp.ini"
export DTRAIN_JOB_TOKEN=0123456789abcdef0123456789abcdef
TS=${TIME_SCALE:-1}
# 12800 samples an epoch: the job must outlast two newcomers' start-ups
# (~1-2 s each) on a quiet machine (1280 ended the job first, 40 epochs in ~2 s);
# each run's limit (240 s) covers the ~145 s these 512000 samples took at
# load 25 (flaky helper, 2026-11-28: 80 s cut the reference run at epoch 20)
LIMIT=$((240 * TS))
Q=(--set train.epochs=${REJOIN_EPOCHS:-40} --set data.limit_train=12800 --set data.limit_test=200
   --set ps.servers=2 --set ps.replicas=2)
sha() { json_str "$T/$1/summary.json" params_sha256; }
pid_in() { grep -m1 '^workers:' "$T/$1.log" | sed -nE "s/.*rank $2 pid ([0-9]+).*/\1/p"; }
# count NAME PATTERN — matching lines of NAME's log, 0 before the log exists
# (a background process opens its log after the fork: the first checks can
# come first)
count() {
  local n
  n=$(grep -c "$2" "$T/$1.log" 2>/dev/null)
  echo "${n:-0}"
}
# wait_for NAME PATTERN N SECONDS — until the log has N lines matching
wait_for() {
  local t0
  t0=$(now)
  while [ "$(count "$1" "$2")" -lt "$3" ] && kill -0 "$job" 2>/dev/null &&
    elapsed_ok "$t0" "$(now)" "$4"; do sleep 0.02; done
  [ "$(count "$1" "$2")" -ge "$3" ]
}
launch() { # NAME — the job in the background, pid in $job
  local P
  P=$(free_port)
  echo "$P" >"$T/$1.port"
  "$DTRAIN" launch --rdzv 127.0.0.1:$P --nproc-per-node 4 -- train "$MLP" "${Q[@]}" \
    --out "$T/$1" >"$T/$1.log" 2>&1 </dev/null &
  job=$!
  PIDS="$PIDS $job"
}
wait_job() { # SECONDS — $rc: the job's status (124: still running)
  local t0
  t0=$(now)
  while kill -0 "$job" 2>/dev/null && elapsed_ok "$t0" "$(now)" "$1"; do sleep 0.05; done
  if kill -0 "$job" 2>/dev/null; then rc=124; return; fi
  wait "$job"
  rc=$?
}

# the reference: no kills
launch ref
wait_job $LIMIT
[ $rc = 0 ] && [ -s "$T/ref/summary.json" ] && pass || fail "ref: exit $rc: $(tail -c 400 "$T/ref.log")"
ref=$(sha ref)

# server 0 killed; a new process in its slot; once it holds its copies, server 1 killed
launch rj
if wait_for rj '^workers:' 1 $((30 * TS)); then
  t0=$(now)
  while ! { [ -s "$T/rj/events.jsonl" ] && grep -q '"epoch"' "$T/rj/events.jsonl"; } &&
    kill -0 "$job" 2>/dev/null && elapsed_ok "$t0" "$(now)" $((30 * TS)); do sleep 0.02; done
  kill -9 "$(pid_in rj 2)"
  wait_for rj "ps worker [01]: server 0 (rank 2) lost at clock" 2 $((20 * TS)) && pass ||
    fail "rj: the workers did not report server 0 lost: $(tail -5 "$T/rj.log")"
  # first a newcomer with another model (another key-range map): the
  # workers skip it (it gives up at its deadline) and take the next one
  DTRAIN_TIMEOUT=$((10 * TS)) DTRAIN_PS_REJOIN=0 "$DTRAIN" launch --join \
    --rdzv "127.0.0.1:$(cat "$T/rj.port")" -- train "$MLP" "${Q[@]}" --set dist.workers=2 \
    --set "model.layers=flatten linear(128) relu linear(10)" >"$T/bad.log" 2>&1 </dev/null &
  badp=$!
  PIDS="$PIDS $badp"
  t0=$(now)
  while ! grep -q "rejoin 1: waiting" "$T/bad.log" && kill -0 "$badp" 2>/dev/null &&
    elapsed_ok "$t0" "$(now)" $((20 * TS)); do sleep 0.02; done
  DTRAIN_PS_REJOIN=0 "$DTRAIN" launch --join --rdzv "127.0.0.1:$(cat "$T/rj.port")" -- \
    train "$MLP" "${Q[@]}" --set dist.workers=2 >"$T/new.log" 2>&1 </dev/null &
  newp=$!
  PIDS="$PIDS $newp"
  t0=$(now)
  while [ "$(count new 'holds its copy of keys')" -lt 2 ] && kill -0 "$newp" 2>/dev/null &&
    elapsed_ok "$t0" "$(now)" $((40 * TS)); do sleep 0.02; done
  if [ "$(count new 'holds its copy of keys')" = 2 ]; then
    pass
    grep -h 'holds its copy' "$T/new.log" | sed 's/.*dtrain warn: //'
    kill -9 "$(pid_in rj 3)"
  else
    fail "new: no two 'holds its copy' lines within 40 s: $(tail -5 "$T/new.log"; tail -5 "$T/rj.log")"
  fi
  wait_job $LIMIT
  [ -n "${KEEP_LOGS:-}" ] && cp "$T"/*.log "$KEEP_LOGS"/
  if [ $rc = 124 ]; then
    fail "rj: still running $LIMIT s after the kills: $(tail -3 "$T/rj.log")"
  else
    [ $rc = 0 ] && pass || fail "rj: exit $rc: $(grep -v 'go on' "$T/rj.log" | tail -c 800)"
    [ -n "$ref" ] && [ "$(sha rj)" = "$ref" ] && pass ||
      fail "rj: params_sha256 $(sha rj), not the run without kills' $ref"
    n=$(count rj "ps worker [01]: server 1 (rank 3) lost at clock")
    [ "$n" = 2 ] && pass || fail "rj: $n workers said they lost server 1"
    n=$(count rj "ps worker [01]: keys .* get a copy on server 0, back in its slot (rejoin 2)")
    [ "$n" = 4 ] && pass || fail "rj: $n lines of workers giving server 0 its ranges back (4 expected)"
    grep -q "ps server 1: server 0 is back; keys" "$T/rj.log" && pass ||
      fail "rj: server 1 did not say it copies to server 0"
  fi
  grep -q "ps worker [01]: rejoin 1 of server 0 skipped: the newcomer has another key-range map" \
    "$T/rj.log" && pass || fail "rj: the workers did not skip the newcomer with another map"
  t0=$(now)
  while kill -0 "$badp" 2>/dev/null && elapsed_ok "$t0" "$(now)" $((30 * TS)); do sleep 0.05; done
  if kill -0 "$badp" 2>/dev/null; then fail "bad: still running"; else
    wait "$badp" && fail "bad: exit 0" || pass
  fi
  t0=$(now)
  while kill -0 "$newp" 2>/dev/null && elapsed_ok "$t0" "$(now)" $((20 * TS)); do sleep 0.05; done
  if kill -0 "$newp" 2>/dev/null; then
    fail "new: the rejoined server still runs 20 s after the job's end"
  else
    wait "$newp" && pass || fail "new: exit $?: $(tail -3 "$T/new.log")"
  fi
  for r in 0 1 2 3; do
    p=$(pid_in rj $r)
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && fail "rj: rank $r (pid $p) still running" || pass
  done
fi
unset DTRAIN_JOB_TOKEN
finish

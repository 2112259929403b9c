#!/usr/bin/env bash
# test_obs_hang.sh — issue 16, hang diagnosis end to end: `dtrain train
# --workers 3`, one worker really stopped (SIGSTOP) while training. The
# other two wait for it in the gradient allreduce and fail (stop detection,
# DTRAIN_SHM_STOPPED_S=2); the launcher reads every rank's flight recorder
# (DIR/obs/rank-R, readable although rank 2 is stopped) and must print, well
# within the 60 s collective deadline, one diagnosis naming rank 2 and the
# allreduce (its sequence number) the others wait in, write it to
# DIR/diagnosis.txt and every rank's recorder to DIR/obs/flight.txt; and
# SIGUSR1 to the launcher of a healthy job prints a diagnosis without
# stopping it. Every process started is killed and reaped by pid.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

# start NAME: a 3-worker job that runs until stopped; sets $parent
start() {
  DTRAIN_SHM_STOPPED_S=2 DTRAIN_TIMEOUT=60 "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 3 \
    --set train.epochs=100000 --set data.limit_train=600 --set data.limit_test=100 --out "$T/$1" \
    >"$T/$1.out" 2>"$T/$1.err" </dev/null &
  parent=$!
  PIDS="$PIDS $parent"
  local t0 ok=0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 60; do
    if [ -s "$T/$1/events.jsonl" ] && grep -q '^workers:' "$T/$1.out"; then ok=1; break; fi
    kill -0 "$parent" 2>/dev/null || break
    sleep 0.05
  done
  [ $ok = 1 ] || { fail "$1: no epoch record within 60 s: $(cat "$T/$1.err")"; return 1; }
  for r in 0 1 2; do
    local p
    p=$(sed -nE "s/.*rank $r pid ([0-9]+).*/\1/p" "$T/$1.out")
    PIDS="$PIDS $p"
  done
}

# SIGUSR1 to a healthy job: a diagnosis line, and the job goes on
if start usr1; then
  kill -USR1 "$parent"
  t0=$(now)
  while ! grep -q 'hang diagnosis (SIGUSR1)' "$T/usr1.err" && elapsed_ok "$t0" "$(now)" 20; do sleep 0.1; done
  grep -q 'hang diagnosis (SIGUSR1)' "$T/usr1.err" && pass || fail "SIGUSR1: no diagnosis: $(cat "$T/usr1.err")"
  kill -0 "$parent" 2>/dev/null && pass || fail "SIGUSR1 stopped the job"
  grep -q '^rank 2 (pid' "$T/usr1/obs/flight.txt" && pass || fail "SIGUSR1: no recorder of rank 2 in flight.txt"
  kill -TERM "$parent"
  wait "$parent" 2>/dev/null
fi

# rank 2 stopped: the diagnosis names it and the collective
if start stop; then
  victim=$(sed -nE "s/.*rank 2 pid ([0-9]+).*/\1/p" "$T/stop.out")
  t0=$(now)
  kill -STOP "$victim"
  while ! grep -q 'hang diagnosis' "$T/stop.err" && elapsed_ok "$t0" "$(now)" 40; do sleep 0.1; done
  line=$(grep -m1 'hang diagnosis' "$T/stop.err")
  if [ -z "$line" ]; then
    fail "no hang diagnosis within 40 s of stopping rank 2: $(cat "$T/stop.err")"
  else
    pass
    echo "$line"
    # names the rank: it never entered the op, or it is stopped inside it
    echo "$line" | grep -Eq "rank 2 never entered allreduce #[0-9]+|rank 2 \(pid $victim\) is stopped" &&
      pass || fail "diagnosis does not name rank 2: $line"
    echo "$line" | grep -Eq "allreduce #[0-9]+ \(" && pass || fail "diagnosis names no collective: $line"
    echo "$line" | grep -Eq "ranks? [0-9,]*[01][0-9,]* (waiting in it|all in)" && pass ||
      fail "diagnosis does not say who waits: $line"
    grep -q "rank 2" "$T/stop/diagnosis.txt" && pass || fail "no DIR/diagnosis.txt naming rank 2"
    [ "$(grep -c '^rank [012] (pid' "$T/stop/obs/flight.txt")" = 3 ] && pass ||
      fail "flight.txt lacks a rank: $(head -c 400 "$T/stop/obs/flight.txt")"
  fi
  while kill -0 "$parent" 2>/dev/null && elapsed_ok "$t0" "$(now)" 60; do sleep 0.1; done
  kill -0 "$parent" 2>/dev/null && fail "job still running 60 s after rank 2 stopped" || pass
  wait "$parent" 2>/dev/null
  [ $? -ne 0 ] && pass || fail "exit status 0 with a stopped worker"
  # the ranks that failed dumped their own recorders
  ls "$T"/stop/obs/flight-rank-*.txt >/dev/null 2>&1 && pass || fail "no per-rank flight dump"
fi
finish

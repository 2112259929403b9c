#!/usr/bin/env bash
# test_obs_mpirun_hang.sh — issue 16, hang diagnosis under Open MPI's
# mpirun, where no dtrain launcher merges the ranks' recorders: the ranks
# do it themselves (src/cli/obs_cli.c).
#  1. SIGUSR1 to mpirun (which forwards it to every rank) of a healthy
#     3-rank job: every rank dumps its recorder (DIR/obs/flight-rank-R.txt),
#     rank 0 prints one "hang diagnosis (SIGUSR1)" line, the job goes on.
#  2. SIGSTOP of rank 2 of 3 while training: ranks 0 and 1 wait for it in
#     the gradient allreduce and fail (stop detection, DTRAIN_SHM_STOPPED_S
#     = 2); the first to fail prints one diagnosis naming rank 2 and the
#     allreduce, well within the 60 s deadline, and writes DIR/diagnosis.txt.
# Skipped (77) without mpirun. Every process is bounded and stopped by pid.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/lib_obs.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (Debian package openmpi-bin)"; exit 77; }
# Open MPI leaks in its dlopen'ed components; LeakSanitizer would blame dtrain.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
LONG=(--set train.epochs=100000 --set data.limit_train=600 --set data.limit_test=100)
victim=""
cleanup() {
  [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null && kill -9 "$victim" 2>/dev/null
  kill_pids
  rm -rf "$T"
}
trap cleanup EXIT

# start NAME: a 3-rank job under mpirun that trains until stopped; sets $MJ
start() {
  mkdir -p "$T/rdzv-$1"
  DTRAIN_RDZV_DIR="$T/rdzv-$1" DTRAIN_SHM_STOPPED_S=2 DTRAIN_TIMEOUT=60 \
    mpirun --allow-run-as-root --oversubscribe -x DTRAIN_RDZV_DIR -x DTRAIN_SHM_STOPPED_S \
    -x DTRAIN_TIMEOUT -n 3 "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" "${LONG[@]}" \
    --out "$T/$1" >"$T/$1.out" 2>"$T/$1.err" </dev/null &
  MJ=$!
  PIDS="$PIDS $MJ"
  local t0 ok=0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 90; do
    if [ -s "$T/$1/events.jsonl" ] && [ -s "$T/$1/obs/rank-2" ]; then ok=1; break; fi
    kill -0 "$MJ" 2>/dev/null || break
    sleep 0.1
  done
  [ $ok = 1 ] || { fail "$1: no epoch record within 90 s: $(tail -5 "$T/$1.err")"; return 1; }
  for r in 0 1 2; do PIDS="$PIDS $(page_pid "$T/$1/obs/rank-$r")"; done
}

# ---- 1. SIGUSR1: every rank dumps, one diagnosis, the job goes on --------------
if start usr1; then
  kill -USR1 "$MJ"
  t0=$(now)
  while ! grep -q 'hang diagnosis (SIGUSR1)' "$T/usr1.err" && elapsed_ok "$t0" "$(now)" 20; do sleep 0.1; done
  grep 'hang diagnosis' "$T/usr1.err"
  grep -q 'hang diagnosis (SIGUSR1)' "$T/usr1.err" && pass || fail "SIGUSR1: no diagnosis: $(tail -5 "$T/usr1.err")"
  sleep 1
  [ "$(grep -c 'hang diagnosis' "$T/usr1.err")" = 1 ] && pass ||
    fail "SIGUSR1: $(grep -c 'hang diagnosis' "$T/usr1.err") diagnosis lines, want 1 (the lowest live rank's)"
  for r in 0 1 2; do
    grep -q "^rank $r (pid" "$T/usr1/obs/flight-rank-$r.txt" 2>/dev/null && pass ||
      fail "SIGUSR1: rank $r did not dump its recorder"
  done
  [ "$(grep -c '^rank [012] (pid' "$T/usr1/obs/flight.txt")" = 3 ] && pass ||
    fail "SIGUSR1: flight.txt lacks a rank: $(head -c 300 "$T/usr1/obs/flight.txt")"
  kill -0 "$MJ" 2>/dev/null && pass || fail "SIGUSR1 stopped the job: $(tail -5 "$T/usr1.err")"
  stop_job "$MJ"
fi

# ---- 2. rank 2 stopped: the ranks name it and the collective --------------------
if start stop; then
  victim=$(page_pid "$T/stop/obs/rank-2")
  t0=$(now)
  kill -STOP "$victim"
  while ! grep -q 'hang diagnosis' "$T/stop.err" && elapsed_ok "$t0" "$(now)" 40; do sleep 0.1; done
  line=$(grep -m1 'hang diagnosis' "$T/stop.err")
  if [ -z "$line" ]; then
    fail "no hang diagnosis within 40 s of stopping rank 2: $(tail -8 "$T/stop.err")"
  else
    pass
    echo "$line"
    echo "$line" | grep -Eq "rank 2 never entered allreduce #[0-9]+|rank 2 \(pid $victim\) is stopped" &&
      pass || fail "diagnosis does not name rank 2: $line"
    echo "$line" | grep -Eq "allreduce #[0-9]+ \(" && pass || fail "diagnosis names no collective: $line"
    echo "$line" | grep -Eq "ranks? [0-9,]*[01][0-9,]* (waiting in it|all in)" && pass ||
      fail "diagnosis does not say who waits: $line"
    grep -q "rank 2" "$T/stop/diagnosis.txt" && pass || fail "no DIR/diagnosis.txt naming rank 2"
  fi
  sleep 2
  [ "$(grep -c 'hang diagnosis' "$T/stop.err")" = 1 ] && pass ||
    fail "$(grep -c 'hang diagnosis' "$T/stop.err") diagnosis lines, want 1: $(grep 'hang diagnosis' "$T/stop.err")"
  kill -CONT "$victim" 2>/dev/null
  kill -9 "$victim" 2>/dev/null
  stop_job "$MJ"
fi
finish

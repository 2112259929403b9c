#!/usr/bin/env bash
# test_cli_signals.sh — what stopping a running `dtrain train --workers 4`
# leaves behind (issue 8 item 2). The launcher runs in its own session
# (setsid), so its session id finds every process it started: workers and
# the sweeper. Once training is under way:
#  1. Ctrl-C (SIGINT to the whole process group): exit 130, one line
#     "interrupted by SIGINT".
#  2. SIGTERM to the launcher only: it stops the workers itself; exit 143.
#  3. SIGKILL of a worker: exit 1 naming the killed rank.
#  4. SIGKILL of the launcher: its workers die with it (PR_SET_PDEATHSIG).
#  5. SIGTERM to a 1-node `dtrain launch --nproc-per-node 2`: exit 143.
# After each: no process of the session left (checked by pid), nothing in
# /dev/shm created by a worker pid (shm inboxes dtshm-H-R-PID-N, windows
# dtrain-win-PID-N), no summary.json, nothing of the job in /tmp.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
command -v setsid >/dev/null || { echo "setsid not found"; exit 77; }
SIDS=""
cleanup() {
  for s in $SIDS; do for p in $(pgrep -s "$s" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; done
  rm -rf "$T"
}
trap cleanup EXIT
# alive and not a zombie (an orphan may wait for a reaper that never comes)
alive() { [ -e "/proc/$1/stat" ] && ! awk '{exit !($3 == "Z")}' "/proc/$1/stat" 2>/dev/null; }
worker_pids() { grep -m1 '^workers:' "$1" | grep -oE 'pid [0-9]+' | cut -d' ' -f2; }
session_left() { # pids still alive in session $1
  local p left=""
  for p in $(pgrep -s "$1" 2>/dev/null); do alive "$p" && left="$left $p"; done
  echo $left
}
shm_left() { # /dev/shm names created by one of the pids
  local p
  for p in "$@"; do
    ls /dev/shm 2>/dev/null | grep -E "^dtshm-[0-9a-f]+-[0-9]+-$p-|^dtrain-win-$p-"
  done
}
# Rendezvous directories go to a private DTRAIN_RDZV_DIR: other tests that
# run at the same time create and remove their own in /tmp, which made a
# before/after listing of /tmp fail this test in a CI dry run.
export DTRAIN_RDZV_DIR="$T/rdzv"
mkdir -p "$DTRAIN_RDZV_DIR"

# start NAME ARGS... — runs dtrain ARGS in a new session; sets L (its pid =
# its session id) and W (worker pids) once an epoch record exists.
start() {
  local name=$1
  shift
  setsid "$DTRAIN" "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" </dev/null &
  L=$!
  SIDS="$SIDS $L"
  local t0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 60; do
    if [ -s "$T/$name/events.jsonl" ] && grep -q '^workers:' "$T/$name.out"; then
      W=$(worker_pids "$T/$name.out")
      return 0
    fi
    kill -0 "$L" 2>/dev/null || break
    sleep 0.05
  done
  fail "$name: no epoch record within 60 s: $(cat "$T/$name.err")"
  return 1
}

# finish NAME WANT_RC PATTERN — waits (bounded) for the launcher, checks its
# status and stderr, then that nothing is left.
finish_case() {
  local name=$1 want=$2 pat=$3 t0 rc
  t0=$(now)
  while kill -0 "$L" 2>/dev/null && elapsed_ok "$t0" "$(now)" 20; do sleep 0.05; done
  if kill -0 "$L" 2>/dev/null; then
    fail "$name: launcher still running 20 s later"
    kill -9 "$L"
  fi
  wait "$L"
  rc=$?
  if [ "$want" = nonzero ]; then
    [ $rc -ne 0 ] && pass || fail "$name: exit status 0"
  else
    [ $rc = "$want" ] && pass || fail "$name: exit status $rc, want $want: $(cat "$T/$name.err")"
  fi
  if [ -n "$pat" ]; then
    grep -Eq "$pat" "$T/$name.err" && pass || fail "$name: stderr does not match '$pat': $(cat "$T/$name.err")"
  fi
  # every process of the session is gone (workers by PR_SET_PDEATHSIG, the
  # sweeper once it has cleaned up) within a few seconds
  local left
  t0=$(now)
  while left=$(session_left "$L"); [ -n "$left" ] && elapsed_ok "$t0" "$(now)" 10; do sleep 0.1; done
  [ -z "$left" ] && pass || fail "$name: processes left: $left ($(ps -o pid,stat,args -p "${left// /,}" 2>/dev/null))"
  for p in $W; do alive "$p" && fail "$name: worker $p still running" || pass; done
  local shm
  shm=$(shm_left $W)
  [ -z "$shm" ] && pass || fail "$name: left in /dev/shm: $shm"
  [ ! -e "$T/$name/summary.json" ] && pass || fail "$name: summary.json written"
}

ARGS=(train "$CFG" --workers 4 --set train.epochs=100000 --set data.limit_train=1000
  --set data.limit_test=200)

# 1. Ctrl-C: the terminal sends SIGINT to the whole foreground process group
if start int "${ARGS[@]}"; then
  kill -INT -- "-$L"
  finish_case int 130 '^dtrain: interrupted by SIGINT: stopped 4 workers'
  [ "$(grep -c 'interrupted' "$T/int.err")" = 1 ] && pass || fail "int: $(cat "$T/int.err")"
fi

# 2. SIGTERM to the launcher only
if start term "${ARGS[@]}"; then
  kill -TERM "$L"
  finish_case term 143 '^dtrain: interrupted by SIGTERM: stopped 4 workers'
fi

# 3. SIGKILL of one worker
if start wkill "${ARGS[@]}"; then
  victim=$(grep -m1 '^workers:' "$T/wkill.out" | sed -nE 's/.*rank 2 pid ([0-9]+).*/\1/p')
  kill -9 "$victim"
  finish_case wkill 1 "worker rank 2 \(pid $victim\) was killed by signal 9"
fi

# 4. SIGKILL of the launcher
if start lkill "${ARGS[@]}"; then
  kill -9 "$L"
  finish_case lkill 137 ''
fi

# 4b. SIGKILL of the launcher as soon as the workers exist (before they have
# all mapped each other's shared memory, when a kill used to leave it)
setsid "$DTRAIN" "${ARGS[@]}" --out "$T/early" >"$T/early.out" 2>"$T/early.err" </dev/null &
L=$!
SIDS="$SIDS $L"
t0=$(now)
while ! grep -q '^workers:' "$T/early.out" 2>/dev/null && kill -0 "$L" 2>/dev/null &&
  elapsed_ok "$t0" "$(now)" 60; do sleep 0.01; done
W=$(worker_pids "$T/early.out")
[ "$(echo $W | wc -w)" = 4 ] && pass || fail "early: worker pids '$W'"
kill -9 "$L"
finish_case early 137 ''

# 5. SIGTERM to a single-node dtrain launch
if start launch launch --nproc-per-node 2 -- train "$CFG" --set train.epochs=100000 \
  --set data.limit_train=1000 --set data.limit_test=200; then
  kill -TERM "$L"
  finish_case launch 143 '^dtrain: interrupted by SIGTERM: stopped 2 workers'
fi

rdzv_after=$(ls -A "$DTRAIN_RDZV_DIR" 2>/dev/null)
[ -z "$rdzv_after" ] && pass || fail "rendezvous directories left behind: $rdzv_after"
finish

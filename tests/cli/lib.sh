# lib.sh — helpers shared by the dtrain CLI shell tests (sourced, not run).
# Needs DTRAIN (the binary); makes a temporary directory $T removed on exit.
set -u
: "${DTRAIN:?DTRAIN must name the dtrain binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_cli.XXXXXX")
# PIDS: every background process a test starts (`PIDS="$PIDS $!"`); on exit
# each is SIGKILLed and reaped by pid, then $T is removed. A test that needs
# more (a namespace, a process group) sets its own EXIT trap and calls
# kill_pids from it.
PIDS=""
kill_pids() {
  for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
  for p in $PIDS; do wait "$p" 2>/dev/null; done
}
trap 'kill_pids; rm -rf "$T"' EXIT
FAILS=0
PASSES=0
SKIPS=0
FASHION=/usr/share/datasets/fashion-mnist

pass() { PASSES=$((PASSES + 1)); }
# now — wall-clock seconds; elapsed_ok T0 T1 LIMIT — true when T1 - T0 <= LIMIT.
now() { date +%s.%N; }
elapsed_ok() { awk -v a="$1" -v b="$2" -v lim="$3" 'BEGIN{exit !(b - a <= lim)}'; }
# wait_file PATH SECONDS PID — until PATH exists (0), or PID ended or SECONDS
# passed (1): a background run's first checkpoint, a file a server writes.
wait_file() {
  local t0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" "$2"; do
    [ -e "$1" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.01
  done
  return 1
}
# run_bounded SECS CMD... — runs CMD in the background (its pid joins PIDS)
# and waits; past SECS it is stopped (TERM, 2 s, KILL) and 124 returned.
run_bounded() { # seconds cmd...
  local secs=$1; shift
  "$@" &
  local pid=$! t=0
  PIDS="$PIDS $pid"
  while kill -0 $pid 2>/dev/null; do
    if [ $t -ge $((secs * 10)) ]; then
      echo "'$*' still running after $secs s; stopping pid $pid" >&2
      kill -TERM $pid 2>/dev/null; sleep 2; kill -KILL $pid 2>/dev/null
      wait $pid 2>/dev/null
      return 124
    fi
    sleep 0.1; t=$((t + 1))
  done
  wait $pid
}
# free_port [IPV4] — a TCP port the kernel just handed out, kept out of other
# bind(0)/connect() picks for about a minute (tests/free_port.c), for a
# listener that must be named before it starts (--rdzv HOST:PORT). Never a
# fixed or random number: parallel tests would collide.
free_port() { "${DT_TEST_BIN:-$(dirname "$DTRAIN")}/dt_free_port" "$@"; }
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
# skip_part WHAT WHY — a part of the test cannot run here (no mpirun, no
# namespaces): says so on stdout, and finish then exits 77 (CTest: skipped)
# unless something failed, so a partly run test is never reported as passed.
skip_part() { echo "SKIP ($1): $2"; SKIPS=$((SKIPS + 1)); }

# expect_bad NAME PATTERN ARGS... — runs `dtrain ARGS` with --out $T/NAME;
# it must exit 2, print exactly one line on stderr matching PATTERN (grep -E),
# and leave no summary.json (nor the output directory) behind.
expect_bad() {
  local name=$1 pat=$2
  shift 2
  local out="$T/out_$name"
  "$DTRAIN" "$@" --out "$out" >"$T/$name.stdout" 2>"$T/$name.stderr" </dev/null
  local rc=$?
  local lines
  lines=$(wc -l <"$T/$name.stderr")
  if [ "$rc" -ne 2 ]; then fail "$name: exit $rc, want 2 ($(head -c 300 "$T/$name.stderr"))"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines lines on stderr, want 1:"; cat "$T/$name.stderr" >&2; return; fi
  if ! grep -Eq -- "$pat" "$T/$name.stderr"; then fail "$name: stderr '$(cat "$T/$name.stderr")' does not match '$pat'"; return; fi
  if [ -e "$out/summary.json" ] || [ -e "$out" ]; then fail "$name: output written to $out"; return; fi
  pass
}

# json_num FILE KEY — the number KEY has in a cJSON-printed FILE.
json_num() { grep -Eo "\"$2\":[[:space:]]*-?[0-9.eE+-]+" "$1" | head -1 | sed -E 's/.*:[[:space:]]*//'; }
json_str() { grep -Eo "\"$2\":[[:space:]]*\"[^\"]*\"" "$1" | head -1 | sed -E 's/.*:[[:space:]]*"//; s/"$//'; }

# workers_of FILE — the worker pids a launcher printed ("workers: ... pid N").
workers_of() { grep -m1 '^workers:' "$1" 2>/dev/null | grep -Eo 'pid [0-9]+' | awk '{print $2}'; }
# signal_resume HASH ARGS... — a job stopped by a signal resumes exactly:
# for `kill` (SIGKILL of the launcher and its workers) and `term` (SIGTERM
# to the launcher: exit 143 and "stopped by a signal after step N ...
# checkpoint written"), runs `dtrain train ARGS --set ckpt.every_steps=1
# --out $T/WHAT` in the background (a checkpoint every step keeps it busy
# long enough), signals it once step 3's checkpoint exists, resumes it with
# `--resume` and the same ARGS, and checks that the resumed run ends with
# params_sha256 HASH. A run that ended before the signal is a skipped part.
signal_resume() {
  local want=$1 what bg rc=0
  shift
  for what in kill term; do
    "$DTRAIN" train "$@" --set ckpt.every_steps=1 --out "$T/$what" >"$T/$what.out" 2>"$T/$what.err" </dev/null &
    bg=$!
    PIDS="$PIDS $bg"
    if ! wait_file "$T/$what/ckpt/step-00000003" 60 "$bg"; then
      fail "$what: no checkpoint: $(tail -2 "$T/$what.err")"
      continue
    fi
    if [ $what = kill ]; then
      # shellcheck disable=SC2046
      kill -9 "$bg" $(workers_of "$T/$what.out") 2>/dev/null
      wait "$bg" 2>/dev/null
    else
      kill -TERM "$bg"
      wait "$bg"
      rc=$?
    fi
    if [ -e "$T/$what/summary.json" ]; then
      skip_part $what "the run ended before the signal"
      continue
    fi
    if [ $what = term ]; then
      [ $rc = 143 ] && pass || fail "SIGTERM: exit $rc, want 143: $(cat "$T/term.err")"
      grep -q 'stopped by a signal after step [0-9]* .*checkpoint written: .*step-' "$T/term.err" && pass \
        || fail "SIGTERM: message: $(cat "$T/term.err")"
    fi
    "$DTRAIN" train "$@" --out "$T/$what" --resume >"$T/$what.r.out" 2>"$T/$what.r.err" \
      || { fail "$what: resume: $(tail -1 "$T/$what.r.err")"; continue; }
    local got
    got=$(json_str "$T/$what/summary.json" params_sha256)
    [ "$got" = "$want" ] && pass || fail "$what: resumed $got != uninterrupted $want"
  done
}

# finish — the summary line; status 0 all passed, 1 something failed, 77
# nothing failed but a part was skipped. Call it last: `finish` (or
# `finish; exit $?` when it is not the last command).
finish() {
  echo "$PASSES passed, $FAILS failed, $SKIPS part(s) skipped"
  [ "$FAILS" -eq 0 ] || return 1
  [ "$SKIPS" -eq 0 ] || return 77
}

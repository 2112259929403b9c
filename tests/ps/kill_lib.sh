# kill_lib.sh — helpers of the ps tests that SIGKILL servers mid-run
# (test_ps_failover.sh, test_ps_rereplicate.sh), sourced after
# tests/cli/lib.sh with MLP (the config) and Q (the run's arguments) set.
# Every job started here is in PIDS, so lib.sh stops it by pid on exit.

# start NAME ARGS... — runs in the background (pid in $parent) and waits
# for the first epoch record; 1 if it did not come within 30 s
start() {
  local name=$1
  shift
  "$DTRAIN" train "$MLP" $Q "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" </dev/null &
  parent=$!
  PIDS="$PIDS $parent"
  local t0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 30; do
    if [ -s "$T/$name/events.jsonl" ] && grep -q '"epoch"' "$T/$name/events.jsonl" &&
       grep -q '^workers:' "$T/$name.out"; then return 0; fi
    kill -0 "$parent" 2>/dev/null || break
    sleep 0.02
  done
  fail "$name: no epoch record within 30 s: $(head -c 400 "$T/$name.err")"
  return 1
}
# pid_of NAME RANK — the pid the launcher printed for that rank
pid_of() { grep -m1 '^workers:' "$T/$1.out" | sed -nE "s/.*rank $2 pid ([0-9]+).*/\1/p"; }
# wait_end NAME SECONDS — waits for $parent; its status in $rc (124: still running)
wait_end() {
  local t0
  t0=$(now)
  while kill -0 "$parent" 2>/dev/null && elapsed_ok "$t0" "$(now)" "$2"; do sleep 0.05; done
  if kill -0 "$parent" 2>/dev/null; then rc=124; return; fi
  wait "$parent"
  rc=$?
}
# no_procs NAME NRANKS — no rank of that job is left running
no_procs() {
  for r in $(seq 0 $(($2 - 1))); do
    p=$(pid_of "$1" $r)
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && fail "$1: rank $r (pid $p) still running" || pass
  done
}

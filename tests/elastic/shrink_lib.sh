# shrink_lib.sh — shared by the one-host shrink and join tests (sourced after
# tests/cli/lib.sh): BASE (2 epochs of N samples), run NAME KILLSPEC ARGS
# (3 workers, DTRAIN_TEST_KILL), shrunk NAME WORKERS (status 0, the smaller
# world, 2 epochs recorded, accuracy > 0.65, visits exact) and leftovers (no
# worker or shared memory of the runs left).
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CHECK="python3 $SRC/tests/elastic/check_visits.py"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

N=${N:-1920} # 30 steps of 64 per epoch (test_elastic_join: 3200, 50)
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
  awk -v a="$acc" 'BEGIN{exit !(a > 0.65)}' || { fail "$name: test accuracy $acc"; return; }
  if ! $CHECK "$T/$name/v" $N 2 >"$T/$name/visits" 2>&1; then
    fail "$name: visit record: $(cat "$T/$name/visits")"
    return
  fi
  pass
}

leftovers() {
  local d p
  for d in "$T"/*/log; do
    for p in $(grep -o 'pid [0-9]*' "$d" | awk '{print $2}' | sort -u); do
      if ls /dev/shm 2>/dev/null | grep -q -- "-$p-"; then fail "shared memory of pid $p left in /dev/shm"; fi
      if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then fail "worker $p still running"; fi
    done
  done
}

# guard SECS 'COMMANDS' — runs COMMANDS (a job's kill) after SECS unless
# unguard comes first; its sleep dies with it (a stray sleep holding the
# test's output open kept ctest waiting 2 minutes after the test ended)
guard() {
  local s=$1 c=$2
  ( trap 'kill $sp 2>/dev/null; exit 0' TERM; sleep "$s" & sp=$!; wait $sp; eval "$c" ) >/dev/null 2>&1 &
  GUARD=$!
}
unguard() { kill "$GUARD" 2>/dev/null; wait "$GUARD" 2>/dev/null; }

#!/usr/bin/env bash
# test_elastic_standby.sh — spares on standby hold a current copy of the
# state (docs/elastic.md "Standby copy"): with --standby 1 and
# dist.standby_refresh_steps = 5 the members refresh the node's standby copy
# every 5 steps; when a worker is lost (deterministic mode, SIGKILLed at step
# 45) the woken spare takes the state from that copy — its log names the
# periodic refreshes and says no parameters or optimizer state were
# broadcast — and the job ends with 3 workers, every sample trained once per
# epoch, and the uninterrupted run's params_sha256. Normal mode: a loss at
# step 22 (the copy 2 steps behind, caught up in place) ends with 3 workers
# and the visit record exact. Every run has a time limit.
. "$(dirname "$0")/../cli/lib.sh"
N=3200 # 50 steps of 64 per epoch
. "$(dirname "$0")/shrink_lib.sh" # BASE, run
export DTRAIN_LOG_LEVEL=info # the spare says where its state came from

# standby NAME — 3 workers again, visits exact, the spare's state from the copy
standby() {
  local name=$1 s="$T/$1/out/summary.json" log="$T/$1/log"
  if [ "$RC" -ne 0 ]; then fail "$name: exit $RC: $(grep -v info "$log" | tail -3)"; return 1; fi
  [ "$(json_num "$s" workers)" = 3 ] || { fail "$name: summary says $(json_num "$s" workers) workers, want 3"; return 1; }
  if ! $CHECK "$T/$name/v" $N 2 >"$T/$name/visits" 2>&1; then
    fail "$name: visit record: $(cat "$T/$name/visits")"; return 1
  fi
  local line
  line=$(grep -o "member 3: state of step [0-9]* taken from the standby copy ([0-9]* periodic refreshes[^)]*)" "$log" | head -1)
  if [ -z "$line" ] || ! grep -q "no broadcast of parameters or optimizer state" "$log"; then
    fail "$name: the spare did not take the state from the standby copy: $(grep -E 'standby|joiner' "$log" | head -3)"
    return 1
  fi
  local n
  n=$(echo "$line" | sed 's/.*(\([0-9]*\) periodic refreshes.*/\1/')
  [ "$n" -ge 1 ] || { fail "$name: no periodic refresh of the copy before the loss: $line"; return 1; }
  pass
}

mkdir -p "$T/ref"
timeout -k 5 120 "$DTRAIN" train "${BASE[@]}" --workers 1 --set dist.deterministic=true \
  --out "$T/ref/out" >"$T/ref/log" 2>&1 </dev/null || fail "reference run: $(tail -3 "$T/ref/log")"

run det 2:45:backward --standby 1 --set dist.deterministic=true \
  --set dist.min_workers=2 --set dist.standby_refresh_steps=5
if standby det; then
  a=$(json_str "$T/ref/out/summary.json" params_sha256)
  b=$(json_str "$T/det/out/summary.json" params_sha256)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass
  else fail "deterministic: params_sha256 $b after a loss and a spare from the standby copy, $a without"; fi
fi

run normal 1:22:forward --standby 1 --set dist.min_workers=2 \
  --set dist.standby_refresh_steps=5
standby normal

leftovers
finish

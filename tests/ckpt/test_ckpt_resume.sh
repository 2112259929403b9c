#!/usr/bin/env bash
# test_ckpt_resume.sh — exact continuation from checkpoints through the
# command line (docs/checkpoint.md), each against an uninterrupted run:
#  - 1 worker and 2 workers: every process SIGKILLed after a checkpoint,
#    `--resume` ends with the same params_sha256;
#  - deterministic mode: a run of 3 workers resumed from a mid-run
#    checkpoint with 2, 1 and 4 workers ends with the 3-worker hash;
#  - SIGKILL at random moments while the background writer is busy
#    (checkpoint every step): each time --resume finds a valid checkpoint and
#    ends with the right hash (3 kills here; DTRAIN_LONG=1: 30);
#  - SIGTERM: exit 143, the message names the checkpoint written, resume exact.
# Every process started is killed and reaped by pid; $T is removed.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
MLP="$SRC/examples/fashion_mlp.ini"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

# small and quick: 4 epochs of 32 steps
S=(--set train.epochs=4 --set data.limit_train=2000 --set data.limit_test=500 --set ckpt.keep=0)
sha() { json_str "$1/summary.json" params_sha256; }

# run_bg NAME ARGS... — dtrain train in the background; sets BG to its pid
run_bg() {
  local name=$1
  shift
  "$DTRAIN" train "$MLP" "${S[@]}" "$@" >"$T/$name.out" 2>"$T/$name.err" </dev/null &
  BG=$!
  PIDS="$PIDS $BG"
}

# kill_all NAME PID — SIGKILL dtrain and every worker it printed
kill_all() {
  local w
  w=$(grep -m1 '^workers:' "$T/$1.out" 2>/dev/null | grep -Eo 'pid [0-9]+' | awk '{print $2}')
  kill -9 "$2" $w 2>/dev/null
  wait "$2" 2>/dev/null
}

# --- references: uninterrupted runs (checkpoints do not change training) ----
"$DTRAIN" train "$MLP" "${S[@]}" --out "$T/ref1" >/dev/null 2>"$T/ref1.err" || fail "ref1: $(cat "$T/ref1.err")"
"$DTRAIN" train "$MLP" "${S[@]}" --workers 2 --out "$T/ref2" >/dev/null 2>"$T/ref2.err" || fail "ref2: $(cat "$T/ref2.err")"
H1=$(sha "$T/ref1")
H2=$(sha "$T/ref2")
[ -n "$H1" ] && [ -n "$H2" ] && pass || fail "no reference hashes"
# a checkpoint at every epoch end by default, listed in the summary
[ "$(json_num "$T/ref1/summary.json" written)" = 4 ] && pass || fail "ref1: checkpoints written != 4"

# --- SIGKILL of every process after a checkpoint, then --resume -------------
for w in 1 2; do
  run_bg kill$w --workers $w --set ckpt.every_steps=7 --out "$T/kill$w"
  if wait_file "$T/kill$w/ckpt/step-00000014" 60 "$BG"; then pass; else fail "kill$w: no checkpoint: $(cat "$T/kill$w.err")"; fi
  kill_all kill$w "$BG"
  [ -e "$T/kill$w/summary.json" ] && fail "kill$w: finished before the kill (make the run longer)"
  "$DTRAIN" train "$MLP" "${S[@]}" --workers $w --out "$T/kill$w" --resume >"$T/kill$w.r.out" 2>"$T/kill$w.r.err" \
    || fail "kill$w: resume failed: $(cat "$T/kill$w.r.err")"
  want=$H1
  [ $w = 2 ] && want=$H2
  [ "$(sha "$T/kill$w")" = "$want" ] && pass || fail "kill$w: params_sha256 $(sha "$T/kill$w") != uninterrupted $want"
  grep -q '^resuming from .*step-' "$T/kill$w.r.out" && pass || fail "kill$w: no 'resuming from' line"
done

# --- deterministic: 3 workers, resumed with 2, 1 and 4 ------------------------
D=(--set dist.deterministic=true --set ckpt.every_steps=30)
"$DTRAIN" train "$MLP" "${S[@]}" "${D[@]}" --workers 3 --out "$T/det3" >/dev/null 2>"$T/det3.err" || fail "det3: $(cat "$T/det3.err")"
HD=$(sha "$T/det3")
for w in 2 1 4; do
  "$DTRAIN" train "$MLP" "${S[@]}" "${D[@]}" --workers $w --out "$T/det3r$w" \
    --resume "$T/det3/ckpt/step-00000030" >/dev/null 2>"$T/det3r$w.err" || fail "det 3->$w: $(cat "$T/det3r$w.err")"
  [ "$(sha "$T/det3r$w")" = "$HD" ] && pass || fail "det 3->$w: params_sha256 $(sha "$T/det3r$w") != 3 workers' $HD"
done

# --- SIGKILL at random moments during background writes ----------------------
N=3
[ "${DTRAIN_LONG:-0}" = 1 ] && N=30
good=0
for i in $(seq 1 "$N"); do
  run_bg rnd$i --set ckpt.every_steps=1 --out "$T/rnd$i"
  if ! wait_file "$T/rnd$i/ckpt/latest" 60 "$BG"; then fail "rnd$i: no checkpoint: $(cat "$T/rnd$i.err")"; continue; fi
  sleep "$(awk -v s="$RANDOM" 'BEGIN{srand(s); printf "%.3f", rand() * 0.4}')"
  kill_all rnd$i "$BG"
  "$DTRAIN" train "$MLP" "${S[@]}" --out "$T/rnd$i" --resume >"$T/rnd$i.r.out" 2>"$T/rnd$i.r.err" \
    || { fail "rnd$i: resume failed: $(cat "$T/rnd$i.r.err")"; continue; }
  [ "$(sha "$T/rnd$i")" = "$H1" ] && good=$((good + 1)) || fail "rnd$i: params_sha256 differs after a kill"
  rm -rf "$T/rnd$i"
done
[ $good = "$N" ] && pass
echo "random kills during writes: $good of $N resumed exactly"

# --- SIGTERM: a checkpoint at the step boundary, exit 143 ---------------------
# a checkpoint every step keeps the run busy long enough to be signalled
run_bg term --set ckpt.every_steps=1 --out "$T/term"
if wait_file "$T/term/ckpt/latest" 60 "$BG"; then
  kill -TERM "$BG"
  wait "$BG"
  rc=$?
  if [ -e "$T/term/summary.json" ]; then
    skip_part sigterm "the run ended before the signal"
  else
    [ $rc = 143 ] && pass || fail "SIGTERM: exit $rc, want 143: $(cat "$T/term.err")"
    grep -q 'stopped by a signal after step [0-9]* .*checkpoint written: .*step-' "$T/term.err" && pass \
      || fail "SIGTERM: message: $(cat "$T/term.err")"
    "$DTRAIN" train "$MLP" "${S[@]}" --out "$T/term" --resume >/dev/null 2>"$T/term.r.err" || fail "term resume: $(cat "$T/term.r.err")"
    [ "$(sha "$T/term")" = "$H1" ] && pass || fail "SIGTERM resume: params_sha256 differs"
  fi
else
  fail "term: no epoch record: $(cat "$T/term.err")"
fi
finish

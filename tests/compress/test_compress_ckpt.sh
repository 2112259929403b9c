#!/usr/bin/env bash
# test_compress_ckpt.sh — compression state in checkpoints (docs/compress.md
# "Checkpoints", docs/checkpoint.md): 2 workers over tcp, compression
# forced on one host, a checkpoint every 7 steps.
#  1. int8, powersgd, topk with worker momentum and sign with the
#     optimizer's momentum before the codec (DTRAIN_CZ_SIGN_MOM=1): two uninterrupted runs
#     end with the same params_sha256 (the premise), the checkpoint holds
#     worker-0/worker-1.safetensors (owners "worker-0", "worker-1") and
#     verifies, and a run resumed from the step-14 checkpoint (what a run
#     SIGKILLed after it leaves) ends with the uninterrupted hash — which
#     needs the residuals, the velocities, PowerSGD's Q and sign's summed
#     velocities of both workers;
#  2. one real SIGKILL of every process after a checkpoint, then --resume;
#  3. resuming with another codec or worker count goes on, with one warning
#     line saying the compression state starts at zero;
#  4. checkpoints only rank 0 decides — ckpt.every_seconds and SIGTERM —
#     are announced with a step's gradients, hold every worker's state and
#     resume exactly too.
# Every process is bounded by a deadline and stopped by pid.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# 3 epochs of 16 steps (batch 64, 1000 samples)
S=(--set train.epochs=3 --set data.limit_train=1000 --set data.limit_test=300 --set ckpt.keep=0
  --set ckpt.every_steps=7 --set dist.transport=tcp --set dist.compress_force=true
  --set dist.compress_start_step=0)
sha() { json_str "$1/summary.json" params_sha256; }

# train NAME WORKERS CODEC [more args]
train() {
  local name=$1 w=$2 codec=$3
  shift 3
  run_bounded 120 "$DTRAIN" train "$CFG" --workers "$w" "${S[@]}" --set dist.compress="$codec" \
    "$@" >"$T/$name.out" 2>"$T/$name.err" </dev/null
}

MOM=(--set dist.compress_momentum=0.9 --set optim.momentum=0)
# ---- 1 ---------------------------------------------------------------------------
for codec in int8 powersgd topk+mom sign; do
  c=${codec%+mom}
  extra=()
  [ "$c" != "$codec" ] && extra=("${MOM[@]}")
  n=${codec/+/_}
  if [ "$c" = sign ]; then export DTRAIN_CZ_SIGN_MOM=1; else unset DTRAIN_CZ_SIGN_MOM; fi
  train "$n" 2 "$c" "${extra[@]}" --out "$T/$n" || { fail "$n: $(tail -2 "$T/$n.err")"; continue; }
  train "$n.again" 2 "$c" "${extra[@]}" --out "$T/$n.again" || fail "$n.again: $(tail -2 "$T/$n.again.err")"
  H=$(sha "$T/$n")
  [ -n "$H" ] && [ "$H" = "$(sha "$T/$n.again")" ] && pass || fail "$n: two uninterrupted runs differ"
  ck="$T/$n/ckpt/step-00000014"
  [ -s "$ck/worker-0.safetensors" ] && [ -s "$ck/worker-1.safetensors" ] && pass ||
    fail "$n: no per-worker files in $ck: $(ls "$ck" 2>&1)"
  grep -q '"owner":[[:space:]]*"worker-1"' "$ck/manifest.json" && pass || fail "$n: manifest has no owner worker-1"
  "$DTRAIN" ckpt verify "$ck" >/dev/null 2>"$T/$n.verify" && pass || fail "$n: ckpt verify: $(cat "$T/$n.verify")"
  train "$n.r" 2 "$c" "${extra[@]}" --out "$T/$n.r" --resume "$ck" || fail "$n.r: $(tail -2 "$T/$n.r.err")"
  [ "$(sha "$T/$n.r")" = "$H" ] && pass || fail "$n: resumed params_sha256 $(sha "$T/$n.r") != uninterrupted $H"
  grep -q "start at zero\|starts at zero" "$T/$n.r.err" && fail "$n: resume warned: $(grep zero "$T/$n.r.err")"
done
unset DTRAIN_CZ_SIGN_MOM

# ---- 2: SIGKILL after a checkpoint --------------------------------------------------
"$DTRAIN" train "$CFG" --workers 2 "${S[@]}" --set train.epochs=30 --set dist.compress=int8 \
  --out "$T/kill" >"$T/kill.out" 2>"$T/kill.err" </dev/null &
BG=$!
PIDS="$PIDS $BG"
wait_file "$T/kill/ckpt/step-00000021" 60 "$BG" || true # checked below
w=$(grep -m1 '^workers:' "$T/kill.out" 2>/dev/null | grep -Eo 'pid [0-9]+' | awk '{print $2}')
kill -9 "$BG" $w 2>/dev/null
wait "$BG" 2>/dev/null
if [ -e "$T/kill/summary.json" ] || [ ! -e "$T/kill/ckpt/step-00000021" ]; then
  fail "kill: no checkpoint before the kill or the run ended first: $(tail -2 "$T/kill.err")"
else
  run_bounded 300 "$DTRAIN" train "$CFG" --workers 2 "${S[@]}" --set train.epochs=30 --set dist.compress=int8 \
    --out "$T/kill" --resume >"$T/kill.r.out" 2>"$T/kill.r.err" </dev/null || fail "kill: resume: $(tail -2 "$T/kill.r.err")"
  train kill.ref 2 int8 --set train.epochs=30 --out "$T/kill.ref" || fail "kill.ref: $(tail -2 "$T/kill.ref.err")"
  [ -n "$(sha "$T/kill")" ] && [ "$(sha "$T/kill")" = "$(sha "$T/kill.ref")" ] && pass ||
    fail "kill: resumed params_sha256 $(sha "$T/kill") != uninterrupted $(sha "$T/kill.ref")"
fi

# ---- 3: another codec, another worker count ------------------------------------------
ck="$T/int8/ckpt/step-00000014"
train other_codec 2 sign --out "$T/other_codec" --resume "$ck" || fail "other_codec: $(tail -2 "$T/other_codec.err")"
grep -q "per-worker compression state saved with dist.compress = int8, this run uses sign; it starts at zero" \
  "$T/other_codec.err" && pass || fail "other_codec: no warning: $(cat "$T/other_codec.err")"
train other_count 3 int8 --out "$T/other_count" --resume "$ck" || fail "other_count: $(tail -2 "$T/other_count.err")"
grep -q "was written by 2 workers, this run has 3: error-feedback residuals and worker momentum start at zero" \
  "$T/other_count.err" && pass || fail "other_count: no warning: $(cat "$T/other_count.err")"
[ "$(grep -c 'start at zero\|starts at zero' "$T/other_count.err")" = 1 ] && pass || fail "other_count: not one line"
# ---- 4: a timer and a signal ------------------------------------------------------------
H=$(sha "$T/int8")
train timer 2 int8 --set ckpt.every_steps=0 --set ckpt.every_seconds=0.01 --out "$T/timer" ||
  fail "timer: $(tail -2 "$T/timer.err")"
tck=""
for d in "$T"/timer/ckpt/step-*; do
  n=$((10#${d##*step-}))
  [ $((n % 16)) != 0 ] && tck=$d && break
done
if [ -z "$tck" ]; then
  skip_part timer "the run ended before a timer checkpoint: $(ls "$T/timer/ckpt")"
else
  [ -s "$tck/worker-1.safetensors" ] && pass || fail "timer: no worker files in $tck"
  train timer.r 2 int8 --out "$T/timer.r" --resume "$tck" || fail "timer.r: $(tail -2 "$T/timer.r.err")"
  [ "$(sha "$T/timer.r")" = "$H" ] && pass || fail "timer: resumed from $tck: $(sha "$T/timer.r") != $H"
fi
"$DTRAIN" train "$CFG" --workers 2 "${S[@]}" --set train.epochs=30 --set ckpt.every_steps=0 \
  --set dist.compress=int8 --out "$T/term" >"$T/term.out" 2>"$T/term.err" </dev/null &
BG=$!
PIDS="$PIDS $BG"
wait_file "$T/term/ckpt/step-00000016" 60 "$BG" || true # the run's end is checked below
kill -TERM "$BG"
wait "$BG"
rc=$?
if [ -e "$T/term/summary.json" ]; then
  skip_part sigterm "the run ended before the signal"
else
  [ $rc = 143 ] && pass || fail "SIGTERM: exit $rc, want 143: $(tail -3 "$T/term.err")"
  last=$(cat "$T/term/ckpt/latest" 2>/dev/null)
  [ -n "$last" ] && [ "$last" != step-00000016 ] && [ -s "$T/term/ckpt/$last/worker-1.safetensors" ] && pass ||
    fail "SIGTERM: latest '$last' has no worker files: $(ls "$T/term/ckpt/$last" 2>&1)"
  run_bounded 300 "$DTRAIN" train "$CFG" --workers 2 "${S[@]}" --set train.epochs=30 --set ckpt.every_steps=0 \
    --set dist.compress=int8 --out "$T/term" --resume >"$T/term.r.out" 2>"$T/term.r.err" </dev/null ||
    fail "SIGTERM: resume: $(tail -2 "$T/term.r.err")"
  [ -n "$(sha "$T/term")" ] && [ "$(sha "$T/term")" = "$(sha "$T/kill.ref")" ] && pass ||
    fail "SIGTERM: resumed params_sha256 $(sha "$T/term") != uninterrupted $(sha "$T/kill.ref")"
fi
finish

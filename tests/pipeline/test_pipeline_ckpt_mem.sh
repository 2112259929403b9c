#!/usr/bin/env bash
# test_pipeline_ckpt_mem.sh — a pipeline checkpoint does not bring the
# whole model into rank 0's memory (docs/pipeline.md "Checkpoints"): the
# other stages' parameters and optimizer state go through a spill file on
# rank 0, never its memory.
#  - 2 stages, stage 0 tiny (50K parameters), stage 1 big (4.35M: 17 MB of
#    parameters, 35 MB of AdamW moments): rank 0's peak RSS with a
#    checkpoint every step exceeds the same run's without checkpoints by
#    less than half of stage 1's parameter bytes (gathering to memory, as
#    before, costs rank 0 stage 1's parameters and moments plus a copy of
#    the whole model: about 70 MB);
#  - that checkpoint resumes to the uninterrupted run's params_sha256, and
#    `dtrain ckpt verify` passes;
#  - 3 stages (two spilled stages), deterministic mode: written at step 5
#    of 10, resumed, the same params_sha256 as the uninterrupted run; its
#    model export byte for byte that of a one-process checkpoint of the
#    same step.
# Every process started is waited for; $T is removed.
. "$(dirname "$0")/../cli/lib.sh"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
[ -x /usr/bin/python3 ] || { echo "SKIP: no python3 to read summary.json"; exit 77; }

MLP="flatten linear(64) relu linear(2048) relu linear(2048) relu linear(10)"
B=(--set data.limit_train=256 --set data.limit_test=64 --set train.epochs=1 --set train.batch=32
   --set "model.layers=$MLP" --set optim.name=adamw --set ckpt.keep=0 --set ckpt.epoch_end=false)
P2=(--workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=2 --set model.stages=2)
sha() { json_str "$1/summary.json" params_sha256; }
rss0() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(int(d['per_worker'][0]['peak_rss_bytes']))" "$1/summary.json"; }

train() { # NAME ARGS... — a run that must succeed, into $T/NAME
  local name=$1
  shift
  "$DTRAIN" train "${B[@]}" "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" \
    || { fail "$name: $(tail -1 "$T/$name.err")"; return 1; }
}

# --- rank 0's memory: checkpoints every step against none ---------------------
# (an ASan build keeps freed blocks in quarantine, so every checkpoint's
# short-lived buffers would add up in the peak: reuse them at once)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
if train nock "${P2[@]}" && train ck "${P2[@]}" --set ckpt.every_steps=1; then
  a=$(rss0 "$T/nock") b=$(rss0 "$T/ck")
  # stage 1's parameters: layers 3.. of the MLP (64*2048+2048 + 2048*2048+2048 + 2048*10+10)
  s1=$(( (64 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10) * 4 ))
  d=$(( b - a ))
  echo "rank 0 peak RSS: $a bytes without checkpoints, $b with one every step (+$d; stage 1's parameters $s1 bytes)"
  [ "$d" -lt $(( s1 / 2 )) ] && pass \
    || fail "rank 0 holds the other stage's state at a checkpoint: peak RSS +$d bytes, stage 1's parameters are $s1"
  [ "$(sha "$T/ck")" = "$(sha "$T/nock")" ] && pass || fail "checkpoints changed training"
  [ -d "$T/ck/ckpt/step-00000004" ] && "$DTRAIN" ckpt verify "$T/ck/ckpt/step-00000004" >"$T/v.out" 2>&1 \
    && pass || fail "ckpt verify: $(cat "$T/v.out" 2>/dev/null)"
  train ckr "${P2[@]}" --resume "$T/ck/ckpt/step-00000004" \
    && { [ "$(sha "$T/ckr")" = "$(sha "$T/nock")" ] && pass || fail "2 stages resumed: $(sha "$T/ckr") != $(sha "$T/nock")"; }
fi

# --- 3 stages, deterministic: two stages spilled, exact resume and export ------
DET=(--set dist.deterministic=true --set dist.micro_batch=8 --set "model.layers=flatten linear(32) relu linear(24) relu linear(16) relu linear(10)")
P3=(--workers 3 --set dist.pipeline_stages=3 --set dist.micro_batches=2)
train ref "${DET[@]}" --set ckpt.every_steps=5 || exit 1
train d3 "${DET[@]}" "${P3[@]}" --set ckpt.every_steps=5 \
  && { [ "$(sha "$T/d3")" = "$(sha "$T/ref")" ] && pass || fail "3 stages: $(sha "$T/d3") != $(sha "$T/ref")"; }
train d3r "${DET[@]}" "${P3[@]}" --resume "$T/d3/ckpt/step-00000005" \
  && { [ "$(sha "$T/d3r")" = "$(sha "$T/ref")" ] && pass || fail "3 stages resumed: $(sha "$T/d3r") != $(sha "$T/ref")"; }
if "$DTRAIN" export "$T/d3/ckpt/step-00000005" --out "$T/d3.st" >"$T/e1.out" 2>&1 \
   && "$DTRAIN" export "$T/ref/ckpt/step-00000005" --out "$T/ref.st" >"$T/e2.out" 2>&1; then
  cmp -s "$T/d3.st" "$T/ref.st" && pass || fail "3 stages: export differs from one process's"
else
  fail "export: $(cat "$T/e1.out" "$T/e2.out")"
fi
finish

#!/usr/bin/env bash
# test_zero_ckpt_mem.sh — a ZeRO-1 checkpoint does not bring the whole
# model's optimizer state into rank 0's memory (docs/pipeline.md "ZeRO-1",
# src/engine/strategy_zero.c): the other ranks' blocks and rank 0's
# parameters go through a spill file, never its memory; resuming, each
# rank reads its own block of the state out of the checkpoint.
#  - 2 workers, AdamW, an MLP of 5.8M parameters (23 MB; the whole state
#    46 MB, each rank's block 23 MB): rank 0's peak RSS with a checkpoint
#    every step exceeds the same run's without checkpoints by less than
#    half of the parameter bytes (gathering to memory, as before, costs
#    rank 0 the whole state, a peer's block, and the snapshot's copies of
#    the parameters and the state: about 140 MB);
#  - checkpoints change nothing, and the run resumed from one ends with the
#    uninterrupted run's params_sha256 (one host: ZeRO-1 is ddp's bits);
#  - rank 0's peak RSS resuming exceeds a fresh run's by less than half of
#    the parameter bytes (no rank reads the whole state);
# each over shm and over tcp. (Before, the old code's one 22 MiB send of a
# block hung over shm: it now goes in 1 MiB chunks, as the pipeline's.)
# Every process started is waited for; $T is removed.
. "$(dirname "$0")/../cli/lib.sh"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
[ -x /usr/bin/python3 ] || { echo "SKIP: no python3 to read summary.json"; exit 77; }

MLP="flatten linear(2048) relu linear(2048) relu linear(10)"
B=(--set data.limit_train=384 --set data.limit_test=64 --set train.epochs=1 --set train.batch=64
   --set "model.layers=$MLP" --set optim.name=adamw --set optim.lr=0.001 --set ckpt.keep=0
   --set ckpt.epoch_end=false --workers 2 --set dist.zero=1)
sha() { json_str "$1/summary.json" params_sha256; }
rss0() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(int(d['per_worker'][0]['peak_rss_bytes']))" "$1/summary.json"; }
train() { # NAME ARGS... — a run that must succeed, into $T/NAME
  local name=$1
  shift
  "$DTRAIN" train "${B[@]}" "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" \
    || { fail "$name: $(tail -1 "$T/$name.err")"; return 1; }
}
# (an ASan build keeps freed blocks in quarantine: reuse them at once)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
P=$(( (784 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10) * 4 ))

# one host (shared memory, the gradients in a window) and tcp
for x in shm tcp; do
  X=(--set dist.transport=$x)
  if train nock$x "${X[@]}" && train ck$x "${X[@]}" --set ckpt.every_steps=1; then
    a=$(rss0 "$T/nock$x") b=$(rss0 "$T/ck$x")
    d=$(( b - a ))
    echo "$x: rank 0 peak RSS: $a bytes without checkpoints, $b with one every step (+$d; the parameters $P bytes, AdamW's state twice that)"
    [ "$d" -lt $(( P / 2 )) ] && pass \
      || fail "$x: rank 0 holds the others' optimizer state at a checkpoint: peak RSS +$d bytes, the parameters are $P"
    [ "$(sha "$T/ck$x")" = "$(sha "$T/nock$x")" ] && pass || fail "$x: checkpoints changed training"
    C="$T/ck$x/ckpt/step-00000003"
    "$DTRAIN" ckpt verify "$C" >"$T/v.out" 2>&1 && pass || fail "ckpt verify: $(cat "$T/v.out")"
    if train res$x "${X[@]}" --resume "$C"; then
      [ "$(sha "$T/res$x")" = "$(sha "$T/nock$x")" ] && pass \
        || fail "$x: resumed: $(sha "$T/res$x") != $(sha "$T/nock$x")"
      r=$(rss0 "$T/res$x")
      d=$(( r - a ))
      echo "$x: rank 0 peak RSS resuming: $r bytes (+$d over a fresh run)"
      [ "$d" -lt $(( P / 2 )) ] && pass \
        || fail "$x: a rank reads the whole optimizer state on resume: rank 0's peak RSS +$d bytes, the parameters are $P"
    fi
  fi
done
finish

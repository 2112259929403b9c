#!/usr/bin/env bash
# test_zero_ckpt.sh — checkpoints of ZeRO-1 jobs (dist.zero = 1,
# docs/pipeline.md "ZeRO-1"): each worker holds the optimizer state of its
# block of the parameters only; at a checkpoint the blocks come to rank 0,
# which writes the whole model's state in ddp's form. So:
#  - checkpoints do not change training (same params_sha256 with and
#    without them), and a run resumed from one ends with the uninterrupted
#    run's params_sha256 — AdamW (two state floats per parameter), SGD with
#    momentum (one), plain SGD (none);
#  - on one host ZeRO-1 gives ddp's bits, so a ZeRO-1 checkpoint resumed by
#    ddp, and a ddp checkpoint resumed by ZeRO-1, end with the same hash;
#    3 workers (a model whose size is not a multiple of 3: the tail every
#    worker updates) resumed from a 2-worker checkpoint equal ddp's 3
#    workers resumed from it;
#  - SIGKILL of every process after a checkpoint, then --resume; SIGTERM:
#    exit 143 after rank 0 wrote, resume exact; `dtrain ckpt verify` passes.
# Every process started is killed and reaped by pid; $T is removed.
. "$(dirname "$0")/../cli/lib.sh"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

# 784*32+32 + 32*24+24 + 24*10+10 = 26162 parameters: 26162 mod 3 = 2
MLP="flatten linear(32) relu dropout(0.3) linear(24) relu linear(10)"
B=(--set data.limit_train=600 --set data.limit_test=200 --set train.epochs=2 --set train.batch=48
   --set "model.layers=$MLP" --set ckpt.keep=0)
ADAMW=(--set optim.name=adamw --set optim.lr=0.002)
Z=(--set dist.zero=1)
sha() { json_str "$1/summary.json" params_sha256; }

train() { # NAME ARGS... — a run that must succeed, into $T/NAME
  local name=$1
  shift
  "$DTRAIN" train "${B[@]}" "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" \
    || { fail "$name: $(tail -1 "$T/$name.err")"; return 1; }
}
same() { # WHAT RUN HASH
  [ "$(sha "$T/$2")" = "$3" ] && pass || fail "$1: $(sha "$T/$2") != $3"
}

# --- AdamW, 2 workers: checkpoints change nothing, resume is exact -----------
train z0 "${ADAMW[@]}" "${Z[@]}" --workers 2 || exit 1
H=$(sha "$T/z0")
train z "${ADAMW[@]}" "${Z[@]}" --workers 2 --set ckpt.every_steps=5 || exit 1
same "ZeRO-1 with checkpoints" z "$H"
grep -q "checkpoints are not taken" "$T/z.err" && fail "ZeRO-1 still refuses checkpoints: $(cat "$T/z.err")"
C="$T/z/ckpt/step-00000010"
[ -d "$C" ] && pass || fail "no checkpoint at step 10: $(ls "$T/z/ckpt" 2>&1)"
"$DTRAIN" ckpt verify "$T/z/ckpt" >"$T/verify.out" 2>&1 && pass || fail "ckpt verify: $(cat "$T/verify.out")"
train zr "${ADAMW[@]}" "${Z[@]}" --workers 2 --resume "$C" && same "ZeRO-1 resumed" zr "$H"

# --- interchange with ddp (the same bits on one host) ------------------------
train d "${ADAMW[@]}" --workers 2 --set ckpt.every_steps=5 && same "ddp equals ZeRO-1" d "$H"
train z2d "${ADAMW[@]}" --workers 2 --resume "$C" && same "ZeRO-1 checkpoint -> ddp" z2d "$H"
train d2z "${ADAMW[@]}" "${Z[@]}" --workers 2 --resume "$T/d/ckpt/step-00000010" \
  && same "ddp checkpoint -> ZeRO-1" d2z "$H"
# another worker count: ZeRO-1 with 3 (a tail of 2 parameters) equals ddp with 3
if train z3 "${ADAMW[@]}" "${Z[@]}" --workers 3 --resume "$C" \
  && train d3 "${ADAMW[@]}" --workers 3 --resume "$C"; then
  H3=$(sha "$T/d3")
  same "2 -> 3 workers: ZeRO-1 vs ddp" z3 "$H3"
  [ "$H3" != "$H" ] && pass || fail "3 workers resumed give 2 workers' hash: the test proves nothing"
fi
# ... and a 3-worker ZeRO-1 checkpoint (blocks of 8720 plus the tail) resumed by itself
if train z3c "${ADAMW[@]}" "${Z[@]}" --workers 3 --set ckpt.every_steps=6; then
  train z3r "${ADAMW[@]}" "${Z[@]}" --workers 3 --resume "$T/z3c/ckpt/step-00000006" \
    && same "ZeRO-1, 3 workers, resumed" z3r "$(sha "$T/z3c")"
fi

# --- SGD with momentum (one state float), plain SGD (none) -------------------
for o in "0.9" "0"; do
  M=(--set optim.name=sgd --set optim.lr=0.05 --set "optim.momentum=$o")
  train s$o "${M[@]}" "${Z[@]}" --workers 2 --set ckpt.every_steps=7 || continue
  train s${o}r "${M[@]}" "${Z[@]}" --workers 2 --resume "$T/s$o/ckpt/step-00000007" \
    && same "sgd momentum $o resumed" s${o}r "$(sha "$T/s$o")"
done

# --- SIGKILL after a checkpoint; SIGTERM -------------------------------------
LONG=(--set train.epochs=6 --set data.limit_train=1200)
train lref "${ADAMW[@]}" "${Z[@]}" --workers 2 "${LONG[@]}" || exit 1
HL=$(sha "$T/lref")
signal_resume "$HL" "${B[@]}" "${ADAMW[@]}" "${Z[@]}" --workers 2 "${LONG[@]}"
finish

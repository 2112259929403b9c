#!/usr/bin/env bash
# test_ckpt_faults.sh — what goes wrong around checkpoints, through the
# command line (docs/checkpoint.md):
#  - another model or data set: --resume refused with exit 2 naming the key;
#    another train.epochs is accepted;
#  - the newest checkpoint damaged (a byte flipped): a warning naming it, the
#    previous one is used; every checkpoint damaged: exit 2 naming them;
#  - an unwritable ckpt.dir: exit 2 before training, naming ckpt.dir;
#  - a full file system (a 5 MB tmpfs in a private mount namespace): the
#    failed write is a warning naming the path, older checkpoints stay and
#    verify, training goes on and summary.json reports the failure;
#  - dtrain ckpt ls / verify (exit 1 on damage), dtrain export (the weights
#    file parses, names nn.Sequential tensors), model.init from it.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
MLP="$SRC/examples/fashion_mlp.ini"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
S=(--set train.epochs=2 --set data.limit_train=2000 --set data.limit_test=300 --set ckpt.keep=0
   --set ckpt.every_steps=10)

"$DTRAIN" train "$MLP" "${S[@]}" --out "$T/a" >/dev/null 2>"$T/a.err" || fail "a: $(cat "$T/a.err")"
ls "$T/a/ckpt" | grep -q step-00000064 && pass || fail "no final checkpoint: $(ls "$T/a/ckpt")"

# --- synchronous writes, by time ----------------------------------------------------
"$DTRAIN" train "$MLP" "${S[@]}" --set ckpt.every_steps=0 --set ckpt.async=false --set ckpt.epoch_end=false \
  --set ckpt.every_seconds=0.001 --out "$T/sync" >/dev/null 2>"$T/sync.err" || fail "sync: $(cat "$T/sync.err")"
[ "$(json_num "$T/sync/summary.json" written)" -ge 2 ] 2>/dev/null && pass || fail "every_seconds: $(json_num "$T/sync/summary.json" written) checkpoints"
grep -q '"async":[[:space:]]*false' "$T/sync/summary.json" && pass || fail "sync: summary does not say async false"
"$DTRAIN" ckpt verify "$T/sync" >"$T/sync.verify" 2>&1 && pass || fail "sync: verify: $(cat "$T/sync.verify")"
[ "$(json_str "$T/sync/summary.json" params_sha256)" = "$(json_str "$T/a/summary.json" params_sha256)" ] && pass \
  || fail "checkpointing changed the trajectory"

# --- fingerprint ------------------------------------------------------------------
expect_bad other_model 'model.layers' train "$MLP" "${S[@]}" --set 'model.layers=flatten linear(64) relu linear(10)' --resume "$T/a"
expect_bad other_data 'data.train_samples' train "$MLP" "${S[@]}" --set data.limit_train=1000 --resume "$T/a"
expect_bad other_lr 'optim.lr' train "$MLP" "${S[@]}" --set optim.lr=0.01 --resume "$T/a"
"$DTRAIN" train "$MLP" "${S[@]}" --set train.epochs=3 --out "$T/more" --resume "$T/a" >/dev/null 2>"$T/more.err" \
  && pass || fail "more epochs refused: $(cat "$T/more.err")"
[ "$(json_num "$T/more/summary.json" steps)" = 96 ] && pass || fail "3 epochs after resume: steps $(json_num "$T/more/summary.json" steps)"

# --- damage: the newest falls back to the previous -------------------------------------
cp -r "$T/a" "$T/b"
f="$T/b/ckpt/step-00000064/model.safetensors"
printf '\x7f' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
"$DTRAIN" ckpt verify "$T/b" >"$T/verify.out" 2>&1
[ $? = 1 ] && pass || fail "ckpt verify: exit 0 with a damaged file"
grep -q 'step-00000064 .*INVALID.*model.safetensors.*SHA-256' "$T/verify.out" && pass || fail "verify output: $(cat "$T/verify.out")"
grep -q 'step-00000060 .*ok' "$T/verify.out" && pass || fail "verify: step 60 not ok"
"$DTRAIN" train "$MLP" "${S[@]}" --out "$T/b" --resume >"$T/b.out" 2>"$T/b.err" || fail "fallback resume: $(cat "$T/b.err")"
grep -q "checkpoint '.*step-00000064' skipped: .*model.safetensors" "$T/b.err" && pass || fail "no warning naming the damaged file: $(cat "$T/b.err")"
grep -q 'resuming from .*step-00000060' "$T/b.out" && pass || fail "did not fall back to step 60: $(cat "$T/b.out")"
[ "$(json_str "$T/b/summary.json" params_sha256)" = "$(json_str "$T/a/summary.json" params_sha256)" ] && pass \
  || fail "fallback resume: params_sha256 differs"

# --- nothing valid: exit 2 ------------------------------------------------------------
mkdir -p "$T/c/ckpt"
cp -r "$T/a/ckpt/step-00000010" "$T/c/ckpt/"
rm "$T/c/ckpt/step-00000010/manifest.json"
echo step-00000099 >"$T/c/ckpt/latest"
"$DTRAIN" train "$MLP" "${S[@]}" --out "$T/c" --resume >"$T/c.out" 2>"$T/c.err"
[ $? = 2 ] && pass || fail "no valid checkpoint: exit not 2"
grep -q 'dangling' "$T/c.err" && pass || fail "dangling latest not named: $(cat "$T/c.err")"
grep -q 'no valid checkpoint under .*tried: step-00000010' "$T/c.err" && pass || fail "exit-2 message: $(cat "$T/c.err")"
[ -e "$T/c/summary.json" ] && fail "summary written after a refused resume" || pass

# --- unwritable ckpt.dir -----------------------------------------------------------------
touch "$T/plainfile"
expect_bad unwritable 'ckpt.dir.*plainfile' train "$MLP" "${S[@]}" --set ckpt.dir="$T/plainfile/ck"

# --- ls, export, model.init -------------------------------------------------------------
"$DTRAIN" ckpt ls "$T/a" >"$T/ls.out" && pass || fail "ckpt ls failed"
[ "$(grep -c ' ok' "$T/ls.out")" = 8 ] && pass || fail "ckpt ls: $(cat "$T/ls.out")"
grep -q 'step-00000064 .*<- latest' "$T/ls.out" && pass || fail "ls does not mark latest"
"$DTRAIN" export "$T/a" --out "$T/w.safetensors" >"$T/export.out" 2>&1 && pass || fail "export: $(cat "$T/export.out")"
grep -q 'exported step 64' "$T/export.out" && pass || fail "export output: $(cat "$T/export.out")"
head -c 4000 "$T/w.safetensors" | grep -q '"1.weight":{"dtype":"F32","shape":\[256,784\]' && pass || fail "export: no 1.weight [256,784]"
head -c 4000 "$T/w.safetensors" | grep -q '"dtrain.layers":"flatten linear(256)' && pass || fail "export: no layer spec"
# training from exported weights: the run starts from them (its first epoch loss
# is far below a fresh start's)
"$DTRAIN" train "$MLP" "${S[@]}" --set train.epochs=1 --set model.init="$T/w.safetensors" --out "$T/init" >/dev/null 2>"$T/init.err" \
  || fail "model.init: $(cat "$T/init.err")"
"$DTRAIN" train "$MLP" "${S[@]}" --set train.epochs=1 --out "$T/fresh" >/dev/null 2>&1
l_init=$(json_num "$T/init/events.jsonl" train_loss)
l_fresh=$(json_num "$T/fresh/events.jsonl" train_loss)
awk -v a="$l_init" -v b="$l_fresh" 'BEGIN{exit !(a < b * 0.8)}' && pass || fail "model.init: loss $l_init not below fresh $l_fresh"
expect_bad init_other 'model.init.*1.weight' train "$MLP" "${S[@]}" --set 'model.layers=flatten linear(32) relu linear(10)' --set model.init="$T/w.safetensors"

# --- a full file system: 5 MB of tmpfs in a namespace of our own ---------------------------
if unshare -m --propagation private true 2>/dev/null; then
  mkdir -p "$T/mnt"
  unshare -m --propagation private sh -c "mount -t tmpfs -o size=5m tmpfs '$T/mnt' && \
    '$DTRAIN' train '$MLP' $(printf "'%s' " "${S[@]}") --out '$T/full' --set ckpt.dir='$T/mnt/ck' >'$T/full.out' 2>'$T/full.err'; \
    echo \$? >'$T/full.rc'; '$DTRAIN' ckpt verify '$T/mnt/ck' >'$T/full.verify' 2>&1; echo \$? >>'$T/full.rc'"
  [ "$(head -1 "$T/full.rc")" = 0 ] && pass || fail "full disk: training did not go on: $(cat "$T/full.err")"
  grep -q "checkpoint of step [0-9]* not written .*mnt/ck.*No space left on device" "$T/full.err" && pass \
    || fail "full disk: no warning naming the path: $(cat "$T/full.err")"
  [ "$(json_num "$T/full/summary.json" failed)" -ge 1 ] 2>/dev/null && pass || fail "full disk: summary has no failed checkpoint"
  grep -q '"last_error":.*No space left' "$T/full/summary.json" && pass || fail "full disk: summary lacks the error"
  [ "$(sed -n 2p "$T/full.rc")" = 0 ] && pass || fail "full disk: kept checkpoints do not verify: $(cat "$T/full.verify")"
  grep -q ' ok' "$T/full.verify" && pass || fail "full disk: no checkpoint kept: $(cat "$T/full.verify")"
else
  skip_part full-disk "cannot create a mount namespace here (unshare -m)"
fi
finish

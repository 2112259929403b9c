#!/usr/bin/env bash
# test_pipeline_ckpt.sh — checkpoints of pipeline jobs (docs/pipeline.md
# "Checkpoints"): each stage's optimizer state in its own file (owner
# "stage-S" in the manifest) beside the whole model's parameters, and
# exact continuation:
#  - deterministic mode (pipeline_det), 2 stages, gpipe and 1f1b: a run
#    resumed from a mid-run checkpoint ends with the uninterrupted run's
#    params_sha256 (which is one ddp_det worker's);
#  - re-partitioning: that checkpoint resumed with 3 stages, 1 process,
#    hybrid 2 x 2 and plain ddp_det, a ddp_det checkpoint resumed by 2
#    stages, a hybrid 2 x 2 job's checkpoint resumed by 3 stages: all end
#    with the same hash;
#  - normal mode, 2 stages, gpipe and 1f1b: resumed == uninterrupted;
#  - ZeRO-1 inside a hybrid 2 x 2 job (dist.zero): its checkpoint resumed
#    sharded and unsharded == uninterrupted;
#  - SIGKILL of every process after a checkpoint, then --resume; SIGTERM to
#    the job: exit 143, every rank stops after rank 0 wrote, resume exact;
#  - `dtrain ckpt verify` passes and `dtrain export` gives the whole model,
#    byte for byte the export of a one-process checkpoint of the same step.
# Every process started is killed and reaped by pid; $T is removed.
. "$(dirname "$0")/../cli/lib.sh"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

MLP="flatten linear(32) relu dropout(0.3) linear(24) batchnorm relu linear(10)"
B=(--set data.limit_train=600 --set data.limit_test=200 --set train.epochs=2 --set train.batch=48
   --set "model.layers=$MLP" --set optim.name=adamw --set ckpt.keep=0)
DET=(--set dist.deterministic=true --set dist.micro_batch=8)
sha() { json_str "$1/summary.json" params_sha256; }
p2() { echo --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=3 --set "dist.schedule=$1"; }

train() { # NAME ARGS... — a run that must succeed, into $T/NAME
  local name=$1
  shift
  "$DTRAIN" train "${B[@]}" "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" \
    || { fail "$name: $(tail -1 "$T/$name.err")"; return 1; }
}

# --- deterministic: the reference is one ddp_det worker ----------------------
train ref "${DET[@]}" --set ckpt.every_steps=10 || exit 1
H=$(sha "$T/ref")
for s in 1f1b gpipe; do
  # shellcheck disable=SC2046
  train det_$s "${DET[@]}" $(p2 $s) --set ckpt.every_steps=5 || continue
  [ "$(sha "$T/det_$s")" = "$H" ] && pass || fail "det $s: checkpoints changed training"
  C="$T/det_$s/ckpt/step-00000010"
  # shellcheck disable=SC2046
  train det_${s}_r "${DET[@]}" $(p2 $s) --resume "$C" || continue
  [ "$(sha "$T/det_${s}_r")" = "$H" ] && pass || fail "det $s resumed: $(sha "$T/det_${s}_r") != $H"
done
C="$T/det_1f1b/ckpt/step-00000010"
# the manifest: one file per stage, owned by it
for st in 0 1; do
  grep -A2 "\"stage-$st.safetensors\"" "$C/manifest.json" | grep -q "\"owner\":.*\"stage-$st\"" && pass \
    || fail "manifest: no stage-$st.safetensors owned by stage-$st: $(cat "$C/manifest.json")"
done
"$DTRAIN" ckpt verify "$T/det_1f1b/ckpt" >"$T/verify.out" 2>&1 && pass || fail "ckpt verify: $(cat "$T/verify.out")"

# --- re-partitioning: another stage count, no pipeline, hybrid ----------------
train rp3 "${DET[@]}" --workers 3 --set dist.pipeline_stages=3 --set dist.micro_batches=2 --resume "$C" \
  && { [ "$(sha "$T/rp3")" = "$H" ] && pass || fail "2 -> 3 stages: $(sha "$T/rp3") != $H"; }
train rp1 "${DET[@]}" --resume "$C" \
  && { [ "$(sha "$T/rp1")" = "$H" ] && pass || fail "2 stages -> 1 process: $(sha "$T/rp1") != $H"; }
train rp22 "${DET[@]}" --workers 4 --set dist.pipeline_stages=2 --set dist.schedule=gpipe --resume "$C" \
  && { [ "$(sha "$T/rp22")" = "$H" ] && pass || fail "2 stages -> 2 x 2: $(sha "$T/rp22") != $H"; }
# shellcheck disable=SC2046
train ddp2p "${DET[@]}" $(p2 1f1b) --resume "$T/ref/ckpt/step-00000010" \
  && { [ "$(sha "$T/ddp2p")" = "$H" ] && pass || fail "ddp_det -> 2 stages: $(sha "$T/ddp2p") != $H"; }

# a hybrid 2 x 2 job writes (replica 0's stages gather), 3 stages resume
if train w22 "${DET[@]}" --workers 4 --set dist.pipeline_stages=2 --set ckpt.every_steps=5; then
  [ "$(sha "$T/w22")" = "$H" ] && pass || fail "2 x 2 writing checkpoints: $(sha "$T/w22") != $H"
  train w22r "${DET[@]}" --workers 3 --set dist.pipeline_stages=3 --resume "$T/w22/ckpt/step-00000010" \
    && { [ "$(sha "$T/w22r")" = "$H" ] && pass || fail "2 x 2 -> 3 stages: $(sha "$T/w22r") != $H"; }
fi

# --- export: the whole model, the same bytes as a one-process checkpoint's ----
"$DTRAIN" export "$C" --out "$T/pipe.safetensors" >/dev/null 2>"$T/exp.err" || fail "export: $(cat "$T/exp.err")"
"$DTRAIN" export "$T/ref/ckpt/step-00000010" --out "$T/one.safetensors" >/dev/null 2>>"$T/exp.err" || fail "export: $(cat "$T/exp.err")"
cmp -s "$T/pipe.safetensors" "$T/one.safetensors" && pass || fail "export of the pipeline checkpoint differs from one process's"

# --- normal mode: resumed == uninterrupted -----------------------------------
for s in 1f1b gpipe; do
  # shellcheck disable=SC2046
  train n_$s $(p2 $s) --set ckpt.every_steps=7 || continue
  # shellcheck disable=SC2046
  train n_${s}_r $(p2 $s) --resume "$T/n_$s/ckpt/step-00000007" || continue
  [ "$(sha "$T/n_${s}_r")" = "$(sha "$T/n_$s")" ] && pass || fail "normal $s: resumed $(sha "$T/n_${s}_r") != $(sha "$T/n_$s")"
done

# --- ZeRO-1 in the hybrid groups: each stage's optimizer state sharded over
# its 2 replicas, put together in the checkpoint; resumed sharded and not
Z=(--workers 4 --set dist.pipeline_stages=2 --set dist.micro_batches=3)
if train z22 "${Z[@]}" --set dist.zero=1 --set ckpt.every_steps=7; then
  train z22r "${Z[@]}" --set dist.zero=1 --resume "$T/z22/ckpt/step-00000007" \
    && { [ "$(sha "$T/z22r")" = "$(sha "$T/z22")" ] && pass || fail "ZeRO-1 2 x 2 resumed: $(sha "$T/z22r") != $(sha "$T/z22")"; }
  train z22u "${Z[@]}" --resume "$T/z22/ckpt/step-00000007" \
    && { [ "$(sha "$T/z22u")" = "$(sha "$T/z22")" ] && pass || fail "ZeRO-1 2 x 2 resumed unsharded: $(sha "$T/z22u") != $(sha "$T/z22")"; }
fi

# --- SIGKILL after a checkpoint; SIGTERM -------------------------------------
LONG=(--set train.epochs=6 --set data.limit_train=1200)
train lref "${DET[@]}" "${LONG[@]}" || exit 1
HL=$(sha "$T/lref")
# shellcheck disable=SC2046
signal_resume "$HL" "${B[@]}" "${DET[@]}" "${LONG[@]}" $(p2 1f1b)
finish

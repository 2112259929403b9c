#!/usr/bin/env bash
# test_pipeline_phases.sh — the time line a pipeline run prints at its end
# (docs/pipeline.md "Benchmarks"; bench/pipeline.sh's breakdown reads it):
# rank 0 prints "pipeline time per step (ms, N steps):" and one line per
# stage with forward, backward, packing, weight gradients, optimizer,
# receiving, sends, replica reduction and checkpoint agreement; forward and
# backward are positive on each stage, and a stage's compute (forward,
# backward, packing, weight gradients, optimizer) is not more than the
# run's training time per step. (Its waits may be: the last stage's
# checkpoint agreement also waits for stage 0's epoch end.)
. "$(dirname "$0")/../cli/lib.sh"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

MLP="flatten linear(256) relu linear(256) relu linear(10)"
if "$DTRAIN" train --set data.limit_train=256 --set data.limit_test=64 --set train.epochs=1 \
     --set train.batch=32 --set "model.layers=$MLP" --set ckpt.epoch_end=false --workers 2 \
     --set dist.pipeline_stages=2 --set dist.micro_batches=4 --out "$T/r" >"$T/r.out" 2>"$T/r.err"; then
  grep -q 'pipeline time per step (ms, 8 steps):' "$T/r.err" && pass \
    || fail "no time line header: $(cat "$T/r.err")"
  tps=$(awk '/"train_seconds"/ {gsub(/[^0-9.eE+-]/, "", $2); print 1000 * $2 / 8; exit}' "$T/r/summary.json")
  for s in 0 1; do
    line=$(grep -E "^stage $s: forward [0-9.]+, backward [0-9.]+, packing [0-9.]+, weight gradients [0-9.]+, optimizer [0-9.]+; receiving [0-9.]+, sends [0-9.]+, replica reduction [0-9.]+, checkpoint agreement [0-9.]+$" "$T/r.err")
    [ -n "$line" ] || { fail "stage $s: no time line: $(cat "$T/r.err")"; continue; }
    echo "$line (train time per step $tps ms)"
    echo "$line" | awk -v tps="$tps" '{
      n = split($0, f, /[^0-9.]+/); s = 0; for (i = 3; i <= 7; i++) s += f[i]
      fw = f[3]; bw = f[4]
      exit !(fw > 0 && bw > 0 && s <= tps * 1.05 + 1) }' && pass \
      || fail "stage $s: parts not positive or above the step ($tps ms): $line"
  done
else
  fail "run: $(tail -1 "$T/r.err")"
fi
finish

#!/usr/bin/env bash
# test_pipeline_cli.sh — the pipeline through `dtrain train`: bad settings
# end with exit 2 and one line (more stages than layers, cut points out of
# range or not increasing, a worker count that is not a multiple of the
# stages, a bad schedule), and a 2-stage run with --workers trains and
# prints its partition at the cut points given.
. "$(dirname "$0")/../cli/lib.sh"

MLP="flatten linear(64) relu linear(10)"
D="--set data.limit_train=2048 --set data.limit_test=500 --set train.epochs=1"
expect_bad too_many_stages "dist.pipeline_stages = 5: the model has 4 layers" \
  train $D --set "model.layers=$MLP" --workers 5 --set dist.pipeline_stages=5
expect_bad cut_range "model.stages: cut point 9 is out of range \[1, 3\]" \
  train $D --set "model.layers=$MLP" --workers 2 --set dist.pipeline_stages=2 --set model.stages=9
expect_bad cut_count "model.stages: 2 cut points for dist.pipeline_stages = 2" \
  train $D --set "model.layers=$MLP" --workers 2 --set dist.pipeline_stages=2 --set model.stages=1,2
expect_bad cut_order "model.stages: cut points must increase" \
  train $D --set "model.layers=$MLP" --workers 3 --set dist.pipeline_stages=3 --set model.stages=2,1
expect_bad cut_syntax "model.stages: expects cut points" \
  train $D --set "model.layers=$MLP" --set model.stages=a
expect_bad not_multiple "3 workers are not a multiple of 2 stages" \
  train $D --set "model.layers=$MLP" --workers 3 --set dist.pipeline_stages=2
expect_bad no_workers "dist.pipeline_stages = 2: 1 workers are not a multiple of it" \
  train $D --set "model.layers=$MLP" --set dist.pipeline_stages=2
expect_bad schedule "dist.schedule: unknown value 'zigzag'" \
  train $D --set dist.schedule=zigzag

# a run: the partition is printed, the cut points are honoured
if "$DTRAIN" train $D --set "model.layers=$MLP" --workers 2 --set dist.pipeline_stages=2 \
    --set model.stages=3 --set dist.micro_batches=4 --out "$T/run" >"$T/run.out" 2>"$T/run.err"; then
  grep -q "stage 0: layers 1-3" "$T/run.err" && grep -q "stage 1: layers 4-4" "$T/run.err" &&
    grep -q '"test_accuracy"' "$T/run/summary.json" && pass ||
    fail "2-stage run: partition or summary missing: $(cat "$T/run.err")"
else
  fail "2-stage run failed: $(cat "$T/run.err")"
fi
finish

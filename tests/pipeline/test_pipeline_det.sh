#!/usr/bin/env bash
# test_pipeline_det.sh — deterministic mode with the pipeline: the same
# params_sha256 as one ddp_det worker for P in {1, 2, 3} stages, several
# micro-batch counts, both schedules, recomputation and data-parallel widths
# 1 and 2 (hybrid 2 x 2), on an MLP with dropout and batch norm and on a CNN
# whose first layer is a convolution; and the same test_loss and
# test_accuracy: with P > 1 the evaluation goes forward through the stages
# (no rank holds the whole model), and gives the whole model's bits.
. "$(dirname "$0")/../cli/lib.sh"

D=(--set data.limit_train=600 --set data.limit_test=200 --set train.epochs=1 --set train.batch=48
   --set dist.deterministic=true --set dist.micro_batch=8)
sha() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['params_sha256'], repr(d['test_loss']), repr(d['test_accuracy']))" "$1"; }

check() { # NAME SPEC REF_SHA ARGS...
  local name=$1 spec=$2 ref=$3
  shift 3
  if ! "$DTRAIN" train "${D[@]}" --set "model.layers=$spec" "$@" --out "$T/$name" \
      >"$T/$name.out" 2>"$T/$name.err"; then
    fail "$name: $(tail -1 "$T/$name.err")"
    return
  fi
  local got
  got=$(sha "$T/$name/summary.json")
  [ "$got" = "$ref" ] && pass || fail "$name ($*): params_sha256 test_loss test_accuracy $got, one ddp_det worker $ref"
}

MLP="flatten linear(32) relu dropout(0.3) linear(24) batchnorm relu linear(10)"
CNN="conv(4,3,pad=1) batchnorm relu maxpool(2) conv(8,3,pad=1) relu maxpool(2) flatten linear(10)"
for spec in "$MLP" "$CNN"; do
  tag=$([ "$spec" = "$MLP" ] && echo mlp || echo cnn)
  if ! "$DTRAIN" train "${D[@]}" --set "model.layers=$spec" --out "$T/ref_$tag" >/dev/null 2>"$T/ref.err"; then
    fail "reference $tag: $(tail -1 "$T/ref.err")"
    continue
  fi
  ref=$(sha "$T/ref_$tag/summary.json")
  check "${tag}_p1m3" "$spec" "$ref" --set dist.micro_batches=3
  check "${tag}_p2m1" "$spec" "$ref" --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=1
  check "${tag}_p2m4g" "$spec" "$ref" --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=4 --set dist.schedule=gpipe
  check "${tag}_p3m2" "$spec" "$ref" --workers 3 --set dist.pipeline_stages=3 --set dist.micro_batches=2
  check "${tag}_p3m12r" "$spec" "$ref" --workers 3 --set dist.pipeline_stages=3 --set dist.micro_batches=12 --set train.recompute=true
  check "${tag}_w4p2" "$spec" "$ref" --workers 4 --set dist.pipeline_stages=2 --set dist.micro_batches=3
done
finish

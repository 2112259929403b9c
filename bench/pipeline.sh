#!/usr/bin/env bash
# bench/pipeline.sh — `make bench-pipeline`: pipeline parallelism on the deep
# MLP (examples/fashion_deep_mlp.ini, 18.4M parameters, batch 256), back to
# back on this machine:
#   1. samples/s of one process vs 2 stages, 1f1b, m = 8 (target >= 1.7x);
#   2. the measured bubble (mean share of a stage's step time spent waiting
#      for its neighbours) next to (p-1)/(m+p-1), m = 2, 4, 8, 16;
#   3. PyTorch 1.13 Pipe (2 stages on CPU, same model and m; target: dtrain
#      >= 3x its samples/s);
#   4. peak RSS per rank (VmHWM): 1f1b vs gpipe at m = 16, recompute.
# Each dtrain figure is the median of DT_BENCH_REPS runs of DT_BENCH_STEPS
# steps (training time only, from summary.json). The machine has 2 cores
# and is shared: re-run before believing a single number.
# Env: BUILD (default build/release), DT_BENCH_STEPS (30), DT_BENCH_REPS (3),
#      DT_BENCH_ONLY (all, or one of speed bubble torch rss; or accuracy,
#      the two accuracy runs, ~30 minutes, not part of all).
set -u
SRC="$(cd "$(dirname "$0")/.." && pwd)"
cd "$SRC" || exit 1
BUILD="${BUILD:-build/release}"
STEPS="${DT_BENCH_STEPS:-30}"
REPS="${DT_BENCH_REPS:-3}"
ONLY="${DT_BENCH_ONLY:-all}"
want() { [ "$ONLY" = all ] || [ "$ONLY" = "$1" ]; }
DT="$BUILD/dtrain"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/dt_bench_pipe.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
CFG=examples/fashion_deep_mlp.ini
BASE=(--set train.epochs=1 --set "data.limit_train=$((256 * STEPS))" --set data.limit_test=256)

# run NAME ARGS... -> prints samples/s, bubble and peak RSS (MiB, max over ranks)
run() {
  local name=$1
  shift
  "$DT" train "$CFG" "${BASE[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 &
  local pid=$! hwm=0
  while kill -0 "$pid" 2>/dev/null; do
    for p in $pid $(pgrep -P "$pid"); do
      local v
      v=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null)
      [ -n "$v" ] && [ "$v" -gt "$hwm" ] && hwm=$v
    done
    sleep 0.2
  done
  wait "$pid" || { echo "FAILED: $name: $(tail -2 "$OUT/$name.log")" >&2; echo "0 0 0"; return; }
  /usr/bin/python3 - "$OUT/$name/summary.json" "$hwm" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
per = d.get("per_worker") or []
b = [w["comm_seconds"] / w["train_seconds"] for w in per if w.get("train_seconds")]
print(f'{d["samples_per_second"]:.1f} {sum(b) / len(b) if b else 0:.3f} {int(sys.argv[2]) / 1024:.0f}')
PY
}

# median NAME ARGS... -> "samples/s bubble rss" of the run with the median samples/s
median() {
  local name=$1
  shift
  for i in $(seq "$REPS"); do run "$name$i" "$@"; done | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'
}

if want speed; then
echo "== deep MLP, batch 256, $STEPS steps, median of $REPS (machine shared by six helpers)"
one=$(median one)
echo "1 process:              $one  (samples/s, -, peak RSS MiB)"
p2=$(median p2 --workers 2 --set dist.pipeline_stages=2 --set dist.schedule=1f1b --set dist.micro_batches=8)
echo "2 stages 1f1b m=8:      $p2  (samples/s, bubble, peak RSS MiB per rank)"
awk -v a="${one%% *}" -v b="${p2%% *}" 'BEGIN {printf "speed-up: %.2fx (target >= 1.7x)\n", b / a}'
p2w=$(DTRAIN_PIPE_WGRAD=0 median p2w --workers 2 --set dist.pipeline_stages=2 --set dist.schedule=1f1b --set dist.micro_batches=8)
echo "same, weight gradients per micro-batch (DTRAIN_PIPE_WGRAD=0): $p2w"
awk -v a="${p2w%% *}" -v b="${p2%% *}" 'BEGIN {printf "deferred / per-micro-batch weight gradients: %.2fx\n", b / a}'

fi

if want bubble; then
echo "== bubble, 2 stages 1f1b: measured vs (p-1)/(m+p-1)"
for m in 2 4 8 16; do
  r=$(median "b$m" --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=$m)
  awk -v m=$m -v r="$r" 'BEGIN {split(r, f, " "); printf "m=%-3d samples/s %8.1f  bubble %.3f  ideal %.3f\n", m, f[1], f[2], 1 / (m + 1)}'
done

fi

if want torch; then
echo "== PyTorch 1.13 Pipe, 2 stages on CPU, m=8, back to back"
t=$(/usr/bin/python3 bench/pipeline_vs_torch.py 8 "$((STEPS / 3 + 2))" 2>/dev/null | awk '/torch_pipe/ {print $3}')
p2b=$(median p2b --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=8)
echo "torch Pipe ($(/usr/bin/python3 -c 'import os; print(os.cpu_count())') intra-op threads in one process): $t samples/s; dtrain: ${p2b%% *} samples/s"
awk -v a="$t" -v b="${p2b%% *}" 'BEGIN {if (a > 0) printf "dtrain / Pipe: %.2fx (target >= 3x)\n", b / a}'

fi

# The accuracy bars (issue 14: deep MLP >= 0.890, deep CNN >= 0.920, with the
# pipeline): the example configs as they are (8 epochs, SGD momentum 0.9,
# cosine), 2 stages 1f1b. About 10 + 20 minutes on a quiet machine, so only
# with DT_BENCH_ONLY=accuracy (never in `all`). Measured 2026-11-23 under
# load: MLP 0.8942 after epoch 7, 0.8951 after 8; CNN 0.9206 after epoch 5,
# 0.9356 after 8 (bench/RESULTS.md).
if [ "$ONLY" = accuracy ]; then
for cfg in examples/fashion_deep_mlp.ini examples/fashion_deep_cnn.ini; do
  echo "== $cfg, 2 stages, 1f1b (test accuracy per epoch)"
  "$DT" train "$cfg" --workers 2 --set dist.pipeline_stages=2 --out "$OUT/acc" 2>&1 | grep -E '^epoch'
  rm -rf "$OUT/acc"
done
fi

if want rss; then
echo "== peak RSS per rank (MiB): minus a baseline run (same data, a 10-output linear model)"
# The data set (Fashion-MNIST as floats, about 220 MiB) is in every rank;
# the baseline takes it out so what is left is the model's memory.
rss() { local r; r=$(run "$@"); echo "${r##* }"; }
base1=$(rss base1 --set "model.layers=flatten linear(10)")
base2=$(rss base2 --set "model.layers=flatten linear(10)" --workers 2)
echo "baseline: 1 process $base1 MiB, 2 workers $base2 MiB per rank"
show() { # LABEL BASE NAME ARGS...
  local label=$1 b=$2 name=$3
  shift 3
  local r
  r=$(run "$name" "$@")
  awk -v l="$label" -v r="$r" -v b="$b" 'BEGIN {split(r, f, " "); printf "%-34s %6.0f MiB above baseline (samples/s %.1f)\n", l, f[3] - b, f[1]}'
}
show "1 process (params+grads+momentum)" "$base1" m1
show "2 stages 1f1b m=16" "$base2" m2 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=1f1b
show "2 stages gpipe m=16" "$base2" m3 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=gpipe
show "2 stages gpipe m=16 recompute" "$base2" m4 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=gpipe --set train.recompute=true
show "2 stages 1f1b m=16 recompute" "$base2" m5 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=1f1b --set train.recompute=true
show "ddp 2 workers" "$base2" m6 --workers 2
show "ZeRO-1 2 workers" "$base2" m7 --workers 2 --set dist.zero=1
echo "activation memory per stage as allocated (rank 0's start line):"
for n in m2 m3 m4 m5; do grep -h "activation memory" "$OUT/$n.log"; done
fi


#!/usr/bin/env bash
# bench/ckpt.sh — `make bench-ckpt`: what checkpoints cost, back to back on
# this machine (docs/checkpoint.md; targets from the checkpoint issue):
#   1. training with a checkpoint every 200 steps vs none, MLP and CNN,
#      samples/s from summary.json, alternating rounds (target: MLP <= 3%
#      slower, CNN <= 1%);
#   2. write speed of a checkpoint of the ~20M-parameter wide MLP
#      (examples/fashion_wide_mlp.ini: parameters + SGD momentum, 160 MB)
#      against `dd oflag=direct` on the same file system (target >= 80%) and
#      torch.save of the same tensors + momentum with fsync (target >= 1.5x);
#   3. time from start to the end of the first resumed step of the MLP
#      (the resumed run has one step left; wall time of the whole command, an
#      upper bound; target <= 1 s);
#   4. DT_BENCH_KILLS (default 30) SIGKILLs at random moments during
#      background writes, each followed by --resume (DTRAIN_LONG=1
#      tests/ckpt/test_ckpt_resume.sh), when DT_BENCH_KILLS > 0.
# Medians of DT_BENCH_REPS rounds. The machine has 2 cores and is shared:
# the load average is printed with the results; re-run before believing a
# single number.
# Env: BUILD (default build/release), DT_BENCH_REPS (3), DT_BENCH_DIR (a
#      directory on the disk to measure, default /var/tmp), DT_BENCH_KILLS.
set -u
SRC="$(cd "$(dirname "$0")/.." && pwd)"
cd "$SRC" || exit 1
BUILD="${BUILD:-build/release}"
REPS="${DT_BENCH_REPS:-3}"
KILLS="${DT_BENCH_KILLS:-30}"
DT="$BUILD/dtrain"
PY=/usr/bin/python3
OUT=$(mktemp -d "${DT_BENCH_DIR:-/var/tmp}/dt_bench_ckpt.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
if [ ! -x "$DT" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build "$BUILD" -j2 --target dtrain >/dev/null \
    || { echo "dtrain did not build" >&2; exit 1; }
fi

num() { grep -Eo "\"$2\":[[:space:]]*-?[0-9.eE+-]+" "$1" | head -1 | sed -E 's/.*:[[:space:]]*//'; }
median() { sort -g | awk '{a[NR]=$1} END{if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }

echo "# bench/ckpt.sh $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), dir $OUT"

# ---- 1. cost of checkpointing every 200 steps -------------------------------------
overhead() { # NAME CONFIG ARGS...
  local name=$1 cfg=$2
  shift 2
  local off on r ratios=""
  : >"$OUT/$name.off"
  : >"$OUT/$name.on"
  : >"$OUT/$name.cost"
  for r in $(seq 1 "$REPS"); do
    "$DT" train "$cfg" "$@" --set ckpt.epoch_end=false --out "$OUT/${name}_off$r" >/dev/null 2>&1 || echo "run failed" >&2
    "$DT" train "$cfg" "$@" --set ckpt.epoch_end=false --set ckpt.every_steps=200 --out "$OUT/${name}_on$r" >/dev/null 2>&1 || echo "run failed" >&2
    off=$(num "$OUT/${name}_off$r/summary.json" samples_per_second)
    on=$(num "$OUT/${name}_on$r/summary.json" samples_per_second)
    echo "$off" >>"$OUT/$name.off"
    echo "$on" >>"$OUT/$name.on"
    ratios="$ratios $(awk -v a="$on" -v b="$off" 'BEGIN{print a/b}')"
    local f="$OUT/${name}_on$r/summary.json"
    # the training thread's own cost: snapshots + waits for the writer, over its training time
    awk -v a="$(num "$f" snapshot_seconds)" -v b="$(num "$f" wait_seconds)" -v t="$(num "$f" train_seconds)" \
      'BEGIN{print (a + b) / t}' >>"$OUT/$name.cost"
    echo "  $name round $r: none $off, every 200 steps $on samples/s ($(num "$f" written) checkpoints, snapshot $(num "$f" snapshot_seconds) s, waited $(num "$f" wait_seconds) s of $(num "$f" train_seconds) s training)"
    rm -rf "$OUT/${name}_off$r" "$OUT/${name}_on$r"
  done
  local moff mon mr
  moff=$(median <"$OUT/$name.off")
  mon=$(median <"$OUT/$name.on")
  mr=$(echo "$ratios" | tr ' ' '\n' | grep . | median)
  echo "$name: none $moff samples/s, every 200 steps $mon samples/s (medians); paired median on/off $mr -> $(awk -v r="$mr" 'BEGIN{printf "%.1f%%", (1-r)*100}') slower"
  echo "$name: training-thread time in checkpoints (snapshot copies + waits) / training time: median $(median <"$OUT/$name.cost" | awk '{printf "%.3f%%", $1 * 100}')"
}
echo "## 1. checkpoint every 200 steps vs none (1 epoch; samples/s)"
overhead MLP examples/fashion_mlp.ini --set train.epochs=1
overhead CNN examples/fashion_cnn.ini --set train.epochs=1 --set data.limit_train=32000

# ---- 2. write speed of the wide MLP ------------------------------------------------
echo "## 2. write speed: wide MLP (examples/fashion_wide_mlp.ini) vs dd oflag=direct and torch.save"
"$DT" train examples/fashion_wide_mlp.ini --set train.epochs=1 --set data.limit_train=$((64 * 4 * REPS)) \
  --set data.limit_test=64 --set ckpt.every_steps=4 --set ckpt.keep=2 --out "$OUT/wide" >/dev/null 2>"$OUT/wide.err" \
  || { echo "wide run failed: $(cat "$OUT/wide.err")"; exit 1; }
W=$(num "$OUT/wide/summary.json" written)
WS=$(num "$OUT/wide/summary.json" write_seconds)
WB=$(num "$OUT/wide/summary.json" bytes)
SN=$(num "$OUT/wide/summary.json" snapshot_seconds)
DTR=$(awk -v b="$WB" -v s="$WS" 'BEGIN{printf "%.0f", b / s / 1e6}')
echo "dtrain: $W checkpoints of $(awk -v b="$WB" -v n="$W" 'BEGIN{printf "%.1f", b / n / 1e6}') MB in $WS s of writing: $DTR MB/s (hashed, fsynced, renamed; training-thread copies $SN s in all)"
: >"$OUT/dd"
for r in $(seq 1 "$REPS"); do
  dd if=/dev/zero of="$OUT/dd.tmp" bs=4M count=40 oflag=direct 2>&1 | tail -1 |
    awk '{for (i = 1; i <= NF; i++) if ($i == "s,") t = $(i-1); print 167772160 / t / 1e6}' >>"$OUT/dd"
  rm -f "$OUT/dd.tmp"
done
DD=$(median <"$OUT/dd")
echo "dd if=/dev/zero bs=4M count=40 oflag=direct: $(tr '\n' ' ' <"$OUT/dd")MB/s, median $DD MB/s"
echo "dtrain / dd: $(awk -v a="$DTR" -v b="$DD" 'BEGIN{printf "%.2f", a / b}') (target >= 0.80)"
if "$PY" -c 'import torch' 2>/dev/null; then
  "$DT" export "$OUT/wide" --out "$OUT/wide.safetensors" >/dev/null
  : >"$OUT/ts"
  for r in $(seq 1 "$REPS"); do
    OMP_NUM_THREADS=1 "$PY" tools/torch_safetensors.py save-bench "$OUT/wide.safetensors" --moments 1 \
      --out "$OUT/torch.pt" | awk '{print $(NF-1)}' >>"$OUT/ts"
    rm -f "$OUT/torch.pt"
  done
  TS=$(median <"$OUT/ts")
  echo "torch.save (same tensors + momentum, fsync): $(tr '\n' ' ' <"$OUT/ts")MB/s, median $TS MB/s"
  echo "dtrain / torch.save: $(awk -v a="$DTR" -v b="$TS" 'BEGIN{printf "%.2f", a / b}') (target >= 1.5)"
else
  echo "torch.save: skipped (python3-torch missing)"
fi
rm -rf "$OUT/wide" "$OUT/wide.safetensors"

# ---- 2b. the writer alone, alternating with dd and torch.save ---------------------------
echo "## 2b. the writer alone (bench_ckpt_write: 160 MB snapshot, same code as the background thread) vs dd and torch.save, alternating"
cmake --build "$BUILD" -j2 --target bench_ckpt_write >/dev/null 2>&1 || echo "bench_ckpt_write did not build"
HAVE_T=0
"$PY" -c 'import torch' 2>/dev/null && HAVE_T=1
[ $HAVE_T = 1 ] && "$DT" train examples/fashion_wide_mlp.ini --set train.epochs=1 --set data.limit_train=64 \
  --set data.limit_test=64 --out "$OUT/w1" >/dev/null 2>&1 && "$DT" export "$OUT/w1" --out "$OUT/w1.safetensors" >/dev/null
: >"$OUT/bw"; : >"$OUT/bd"; : >"$OUT/bt"
for r in $(seq 1 "$REPS"); do
  rm -rf "$OUT/bwdir" # a fresh directory: the same step twice is not written again
  "$BUILD/bench_ckpt_write" "$OUT/bwdir" 20037642 1 | grep '^write' | tee -a "$OUT/bw.lines" | awk '{print $8}' >>"$OUT/bw"
  dd if=/dev/zero of="$OUT/dd.tmp" bs=4M count=40 oflag=direct 2>&1 | tail -1 |
    awk '{for (i = 1; i <= NF; i++) if ($i == "s,") t = $(i-1); print 167772160 / t / 1e6}' >>"$OUT/bd"
  rm -f "$OUT/dd.tmp"
  if [ $HAVE_T = 1 ]; then
    OMP_NUM_THREADS=1 "$PY" tools/torch_safetensors.py save-bench "$OUT/w1.safetensors" --moments 1 \
      --out "$OUT/torch.pt" | tee -a "$OUT/bt.lines" | awk '{print $(NF-1)}' >>"$OUT/bt"
    rm -f "$OUT/torch.pt"
  fi
done
sed 's/^/  dtrain /' "$OUT/bw.lines"
[ $HAVE_T = 1 ] && sed 's/^/  /' "$OUT/bt.lines"
BW=$(median <"$OUT/bw"); BD=$(median <"$OUT/bd")
echo "writer alone: median $BW MB/s; dd oflag=direct: $(tr '\n' ' ' <"$OUT/bd")MB/s, median $BD MB/s; ratio $(awk -v a="$BW" -v b="$BD" 'BEGIN{printf "%.2f", a / b}') (target >= 0.80)"
if [ $HAVE_T = 1 ]; then
  BT=$(median <"$OUT/bt")
  echo "torch.save: median $BT MB/s; dtrain / torch.save $(awk -v a="$BW" -v b="$BT" 'BEGIN{printf "%.2f", a / b}') (target >= 1.5)"
fi
rm -rf "$OUT/bwdir" "$OUT/w1" "$OUT/w1.safetensors"

# ---- 3. resume: start to the first resumed step --------------------------------------
echo "## 3. resume: the MLP resumed with one step left"
"$DT" train examples/fashion_mlp.ini --set train.epochs=1 --set data.limit_test=100 --set ckpt.every_steps=937 \
  --set ckpt.keep=0 --out "$OUT/res" >/dev/null 2>&1
: >"$OUT/rt"
for r in $(seq 1 "$REPS"); do
  t0=$(now)
  "$DT" train examples/fashion_mlp.ini --set train.epochs=1 --set data.limit_test=100 --set ckpt.epoch_end=false \
    --out "$OUT/res$r" --resume "$OUT/res/ckpt/step-00000937" >/dev/null 2>&1 || echo "resume failed" >&2
  awk -v a="$t0" -v b="$(now)" 'BEGIN{print b - a}' >>"$OUT/rt"
  rm -rf "$OUT/res$r"
done
: >"$OUT/ft"
for r in $(seq 1 "$REPS"); do # the same command without --resume, cut to one step: the fixed cost
  t0=$(now)
  "$DT" train examples/fashion_mlp.ini --set train.epochs=1 --set data.limit_test=100 --set ckpt.epoch_end=false \
    --set data.limit_train=64 --out "$OUT/one$r" >/dev/null 2>&1
  awk -v a="$t0" -v b="$(now)" 'BEGIN{print b - a}' >>"$OUT/ft"
  rm -rf "$OUT/one$r"
done
echo "resumed run, start to end (one step + a 100-sample evaluation): $(tr '\n' ' ' <"$OUT/rt")s, median $(median <"$OUT/rt") s (target <= 1 s)"
echo "for scale, a fresh one-step run of the same command (load data, build, train one step): median $(median <"$OUT/ft") s"

# ---- 4. SIGKILLs during background writes ----------------------------------------------
if [ "$KILLS" -gt 0 ] && [ -f "$BUILD/CTestTestfile.cmake" ]; then
  echo "## 4. $KILLS SIGKILLs at random moments during background writes, each resumed"
  DTRAIN_LONG=1 DTRAIN="$DT" DT_SOURCE_DIR="$SRC" DT_TEST_BIN="$BUILD" bash tests/ckpt/test_ckpt_resume.sh 2>&1 |
    grep -E 'random kills|passed|FAIL'
fi

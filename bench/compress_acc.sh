#!/usr/bin/env bash
# bench/compress_acc.sh — final test accuracy of every codec with and
# without error feedback against dense, in one table (issue 15's target:
# within 0.5 points of dense for every codec with error feedback).
#
# Every run: `dtrain train` of the MLP (or DT_CA_MODEL=cnn) with 3 workers
# forced to compress on one host (dist.compress_force = true; the codec's
# arithmetic does not depend on the transport), DT_CA_EPOCHS epochs
# (5; the CNN 3), batch 256, lr 0.1, seed DT_CA_SEED (42). A variant is a
# codec name, optionally with "+mom" (worker momentum before the codec:
# dist.compress_momentum = 0.9, optim.momentum = 0) and ":key=value,..."
# for more --set words (e.g. "powersgd:dist.compress_start_step=470").
# Each variant runs with EF, then with dist.error_feedback = false
# (DT_CA_NO_NOEF=1 skips those). Prints the table and the load average.
#
# Env: BUILD (build/release), DT_CA_VARIANTS (default "fp16 bf16 int8 qsgd
# sign sign+mom topk topk+mom powersgd"), DT_CA_EPOCHS, DT_CA_SEED,
# DT_CA_MODEL, DT_CA_WORKERS (3), DT_CA_TIMEOUT (900 s per run).
# Raw outputs in $BUILD/bench-compress-acc/.
set -u
SRC="$(cd "$(dirname "$0")/.." && pwd)"
cd "$SRC" || exit 1
BUILD="${BUILD:-build/release}"
DTRAIN="$SRC/$BUILD/dtrain"
MODEL="${DT_CA_MODEL:-mlp}"
CFG="$SRC/examples/fashion_mlp.ini"
DEF_EPOCHS=5
[ "$MODEL" = cnn ] && CFG="$SRC/examples/fashion_cnn.ini" DEF_EPOCHS=3
EPOCHS="${DT_CA_EPOCHS:-$DEF_EPOCHS}"
SEED="${DT_CA_SEED:-42}"
WORKERS="${DT_CA_WORKERS:-3}"
TMO="${DT_CA_TIMEOUT:-900}"
VARIANTS="${DT_CA_VARIANTS:-fp16 bf16 int8 qsgd sign sign+mom topk topk+mom powersgd}"
OUT="$SRC/$BUILD/bench-compress-acc"
mkdir -p "$OUT"
[ -x "$DTRAIN" ] || { echo "bench/compress_acc.sh: $DTRAIN not built" >&2; exit 1; }
load0=$(cut -d' ' -f1 /proc/loadavg)
t0=$SECONDS

# run NAME SET-WORDS...: prints the final test accuracy (or "fail")
run() {
  local name=$1
  shift
  rm -rf "$OUT/$name"
  timeout -k 5 "$TMO" "$DTRAIN" train "$CFG" --workers "$WORKERS" --out "$OUT/$name" \
    --set train.epochs="$EPOCHS" --set train.batch=256 --set optim.lr=0.1 \
    --set train.seed="$SEED" --set ckpt.epoch_end=false "$@" \
    >"$OUT/$name.log" 2>&1 </dev/null
  python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["test_accuracy"])' \
    "$OUT/$name/summary.json" 2>/dev/null || echo fail
}

dense=$(run dense)
printf 'model %s, %s epochs, %s workers on one host (forced), seed %s\n' "$MODEL" "$EPOCHS" "$WORKERS" "$SEED"
printf '%-44s %8s %8s %9s %9s\n' variant EF noEF 'EF-dense' 'noEF-dense'
printf '%-44s %8s\n' dense "$dense"
for v in $VARIANTS; do
  codec=${v%%:*}
  extra=()
  case "$v" in *:*) IFS=, read -r -a kv <<<"${v#*:}"; for x in "${kv[@]}"; do extra+=(--set "$x"); done ;; esac
  case "$codec" in
  *+mom) codec=${codec%+mom}; extra+=(--set dist.compress_momentum=0.9 --set optim.momentum=0) ;;
  esac
  name=$(printf '%s' "$v" | tr ':,=+/' '_____')
  ef=$(run "$name.ef" --set dist.compress="$codec" --set dist.compress_force=true "${extra[@]}")
  noef=-
  [ "${DT_CA_NO_NOEF:-0}" = 1 ] ||
    noef=$(run "$name.noef" --set dist.compress="$codec" --set dist.compress_force=true \
      --set dist.error_feedback=false "${extra[@]}")
  d1=$(python3 -c 'import sys
try: print("%+.2f" % (100 * (float(sys.argv[1]) - float(sys.argv[3]))))
except ValueError: print("-")' "$ef" "$noef" "$dense")
  d2=$(python3 -c 'import sys
try: print("%+.2f" % (100 * (float(sys.argv[2]) - float(sys.argv[3]))))
except ValueError: print("-")' "$ef" "$noef" "$dense")
  printf '%-44s %8s %8s %9s %9s\n' "$v" "$ef" "$noef" "$d1" "$d2"
done
printf 'points against dense; target: EF within -0.50. load %s at start, %s at end; %d s\n' \
  "$load0" "$(cut -d' ' -f1 /proc/loadavg)" $((SECONDS - t0))

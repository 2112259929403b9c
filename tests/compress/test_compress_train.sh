#!/usr/bin/env bash
# test_compress_train.sh — compressed gradients in real training runs
# (docs/compress.md), a short MLP run each:
#  1. every codec over shm (forced: one host) with 3 workers and over tcp
#     with 2 workers (and 5 for topk): the run succeeds and learns (test
#     accuracy well above chance);
#  2. run-to-run reproducibility for a fixed worker count: two topk runs and
#     two int8 runs (stochastic rounding) end with the same parameter hash;
#  3. on one host without dist.compress_force the tuning rule leaves
#     compression off: the parameters equal an uncompressed run's;
#  4. deterministic mode refuses every codec with a message naming both
#     keys; bad values of the new keys exit 2 naming the key;
#  5. under mpirun (dist.transport = mpi), topk and powersgd with 2 ranks.
# Every process is bounded by a deadline and stopped by pid.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
SHORT=(--set train.epochs=1 --set data.limit_train=1600 --set data.limit_test=500)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

above() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a != "" && a + 0 > b + 0)}'; }

# train NAME WORKERS TRANSPORT CODEC [extra --set ...]
train() {
  local name=$1 w=$2 tr=$3 codec=$4
  shift 4
  # compress_start_step=0: compressed from the first step (the default keeps
  # powersgd and sign dense for the first epoch, all of these short runs)
  run_bounded 120 "$DTRAIN" train "$CFG" --workers "$w" "${SHORT[@]}" --set dist.transport="$tr" \
    --set dist.compress="$codec" --set dist.compress_start_step=0 "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" </dev/null
}

# ---- 1 -------------------------------------------------------------------------
for codec in fp16 bf16 int8 qsgd sign topk powersgd; do
  for case in "3 shm" "2 tcp"; do
    set -- $case
    name="${codec}_$2_$1"
    if ! train "$name" "$1" "$2" "$codec" --set dist.compress_force=true; then
      fail "$name: exit $?: $(tail -3 "$T/$name.err")"
      continue
    fi
    acc=$(json_num "$T/$name/summary.json" test_accuracy)
    above "$acc" 0.4 && pass || fail "$name: test accuracy $acc (chance is 0.1)"
  done
done
train topk_tcp_5 5 tcp topk --set dist.compress_force=true --set dist.compress_warmup_epochs=1 &&
  pass || fail "topk_tcp_5: $(tail -3 "$T/topk_tcp_5.err")"

# ---- 2 -------------------------------------------------------------------------
for codec in topk int8; do
  train "${codec}_again" 2 tcp "$codec" --set dist.compress_force=true ||
    fail "${codec}_again: $(tail -3 "$T/${codec}_again.err")"
  a=$(json_str "$T/${codec}_tcp_2/summary.json" params_sha256)
  b=$(json_str "$T/${codec}_again/summary.json" params_sha256)
  [ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "$codec: two runs differ ($a vs $b)"
done

# ---- 3 -------------------------------------------------------------------------
train plain 2 shm none || fail "plain: $(tail -3 "$T/plain.err")"
train auto_off 2 shm topk || fail "auto_off: $(tail -3 "$T/auto_off.err")"
a=$(json_str "$T/plain/summary.json" params_sha256)
b=$(json_str "$T/auto_off/summary.json" params_sha256)
[ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "one host, topk not forced: parameters differ from an uncompressed run"
grep -q "dist.compress = topk left off" "$T/auto_off.out" "$T/auto_off.err" && pass ||
  fail "one host: no message that compression was left off"

# ---- 4 -------------------------------------------------------------------------
for codec in fp16 topk powersgd; do
  expect_bad "det_$codec" "dist.compress = $codec with dist.deterministic = true" \
    train "$CFG" --workers 2 "${SHORT[@]}" --set dist.deterministic=true --set dist.compress=$codec
done
expect_bad bad_codec "dist.compress" train "$CFG" --set dist.compress=zip
expect_bad bad_ratio "compress_ratio" train "$CFG" --set dist.compress_ratio=0
expect_bad bad_levels "qsgd_levels" train "$CFG" --set dist.qsgd_levels=128
expect_bad bad_mom "compress_momentum" train "$CFG" --workers 2 "${SHORT[@]}" \
  --set dist.compress=topk --set dist.compress_force=true --set dist.compress_momentum=0.9

# ---- 5 -------------------------------------------------------------------------
if ! command -v mpirun >/dev/null 2>&1; then
  skip_part "mpirun" "mpirun not found (apt-get install openmpi-bin)"
else
  for codec in topk powersgd; do
    rdir="$T/rdzv_$codec"
    mkdir -p "$rdir"
    run_bounded 120 env DTRAIN_RDZV_DIR="$rdir" mpirun --allow-run-as-root --oversubscribe \
      -x DTRAIN_RDZV_DIR -n 2 "$DTRAIN" train "$CFG" --set dist.transport=mpi "${SHORT[@]}" \
      --set dist.compress=$codec --set dist.compress_force=true --set dist.compress_start_step=0 \
      --out "$T/mpi_$codec" \
      >"$T/mpi_$codec.out" 2>"$T/mpi_$codec.err" </dev/null
    rc=$?
    if grep -q "transport 'mpi' unknown or not built" "$T/mpi_$codec.err"; then
      skip_part "mpirun" "dtrain was built without MPI"
      break
    fi
    [ $rc = 0 ] && pass || { fail "mpirun $codec: exit $rc: $(tail -3 "$T/mpi_$codec.err")"; continue; }
    acc=$(json_num "$T/mpi_$codec/summary.json" test_accuracy)
    above "$acc" 0.4 && pass || fail "mpirun $codec: test accuracy $acc"
  done
fi
finish

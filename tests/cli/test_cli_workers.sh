#!/usr/bin/env bash
# test_cli_workers.sh — `dtrain train --workers 2` and `--workers 3` against
# one worker on the same data (the MLP, 3000 Fashion-MNIST images, 1 epoch,
# global batch 64): the same number of steps, the same test accuracy (to
# rounding: float sums are split differently), one summary.json written by
# rank 0 with workers, per-worker numbers and non-zero traffic over shm,
# nothing on stderr (but the one-line warning when the workers outnumber
# the online cores), and no worker left behind.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

run() {
  local n=$1
  "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers "$n" --set train.epochs=1 \
    --set data.limit_train=3000 --set data.limit_test=1000 --out "$T/w$n" \
    >"$T/out$n" 2>"$T/err$n" </dev/null
}

run 1 && pass || fail "1 worker: exit $?: $(cat "$T/err1")"
acc1=$(json_num "$T/w1/summary.json" test_accuracy)
for n in 2 3; do
  run "$n"
  rc=$?
  [ $rc -eq 0 ] && pass || { fail "$n workers: exit $rc: $(cat "$T/err$n")"; continue; }
  if [ "$n" -gt "$(nproc)" ]; then
    [ "$(wc -l <"$T/err$n")" = 1 ] &&
      grep -q "^dtrain: warning: $n workers on $(nproc) online cores" "$T/err$n" && pass ||
      fail "$n workers on $(nproc) cores: stderr: $(cat "$T/err$n")"
  else
    [ ! -s "$T/err$n" ] && pass || fail "$n workers: stderr: $(cat "$T/err$n")"
  fi
  S="$T/w$n/summary.json"
  [ "$(json_num "$S" workers)" = "$n" ] && pass || fail "$n workers: summary workers"
  [ "$(json_num "$S" steps)" = 47 ] && pass || fail "$n workers: steps $(json_num "$S" steps), want ceil(3000/64)=47"
  [ "$(json_num "$S" train_samples)" = 3000 ] && pass || fail "$n workers: train_samples"
  acc=$(json_num "$S" test_accuracy)
  awk -v a="$acc" -v b="$acc1" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(d <= 0.002 && a > 0.6)}' && pass ||
    fail "$n workers: test_accuracy $acc vs 1 worker $acc1"
  [ "$(grep -c '"rank":' "$S")" = "$n" ] && pass || fail "$n workers: per_worker entries"
  for k in bytes_sent bytes_received comm_seconds compute_seconds comm_hidden_fraction; do
    v=$(json_num "$S" $k)
    [ -n "$v" ] && pass || fail "$n workers: summary lacks $k"
  done
  awk -v s="$(json_num "$S" bytes_sent)" 'BEGIN{exit !(s > 3000000)}' && pass || fail "$n workers: bytes_sent $(json_num "$S" bytes_sent)"
  awk -v h="$(json_num "$S" comm_hidden_fraction)" -v c="$(json_num "$S" compute_seconds)" \
    -v m="$(json_num "$S" comm_seconds)" 'BEGIN{exit !(h >= 0 && h <= 1 && c > 0 && m > 0)}' && pass ||
    fail "$n workers: comm_hidden_fraction/compute_seconds/comm_seconds out of range"
  [ "$(json_str "$S" transport)" = shm ] && pass || fail "$n workers: transport $(json_str "$S" transport)"
  [ "$(wc -l <"$T/w$n/events.jsonl")" -eq 1 ] && pass || fail "$n workers: events.jsonl lines"
  [ "$(grep -c '^test accuracy' "$T/out$n")" = 1 ] && pass || fail "$n workers: final line count"
  # every worker is gone
  for p in $(grep -m1 '^workers:' "$T/out$n" | grep -oE 'pid [0-9]+' | cut -d' ' -f2); do
    kill -0 "$p" 2>/dev/null && { fail "$n workers: worker $p still running"; kill -9 "$p"; } || pass
  done
done
finish

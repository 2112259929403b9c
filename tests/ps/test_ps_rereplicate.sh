#!/usr/bin/env bash
# test_ps_rereplicate.sh — re-replication of replicated shards (docs/ps.md
# "Replicated shards"): 2 workers, 3 separate servers, ps.replicas = 2, so
# each key range has a primary, a backup and one server outside it:
#  - server 0 SIGKILLed mid-run: its ranges (0's, and 2's, whose backup it
#    was) get a new copy on the free server (server 2 takes range 0 from
#    server 1, server 1 range 2 from server 2), both say so; then server 1
#    (range 0's new primary, the former backup) is SIGKILLed too: the job
#    goes on with server 2 alone, says each range now runs on one copy, and
#    bsp ends with the same params_sha256 as the run without kills (no
#    acknowledged update lost or applied twice across both losses);
#  - servers 0 and 1 killed at once (range 0's holders, before any copy):
#    the job ends with a non-zero status within 30 s naming the lost range;
#  - 2 servers (no free one): a loss leaves the ranges on one copy, said in
#    one line per range (checked in test_ps_failover.sh).
# Every process this test starts is killed and reaped by pid on exit.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -e "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }

MLP="$SRC/examples/fashion_mlp.ini"
# 20 epochs of 20 steps, 3 servers holding 2 copies of every range
Q="--set train.epochs=20 --set data.limit_train=1280 --set data.limit_test=200 --workers 2 --servers 3 --set ps.replicas=2"
sha() { json_str "$T/$1/summary.json" params_sha256; }

. "$(dirname "$0")/kill_lib.sh"

# the reference: no kills
run_bounded 50 "$DTRAIN" train "$MLP" $Q --out "$T/ref" >"$T/ref.out" 2>"$T/ref.err" </dev/null
[ -s "$T/ref/summary.json" ] && pass || fail "ref: exit $?: $(head -c 400 "$T/ref.err")"
ref=$(sha ref)

# server 0 killed; once both new copies are in, server 1 too
if start rr; then
  tk=$(now)
  kill -9 "$(pid_of rr 2)"
  t0=$(now)
  while [ "$(grep -c 'holds its copy of keys' "$T/rr.err")" -lt 2 ] && kill -0 "$parent" 2>/dev/null &&
    elapsed_ok "$t0" "$(now)" 20; do sleep 0.02; done
  if [ "$(grep -c 'holds its copy of keys' "$T/rr.err")" = 2 ]; then
    pass
    echo "server 0 SIGKILL -> both new copies in: $(awk -v a="$tk" -v b="$(now)" 'BEGIN{printf "%.3f", b - a}') s (polled)"
    grep -h 'holds its copy' "$T/rr.err" | sed 's/.*dtrain warn: //'
    kill -9 "$(pid_of rr 3)"
  else
    fail "rr: no two 'holds its copy' lines within 20 s of the kill: $(grep -v 'warning: 5' "$T/rr.err" | tail -5)"
  fi
  wait_end rr 50
  if [ $rc = 124 ]; then
    fail "rr: still running 50 s after the kills: $(tail -3 "$T/rr.err")"
  else
    [ $rc = 0 ] && pass || fail "rr: exit $rc: $(grep -v 'go on' "$T/rr.err" | tail -c 600)"
    [ -n "$ref" ] && [ "$(sha rr)" = "$ref" ] && pass ||
      fail "rr: params_sha256 $(sha rr), not the run without kills' $ref"
    grep -q "ps server 2: holds its copy of keys 0-0 (server 0's range) from clock [0-9]* on, from server 1" "$T/rr.err" &&
      pass || fail "rr: server 2 did not take range 0 from server 1: $(grep 'copy' "$T/rr.err" | head -5)"
    grep -q "ps server 1: holds its copy of keys 2-4 (server 2's range) from clock [0-9]* on, from server 2" "$T/rr.err" &&
      pass || fail "rr: server 1 did not take range 2 from server 2"
    n=$(grep -c "ps worker [01]: keys 0-0 (server 0's range) get a new copy on server 2" "$T/rr.err")
    [ "$n" = 2 ] && pass || fail "rr: $n workers said range 0 gets a new copy on server 2"
    n=$(grep -c "ps worker [01]: server 1 (rank 3) lost at clock" "$T/rr.err")
    [ "$n" = 2 ] && pass || fail "rr: $n workers said they lost server 1"
    n=$(grep -c "ps worker [01]: keys 0-0 (server 0's range) now run on 1 copy: no free server" "$T/rr.err")
    [ "$n" = 2 ] && pass || fail "rr: $n workers said range 0 runs on one copy after the second loss"
  fi
  no_procs rr 5
fi

# both holders of range 0 killed before a copy was made: the job ends
if start both; then
  kill -9 "$(pid_of both 2)" "$(pid_of both 3)"
  wait_end both 30
  if [ $rc = 124 ]; then
    fail "both: still running 30 s after the kills"
  else
    [ $rc -ne 0 ] && pass || fail "both: exit 0"
    grep -Eq "every server holding (key 0|that range)" "$T/both.err" && pass ||
      fail "both: no message naming the lost range: $(grep -v 'go on' "$T/both.err" | tail -c 600)"
    [ ! -e "$T/both/summary.json" ] && pass || fail "both: summary.json written"
  fi
  no_procs both 5
fi
finish

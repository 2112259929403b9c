#!/usr/bin/env bash
# test_cli_bench.sh — `dtrain bench allreduce`: short runs over shm and tcp
# with 2 and 3 ranks print a table whose every row was verified (#wrong 0);
# bad arguments (negative or oversized byte counts too) exit 2 with one line. Each run is bounded by `timeout`.
set -u
D=${DTRAIN:?}
fail=0
check_run() { # args...
  out=$(timeout 120 "$D" bench allreduce "$@" 2>&1); rc=$?
  rows=$(grep -cE '^ +[0-9]+ ' <<<"$out")
  wrong=$(awk '/^ +[0-9]+ /{ if ($NF != 0) n++ } END { print n+0 }' <<<"$out")
  if [ $rc -ne 0 ] || [ "$rows" -lt 3 ] || [ "$wrong" -ne 0 ]; then
    echo "FAIL: bench allreduce $*: rc=$rc rows=$rows wrong=$wrong"; echo "$out"; fail=1
  else
    echo "ok: bench allreduce $* ($rows sizes)"
  fi
}
check_run --workers 2 --transport shm --min 4 --max 256K
check_run --workers 3 --transport tcp --min 4 --max 64K --algo ring
check_run --workers 3 --transport shm --min 1K --max 64K --algo rhd --dtype i32 --op max
check_run --workers 1 --min 8 --max 1K

bad() { # expected-substring args...
  want=$1; shift
  err=$("$D" bench "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "$want" <<<"$err" || [ "$(wc -l <<<"$err")" -ne 1 ]; then
    echo "FAIL: bench $*: rc=$rc err=$err"; fail=1
  else
    echo "ok: bench $* -> $err"
  fi
}
bad "unknown benchmark" nosuch
bad "--workers: bad value" allreduce --workers 0
bad "--transport: bad value" allreduce --transport carrier-pigeon
bad "--algo: bad value" allreduce --algo fastest
bad "--min: bad value" allreduce --min 12Q
bad "need --min <= --max" allreduce --min 1M --max 1K
# a negative size is refused, not read as 2^64-5
bad "--max: bad value '-5': expects a byte count of 0 or more" allreduce --max -5
bad "--min: bad value '-1K'" allreduce --min -1K
bad "--max: bad value '5G'" allreduce --max 5G
bad "unknown option" allreduce --frobnicate 1
exit $fail

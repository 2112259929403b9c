#!/usr/bin/env bash
# test_elastic_etcd.sh — elastic membership kept in a real etcd
# (docs/elastic.md "etcd"): starts etcd on loopback (random free ports, its
# own data directory), runs `dtrain launch --rdzv-backend etcd` with 3
# workers and dist.min_workers = 2, SIGKILLs one at step 20: the job must
# finish with status 0 and 2 workers, the visit record exact, the job's
# keys gone from etcd afterwards, and etcd's revision moved (the job
# really talked to it). etcd is stopped by pid. Exits 77 with a reason
# when etcd or curl is not installed or etcd does not start
# (test_elastic_etcd_restart.sh: etcd restarted, leases).
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/etcd_lib.sh"
rev() { rng '{"key":"AA=="}' | grep -o '"revision":"[0-9]*"' | head -1 | tr -dc 0-9; }
r0=$(rev)

N=3200
mkdir -p "$T/shrink/v"
DTRAIN_TEST_VISITS="$T/shrink/v" DTRAIN_TEST_KILL=1:20:forward timeout -k 5 150 \
  "$DTRAIN" launch --rdzv-backend etcd --rdzv "127.0.0.1:$C" --nproc-per-node 3 -- train \
  "$SRC/examples/fashion_mlp.ini" --set train.epochs=2 --set data.limit_train=$N \
  --set data.limit_test=500 --set dist.min_workers=2 --out "$T/shrink/out" \
  >"$T/shrink/log" 2>&1 </dev/null
RC=$?
s="$T/shrink/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 2 ]; then
  fail "etcd shrink: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/shrink/log" | tail -3)"
elif ! grep -q "generation 1" "$T/shrink/log"; then fail "etcd shrink: no generation 1"
elif ! $CHECK "$T/shrink/v" $N 2 >"$T/visits" 2>&1; then fail "etcd shrink: visit record: $(cat "$T/visits")"
else pass; fi
r1=$(rev)
if [ -z "$r1" ] || [ -z "$r0" ] || [ $((r1 - r0)) -lt 10 ]; then fail "etcd revision $r0 -> $r1: the job did not use etcd"; else pass; fi
# every key from "/dtrain" to "/dtrain0" ('/' + 1), counted
left=$(rng "{\"key\":\"$(printf /dtrain | base64)\",\"range_end\":\"$(printf /dtrain0 | base64)\",\"count_only\":true}" |
  grep -o '"count":"[0-9]*"' | tr -dc 0-9)
left=${left:-0}
[ "$left" = 0 ] && pass || fail "etcd: $left keys of the job left under /dtrain"

# a bad backend name is refused up front
expect_bad bad_backend "rdzv-backend 'zk'" launch --rdzv-backend zk -- train "$SRC/examples/fashion_mlp.ini"

stop_etcd
kill -0 "$E" 2>/dev/null && fail "etcd (pid $E) still running"
for p in $(grep -ho 'pid [0-9]*' "$T"/*/log | awk '{print $2}' | sort -u); do
  if ls /dev/shm 2>/dev/null | grep -q -- "-$p-"; then fail "shared memory of pid $p left in /dev/shm"; fi
  if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then fail "worker $p still running"; fi
done
finish

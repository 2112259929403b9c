#!/usr/bin/env bash
# test_elastic_etcd.sh — elastic membership kept in a real etcd
# (docs/elastic.md "etcd"): starts etcd on loopback (random free ports, its
# own data directory), runs `dtrain launch --rdzv-backend etcd` with 3
# workers and dist.min_workers = 2, SIGKILLs one at step 20: the job must
# finish with status 0 and 2 workers, the visit record exact, the job's
# keys gone from etcd afterwards, and etcd's revision moved (the job
# really talked to it). Then etcd restarted mid-run: SIGKILLed once the
# first epoch is recorded and started again on its data directory; once it
# answers, a worker is SIGKILLed from outside: the job must survive both
# (status 0, 2 workers, visits exact). Then the leases: a worker frozen by
# SIGSTOP is found by its etcd lease's expiry ("lease expired" in the log)
# and the others go on; after SIGCONT it finds itself left out and leaves.
# etcd is stopped by pid. Exits 77 with a reason when etcd is not installed
# or does not start.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CHECK="python3 $SRC/tests/elastic/check_visits.py"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (Debian: etcd-server)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed (the test talks to etcd with it)"; exit 77; }

C=$(free_port 127.0.0.1)
PP=$(free_port 127.0.0.1)
start_etcd() {
  etcd --name dt --data-dir "$T/etcd" --listen-client-urls "http://127.0.0.1:$C" \
    --advertise-client-urls "http://127.0.0.1:$C" --listen-peer-urls "http://127.0.0.1:$PP" \
    --initial-advertise-peer-urls "http://127.0.0.1:$PP" --initial-cluster "dt=http://127.0.0.1:$PP" \
    >>"$T/etcd.log" 2>&1 </dev/null &
  E=$!
}
start_etcd
stop_etcd() { kill "$E" 2>/dev/null; wait "$E" 2>/dev/null; }
trap 'stop_etcd; kill_pids; rm -rf "$T"' EXIT
# v3 JSON gateway: rng BODY — a range request's reply
rng() { curl -sf -m 10 -X POST "http://127.0.0.1:$C/v3/kv/range" -d "$1"; }
up=0
for _ in $(seq 1 200); do
  rng '{"key":"AA=="}' >/dev/null 2>&1 && { up=1; break; }
  kill -0 "$E" 2>/dev/null || break
  sleep 0.05
done
[ "$up" = 1 ] || { echo "SKIP: etcd did not start: $(tail -2 "$T/etcd.log")"; exit 77; }
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

# etcd restarted mid-run, then a worker lost (at step 500 of 600, after the
# restart unless the machine is very fast): the job goes on through both
mkdir -p "$T/restart/v"
DTRAIN_TEST_VISITS="$T/restart/v" DTRAIN_TEST_KILL=1:500:forward "$DTRAIN" launch \
  --rdzv-backend etcd --rdzv "127.0.0.1:$C" \
  --nproc-per-node 3 -- train "$SRC/examples/fashion_mlp.ini" --set train.epochs=12 \
  --set data.limit_train=$N --set data.limit_test=500 --set dist.min_workers=2 \
  --out "$T/restart/out" >"$T/restart/log" 2>&1 </dev/null &
job=$!
PIDS="$PIDS $job"
for _ in $(seq 1 1200); do [ -s "$T/restart/out/events.jsonl" ] && break; sleep 0.05; done
kill -9 "$E"; wait "$E" 2>/dev/null
sleep 0.3
start_etcd
for _ in $(seq 1 200); do rng '{"key":"AA=="}' >/dev/null 2>&1 && break; sleep 0.05; done
kill -0 $job 2>/dev/null || fail "etcd restart: the job ended before etcd was back"
( sleep 120; kill -9 $job 2>/dev/null ) & guard=$!
wait $job
RC=$?
kill $guard 2>/dev/null; wait $guard 2>/dev/null
s="$T/restart/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 2 ]; then
  fail "etcd restart: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/restart/log" | tail -3)"
elif ! grep -q "generation 1" "$T/restart/log"; then fail "etcd restart: no generation 1"
elif ! $CHECK "$T/restart/v" $N 12 >"$T/visits" 2>&1; then fail "etcd restart: visit record: $(cat "$T/visits")"
else pass; fi

# leases: a frozen worker's lease expires; it is left out, and leaves after SIGCONT
mkdir -p "$T/frozen/v"
DTRAIN_TEST_VISITS="$T/frozen/v" "$DTRAIN" launch --rdzv-backend etcd --rdzv "127.0.0.1:$C" \
  --nproc-per-node 3 -- train "$SRC/examples/fashion_mlp.ini" --set train.epochs=8 \
  --set data.limit_train=$N --set data.limit_test=500 --set dist.min_workers=2 \
  --set dist.heartbeat_timeout=1 --out "$T/frozen/out" >"$T/frozen/log" 2>&1 </dev/null &
job=$!
PIDS="$PIDS $job"
for _ in $(seq 1 1200); do [ -s "$T/frozen/out/events.jsonl" ] && break; sleep 0.05; done
victim=$(grep -o 'rank 2 pid [0-9]*' "$T/frozen/log" | awk '{print $4}')
( sleep 120; kill -CONT "$victim" 2>/dev/null; kill -9 $job 2>/dev/null ) & guard=$!
[ -n "$victim" ] && kill -STOP "$victim"
for _ in $(seq 1 1200); do grep -q "going on at epoch" "$T/frozen/log" && break; sleep 0.05; done
kill -CONT "$victim" 2>/dev/null
wait $job
RC=$?
kill $guard 2>/dev/null; wait $guard 2>/dev/null
s="$T/frozen/out/summary.json"
if [ "$RC" -ne 0 ] || [ "$(json_num "$s" workers)" != 2 ]; then
  fail "etcd frozen: exit $RC, workers $(json_num "$s" workers 2>/dev/null): $(grep -v info "$T/frozen/log" | tail -3)"
elif ! grep -q "member 2's etcd lease expired" "$T/frozen/log"; then
  fail "etcd frozen: not found by its lease: $(grep -v "info\|^epoch" "$T/frozen/log" | tail -3)"
elif ! grep -Eq "member 2 is not in generation|member 2: its etcd lease expired" "$T/frozen/log"; then
  fail "etcd frozen: the evicted worker did not say it leaves: $(grep -v "info\|^epoch" "$T/frozen/log" | tail -3)"
elif ! $CHECK "$T/frozen/v" $N 8 >"$T/visits" 2>&1; then fail "etcd frozen: visit record: $(cat "$T/visits")"
else pass; fi

# a bad backend name is refused up front
expect_bad bad_backend "rdzv-backend 'zk'" launch --rdzv-backend zk -- train "$SRC/examples/fashion_mlp.ini"

stop_etcd
kill -0 "$E" 2>/dev/null && fail "etcd (pid $E) still running"
for p in $(grep -ho 'pid [0-9]*' "$T"/*/log | awk '{print $2}' | sort -u); do
  if ls /dev/shm 2>/dev/null | grep -q -- "-$p-"; then fail "shared memory of pid $p left in /dev/shm"; fi
  if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then fail "worker $p still running"; fi
done
finish

#!/usr/bin/env bash
# test_netns_tcp.sh — a tcp job across 3 emulated hosts: tools/netns.sh makes
# 3 network namespaces on a bridge with every link shaped by tc tbf to RATE
# (default 400mbit), one rank runs in each (test_netns_rank worker), rank 0
# serves the store, and the allreduce benchmark must give correct results
# at every size from 4 MB to 16 MB and reach busbw >= MIN_PCT% of the shaped
# rate. In make test MIN_PCT is 25 (DT_NETNS_MIN_PCT): a floor that catches
# a transport that stalls or serialises (stop-and-wait on a 50 MB/s link
# lands far below it) but not CPU starvation of a loaded machine, which put
# the 16 MB row at 50-68% in a CI dry run at load 19. The speed target
# itself (85%) is checked by `make bench-comm`, which runs this script with
# DT_NETNS_MIN_PCT=85 on a quiet machine — speed targets live in benchmarks.
# Wrong results or a failed rank fail at once; a run that is only too slow is
# repeated, up to 3 attempts.
#
# Skips (exit 77, which ctest reports as skipped; "SKIP: ..." on stdout) where namespaces cannot be created
# (no root / CAP_NET_ADMIN, no iproute2). Every rank it starts is stopped by
# pid (trap), and netns.sh removes the namespaces even on failure.
set -u
SRC="${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
BIN="${DT_TEST_BIN:-$SRC/build/release}"
WORKER="$BIN/test_netns_rank"
RATE="${DT_NETNS_RATE:-400mbit}"
MINB=$((4 << 20))
MAXB=$((16 << 20))
PORT=29650
MIN_PCT="${DT_NETNS_MIN_PCT:-25}"

inner() {
  read -r -a hosts <<<"$NETNS_HOSTS"
  read -r -a addrs <<<"$NETNS_ADDRS"
  out=$(mktemp)
  pids=()
  cleanup_ranks() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -f "$out"
  }
  trap cleanup_ranks EXIT
  for r in 0 1 2; do
    if [ $r = 0 ]; then
      ip netns exec "${hosts[$r]}" "$WORKER" worker $r 3 "${addrs[0]}:$PORT" "${addrs[$r]}" $MINB $MAXB >"$out" 2>&1 &
    else
      ip netns exec "${hosts[$r]}" "$WORKER" worker $r 3 "${addrs[0]}:$PORT" "${addrs[$r]}" $MINB $MAXB 2>&1 | sed "s/^/[rank $r] /" >&2 &
    fi
    pids+=($!)
  done
  # Bounded wait: 120 s for everything.
  local deadline=$((SECONDS + 120)) status=0
  for i in 0 1 2; do
    while kill -0 "${pids[$i]}" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then
        echo "FAIL: ranks still running after 120 s" >&2
        cat "$out" >&2
        return 1
      fi
      sleep 0.2
    done
    wait "${pids[$i]}" || status=1
  done
  cat "$out"
  [ $status = 0 ] || { echo "FAIL: a rank failed" >&2; return 1; }
  # Rate in GB/s (decimal, as busbw): RATE like 400mbit / 1gbit.
  local rate_gbps
  rate_gbps=$(echo "$RATE" | awk '{ v=$1+0; u=tolower($1); sub(/^[0-9.]+/, "", u);
      m = (u=="kbit")?1e3:(u=="mbit")?1e6:(u=="gbit")?1e9:1; printf "%.6f", v*m/8/1e9 }')
  awk -v rate="$rate_gbps" -v minb=$MINB -v minpct="$MIN_PCT" '
    $1 ~ /^[0-9]+$/ && $1 >= minb {
      n++; pct = 100 * $7 / rate
      printf "size %d: busbw %.4f GB/s = %.1f%% of the shaped %.4f GB/s, wrong %d\n", $1, $7, pct, rate, $8
      if ($8 != 0) wrong++; else if (pct < minpct) slow++
    }
    END { if (n == 0) { print "FAIL: no rows >= 4 MB"; exit 1 }
          if (wrong) { print "FAIL: " wrong " sizes with wrong results"; exit 1 }
          if (slow) { print "SLOW: " slow " sizes below " minpct "% of the shaped rate"; exit 3 }
          print "OK: busbw >= " minpct "% of the shaped rate at every size >= 4 MB" }' "$out"
}

if [ "${1:-}" = inner ]; then
  inner
  exit $?
fi

if [ ! -x "$WORKER" ]; then
  echo "FAIL: $WORKER not built (cmake --build ... --target test_netns_rank)" >&2
  exit 1
fi
if ! "$SRC/tools/netns.sh" check; then
  echo "SKIP: network namespaces unavailable here (see the reason above); multi-host test not run"
  exit 77
fi
export WORKER RATE MINB MAXB PORT MIN_PCT
for attempt in 1 2 3; do
  "$SRC/tools/netns.sh" run -p "dtt$$" -r "$RATE" -- bash "$0" inner
  rc=$?
  [ $rc = 3 ] || exit $rc
  echo "attempt $attempt: below $MIN_PCT% of the shaped rate"
done
echo "FAIL: below $MIN_PCT% of the shaped rate in 3 attempts"
exit 1

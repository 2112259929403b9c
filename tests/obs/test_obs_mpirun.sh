#!/usr/bin/env bash
# test_obs_mpirun.sh — issue 16 under Open MPI's mpirun, where no dtrain
# launcher runs: the first rank of each host serves every rank of its host
# on obs.metrics (one Prometheus target per node).
#  1. `mpirun -n 2 dtrain train ... --set obs.metrics=127.0.0.1:PORT`: exactly
#     one "metrics:" line (ranks 0-1); a real Prometheus (Debian's
#     `prometheus`, scraping every second) finds dtrain_steps_total for rank 0
#     and rank 1 with job = the run directory's name, and the target up.
#  2. three ranks claiming two hosts (DTRAIN_HOST_ID: ranks 0,1 on "ha",
#     rank 2 on "hb"), obs.metrics port 0: two servers, one per host — rank
#     2's shows rank 2 alone, rank 0's shows the whole job (its own ranks
#     0-1 and rank 2 fetched from host hb's server), each rank once —
#     each exposition checked by `promtool check metrics`.
# Skipped (77) without mpirun or prometheus. Every process is bounded by a
# deadline and stopped by pid; files live under $T.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/lib_obs.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (Debian package openmpi-bin)"; exit 77; }
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "SKIP: prometheus/promtool not installed (Debian package prometheus)"
  exit 77
fi
# Open MPI leaks in its dlopen'ed components; LeakSanitizer would blame dtrain.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

PIDS=""
cleanup() {
  for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
  for p in $PIDS; do wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
now() { date +%s.%N; }
elapsed_ok() { awk -v a="$1" -v b="$2" -v lim="$3" 'BEGIN{exit !(b - a <= lim)}'; }
LONG=(--set train.epochs=100000 --set data.limit_train=2000 --set data.limit_test=200)

# waits until file $1 has $2 lines starting "metrics: " (deadline 90 s) while pid $3 lives
wait_lines() {
  local t0
  t0=$(now)
  while [ "$(grep -c '^metrics: ' "$1" 2>/dev/null)" -lt "$2" ] && elapsed_ok "$t0" "$(now)" 90; do
    kill -0 "$3" 2>/dev/null || break
    sleep 0.2
  done
}

# ---- 1. one host, two ranks, a real Prometheus ---------------------------------
MP=$(free_port 127.0.0.1)
PP=$(free_port 127.0.0.1)
mkdir -p "$T/rdzv1"
DTRAIN_RDZV_DIR="$T/rdzv1" mpirun --allow-run-as-root --oversubscribe -x DTRAIN_RDZV_DIR -n 2 \
  "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" "${LONG[@]}" --set obs.metrics=127.0.0.1:$MP \
  --out "$T/mpijob" >"$T/m1.out" 2>"$T/m1.err" </dev/null &
MJ=$!
PIDS="$PIDS $MJ"
wait_lines "$T/m1.out" 1 $MJ
grep -q "^metrics: http://127.0.0.1:$MP/metrics (ranks 0-1)" "$T/m1.out" && pass ||
  { fail "no metrics line for ranks 0-1 on port $MP: $(cat "$T/m1.out" "$T/m1.err" | tail -5)"; finish; exit; }
sleep 2
[ "$(grep -c '^metrics: ' "$T/m1.out")" = 1 ] && pass || fail "$(grep -c '^metrics: ' "$T/m1.out") metrics lines, want 1 (one host: no peers)"
scrape $MP "$T/s1.txt" && pass || fail "cannot fetch /metrics"
promtool check metrics <"$T/s1.txt" >"$T/check1.out" 2>&1 && pass ||
  fail "promtool check metrics: $(cat "$T/check1.out")"

prom_start "$MP" "$PP"
q() { promtool query instant "http://127.0.0.1:$PP" "$1" 2>/dev/null; }
t0=$(now)
got=""
while elapsed_ok "$t0" "$(now)" 60; do
  got=$(q 'dtrain_steps_total > 0')
  [ "$(echo "$got" | grep -c 'rank="[01]"')" = 2 ] && break
  kill -0 $PR 2>/dev/null || break
  sleep 0.5
done
echo "$got"
[ "$(echo "$got" | grep -c 'rank="[01]"')" = 2 ] && pass ||
  fail "Prometheus has no dtrain_steps_total > 0 for ranks 0 and 1 within 60 s: $got $(tail -5 "$T/prom.log")"
echo "$got" | grep -q 'job="mpijob"' && pass || fail "job label: $got"
v=$(q 'count(dtrain_allreduce_seconds_count > 0)' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
[ "$v" = 2 ] && pass || fail "allreduce histograms with observations: $v"
v=$(q 'up{job="dtrain"}' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
[ "$v" = 1 ] && pass || fail "target not up: $v"
kill $PR 2>/dev/null
wait $PR 2>/dev/null
stop_job $MJ

# ---- 2. two hosts (claimed), three ranks: one server per host ------------------
mkdir -p "$T/rdzv2"
cat >"$T/host.sh" <<'EOF'
#!/bin/sh
# ranks 0 and 1 on host "ha", rank 2 on host "hb"
if [ "${OMPI_COMM_WORLD_RANK:-0}" = 2 ]; then DTRAIN_HOST_ID=hb; else DTRAIN_HOST_ID=ha; fi
export DTRAIN_HOST_ID
exec "$@"
EOF
chmod +x "$T/host.sh"
DTRAIN_RDZV_DIR="$T/rdzv2" mpirun --allow-run-as-root --oversubscribe -x DTRAIN_RDZV_DIR -n 3 \
  "$T/host.sh" "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" "${LONG[@]}" \
  --set obs.metrics=127.0.0.1:0 --out "$T/hosts" >"$T/m2.out" 2>"$T/m2.err" </dev/null &
MJ=$!
PIDS="$PIDS $MJ"
wait_lines "$T/m2.out" 2 $MJ
grep '^metrics: ' "$T/m2.out"
[ "$(grep -c '^metrics: http' "$T/m2.out")" = 2 ] && pass ||
  fail "$(grep -c '^metrics: http' "$T/m2.out") endpoints, want 2: $(tail -5 "$T/m2.err")"
PA=$(sed -nE 's|^metrics: http://127.0.0.1:([0-9]+)/metrics \(ranks 0-1\)$|\1|p' "$T/m2.out")
PB=$(sed -nE 's|^metrics: http://127.0.0.1:([0-9]+)/metrics \(ranks 2-2\)$|\1|p' "$T/m2.out")
[ -n "$PA" ] && [ -n "$PB" ] && pass || fail "want servers of ranks 0-1 and 2-2: $(grep '^metrics' "$T/m2.out")"
# every rank's page appears once its rank has registered its metrics
t0=$(now)
while elapsed_ok "$t0" "$(now)" 60; do
  scrape "$PA" "$T/sa.txt"
  scrape "$PB" "$T/sb.txt"
  [ "$(grep -c '^dtrain_steps_total{' "$T/sa.txt")" = 3 ] && [ "$(grep -c '^dtrain_steps_total{' "$T/sb.txt")" = 1 ] && break
  kill -0 $MJ 2>/dev/null || break
  sleep 0.5
done
grep '^dtrain_steps_total{' "$T/sa.txt" "$T/sb.txt"
grep -q "^metrics: the endpoint of ranks 0-1 also shows the ranks of 1 other host" "$T/m2.out" && pass ||
  fail "rank 0 did not say it shows the other host: $(grep '^metrics' "$T/m2.out")"
for r in 0 1 2; do
  [ "$(grep -c "^dtrain_steps_total{.*rank=\"$r\"" "$T/sa.txt")" = 1 ] && pass ||
    fail "rank 0's server (the job's): rank $r not once: $(grep steps_total "$T/sa.txt")"
done
[ "$(grep -c '^dtrain_steps_total{.*rank="2"' "$T/sb.txt")" = 1 ] && pass || fail "host hb's server: $(grep steps_total "$T/sb.txt")"
! grep -q 'rank="[01]"' "$T/sb.txt" && pass || fail "host hb's server serves ranks 0-1"
promtool check metrics <"$T/sa.txt" >"$T/check2a.out" 2>&1 && pass ||
  fail "promtool check metrics (the job's): $(cat "$T/check2a.out")"
promtool check metrics <"$T/sb.txt" >"$T/check2.out" 2>&1 && pass ||
  fail "promtool check metrics: $(cat "$T/check2.out")"
stop_job $MJ
finish

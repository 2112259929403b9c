#!/usr/bin/env bash
# test_obs_launch.sh — issue 16 under `dtrain launch`: two nodes (two
# launchers on loopback, one worker each, obs.metrics port 0 on both).
#  1. One target shows the job: the node launchers leave their endpoints in
#     the rendezvous store, and node 0's endpoint shows ranks 0 and 1 (rank
#     1's page fetched from node 1's endpoint), each once; `promtool check
#     metrics` accepts it; a real Prometheus (Debian's `prometheus`, scraping
#     node 0's endpoint alone every second) finds dtrain_steps_total > 0 for
#     both ranks.
#  2. Hang diagnosis across nodes: rank 1 (node 1's worker) is stopped
#     (SIGSTOP); rank 0 fails at its deadline (DTRAIN_TIMEOUT=10), and node
#     0's launcher prints one diagnosis naming rank 1 (read from node 1's
#     endpoint, with the process state node 1 sees) and the allreduce.
# Skipped (77) without prometheus. Every process is stopped by pid.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/lib_obs.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "SKIP: prometheus/promtool not installed (Debian package prometheus)"
  exit 77
fi
export DTRAIN_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
victim=""
cleanup() {
  [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null && kill -9 "$victim" 2>/dev/null
  kill_pids
  rm -rf "$T"
}
trap cleanup EXIT

worker_pid() { grep -m1 '^workers:' "$1" | grep -oE 'pid [0-9]+' | head -1 | cut -d' ' -f2; }

# start NAME [env...]: the two nodes; sets n0, n1
start() {
  local name=$1 port
  shift
  port=$(free_port)
  for i in 1 0; do
    env "$@" "$DTRAIN" launch --nnodes 2 --node-rank $i --nproc-per-node 1 --rdzv "127.0.0.1:$port" -- \
      train "$SRC/examples/fashion_mlp.ini" --set train.epochs=100000 --set data.limit_train=600 \
      --set data.limit_test=100 --set obs.metrics=127.0.0.1:0 --out "$T/$name" \
      >"$T/$name$i.out" 2>"$T/$name$i.err" </dev/null &
    eval "n$i=$!"
    PIDS="$PIDS $!"
  done
  local t0 ok=0
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 90; do
    if grep -q '^metrics: the endpoint of ranks 0-0 also shows the ranks of 1 other node' "$T/${name}0.out" &&
      grep -q '^workers:' "$T/${name}1.out" && [ -s "$T/$name/events.jsonl" ]; then ok=1; break; fi
    kill -0 "$n0" 2>/dev/null && kill -0 "$n1" 2>/dev/null || break
    sleep 0.1
  done
  [ $ok = 1 ] || { fail "$name: no epoch, or node 0 did not say it shows node 1, within 90 s: $(cat "$T/$name"?.out "$T/$name"?.err | tail -8)"; return 1; }
  PIDS="$PIDS $(worker_pid "$T/${name}0.out") $(worker_pid "$T/${name}1.out")"
}
stop_nodes() {
  kill -TERM "$n0" "$n1" 2>/dev/null
  local t=0
  while { kill -0 "$n0" 2>/dev/null || kill -0 "$n1" 2>/dev/null; } && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
  kill -9 "$n0" "$n1" 2>/dev/null
  wait "$n0" "$n1" 2>/dev/null
}

# ---- 1. node 0's endpoint shows both nodes; a real Prometheus ---------------------
if start job; then
  pass
  P0=$(sed -nE 's|^metrics: http://127.0.0.1:([0-9]+)/metrics \(ranks 0-0\)$|\1|p' "$T/job0.out")
  P1=$(sed -nE 's|^metrics: http://127.0.0.1:([0-9]+)/metrics \(ranks 1-1\)$|\1|p' "$T/job1.out")
  [ -n "$P0" ] && [ -n "$P1" ] && pass || fail "endpoints: $(grep -h '^metrics' "$T"/job?.out)"
  t0=$(now)
  while elapsed_ok "$t0" "$(now)" 60; do
    scrape "$P0" "$T/s0.txt"
    [ "$(grep -c '^dtrain_steps_total{' "$T/s0.txt")" = 2 ] && break
    sleep 0.5
  done
  grep '^dtrain_steps_total{' "$T/s0.txt"
  for r in 0 1; do
    [ "$(grep -c "^dtrain_steps_total{.*rank=\"$r\"" "$T/s0.txt")" = 1 ] && pass ||
      fail "node 0's endpoint: rank $r not once: $(grep steps_total "$T/s0.txt")"
  done
  scrape "$P1" "$T/s1.txt"
  [ "$(grep -c '^dtrain_steps_total{' "$T/s1.txt")" = 1 ] && grep -q '^dtrain_steps_total{.*rank="1"' "$T/s1.txt" &&
    pass || fail "node 1's endpoint should show rank 1 alone: $(grep steps_total "$T/s1.txt")"
  promtool check metrics <"$T/s0.txt" >"$T/check.out" 2>&1 && pass || fail "promtool: $(cat "$T/check.out")"
  PP=$(free_port 127.0.0.1)
  prom_start "$P0" "$PP"
  t0=$(now)
  got=""
  while elapsed_ok "$t0" "$(now)" 60; do
    got=$(promtool query instant "http://127.0.0.1:$PP" 'dtrain_steps_total > 0' 2>/dev/null)
    [ "$(echo "$got" | grep -c 'rank="[01]"')" = 2 ] && break
    kill -0 $PR 2>/dev/null || break
    sleep 0.5
  done
  echo "$got"
  [ "$(echo "$got" | grep -c 'rank="[01]"')" = 2 ] && pass ||
    fail "Prometheus (one target, node 0's) lacks rank 0 or 1 within 60 s: $got $(tail -3 "$T/prom.log")"
  echo "$got" | grep -q 'job="job"' && pass || fail "job label: $got"
  kill $PR 2>/dev/null
  wait $PR 2>/dev/null
  stop_nodes
fi

# ---- 2. rank 1 stopped on node 1: node 0's diagnosis names it ----------------------
if start hang DTRAIN_TIMEOUT=10; then
  victim=$(worker_pid "$T/hang1.out")
  t0=$(now)
  kill -STOP "$victim"
  while ! grep -q 'hang diagnosis' "$T/hang0.err" && elapsed_ok "$t0" "$(now)" 40; do sleep 0.1; done
  line=$(grep -m1 'hang diagnosis' "$T/hang0.err")
  echo "$line"
  if [ -z "$line" ]; then
    fail "node 0: no hang diagnosis within 40 s of stopping rank 1: $(tail -6 "$T/hang0.err")"
  else
    echo "$line" | grep -Eq "rank 1 never entered [a-z]+ #[0-9]+|rank 1 \(pid $victim\) is stopped" && pass ||
      fail "node 0's diagnosis does not name rank 1: $line"
    echo "$line" | grep -Eq "[a-z]+ #[0-9]+ \(" && pass || fail "diagnosis names no operation: $line"
  fi
  grep -q '^rank 1 (pid' "$T/hang/obs/flight.txt" && pass || fail "flight.txt lacks rank 1 (node 1's)"
  kill -CONT "$victim" 2>/dev/null
  kill -9 "$victim" 2>/dev/null
  stop_nodes
fi
finish

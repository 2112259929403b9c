#!/usr/bin/env bash
# bench/elastic_hosts.sh — elastic recovery across hosts (docs/elastic.md),
# part of `make bench-elastic`: 3 emulated hosts (network namespaces,
# tools/netns.sh, unshaped veth links on a bridge), one `dtrain launch` node
# with one worker on each, tcp between them, a 3-worker MLP job with
# dist.min_workers = 2 (6400 samples, 3 epochs, batch 64).
#  1. a worker SIGKILLed from outside (node 2's, at a random moment of the
#     second epoch); recovery = from the kill to the first completed step of
#     the new generation (the survivors' log line, wall clock; the
#     namespaces share the clock); median of HOST_KILLS runs (default 10),
#     target <= 3 s across hosts;
#  2. node 2's launcher SIGKILLed (its worker dies with it; nobody reports
#     the death, the heartbeats find it: dist.heartbeat_timeout = 1 s),
#     LAUNCHER_KILLS runs (default 3);
#  3. with etcd on a fourth host holding the membership (leases), node 0's
#     launcher SIGKILLed, LAUNCHER_KILLS runs (skipped without etcd).
# Prints one line per run and the medians. Needs root (namespaces).
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN=${DTRAIN:-$SRC/${BUILD:-build/release}/dtrain}

if [ "${1:-}" != inner ]; then
  "$SRC/tools/netns.sh" check || { echo "elastic across hosts: skipped (no network namespaces)"; exit 0; }
  export DTRAIN
  exec "$SRC/tools/netns.sh" run -n 4 -p "dbh$$" -- bash "$0" inner
fi

HOST_KILLS=${HOST_KILLS:-10}
LAUNCHER_KILLS=${LAUNCHER_KILLS:-3}
read -r -a HOSTS <<<"$NETNS_HOSTS"
read -r -a ADDRS <<<"$NETNS_ADDRS"
T=$(mktemp -d /tmp/dtrain_bench_hosts.XXXXXX)
export OPENBLAS_NUM_THREADS=1
PIDS=""
trap 'for p in $PIDS; do kill -9 $p 2>/dev/null; done; for p in $PIDS; do wait $p 2>/dev/null; done; rm -rf "$T"' EXIT
now() { date +%s.%N; }
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }

# run D BACKEND VICTIM — one job; VICTIM "worker2", "launcher2", "launcher0";
# prints the recovery time (or nothing when the run did not recover)
run() {
  local d=$1 backend=$2 victim=$3 i rdzv b=() lp=() tk first pid
  mkdir -p "$d"
  # a token per job: a job whose node 0 was killed leaves its keys in etcd
  # (node 0's launcher removes them at its end), and they are the token's
  export DTRAIN_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  if [ "$backend" = etcd ]; then b=(--rdzv-backend etcd); rdzv="${ADDRS[3]}:2379"
  else rdzv="${ADDRS[0]}:29741"; fi
  for i in 2 1 0; do
    DTRAIN_LOG_LEVEL=info ip netns exec "${HOSTS[$i]}" "$DTRAIN" launch "${b[@]}" --nnodes 3 \
      --node-rank $i --nproc-per-node 1 --rdzv "$rdzv" -- train "$SRC/examples/fashion_mlp.ini" \
      --set dist.min_workers=2 --set dist.heartbeat_timeout=1 --set train.epochs=3 \
      --set data.limit_train=6400 --set data.limit_test=1000 --out "$d/out" \
      >"$d/n$i.log" 2>&1 </dev/null &
    lp[$i]=$!
    PIDS="$PIDS $!"
  done
  for _ in $(seq 1 1500); do [ -s "$d/out/events.jsonl" ] && break; sleep 0.02; done
  sleep "0.$((RANDOM % 40 + 10))"
  case $victim in
    worker2) pid=$(grep -o 'rank 2 pid [0-9]*' "$d/n2.log" | awk '{print $4}') ;;
    launcher2) pid=${lp[2]} ;;
    launcher0) pid=${lp[0]} ;;
  esac
  tk=$(now)
  kill -9 "$pid"
  local until=$((SECONDS + 120))
  for i in 0 1 2; do
    while kill -0 "${lp[$i]}" 2>/dev/null && [ $SECONDS -lt $until ]; do sleep 0.1; done
    kill -9 "${lp[$i]}" 2>/dev/null
    wait "${lp[$i]}" 2>/dev/null
  done
  first=$(cat "$d"/n?.log | grep -o 'first step of generation 1 done at wall clock [0-9.]*' |
    awk '{print $NF}' | sort -n | head -1)
  [ -n "$first" ] && awk -v a="$tk" -v b="$first" 'BEGIN{printf "%.3f", b - a}'
}

# series N BACKEND VICTIM LABEL WHAT TARGET — N runs, a line each, then the
# median line
series() {
  local n=$1 backend=$2 victim=$3 label=$4 what=$5 target=$6 k r rec=()
  for k in $(seq 1 "$n"); do
    r=$(run "$T/$victim-$backend-$k" "$backend" "$victim")
    echo "$label $k: recovery ${r:-none} s"
    [ -n "$r" ] && rec+=("$r")
  done
  if [ ${#rec[@]} = 0 ]; then echo "$what: no run recovered"; return; fi
  echo "$what: median $(med "${rec[@]}") s over ${#rec[@]} kills (min $(printf '%s\n' "${rec[@]}" | sort -n | head -1), max $(printf '%s\n' "${rec[@]}" | sort -n | tail -1))$target"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
series "$HOST_KILLS" builtin worker2 "worker kill" "recovery across 3 hosts, a worker SIGKILLed" \
  "; target <= 3 s"
series "$LAUNCHER_KILLS" builtin launcher2 "launcher kill" "recovery across 3 hosts, node 2's \
launcher SIGKILLed (found by heartbeats, dist.heartbeat_timeout = 1 s)" ""

if command -v etcd >/dev/null && command -v curl >/dev/null; then
  e=${ADDRS[3]}
  ip netns exec "${HOSTS[3]}" etcd --name dt --data-dir "$T/etcd" --listen-client-urls "http://$e:2379" \
    --advertise-client-urls "http://$e:2379" --listen-peer-urls "http://$e:2380" \
    --initial-advertise-peer-urls "http://$e:2380" --initial-cluster "dt=http://$e:2380" \
    >"$T/etcd.log" 2>&1 </dev/null &
  PIDS="$PIDS $!"
  for _ in $(seq 1 200); do
    ip netns exec "${HOSTS[3]}" curl -sf -m 1 -X POST "http://$e:2379/v3/kv/range" -d '{"key":"AA=="}' >/dev/null 2>&1 && break
    sleep 0.05
  done
  series "$LAUNCHER_KILLS" etcd launcher0 "etcd, node 0 launcher kill" "recovery across 3 hosts \
with etcd, node 0's launcher SIGKILLed (etcd lease TTL 2 s)" ""
else
  echo "etcd: skipped (etcd or curl not installed)"
fi

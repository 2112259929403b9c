# netns_lib.sh — shared by the multi-host elastic tests (sourced inside
# `tools/netns.sh run -n 4`, after tests/cli/lib.sh): hosts h0..h2 run one
# `dtrain launch` node each (one worker per node, tcp between them), h3 may
# run etcd. Every process is started through `ip netns exec`, which execs,
# so the pid the test holds is the launcher's (or etcd's) own; each joins
# PIDS and is killed by lib.sh's trap. Needs NETNS_HOSTS / NETNS_ADDRS.
read -r -a HOSTS <<<"$NETNS_HOSTS"
read -r -a ADDRS <<<"$NETNS_ADDRS"
CHECK="python3 $SRC/tests/elastic/check_visits.py"
N=1920   # 30 steps of 64 per epoch; the CNN: ~1 s an epoch on a quiet
         # machine, so a kill or cut after the first epoch lands mid-run
export DTRAIN_JOB_TOKEN=${DTRAIN_JOB_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
PORT=29731  # inside our own namespaces: no other test binds there

# start_etcd — etcd on h3 (ADDRS[3]:2379), data in $T/etcd; EPID its pid.
# Returns 1 (with the reason in $T/etcd.log) if it does not answer in 10 s.
start_etcd() {
  local e=${ADDRS[3]}
  ip netns exec "${HOSTS[3]}" etcd --name dt --data-dir "$T/etcd" \
    --listen-client-urls "http://$e:2379" --advertise-client-urls "http://$e:2379" \
    --listen-peer-urls "http://$e:2380" --initial-advertise-peer-urls "http://$e:2380" \
    --initial-cluster "dt=http://$e:2380" >>"$T/etcd.log" 2>&1 </dev/null &
  EPID=$!
  PIDS="$PIDS $EPID"
  for _ in $(seq 1 200); do
    ip netns exec "${HOSTS[3]}" curl -sf -m 1 -X POST "http://$e:2379/v3/kv/range" \
      -d '{"key":"AA=="}' >/dev/null 2>&1 && return 0
    kill -0 "$EPID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# launch NAME BACKEND ARGS... — one launcher per host h0..h2 (BACKEND
# "builtin": node 0's store at ADDRS[0]:PORT; "etcd": etcd on h3), training
# the CNN with dist.min_workers and ARGS; logs $T/NAME/nI.log, records in
# $T/NAME/out, visits in $T/NAME/v; launcher pids in LP[0..2].
launch() {
  local name=$1 backend=$2 i rdzv
  shift 2
  mkdir -p "$T/$name/v"
  local b=()
  if [ "$backend" = etcd ]; then b=(--rdzv-backend etcd); rdzv="${ADDRS[3]}:2379"
  else rdzv="${ADDRS[0]}:$PORT"; fi
  LP=()
  for i in 2 1 0; do
    DTRAIN_TEST_VISITS="$T/$name/v" DTRAIN_TEST_KILL="${KILLSPEC:-}" ip netns exec "${HOSTS[$i]}" "$DTRAIN" launch "${b[@]}" \
      --nnodes 3 --node-rank $i --nproc-per-node 1 --rdzv "$rdzv" -- train \
      "$SRC/examples/fashion_cnn.ini" --set data.limit_train=$N --set data.limit_test=500 \
      --set dist.heartbeat_timeout=1 "$@" --out "$T/$name/out" >"$T/$name/n$i.log" 2>&1 </dev/null &
    LP[$i]=$!
    PIDS="$PIDS $!"
  done
}

# wait_first_epoch NAME — until rank 0 recorded an epoch (bounded: 60 s)
wait_first_epoch() {
  for _ in $(seq 1 1200); do
    [ -s "$T/$1/out/events.jsonl" ] && return 0
    sleep 0.05
  done
  return 1
}

# wait_nodes NAME SECS — waits for the three launchers; RC[i] their status
# (124 if still running after SECS: then killed).
wait_nodes() {
  local name=$1 until=$((SECONDS + $2)) i
  RC=()
  for i in 0 1 2; do
    while kill -0 "${LP[$i]}" 2>/dev/null && [ $SECONDS -lt $until ]; do sleep 0.1; done
    if kill -0 "${LP[$i]}" 2>/dev/null; then
      kill -9 "${LP[$i]}" 2>/dev/null
      wait "${LP[$i]}" 2>/dev/null
      RC[$i]=124
    else
      wait "${LP[$i]}"
      RC[$i]=$?
    fi
  done
}

# went_on NAME WHAT EPOCHS A B [MODE] — nodes A and B ended with status 0,
# the summary says 2 workers, a generation 1 was made, and every sample of
# every epoch was trained exactly once (EPOCHS epochs; MODE as
# check_visits.py's fourth argument).
went_on() {
  local name=$1 what=$2 epochs=$3 a=$4 b=$5 mode=${6:-} s="$T/$1/out/summary.json"
  if [ "${RC[$a]}" != 0 ] || [ "${RC[$b]}" != 0 ]; then
    fail "$what: nodes $a, $b exit ${RC[$a]}, ${RC[$b]}: $(grep -hv "info\|^epoch" "$T/$name/n$a.log" "$T/$name/n$b.log" | tail -4)"
  elif [ "$(json_num "$s" workers)" != 2 ]; then
    fail "$what: summary says '$(json_num "$s" workers 2>/dev/null)' workers, want 2"
  elif ! grep -q "generation 1" "$T/$name/n1.log"; then
    fail "$what: no generation 1 in node 1's log"
  elif ! $CHECK "$T/$name/v" $N "$epochs" $mode >"$T/$name/visits" 2>&1; then
    fail "$what: visit record: $(cat "$T/$name/visits")"
  else
    pass
  fi
}

# recovery NAME — seconds from the failure node 1 saw to its first step of
# generation 1, as node 1 logged it.
recovery() {
  grep -o 'first step of generation 1 done at wall clock [0-9.]*, [0-9.]* s' "$T/$1/n1.log" |
    head -1 | awk '{print $(NF-1)}'
}

# nothing_left NAME — no launcher or worker of the run is alive
nothing_left() {
  local p
  for p in $(grep -ho 'pid [0-9]*' "$T/$1"/n?.log | awk '{print $2}' | sort -u) ${LP[*]}; do
    if kill -0 "$p" 2>/dev/null && grep -q dtrain "/proc/$p/cmdline" 2>/dev/null; then
      fail "$1: pid $p still running"
    fi
  done
}

# netns_nodes.sh — sourced (not run) by the tests that start a two-node
# `dtrain launch` job inside `tools/netns.sh run` (NETNS_HOSTS and
# NETNS_ADDRS come from it; T and DTRAIN from the test's environment).
#
# launch_two_nodes PORT SECS TRAIN_ARGS... — node 1 then node 0, each
# `dtrain launch --nnodes 2 --nproc-per-node 2 --rdzv ADDR0:PORT -- train
# TRAIN_ARGS --out $T/nn` in its namespace (output in $T/nn0.*, $T/nn1.*),
# waits SECS at most; returns 0 when both nodes exit 0. A fixed PORT is safe:
# it is bound inside this run's own namespace. Nodes still running when the
# shell exits are killed and reaped by pid.
NODE_PIDS=()
launch_two_nodes() {
  local port=$1 secs=$2 rc=0 i
  shift 2
  read -r -a hosts <<<"$NETNS_HOSTS"
  read -r -a addrs <<<"$NETNS_ADDRS"
  trap 'for p in "${NODE_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; for p in "${NODE_PIDS[@]}"; do wait "$p" 2>/dev/null; done' EXIT
  for i in 1 0; do
    ip netns exec "${hosts[$i]}" "$DTRAIN" launch --nnodes 2 --node-rank $i --nproc-per-node 2 \
      --rdzv "${addrs[0]}:$port" -- train "$@" --out "$T/nn" \
      >"$T/nn$i.out" 2>"$T/nn$i.err" </dev/null &
    NODE_PIDS[$i]=$!
  done
  local deadline=$((SECONDS + secs))
  for i in 0 1; do
    while kill -0 "${NODE_PIDS[$i]}" 2>/dev/null; do
      [ $SECONDS -ge $deadline ] && { echo "node $i still running after $secs s" >>"$T/nn$i.err"; return 1; }
      sleep 0.1
    done
    wait "${NODE_PIDS[$i]}" || rc=1
  done
  return $rc
}

#!/usr/bin/env bash
# test_launch.sh — `dtrain launch`:
#  (a) one node x 2 workers on loopback against `train --workers 2`: the same
#      steps, test accuracy and params_sha256 (same slices, same reduction);
#  (b) two nodes x 2 workers in two network namespaces (tools/netns.sh: veth
#      links on a bridge, private addresses inside the namespaces only): one
#      summary.json from rank 0 with workers = 4 and a sane accuracy, rank 0
#      reaching its node-mate over shm and the other node over tcp (which
#      only works if the workers listen on the namespace's own address, not
#      127.0.0.1); skipped with a message where namespaces cannot be made
#      (the test then exits 77 after the other parts: reported as skipped);
#  (c) bad input — missing or short DTRAIN_JOB_TOKEN for several nodes, bad
#      --rdzv, node rank >= node count (flag and env), bad counts, unknown
#      options, --max-restarts, dist.workers against the world, transport mpi —
#      each one line on stderr and exit 2, nothing written;
#  (d) a node that never shows up: the other exits 1 within the deadline
#      (DTRAIN_TIMEOUT=3) naming the missing node and its ranks, either way.
# Every process it starts is stopped by pid on exit; netns.sh removes the
# namespaces even on failure.

# (b), inside tools/netns.sh run: node 1 then node 0, each in its namespace,
# bounded wait; T, DTRAIN, CFG come from the environment.
netns_inner() {
  . "$(dirname "$0")/netns_nodes.sh"
  launch_two_nodes 29610 120 "$CFG" --set train.epochs=1 --set data.limit_train=2000 \
    --set data.limit_test=1000
}
if [ "${1:-}" = netns_inner ]; then
  netns_inner
  exit $?
fi

. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
SHORT=(--set train.epochs=1 --set data.limit_train=2000 --set data.limit_test=1000)
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

# ---- (a) one node, two workers vs --workers 2 ----------------------------------
"$DTRAIN" train "$CFG" --workers 2 "${SHORT[@]}" --out "$T/w2" >"$T/w2.out" 2>"$T/w2.err" </dev/null ||
  fail "(a) train --workers 2: $(cat "$T/w2.err")"
"$DTRAIN" launch --nproc-per-node 2 -- train "$CFG" "${SHORT[@]}" --out "$T/l2" \
  >"$T/l2.out" 2>"$T/l2.err" </dev/null
rc=$?
[ $rc = 0 ] && pass || fail "(a) launch 1x2: exit $rc: $(cat "$T/l2.err")"
[ ! -s "$T/l2.err" ] && pass || fail "(a) launch 1x2: stderr: $(cat "$T/l2.err")"
for k in steps workers test_accuracy; do
  [ "$(json_num "$T/l2/summary.json" $k)" = "$(json_num "$T/w2/summary.json" $k)" ] && pass ||
    fail "(a) $k: launch $(json_num "$T/l2/summary.json" $k), --workers $(json_num "$T/w2/summary.json" $k)"
done
[ "$(json_num "$T/l2/summary.json" steps)" = 32 ] && pass || fail "(a) steps, want ceil(2000/64) = 32"
[ "$(json_str "$T/l2/summary.json" params_sha256)" = "$(json_str "$T/w2/summary.json" params_sha256)" ] &&
  pass || fail "(a) params_sha256 differs from --workers 2"
grep -q '^comm: 2 ranks on 1 host; rank 0 reaches rank 1 over shm$' "$T/l2.out" && pass ||
  fail "(a) comm line: $(grep '^comm' "$T/l2.out")"
# the environment does the same as the flags
DTRAIN_NPROC_PER_NODE=2 "$DTRAIN" launch -- train "$CFG" "${SHORT[@]}" --out "$T/e2" \
  >"$T/e2.out" 2>"$T/e2.err" </dev/null && [ "$(json_num "$T/e2/summary.json" workers)" = 2 ] &&
  pass || fail "(a) DTRAIN_NPROC_PER_NODE=2: $(cat "$T/e2.err")"

# ---- (c) usage and bad input ------------------------------------------------------
out=$("$DTRAIN" launch --help) && grep -q -- '--nproc-per-node K' <<<"$out" && grep -q DTRAIN_JOB_TOKEN <<<"$out" &&
  pass || fail "launch --help: '$out'"
"$DTRAIN" --help | grep -q '^  launch ' && pass || fail "dtrain --help does not list launch"
P=$(free_port)
export DTRAIN_JOB_TOKEN="$TOKEN"
L2=(launch --nnodes 2 --rdzv "127.0.0.1:$P")
( unset DTRAIN_JOB_TOKEN
  expect_bad tok_missing '^dtrain: DTRAIN_JOB_TOKEN is not set: .*openssl rand -hex 32' \
    "${L2[@]}" --node-rank 1 -- train "$CFG"
  exit $FAILS ) && pass || fail "(c) missing token"
DTRAIN_JOB_TOKEN=abc expect_bad tok_short '^dtrain: DTRAIN_JOB_TOKEN is too short' \
  "${L2[@]}" --node-rank 1 -- train "$CFG"
expect_bad rdzv_noport "^dtrain: --rdzv 'localhost': expects HOST:PORT" launch --rdzv localhost -- train "$CFG"
expect_bad rdzv_port "^dtrain: --rdzv '127.0.0.1:70000': expects HOST:PORT" launch --rdzv 127.0.0.1:70000 -- train "$CFG"
expect_bad rdzv_host "^dtrain: --rdzv 'no-such-host.invalid:29500': host does not resolve" \
  launch --rdzv no-such-host.invalid:29500 -- train "$CFG"
DTRAIN_RDZV=x:y expect_bad rdzv_env "^dtrain: DTRAIN_RDZV 'x:y': expects HOST:PORT" launch -- train "$CFG"
expect_bad rdzv_missing '^dtrain: --rdzv HOST:PORT \(or DTRAIN_RDZV\) is required for a job of 2 nodes' \
  launch --nnodes 2 --node-rank 1 -- train "$CFG"
expect_bad rdzv_notlocal '^dtrain: --rdzv 192.0.2.1:29500: node 0 serves the rendezvous there but cannot listen' \
  launch --nnodes 2 --node-rank 0 --rdzv 192.0.2.1:29500 -- train "$CFG"
expect_bad node_rank '^dtrain: --node-rank 2: must be below the node count 2 \(node ranks are 0..1\)' \
  "${L2[@]}" --node-rank 2 -- train "$CFG"
DTRAIN_NODE_RANK=3 expect_bad node_rank_env '^dtrain: DTRAIN_NODE_RANK 3: must be below the node count 2' \
  "${L2[@]}" -- train "$CFG"
expect_bad nnodes "^dtrain: --nnodes '0': expects an integer in \[1, 1024\]" launch --nnodes 0 -- train "$CFG"
DTRAIN_NPROC_PER_NODE=two expect_bad nproc "^dtrain: DTRAIN_NPROC_PER_NODE 'two': expects an integer" \
  launch -- train "$CFG"
expect_bad restarts '^dtrain: --max-restarts 3: restarts are not supported' launch --max-restarts 3 -- train "$CFG"
expect_bad unknown "^dtrain: launch: unknown option '--nodes'" launch --nodes 2 -- train "$CFG"
expect_bad no_train "^dtrain: launch: expects '-- train" launch --nproc-per-node 2 -- bench allreduce
expect_bad bind_addr "^dtrain: --bind-addr '10.0.0.300': expects an IPv4 address" \
  launch --bind-addr 10.0.0.300 -- train "$CFG"
expect_bad workers_flag '^dtrain: --workers: not with dtrain launch' launch -- train "$CFG" --workers 2
expect_bad workers_key '^dtrain: dist.workers = 3, but dtrain launch started a world of 2 ranks' \
  launch --nproc-per-node 2 -- train "$CFG" --set dist.workers=3
expect_bad mpi '^dtrain: dist.transport = mpi needs the ranks started by mpirun or srun \(dtrain launch' \
  launch --nproc-per-node 2 -- train "$CFG" --set dist.transport=mpi
DTRAIN_TRANSPORT=ib expect_bad transport_env "^dtrain: DTRAIN_TRANSPORT 'ib': expects auto, shm, tcp or mpi" \
  launch -- train "$CFG"

# ---- (d) a node that never shows up ---------------------------------------------
missing() { # node-rank-present pattern
  local me=$1 pat=$2 t0 t1 rc
  t0=$(date +%s.%N)
  DTRAIN_TIMEOUT=3 timeout 30 "$DTRAIN" "${L2[@]}" --nproc-per-node 2 --node-rank "$me" -- \
    train "$CFG" "${SHORT[@]}" --out "$T/miss$me" >"$T/miss$me.out" 2>"$T/miss$me.err" </dev/null
  rc=$?
  t1=$(date +%s.%N)
  [ $rc = 1 ] && pass || fail "(d) node $me alone: exit $rc, want 1: $(cat "$T/miss$me.err")"
  awk -v a="$t0" -v b="$t1" 'BEGIN{exit !(b - a < 10)}' && pass || fail "(d) node $me alone took $(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}') s"
  [ "$(wc -l <"$T/miss$me.err")" = 1 ] && grep -Eq "$pat" "$T/miss$me.err" && pass ||
    fail "(d) node $me alone: stderr '$(cat "$T/miss$me.err")' does not match '$pat'"
  [ ! -e "$T/miss$me/summary.json" ] && pass || fail "(d) summary.json written"
}
missing 0 "^dtrain: node 0: node 1 \(ranks 2-3\) did not join the rendezvous at 127.0.0.1:$P within 3 s"
missing 1 "^dtrain: node 1: cannot reach the rendezvous store at 127.0.0.1:$P \(served by node 0\) within 3 s"

# ---- (b) two nodes in network namespaces --------------------------------------
"$SRC/tools/netns.sh" check >"$T/netns_check" 2>&1
nrc=$?
if [ $nrc = 77 ]; then
  skip_part b "network namespaces unavailable: $(cat "$T/netns_check")"
elif [ $nrc != 0 ]; then
  fail "(b) netns.sh check: exit $nrc: $(cat "$T/netns_check")"
else
  T="$T" DTRAIN="$DTRAIN" CFG="$CFG" DTRAIN_JOB_TOKEN="$TOKEN" "$SRC/tools/netns.sh" run -p "dtl$$" -n 2 -- \
    bash "$0" netns_inner >"$T/netns.log" 2>&1
  rc=$?
  [ $rc = 0 ] && pass || fail "(b) 2 nodes x 2 in namespaces: exit $rc: $(cat "$T/netns.log" "$T"/nn?.err 2>/dev/null | head -20)"
  S="$T/nn/summary.json"
  [ "$(json_num "$S" workers)" = 4 ] && pass || fail "(b) summary workers '$(json_num "$S" workers)', want 4"
  [ "$(json_num "$S" steps)" = 32 ] && pass || fail "(b) steps '$(json_num "$S" steps)', want 32"
  awk -v a="$(json_num "$S" test_accuracy)" -v b="$(json_num "$T/w2/summary.json" test_accuracy)" \
    'BEGIN{d=a-b; if (d<0) d=-d; exit !(a > 0.6 && d <= 0.002)}' && pass ||
    fail "(b) test_accuracy $(json_num "$S" test_accuracy) vs --workers 2 $(json_num "$T/w2/summary.json" test_accuracy)"
  grep -q '^comm: 4 ranks on 2 hosts; rank 0 reaches rank 1 over shm, ranks 2-3 over tcp$' "$T/nn0.out" &&
    pass || fail "(b) comm line: '$(grep '^comm' "$T/nn0.out")'"
  grep -q '^dtrain .*: node 1 of 2, ranks 2-3 of 4' "$T/nn1.out" && pass || fail "(b) node 1 header: $(head -1 "$T/nn1.out")"
  [ ! -s "$T/nn0.err" ] && [ ! -s "$T/nn1.err" ] && pass || fail "(b) stderr: $(cat "$T"/nn?.err)"
  ip netns list 2>/dev/null | grep -q "dtl$$" && fail "(b) namespaces left behind" || pass
fi
finish

#!/usr/bin/env bash
# test_elastic_hosts.sh — elastic training across hosts (docs/elastic.md):
# 3 emulated hosts (network namespaces, tools/netns.sh), one `dtrain launch`
# node with one worker on each, tcp between them, dist.min_workers = 2.
#  (a) the worker of node 2 SIGKILLed at step 20 (DTRAIN_TEST_KILL): nodes 0
#      and 1 finish (status 0) with 2 workers, every sample of every epoch
#      trained exactly once (visit record);
#  (b) node 2's launcher SIGKILLed mid-run (its worker dies with it, and
#      nobody reports the death: the heartbeats find it): the same, except
#      that the worker, killed at an arbitrary moment, may leave its share
#      of its last step without a record or with two (check_visits.py
#      slack<=22: at most one step's share of one worker);
#  (c) with etcd (on a fourth host) holding the membership, node 0's
#      launcher SIGKILLed mid-run — the node whose launcher serves the
#      built-in store: nodes 1 and 2 go on (status 0, 2 workers, visits
#      exact, the summary written by the new rank 0).
# Recovery times are logged, not checked (bench/elastic.sh measures them).
# Exits 77 with a reason without namespaces (root) or, for (c), etcd.
# Every process is stopped by pid (trap); netns.sh removes the namespaces.
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

if [ "${1:-}" = inner ]; then
  . "$SRC/tests/cli/lib.sh"
  . "$SRC/tests/elastic/netns_lib.sh"

  KILLSPEC=2:20:forward launch kill builtin --set train.epochs=2 --set dist.min_workers=2
  # (DTRAIN_TEST_KILL names member 2: only node 2's worker is member 2)
  wait_nodes kill 90
  went_on kill "(a) worker of node 2 killed" 2 0 1
  echo "(a) recovery $(recovery kill) s"

  launch lk builtin --set train.epochs=3 --set dist.min_workers=2
  if wait_first_epoch lk; then kill -9 "${LP[2]}"; else fail "(b) no epoch recorded"; fi
  wait_nodes lk 90
  [ "${RC[2]}" = 137 ] || fail "(b) node 2's launcher: status ${RC[2]}, want 137 (SIGKILL)"
  went_on lk "(b) launcher of node 2 killed" 3 0 1 "slack<=22"
  echo "(b) recovery $(recovery lk) s"
  nothing_left lk

  if [ "$HAVE_ETCD" = 1 ] && start_etcd; then
    # a 3 s heartbeat (the etcd lease's TTL) instead of netns_lib's 1 s: at
    # load 25 a live member's lease expired before the first epoch ("cut
    # off from etcd for longer than dist.heartbeat_timeout = 1.0 s") and the
    # job stopped; the kill of node 0 is still found by the lease
    launch lk0 etcd --set train.epochs=3 --set dist.min_workers=2 --set dist.heartbeat_timeout=3
    if wait_first_epoch lk0; then kill -9 "${LP[0]}"; else fail "(c) no epoch recorded"; fi
    wait_nodes lk0 90
    went_on lk0 "(c) etcd, launcher of node 0 killed" 3 1 2 "slack<=22"
    grep -q "is rank 0" "$T/lk0/n1.log" || fail "(c) member 1 did not become rank 0"
    echo "(c) recovery $(recovery lk0) s"
    nothing_left lk0
  elif [ "$HAVE_ETCD" = 1 ]; then
    skip_part c "etcd did not start: $(tail -2 "$T/etcd.log")"
  else
    skip_part c "etcd or curl is not installed (Debian: etcd-server, curl)"
  fi
  finish
  exit $?
fi

: "${DTRAIN:?DTRAIN must name the dtrain binary}"
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || { echo "SKIP: no Fashion-MNIST"; exit 77; }
"$SRC/tools/netns.sh" check || { echo "SKIP: network namespaces unavailable here (see above)"; exit 77; }
HAVE_ETCD=0
command -v etcd >/dev/null && command -v curl >/dev/null && HAVE_ETCD=1
export HAVE_ETCD
"$SRC/tools/netns.sh" run -n 4 -p "deh$$" -- bash "$0" inner

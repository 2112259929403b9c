#!/usr/bin/env bash
# test_elastic_split_etcd.sh — part (c) of test_elastic_split.sh: node 0 cut
# off with etcd (on a fourth namespace) holding the membership; nodes 1 and
# 2 keep their leases and go on, node 0 stops saying it cannot reach etcd.
# Exits 77 with a reason without namespaces (root) or etcd.
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PARTS=c exec bash "$SRC/tests/elastic/test_elastic_split.sh"

#!/usr/bin/env bash
# test_elastic_shrink.sh — elastic training on one host without a restart
# (docs/elastic.md): `dtrain train --workers 3 --set dist.min_workers=2`,
# a worker SIGKILLed at a named point (DTRAIN_TEST_KILL): during forward,
# during backward, with its gradients in flight in the allreduce, during
# evaluation. Each time the job must finish with status 0 and a summary
# naming the smaller world, and the per-sample visit record
# (DTRAIN_TEST_VISITS) must show every sample of every epoch trained
# exactly once. dist.min_workers with dist.zero or above dist.workers is
# refused. More cases: test_elastic_shrink_more.sh (rank 0, two at once,
# tcp, during a checkpoint write), test_elastic_shrink_det.sh
# (deterministic mode, below min_workers, an outside kill, SIGSTOP).
# Every run has a time limit; no process or /dev/shm name is left behind.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/shrink_lib.sh"

# strategies without a membership change are refused up front (exit 2, the key named)
expect_bad with_zero "dist.min_workers.*dist.zero" train "${BASE[@]}" --workers 2 \
  --set dist.min_workers=1 --set dist.zero=1
expect_bad too_many "dist.min_workers.*more than dist.workers" train "${BASE[@]}" --workers 2 \
  --set dist.min_workers=3

run forward 2:20:forward --set dist.min_workers=2 && shrunk forward 2
run backward 1:20:backward --set dist.min_workers=2 && shrunk backward 2
run allreduce 2:25:allreduce --set dist.min_workers=2 && shrunk allreduce 2
run eval 1:30:eval --set dist.min_workers=2 && shrunk eval 2
leftovers
finish

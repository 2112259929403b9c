#!/usr/bin/env bash
# test_elastic_shrink_more.sh — more one-host shrink cases
# (test_elastic_shrink.sh has the first): rank 0 lost (it writes the
# records: the new rank 0 appends to them), two workers SIGKILLed at once
# (min_workers 1), one over tcp in the allreduce, and rank 0 SIGKILLed while
# its checkpoint writer thread writes the checkpoint of epoch 1
# (ckpt.async: DTRAIN_TEST_KILL phase ckpt): the job goes on, the new rank
# 0 writes the later checkpoints, every checkpoint left verifies and the
# latest is the last step's. Each: status 0, the smaller world, visits exact.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/shrink_lib.sh"

run rank0 0:40:forward --set dist.min_workers=2 && shrunk rank0 2
run two "1:10:backward,2:10:backward" --set dist.min_workers=1 && shrunk two 1
run tcp 1:45:allreduce --set dist.min_workers=2 --set dist.transport=tcp && shrunk tcp 2

# rank 0 dies while its checkpoint of step 30 is being written
run ckpt 0:30:ckpt --set dist.min_workers=2 --set ckpt.async=true && shrunk ckpt 2
if ! "$DTRAIN" ckpt verify "$T/ckpt/out/ckpt" >"$T/ckpt/verify" 2>&1; then
  fail "ckpt: dtrain ckpt verify: $(tail -3 "$T/ckpt/verify")"
elif ! grep -q "step-00000060 .* ok  <- latest" "$T/ckpt/verify"; then
  fail "ckpt: the latest checkpoint is not step 60: $(cat "$T/ckpt/verify")"
else pass; fi
leftovers
finish

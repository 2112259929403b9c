#!/usr/bin/env bash
# run.sh — `make bench`: dtrain against its peers, back to back, in one run.
# Builds the benchmark programs, measures OpenBLAS's sgemm ceiling, then
# 1. trains the same MLP and CNN with dtrain and with PyTorch 1.13 (one
#    thread, batch 64, SGD momentum 0.9), alternating (bench/nn_vs_torch.py);
# 2. trains them data parallel: dtrain with 1 and 2 workers against PyTorch
#    DistributedDataParallel over Gloo with 2 processes, 32 samples per
#    worker, plus dtrain's deterministic mode (bench/ddp_vs_torch.py).
# Each prints medians and ratios. Environment: REPS (default 3), BUILD
# (default build/release), ONLY=nn|ddp to run one part.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/release}
cmake --build "$BUILD" -j"$(nproc)" --target dtrain sgemm_peak >/dev/null
if [ "${ONLY:-nn}" = nn ]; then
  /usr/bin/python3 bench/nn_vs_torch.py --build "$BUILD" --reps "${REPS:-3}"
  echo
fi
if [ "${ONLY:-ddp}" = ddp ]; then
  /usr/bin/python3 bench/ddp_vs_torch.py --build "$BUILD" --reps "${REPS:-3}" --det
fi

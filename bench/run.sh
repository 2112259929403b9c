#!/usr/bin/env bash
# run.sh — `make bench`: dtrain against its peers, back to back, in one run.
# Builds the benchmark programs, measures OpenBLAS's sgemm ceiling, then
# trains the same MLP and CNN with dtrain and with PyTorch 1.13 (one thread,
# batch 64, SGD momentum 0.9), alternating, and prints medians and ratios.
# Environment: REPS (default 3), BUILD (default build/release).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/release}
cmake --build "$BUILD" -j"$(nproc)" --target dtrain sgemm_peak >/dev/null
exec /usr/bin/python3 bench/nn_vs_torch.py --build "$BUILD" --reps "${REPS:-3}" "$@"

#!/usr/bin/env bash
# obs.sh — `make bench-obs`: the cost and limits of observability (issue 16):
# the CPU cost per step of what the loop records (bench_obs.c); the MLP with
# 2 workers with metrics + tracing both on against both off in PAIRS
# interleaved rounds (samples/s and the workers' CPU per sample, each as a
# ratio of medians with a 90% bootstrap interval, and the recording cost
# over a worker's CPU per step); the scrape time of a 4-worker job's
# /metrics; the size of a 1-epoch trace. bench/obs.py does the runs.
# About 3-4 minutes on 2 quiet cores with the default 20 pairs.
#   SIDES=off,trace,metrics,both  measures tracing and metrics apart
#   EPOCHS=5  longer runs (a 1-epoch MLP run lasts ~0.6 s on 2 quiet cores,
#             so start-up noise spreads the off side by ~20%)
set -euo pipefail
BUILD=${BUILD:-build/release}
cmake --build "$BUILD" --target bench_obs dtrain >/dev/null
"$BUILD/bench_obs" --no-trace
exec python3 "$(dirname "$0")/obs.py" "$BUILD/dtrain" --pairs "${PAIRS:-20}" \
  --sides "${SIDES:-off,both}" --epochs "${EPOCHS:-1}" --bench-obs "$BUILD/bench_obs"

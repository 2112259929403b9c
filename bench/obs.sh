#!/usr/bin/env bash
# obs.sh — `make bench-obs`: the cost and limits of observability (issue 16):
# the CPU cost per step of what the loop records (bench_obs.c), samples/s
# with tracing alone, metrics alone (scraped every 100 ms over a kept-alive
# connection), both, and neither (MLP, 2 workers, paired rounds), the scrape time of a 4-worker job, the size of a 1-epoch trace.
# bench/obs.py does the runs; about 4 minutes on 2 quiet cores.
set -euo pipefail
BUILD=${BUILD:-build/release}
cmake --build "$BUILD" --target bench_obs >/dev/null
"$BUILD/bench_obs"
"$BUILD/bench_obs" --no-trace
exec python3 "$(dirname "$0")/obs.py" "$BUILD/dtrain" --reps "${REPS:-5}"

#!/usr/bin/env bash
# obs.sh — `make bench-obs`: the cost and limits of observability (issue 16):
# samples/s with metrics (scraped) and tracing on vs off (MLP, 2 workers,
# paired rounds), the scrape time of a 4-worker job, the size of a 1-epoch
# trace. bench/obs.py does the work; about 3 minutes on 2 cores.
set -euo pipefail
BUILD=${BUILD:-build/release}
exec python3 "$(dirname "$0")/obs.py" "$BUILD/dtrain" --reps "${REPS:-5}"

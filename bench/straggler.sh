#!/usr/bin/env bash
# straggler.sh — `make bench-straggler`: one worker slowed for real (a cgroup CPU quota
# of 50% of a core) in a 2-worker job: static vs dynamic (normal mode), static /
# dynamic / steal in deterministic mode (params_sha256 compared), PyTorch DDP with
# the same throttle; 3 workers with one SIGSTOPped for 5 s; accuracy under the
# throttle. bench/straggler.py does the work and removes every cgroup it made.
# Needs root and a cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max);
# skips with a message otherwise. ~5 minutes on a quiet 2-core machine.
set -eu
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build/release}"
if [ "$(id -u)" != 0 ] || { [ ! -w /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && [ ! -e /sys/fs/cgroup/unified/cgroup.controllers ]; }; then
  echo "bench-straggler: skipped: needs root and a writable cgroup cpu controller"
  exit 0
fi
python3 bench/straggler.py --build "$BUILD" --reps "${REPS:-3}" --stop 5 ${ACCURACY:+--accuracy} "$@"

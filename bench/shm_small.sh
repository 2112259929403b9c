#!/usr/bin/env bash
# bench/shm_small.sh — the shm small-message latency against Open MPI, in
# paired rounds: allreduce of 16, 32 and 64 bytes between 2 ranks, each
# round running dtrain with DTRAIN_SHM_ASYM_FENCE=0 (a full fence per
# message, the old path), dtrain as built (=1) and Open MPI's
# MPI_Allreduce (bench/peers/mpi_allreduce.c), back to back. Each run times
# its calls one by one and reports their median (`--time median`), so a
# preemption on a busy host moves it little. Prints every round's figures,
# the medians over rounds and the ratios dtrain / Open MPI (target <= 1.5x
# at 16-64 B, issue 15) and fence / no fence.
#
# Env: BUILD (default build/release), ROUNDS (7), ITERS (20000 calls per size).
set -u
SRC="$(cd "$(dirname "$0")/.." && pwd)"
cd "$SRC" || exit 1
BUILD="${BUILD:-build/release}"
ROUNDS="${ROUNDS:-7}"
ITERS="${ITERS:-20000}"
OUT="$BUILD/bench-comm"
mkdir -p "$OUT"
[ -x "$BUILD/dtrain" ] || { echo "bench/shm_small.sh: $BUILD/dtrain not built (make build)" >&2; exit 1; }
command -v mpicc >/dev/null && mpicc -O2 -o "$OUT/mpi_allreduce" bench/peers/mpi_allreduce.c ||
  { echo "bench/shm_small.sh: Open MPI (mpicc) missing: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1; }
raw="$OUT/shm_small.txt"
: >"$raw"
for r in $(seq "$ROUNDS"); do
  for f in 0 1; do
    DTRAIN_SHM_ASYM_FENCE=$f timeout 300 "$BUILD/dtrain" bench allreduce --workers 2 --transport shm \
      --min 16 --max 64 --iters "$ITERS" --time median 2>/dev/null </dev/null |
      awk -v n="dtrain_fence$((1 - f))" '$1 ~ /^[0-9]+$/ { print n, $1, $5 }' >>"$raw"
  done
  timeout 300 mpirun --allow-run-as-root --oversubscribe -n 2 "$OUT/mpi_allreduce" 16 64 "$ITERS" median \
    2>/dev/null </dev/null | awk '$1 ~ /^[0-9]+$/ { print "openmpi", $1, $3 }' >>"$raw"
done
echo "# median per-call time (us) of each run, $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$raw" <<'PY'
import sys, statistics as st
d = {}
for line in open(sys.argv[1]):
    n, b, t = line.split()
    d.setdefault((n, int(b)), []).append(float(t))
med = {k: st.median(v) for k, v in d.items()}
for k in sorted(d):
    print("%-14s %3d B  median %.3f  | %s" % (k[0], k[1], med[k], " ".join("%.2f" % x for x in d[k])))
for b in (16, 64): # the Open MPI peer steps by 4x
    m = med.get(("openmpi", b))
    a, f = med.get(("dtrain_fence0", b)), med.get(("dtrain_fence1", b))
    if a and m:
        print("%3d B: dtrain / Open MPI %.2fx (target <= 1.5x); with the fence per message %.2fx; fence / no fence %.2fx"
              % (b, a / m, (f or 0) / m, (f or 0) / a))
PY

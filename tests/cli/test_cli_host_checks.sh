#!/usr/bin/env bash
# test_cli_host_checks.sh — what the launcher says about the host before it
# starts workers (issue 8):
#  1. --workers 64 against a /dev/shm that has 16 MiB free
#     (DTRAIN_SHM_LIMIT_BYTES: the real /dev/shm is not filled) is refused
#     before anything starts: exit 2, one line saying how much the job needs
#     and how much there is, after the one-line warning that 64 workers
#     outnumber the cores; no worker, no output directory. The same job over
#     tcp (no rings) passes the check (it is not run to the end: bench with
#     64 ranks would take long; its refusal-free start is enough).
#  2. `dtrain launch --rdzv 0.0.0.0:PORT` binds every interface: allowed,
#     and said in one line at start; the job runs to the end.
#  3. `dtrain launch --nproc-per-node 1` (a world of one) runs to the end.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
SMALL=(--set train.epochs=1 --set data.limit_train=500 --set data.limit_test=100)

# 1. the memory check
DTRAIN_SHM_LIMIT_BYTES=16777216 "$DTRAIN" train "$CFG" --workers 64 "${SMALL[@]}" --out "$T/m64" \
  >"$T/m64.out" 2>"$T/m64.err" </dev/null
rc=$?
[ $rc = 2 ] && pass || fail "64 workers, 16 MiB: exit $rc, want 2: $(cat "$T/m64.err")"
grep -Eq '^dtrain: 64 workers need about [0-9.]+ (MiB|GiB) of shared memory \(.*\) but /dev/shm has 16.0 MiB free \(DTRAIN_SHM_LIMIT_BYTES\)' \
  "$T/m64.err" && pass || fail "64 workers, 16 MiB: refusal line: $(cat "$T/m64.err")"
ncpu=$(nproc)
if [ "$ncpu" -lt 64 ]; then
  # the refusal comes before the start, so no warning about cores either
  [ "$(wc -l <"$T/m64.err")" = 1 ] && pass || fail "64 workers: stderr has $(wc -l <"$T/m64.err") lines: $(cat "$T/m64.err")"
fi
grep -q '^workers:' "$T/m64.out" && fail "64 workers: workers were started" || pass
[ ! -e "$T/m64" ] && pass || fail "64 workers: output directory made"

# the same with a limit that fits: the check passes (a 2-worker job runs)
DTRAIN_SHM_LIMIT_BYTES=$((1 << 30)) "$DTRAIN" train "$CFG" --workers 2 "${SMALL[@]}" --out "$T/m2" \
  >"$T/m2.out" 2>"$T/m2.err" </dev/null && pass || fail "2 workers, 1 GiB: $(cat "$T/m2.err")"

# workers beyond the cores: one warning line, the job runs
n=$((ncpu + 1))
"$DTRAIN" train "$CFG" --workers "$n" --set dist.transport=tcp "${SMALL[@]}" --out "$T/over" \
  >"$T/over.out" 2>"$T/over.err" </dev/null
rc=$?
[ $rc = 0 ] && pass || fail "$n workers: exit $rc: $(cat "$T/over.err")"
[ "$(wc -l <"$T/over.err")" = 1 ] &&
  grep -q "^dtrain: warning: $n workers on $ncpu online cores" "$T/over.err" && pass ||
  fail "$n workers on $ncpu cores: stderr '$(cat "$T/over.err")'"

# 2. --rdzv 0.0.0.0:PORT
port=$(free_port)
"$DTRAIN" launch --rdzv "0.0.0.0:$port" --nproc-per-node 2 -- train "$CFG" "${SMALL[@]}" \
  --out "$T/any" >"$T/any.out" 2>"$T/any.err" </dev/null
rc=$?
[ $rc = 0 ] && pass || fail "rdzv 0.0.0.0: exit $rc: $(cat "$T/any.err")"
[ "$(grep -vc '^dtrain: warning: .* online cores' "$T/any.err")" = 1 ] &&
  grep -q "^dtrain: note: rdzv 0.0.0.0:$port: the rendezvous store listens on every interface" "$T/any.err" &&
  pass || fail "rdzv 0.0.0.0: stderr '$(cat "$T/any.err")'"
[ -e "$T/any/summary.json" ] && pass || fail "rdzv 0.0.0.0: no summary.json"

# a world of one under dtrain launch trains in the launcher itself (a forked
# single worker hung: its engine's loader thread stayed in the parent)
timeout 120 "$DTRAIN" launch --nproc-per-node 1 -- train "$CFG" "${SMALL[@]}" --out "$T/one" \
  >"$T/one.out" 2>"$T/one.err" </dev/null
rc=$?
[ $rc = 0 ] && [ -e "$T/one/summary.json" ] && pass || fail "launch 1x1: exit $rc: $(cat "$T/one.err")"
finish

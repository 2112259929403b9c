#!/usr/bin/env bash
# test_ps_quota_wait.sh — workers under a CPU quota below one core wait for
# parameters by sleeping between polls (DTRAIN_PS_QUOTA_SLEEP, docs/ps.md
# "ssp against bsp under a persistent straggler"): the whole job (launcher,
# 2 workers, 1 separate server; and colocated bsp) in a cgroup-v1 group of
# 0.9 cores, bsp ends with ddp's params_sha256 (the sleeping wait takes
# every reply) and both workers say they sleep; with DTRAIN_PS_QUOTA_SLEEP=0
# neither says so. Needs root and a writable cgroup-v1 cpu controller
# (exit 77 otherwise). The group is removed on exit.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -e "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
CG=/sys/fs/cgroup/cpu
[ "$(id -u)" = 0 ] && [ -w "$CG" ] && [ -e "$CG/cpu.cfs_quota_us" ] ||
  { echo "SKIP: needs root and a writable cgroup-v1 cpu controller at $CG"; exit 77; }
G="$CG/dtrain_test_ps_quota_$$"
mkdir "$G" || { echo "SKIP: cannot create $G"; exit 77; }
trap 'kill_pids; rm -rf "$T"; rmdir "$G" 2>/dev/null' EXIT
echo 100000 >"$G/cpu.cfs_period_us"
echo 90000 >"$G/cpu.cfs_quota_us"

MLP="$SRC/examples/fashion_mlp.ini"
Q="--set train.epochs=2 --set data.limit_train=3200 --set data.limit_test=500 --workers 2"
sha() { json_str "$T/$1/summary.json" params_sha256; }

run() { # NAME ENV-ASSIGNMENT ARGS...: the job inside the group
  local name=$1 envset=$2
  shift 2
  run_bounded 120 bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec env "$@"' _ "$G" \
    "$envset" "$DTRAIN" train "$MLP" $Q "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" </dev/null
  local rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$T/$name/summary.json" ]; then
    fail "$name: exit $rc: $(head -c 400 "$T/$name.err")"
    return 1
  fi
  pass
}
sleeping() { grep -c "waits for parameters sleep between polls" "$T/$1.err"; }

run ddp X=1 && run sep X=1 --servers 1 && run coloc X=1 --set ps.colocate=true &&
  run sep0 DTRAIN_PS_QUOTA_SLEEP=0 --servers 1 || finish
ref=$(sha ddp)
for n in sep coloc sep0; do
  [ "$(sha $n)" = "$ref" ] && pass || fail "$n: params_sha256 $(sha $n), ddp's $ref"
done
for n in sep coloc; do
  [ "$(sleeping $n)" -eq 2 ] && pass ||
    fail "$n: $(sleeping $n) workers said they sleep under the quota (want 2): $(head -c 300 "$T/$n.err")"
done
[ "$(sleeping sep0)" -eq 0 ] && pass || fail "sep0: workers sleep with DTRAIN_PS_QUOTA_SLEEP=0"
finish

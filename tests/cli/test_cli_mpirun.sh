#!/usr/bin/env bash
# test_cli_mpirun.sh — ranks started by someone else:
#  1. `mpirun -n 2 dtrain train CFG --set dist.transport=mpi` against
#     `dtrain train CFG --workers 2`: the same steps, test accuracy within
#     1e-3, workers = 2, transport mpi, rank 0 alone prints and writes; the
#     ranks met through a file store (in a private DTRAIN_RDZV_DIR) that is
#     removed afterwards.
#  2. the same under mpirun with dist.transport=auto (shm between the ranks).
#  3. srun-like: two processes with SLURM_PROCID/SLURM_NTASKS/SLURM_STEP_ID
#     set by hand, meeting at DTRAIN_RDZV (rank 0 serves it), each claiming a
#     different host (DTRAIN_HOST_ID), so they talk tcp; and a rank whose
#     peer never starts exits 1 within the deadline naming the missing rank;
#     and bad input (no job id to meet by, --workers under srun) exits 2.
# Parts 1-2 skip (the rest still runs) when mpirun is missing or dtrain was
# built without MPI; the test then exits 77 (reported as skipped) unless
# something failed.
# Every process is bounded by a deadline and stopped by pid.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CFG="$SRC/examples/fashion_mlp.ini"
SHORT=(--set train.epochs=1 --set data.limit_train=2000 --set data.limit_test=1000)
# Open MPI leaks in its dlopen'ed components; LeakSanitizer would blame dtrain.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

close_to() { awk -v a="$1" -v b="$2" -v e="$3" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(a != "" && d <= e)}'; }

"$DTRAIN" train "$CFG" --workers 2 "${SHORT[@]}" --out "$T/w2" >"$T/w2.out" 2>"$T/w2.err" </dev/null ||
  fail "train --workers 2: $(cat "$T/w2.err")"
ACC=$(json_num "$T/w2/summary.json" test_accuracy)
STEPS=$(json_num "$T/w2/summary.json" steps)
# ---- 1, 2: mpirun ------------------------------------------------------------
if ! command -v mpirun >/dev/null 2>&1; then
  skip_part "mpirun parts" "mpirun not found (apt-get install openmpi-bin)"
else
  for tr in mpi auto; do
    out="$T/m_$tr"
    # a private rendezvous directory: other tests run mpirun at the same time
    rdir="$T/rdzv_$tr"
    mkdir -p "$rdir"
    run_bounded 120 env DTRAIN_RDZV_DIR="$rdir" mpirun --allow-run-as-root --oversubscribe \
      -x DTRAIN_RDZV_DIR -n 2 "$DTRAIN" train "$CFG" \
      --set dist.transport=$tr "${SHORT[@]}" --out "$out" >"$out.out" 2>"$out.err" </dev/null
    rc=$?
    if [ $tr = mpi ] && grep -q "transport 'mpi' unknown or not built" "$out.err"; then
      skip_part "mpirun parts" "dtrain was built without MPI"
      break
    fi
    [ $rc = 0 ] && pass || { fail "mpirun -n 2, transport $tr: exit $rc: $(tail -5 "$out.err")"; continue; }
    S="$out/summary.json"
    [ "$(json_num "$S" steps)" = "$STEPS" ] && pass || fail "mpirun $tr: steps $(json_num "$S" steps), --workers 2: $STEPS"
    [ "$(json_num "$S" workers)" = 2 ] && pass || fail "mpirun $tr: workers $(json_num "$S" workers)"
    close_to "$(json_num "$S" test_accuracy)" "$ACC" 0.001 && pass ||
      fail "mpirun $tr: test_accuracy $(json_num "$S" test_accuracy), --workers 2: $ACC"
    want=$tr; [ $tr = auto ] && want=shm
    [ "$(json_str "$S" transport)" = $want ] && pass || fail "mpirun $tr: transport $(json_str "$S" transport), want $want"
    [ "$(grep -c '^test accuracy' "$out.out")" = 1 ] && pass || fail "mpirun $tr: final line printed $(grep -c '^test accuracy' "$out.out") times"
    [ "$(grep -c '^dtrain .*started by mpirun' "$out.out")" = 1 ] && pass || fail "mpirun $tr: header: $(head -2 "$out.out")"
    grep -q "^comm: 2 ranks on 1 host; rank 0 reaches rank 1 over $want" "$out.out" && pass ||
      fail "mpirun $tr: comm line '$(grep '^comm' "$out.out")'"
    [ -z "$(ls -A "$rdir")" ] && pass || fail "mpirun $tr: rendezvous directory left: $(ls -A "$rdir")"
  done
fi

# ---- 3: srun-like environment ---------------------------------------------------
export DTRAIN_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=$(free_port)
pids=()
for r in 1 0; do
  SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=$$ DTRAIN_RDZV=127.0.0.1:$port \
    DTRAIN_HOST_ID=fakehost$r run_bounded 120 "$DTRAIN" train "$CFG" "${SHORT[@]}" --out "$T/s" \
    >"$T/s$r.out" 2>"$T/s$r.err" </dev/null &
  pids[$r]=$!
done
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] && pass || fail "srun-like: exit $rc0/$rc1: $(cat "$T/s0.err" "$T/s1.err")"
S="$T/s/summary.json"
[ "$(json_num "$S" steps)" = "$STEPS" ] && pass || fail "srun-like: steps $(json_num "$S" steps)"
close_to "$(json_num "$S" test_accuracy)" "$ACC" 0.001 && pass || fail "srun-like: test_accuracy $(json_num "$S" test_accuracy) vs $ACC"
[ "$(json_str "$S" transport)" = tcp ] && pass || fail "srun-like: transport $(json_str "$S" transport), want tcp"
grep -q '^comm: 2 ranks on 2 hosts; rank 0 reaches rank 1 over tcp$' "$T/s0.out" && pass || fail "srun-like: comm line '$(grep '^comm' "$T/s0.out")'"
[ ! -s "$T/s1.out" ] && pass || fail "srun-like: rank 1 printed: $(head -3 "$T/s1.out")"

# a rank whose peer never starts (file store in /tmp, DTRAIN_TIMEOUT=3)
t0=$(date +%s)
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=miss$$ DTRAIN_TIMEOUT=3 \
  run_bounded 30 "$DTRAIN" train "$CFG" "${SHORT[@]}" --out "$T/miss" >"$T/miss.out" 2>"$T/miss.err" </dev/null
rc=$?
[ $rc = 1 ] && pass || fail "missing rank: exit $rc, want 1"
[ $(($(date +%s) - t0)) -le 10 ] && pass || fail "missing rank: took $(($(date +%s) - t0)) s"
grep -q '^dtrain: rank 0 (srun SLURM_PROCID=0): joining the job: .*rank 1 of job train did not join before the deadline' "$T/miss.err" &&
  [ "$(wc -l <"$T/miss.err")" = 1 ] && pass || fail "missing rank: stderr '$(cat "$T/miss.err")'"
[ ! -e "/tmp/dtrain-rdzv-$(id -u)-miss$$.0" ] && pass || fail "missing rank: rendezvous directory left"

# bad input under srun
unset DTRAIN_JOB_TOKEN
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 expect_bad nojobid \
  '^dtrain: srun started 2 ranks but gave no job id to meet by: set DTRAIN_RDZV' train "$CFG"
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=1 expect_bad workers \
  '^dtrain: --workers 2: this process is already rank 0 of 2 started by srun' train "$CFG" --workers 2
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 DTRAIN_RDZV=127.0.0.1:$port expect_bad notoken \
  '^dtrain: DTRAIN_JOB_TOKEN is not set: a job that meets at DTRAIN_RDZV needs' train "$CFG"
SLURM_PROCID=3 SLURM_NTASKS=2 SLURM_STEP_ID=0 expect_bad badrank \
  "^dtrain: SLURM_PROCID '3': expects an integer in \[0, 1\]" train "$CFG"
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=1 expect_bad workers_key \
  '^dtrain: dist.workers = 4, but srun started a world of 2 ranks' train "$CFG" --set dist.workers=4

finish

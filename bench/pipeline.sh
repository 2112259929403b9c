#!/usr/bin/env bash
# bench/pipeline.sh — `make bench-pipeline`: pipeline parallelism on the deep
# MLP (examples/fashion_deep_mlp.ini, 18.4M parameters, batch 256), back to
# back on this machine:
#   1. samples/s of one process (plain training, the whole batch at once)
#      and of PyTorch Pipe (checkpoint=never)
#      vs 2 stages, 1f1b, m = 8 (target >= 1.7x), in paired rounds, and
#      two plain processes at once (what two cores give two processes);
#   2. the measured bubble (mean share of a stage's step time spent waiting
#      for its neighbours) next to (p-1)/(m+p-1), m = 2, 4, 8, 16;
#   3. PyTorch 1.13 Pipe (2 stages on CPU, same model and m; target: dtrain
#      >= 3x its samples/s);
#   4. peak RSS per rank (VmHWM): 1f1b vs gpipe at m = 16, recompute (rss);
#      and per rank for P = 1, 2, 3 stages against each stage's parameters,
#      gradients and momentum (memory: issue 14's "about 1/P of the whole");
#   5. recomputation's extra step time and CPU (gpipe and 1f1b, m = 16, paired rounds);
#   6. (gemm) the stage's products at 32 rows against one process's at 256,
#      with the second core idle and busy (bench/bench_pipe_gemm.c);
#   7. (wgrad, not part of all) deferred weight gradients on and off
#      (DTRAIN_PIPE_WGRAD=1/0), 2 stages 1f1b m = 8, in alternating pairs:
#      the ranks' CPU per sample (a count the load moves little) and
#      samples/s, per pair and as paired medians, and each stage's
#      activation memory with and without the stash.
# Each dtrain figure is the median of DT_BENCH_REPS runs of DT_BENCH_STEPS
# steps (training time only, from summary.json). The machine has 2 cores
# and is shared: re-run before believing a single number.
# Env: BUILD (default build/release), DT_BENCH_STEPS (30), DT_BENCH_REPS (3),
#      DT_BENCH_ONLY (all, or one of speed wpack breakdown gemm bubble recompute torch rss memory; or accuracy,
#      the two accuracy runs, ~30 minutes, or wgrad, not part of all), DT_BENCH_GEMM_ROUNDS (gemm's rounds, 15),
#      DT_BENCH_PAIRS (wgrad's pairs, 5).
set -u
SRC="$(cd "$(dirname "$0")/.." && pwd)"
cd "$SRC" || exit 1
BUILD="${BUILD:-build/release}"
STEPS="${DT_BENCH_STEPS:-30}"
REPS="${DT_BENCH_REPS:-3}"
ONLY="${DT_BENCH_ONLY:-all}"
want() { [ "$ONLY" = all ] || [ "$ONLY" = "$1" ]; }
DT="$BUILD/dtrain"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/dt_bench_pipe.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
CFG=examples/fashion_deep_mlp.ini
# no epoch-end checkpoint (150 MB of disk writes per run that time nothing)
BASE=(--set train.epochs=1 --set "data.limit_train=$((256 * STEPS))" --set data.limit_test=256
      --set ckpt.epoch_end=false)

# cpu NAME -> every rank's CPU seconds per 1000 samples of run NAME
cpu() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.3f' % (1000 * sum(w['cpu_seconds'] for w in d['per_worker']) / d['train_samples']))" "$OUT/$1/summary.json" 2>/dev/null || echo 0; }

# run NAME ARGS... -> prints samples/s, bubble and peak RSS (MiB, max over
# the ranks' own peak_rss_bytes in summary.json). No polling of /proc while
# it runs: a loop of pgrep and awk every 0.2 s took CPU from the 2-stage
# runs (both cores busy), not from the 1-process one (a core free): 2
# stages ran 1.031x as fast without it (median of 5 alternating pairs, 5 of
# 5 faster, 2026-11-28, bench/RESULTS.md).
run() {
  local name=$1
  shift
  "$DT" train "$CFG" "${BASE[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 ||
    { echo "FAILED: $name: $(tail -2 "$OUT/$name.log")" >&2; echo "0 0 0"; return; }
  /usr/bin/python3 - "$OUT/$name/summary.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
per = d.get("per_worker") or []
b = [w["comm_seconds"] / w["train_seconds"] for w in per if w.get("train_seconds")]
rss = max([d.get("peak_rss_bytes", 0)] + [w.get("peak_rss_bytes", 0) for w in per])
print(f'{d["samples_per_second"]:.1f} {sum(b) / len(b) if b else 0:.3f} {rss / 1048576:.0f}')
PY
}

# median NAME ARGS... -> "samples/s bubble rss" of the run with the median samples/s
median() {
  local name=$1
  shift
  for i in $(seq "$REPS"); do run "$name$i" "$@"; done | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'
}

if want speed; then
echo "== deep MLP, batch 256, $STEPS steps, $REPS rounds: in each, 1 process then 2 stages (1f1b, m=8) then 2 stages without packed forward weights (DTRAIN_PIPE_WPACK=0), with weight gradients per micro-batch (DTRAIN_PIPE_WGRAD=0), without the extra warm-up forward (DTRAIN_PIPE_WARMUP=0), with stage 0's helper thread (DTRAIN_PIPE_TAIL=1), with DTRAIN_PIPE_OFFLOAD flipped from its default, then PyTorch Pipe (checkpoint=never, where python3 has torch); medians, and the median of each round's ratio"
# The baseline is plain training in one process (the whole batch at once,
# strategy local): the example config asks for 8 micro-batches, which in
# one process would be micro-batch accumulation, slower than one batch.
P2=(--workers 2 --set dist.pipeline_stages=2 --set dist.schedule=1f1b --set dist.micro_batches=8)
# the same 2 stages in PyTorch 1.13's Pipe (bench/pipeline_vs_torch.py, as
# in the torch section), one run per round, 0 without torch
have_torch=0
/usr/bin/python3 -c 'import torch' 2>/dev/null && have_torch=1
tpn() { [ "$have_torch" = 1 ] && /usr/bin/python3 bench/pipeline_vs_torch.py 8 "$((STEPS / 3 + 2))" 256 never 2>/dev/null | awk '/torch_pipe/ {print $3}'; }
# the last stage making stage 0's first weight gradient (DTRAIN_PIPE_OFFLOAD):
# the run with it flipped from the binary's default (none where the binary
# has no such knob: "0 0 0")
od=$("$DT" env 2>/dev/null | awk '$1 == "DTRAIN_PIPE_OFFLOAD" {print $3}')
for i in $(seq "$REPS"); do
  t=$(tpn)
  o="0 0 0"
  [ -n "$od" ] && o=$(DTRAIN_PIPE_OFFLOAD=$((1 - od)) run "p2o$i" "${P2[@]}")
  # the machine's own ceiling for two processes: two plain one-process
  # runs at once, their samples/s summed
  run "twoa$i" --set dist.micro_batches=1 >"$OUT/twoa$i.txt" &
  run "twob$i" --set dist.micro_batches=1 >"$OUT/twob$i.txt"
  wait
  two=$(cat "$OUT/twoa$i.txt" "$OUT/twob$i.txt" | awk '{s += $1} END {printf "%.1f", s}')
  echo "$(run "one$i" --set dist.micro_batches=1) $(run "p2$i" "${P2[@]}") $(DTRAIN_PIPE_WPACK=0 run "p2p$i" "${P2[@]}") $(DTRAIN_PIPE_WGRAD=0 run "p2w$i" "${P2[@]}") $(DTRAIN_PIPE_WARMUP=0 run "p2u$i" "${P2[@]}") ${t:-0} $(DTRAIN_PIPE_TAIL=1 run "p2t$i" "${P2[@]}") $o $two"
done > "$OUT/speed.txt"
# columns: 1 process (sps bubble rss), 2 stages (sps bubble rss), no wpack (...), no wgrad (...),
# no extra warm-up (...), Pipe (sps), helper thread (sps bubble rss), offload flipped (...),
# two plain processes at once (summed sps)
awk -v od="${od:-}" '
  function med(v, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                                  return v[int((n + 1) / 2)] }
  { n++; o[n] = $1; p[n] = $4; b[n] = $5; r[n] = $6; q[n] = $7; w[n] = $10; x[n] = $4 / $1; y[n] = $4 / $7; z[n] = $4 / $10
    u[n] = $13; ub[n] = $14; v[n] = $4 / $13; tp[n] = $16; tr[n] = $16 > 0 ? $4 / $16 : 0
    hs[n] = $17; hb[n] = $18; hr[n] = $17 > 0 ? $4 / $17 : 0
    os[n] = $20; ob[n] = $21; orr[n] = $20 > 0 ? $4 / $20 : 0
    tw[n] = $23; twr[n] = $23 / $1; twp[n] = $4 / $23 }
  END {
    printf "1 process:              %.1f samples/s (median)\n", med(o, n)
    printf "2 stages 1f1b m=8:      %.1f samples/s  bubble %.3f  peak RSS %d MiB per rank (medians)\n", med(p, n), med(b, n), med(r, n)
    printf "speed-up: %.2fx (median of %d paired rounds; ratio of the medians %.2fx; target >= 1.7x)\n", med(x, n), n, med(p, n) / med(o, n)
    printf "two plain processes at once (the machine'"'"'s ceiling for two): %.1f samples/s, %.2fx one process; 2 stages reach %.2fx of it (medians of the rounds)\n", med(tw, n), med(twr, n), med(twp, n)
    printf "same, forward weights packed per micro-batch (DTRAIN_PIPE_WPACK=0): %.1f samples/s; packed once per step: %.2fx of it\n", med(q, n), med(y, n)
    printf "same, weight gradients per micro-batch (DTRAIN_PIPE_WGRAD=0): %.1f samples/s; deferred: %.2fx of it\n", med(w, n), med(z, n)
    printf "same, without the extra warm-up forward (DTRAIN_PIPE_WARMUP=0): %.1f samples/s, bubble %.3f; with it: %.2fx of it\n", med(u, n), med(ub, n), med(v, n)
    printf "same, with the helper thread of stage 0 (DTRAIN_PIPE_TAIL=1): %.1f samples/s, bubble %.3f; without it: %.2fx of it\n", med(hs, n), med(hb, n), med(hr, n)
    if (od == "") print "same, DTRAIN_PIPE_OFFLOAD flipped: not run (the binary has no such knob)"
    else if (od == 0)
      printf "same, with the last stage making the first weight gradient of stage 0 (DTRAIN_PIPE_OFFLOAD=1): %.1f samples/s, bubble %.3f; without it (the default): %.2fx of it\n", med(os, n), med(ob, n), med(orr, n)
    else
      printf "same, with stage 0 making its first weight gradient itself (DTRAIN_PIPE_OFFLOAD=0): %.1f samples/s, bubble %.3f; with the offload (the default): %.2fx of it\n", med(os, n), med(ob, n), med(orr, n)
    if (med(tp, n) > 0)
      printf "PyTorch Pipe (checkpoint=never, the same arithmetic): %.1f samples/s; dtrain 2 stages: %.2fx of it (median of %d paired rounds; target >= 3x)\n", med(tp, n), med(tr, n), n
    else print "PyTorch Pipe: not run (no torch in /usr/bin/python3)"
  }' "$OUT/speed.txt"

fi

if want wpack; then
# Packing a stage's forward weights once per step (DTRAIN_PIPE_WPACK=1)
# against packing them per micro-batch inside the GEMM (0), 2 stages 1f1b
# m=8, on three shapes: the bench's deep MLP at batch 256 (micro-batches of
# 32 rows) and 128 (16 rows), and a 1024-wide one at batch 256. Paired
# rounds (the order alternates), medians; CPU is both stages' CPU seconds
# per 1000 samples (less sensitive to other load than samples/s).
echo "== forward weights packed once per step (WPACK=1) vs per micro-batch (WPACK=0), 2 stages 1f1b m=8, $STEPS steps, $REPS paired rounds"
P2=(--workers 2 --set dist.pipeline_stages=2 --set dist.schedule=1f1b --set dist.micro_batches=8)
W1024="flatten linear(1024) relu linear(1024) relu dropout(0.2) linear(1024) relu linear(1024) relu dropout(0.2) linear(1024) relu linear(10)"
for shape in "deep-256|256|" "deep-128|128|" "w1024-256|256|$W1024"; do
  IFS='|' read -r tag batch layers <<<"$shape"
  X=(--set "train.batch=$batch" --set "data.limit_train=$((batch * STEPS))")
  [ -n "$layers" ] && X+=(--set "model.layers=$layers")
  for i in $(seq "$REPS"); do
    if [ $((i % 2)) = 1 ]; then
      a=$(DTRAIN_PIPE_WPACK=1 run "wp1$tag$i" "${P2[@]}" "${X[@]}"); ca=$(cpu "wp1$tag$i")
      b=$(DTRAIN_PIPE_WPACK=0 run "wp0$tag$i" "${P2[@]}" "${X[@]}"); cb=$(cpu "wp0$tag$i")
    else
      b=$(DTRAIN_PIPE_WPACK=0 run "wp0$tag$i" "${P2[@]}" "${X[@]}"); cb=$(cpu "wp0$tag$i")
      a=$(DTRAIN_PIPE_WPACK=1 run "wp1$tag$i" "${P2[@]}" "${X[@]}"); ca=$(cpu "wp1$tag$i")
    fi
    echo "${a%% *} $ca ${b%% *} $cb"
  done > "$OUT/wpack_$tag.txt"
  awk -v t="$tag" '
    function med(v, n,   i, j, x) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
                                    return v[int((n + 1) / 2)] }
    { n++; a[n] = $1; ca[n] = $2; b[n] = $3; cb[n] = $4; r[n] = $1 / $3; c[n] = $4 > 0 ? $2 / $4 : 0 }
    END { printf "%-10s WPACK=1 %7.1f samples/s %6.3f CPU s/1000 | WPACK=0 %7.1f samples/s %6.3f CPU s/1000 | packed/unpacked: speed %.3fx, CPU %.3fx (paired medians of %d)\n",
                 t, med(a, n), med(ca, n), med(b, n), med(cb, n), med(r, n), med(c, n), n }' "$OUT/wpack_$tag.txt"
done
fi

if want gemm; then
# Why a stage's compute exceeds its share of one process's step: its
# forward and input-gradient products have 32 rows (256 / m), one process's
# 256, and the other core is busy (the other stage) where one process runs
# alone. bench_pipe_gemm times both at the deep MLP's shapes (thread CPU
# time, paired rounds) and weights them by stage 0's FLOPs.
echo "== GEMM: 256 rows as 8 products of 32 vs 1 of 256, deep MLP shapes, second core idle / busy"
cmake --build "$BUILD" --target bench_pipe_gemm -j2 >/dev/null 2>&1 || echo "FAILED: building bench_pipe_gemm" >&2
"$BUILD/bench_pipe_gemm" "${DT_BENCH_GEMM_ROUNDS:-15}"
fi

if want breakdown; then
# Where a step's time goes, per stage of 2 stages 1f1b m=8, next to one
# process (plain training): each stage's step split into compute (its
# forwards, backwards, weight packing and deferred weight gradients),
# waiting (send/recv, and ranks > 0 waiting for stage 0 in the per-step
# checkpoint agreement) and the rest (optimizer step on its span, data); and its compute against its share of
# the one process's step (the share of the model's
# GEMM work: 3 products per linear parameter, 2 for the first layer, which
# makes no input gradient; the stages' parameter counts are read from the
# partition printed at start): above 1 is what small micro-batch GEMMs and
# two processes sharing caches and memory cost.
echo "== breakdown: ms per step, 2 stages 1f1b m=8 vs 1 process, $STEPS steps, $REPS paired rounds (medians)"
for i in $(seq "$REPS"); do
  run "bd1_$i" --set dist.micro_batches=1 >/dev/null
  run "bd2_$i" --workers 2 --set dist.pipeline_stages=2 --set dist.schedule=1f1b --set dist.micro_batches=8 >/dev/null
done
/usr/bin/python3 - "$OUT" "$REPS" "$STEPS" <<'PY'
import json, re, statistics as st, sys
out, reps, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
one, rows, ratio = [], [[], []], []
for i in range(1, reps + 1):
    try:
        a = json.load(open(f"{out}/bd1_{i}/summary.json"))
        b = json.load(open(f"{out}/bd2_{i}/summary.json"))
    except OSError:
        continue
    t1 = 1000 * a["train_seconds"] / a["steps"]
    # GEMM units per stage: 3 per parameter, the first layer's (784 x 2048 + 2048) 2
    cost = [3e6 * float(x) for x in re.findall(r"stage \d+: layers .*?, ([0-9.]+)M params", open(f"{out}/bd2_{i}.log").read())]
    if cost:
        cost[0] -= 784 * 2048 + 2048
    one.append(t1)
    ratio.append(a["train_seconds"] / b["train_seconds"])
    for w in b["per_worker"]:
        r, n = w["rank"], b["steps"]
        share = cost[r] / sum(cost) if len(cost) == 2 else 0.5
        t, c, q = (1000 * w[k] / n for k in ("train_seconds", "compute_seconds", "comm_seconds"))
        rows[r].append((t, c, q, t - c - q, share, c / (share * t1)))
if not one or not rows[0] or not rows[1]:
    sys.exit("breakdown: no complete round")
print(f"1 process: {st.median(one):.1f} ms per step (plain training, batch 256)")
for r in (0, 1):
    if not rows[r]:
        continue
    m = [st.median(x[k] for x in rows[r]) for k in range(6)]
    print(f"stage {r}: {m[0]:.1f} ms per step = compute {m[1]:.1f} + waiting {m[2]:.1f} + other {m[0] - m[1] - m[2]:.1f}; "
          f"share of the model {m[4]:.3f}: compute / (share x 1 process) = {m[5]:.2f}")
print(f"speed-up {st.median(ratio):.2f}x (median of {len(ratio)} paired rounds); the slowest stage's "
      f"compute alone bounds it at {st.median(one) / max(st.median(x[1] for x in rows[r]) for r in (0, 1)):.2f}x")
# the two stages' compute together against one process's step: with any
# split and no waiting at all, 2 cores give at most 2 / that
both = st.median(one) / (st.median(x[1] for x in rows[0]) + st.median(x[1] for x in rows[1]))
print(f"both stages' compute together: {1 / both:.2f} of one process's step; with a perfect split "
      f"and no waiting 2 stages reach at most {2 * both:.2f}x")
# each stage's time line (rank 0's "pipeline time per step" lines, ms per
# step): medians over the rounds, and each part against the stage's share
# of one process's step (the same split of the model's GEMM work)
keys = ["forward", "backward", "packing", "weight gradients", "optimizer", "receiving", "sends",
        "replica reduction", "checkpoint agreement"]
ph = [[], []]
for i in range(1, reps + 1):
    try:
        txt = open(f"{out}/bd2_{i}.log").read()
    except OSError:
        continue
    for r in (0, 1):
        m = re.search(rf"^stage {r}: forward .*$", txt, re.M)
        if m:
            ph[r].append([float(re.search(rf"{k} ([0-9.]+)", m.group(0)).group(1)) for k in keys])
for r in (0, 1):
    if not ph[r] or not rows[r]:
        continue
    med = [st.median(x[k] for x in ph[r]) for k in range(len(keys))]
    share = st.median(x[4] for x in rows[r]) * st.median(one)
    print(f"stage {r} time line (ms per step, medians): " + ", ".join(f"{k} {v:.1f}" for k, v in zip(keys, med)))
    print(f"stage {r}: forward + backward + weight gradients = {sum(med[:4]):.1f} ms against its share of "
          f"one process's step {share:.1f} ms ({sum(med[:4]) / share:.2f}); per micro-batch "
          f"forward {med[0] / 8:.2f} ms, backward {med[1] / 8:.2f} ms")
PY
fi

if want bubble; then
echo "== bubble, 2 stages 1f1b: measured vs (p-1)/(m+p-1)"
for m in 2 4 8 16; do
  r=$(median "b$m" --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=$m)
  awk -v m=$m -v r="$r" 'BEGIN {split(r, f, " "); printf "m=%-3d samples/s %8.1f  bubble %.3f  ideal %.3f\n", m, f[1], f[2], 1 / (m + 1)}'
done

fi

if want recompute; then
# train.recompute against keeping the activations, 2 stages, m = 16, gpipe
# (the schedule that holds every micro-batch) and 1f1b; paired rounds in
# alternating order; extra step time = median of the rounds' time ratios,
# CPU = both stages' CPU seconds per 1000 samples (paired median ratio).
echo "== recomputation's time, 2 stages m=16 with and without train.recompute ($REPS paired rounds; target: <= 35% extra step time at >= 3x less activation memory)"
for sched in gpipe 1f1b; do
  # the balanced cut of a quiet machine, fixed (measured at start under
  # load it moves, and with it both the memory and the time of a run)
  G=(--workers 2 --set dist.pipeline_stages=2 --set "dist.schedule=$sched" --set dist.micro_batches=16
     --set model.stages=7)
  for i in $(seq "$REPS"); do
    if [ $((i % 2)) = 1 ]; then
      a=$(run "g$sched$i" "${G[@]}"); b=$(run "gr$sched$i" "${G[@]}" --set train.recompute=true)
    else
      b=$(run "gr$sched$i" "${G[@]}" --set train.recompute=true); a=$(run "g$sched$i" "${G[@]}")
    fi
    echo "${a%% *} $(cpu "g$sched$i") ${b%% *} $(cpu "gr$sched$i")"
  done > "$OUT/recompute_$sched.txt"
  awk -v t="$sched" '
    function med(v, n,   i, j, x) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
                                    return v[int((n + 1) / 2)] }
    { n++; a[n] = $1; b[n] = $3; r[n] = $3 > 0 ? $1 / $3 : 0; c[n] = $2 > 0 ? $4 / $2 : 0 }
    END { printf "%s m=16: %.1f samples/s kept, %.1f with recompute: recompute %+.0f%% step time, %+.0f%% CPU per sample (paired medians of %d)\n",
                 t, med(a, n), med(b, n), (med(r, n) - 1) * 100, (med(c, n) - 1) * 100, n }' "$OUT/recompute_$sched.txt"
  echo "activation memory per stage as allocated, without and with recompute:"
  grep -h "activation memory" "$OUT/g${sched}1.log" "$OUT/gr${sched}1.log"
done

fi

if want torch; then
echo "== PyTorch 1.13 Pipe, 2 stages on CPU, m=8, back to back"
# Pipe, 2 partitions, chunks = m = 8, the same 784-2048x5-10 MLP with the
# same dropout, batch 256, SGD momentum; checkpoint="never" (dtrain keeps
# its activations too) and Pipe's default "except_last" (recomputes 7 of 8
# micro-batches), each once per round, alternating with dtrain's runs;
# medians over DT_BENCH_REPS rounds.
tp() { /usr/bin/python3 bench/pipeline_vs_torch.py 8 "$((STEPS / 3 + 2))" 256 "$1" 2>/dev/null | awk '/torch_pipe/ {print $3}'; }
for i in $(seq "$REPS"); do
  echo "$(tp never) $(tp except_last) $(run "p2b$i" --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=8)"
done > "$OUT/torch.txt"
med() { awk -v c="$1" '{print $c}' "$OUT/torch.txt" | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }
tn=$(med 1) te=$(med 2) d=$(med 3)
echo "torch Pipe ($(/usr/bin/python3 -c 'import os; print(os.cpu_count())') intra-op threads in one process): checkpoint=never $tn, except_last $te samples/s; dtrain 2 stages 1f1b m=8: $d samples/s"
awk -v a="$tn" -v e="$te" -v b="$d" 'BEGIN {if (a > 0 && e > 0) printf "dtrain / Pipe: %.2fx against checkpoint=never (the same arithmetic; target >= 3x), %.2fx against Pipe'"'"'s default except_last\n", b / a, b / e}'

fi

# The accuracy bars (issue 14: deep MLP >= 0.890, deep CNN >= 0.920, with the
# pipeline): the example configs as they are (8 epochs, SGD momentum 0.9,
# cosine), 2 stages 1f1b. About 10 + 20 minutes on a quiet machine, so only
# with DT_BENCH_ONLY=accuracy (never in `all`). Measured 2026-11-23 under
# load: MLP 0.8942 after epoch 7, 0.8951 after 8; CNN 0.9206 after epoch 5,
# 0.9356 after 8 (bench/RESULTS.md).
if [ "$ONLY" = accuracy ]; then
for cfg in examples/fashion_deep_mlp.ini examples/fashion_deep_cnn.ini; do
  echo "== $cfg, 2 stages, 1f1b (test accuracy per epoch)"
  "$DT" train "$cfg" --workers 2 --set dist.pipeline_stages=2 --out "$OUT/acc" 2>&1 | grep -E '^epoch'
  rm -rf "$OUT/acc"
done
fi

if want memory; then
echo "== memory per rank (issue 14: per-stage parameters + optimizer state about 1/P of the whole): peak RSS of each rank (summary.json per_worker peak_rss_bytes, VmHWM) minus a baseline run with the same data and worker count (a 10-output linear model); deep MLP, $STEPS steps, no checkpoints"
# The data set (about 220 MiB of floats) is in every rank (inherited from
# the launcher); the baseline takes it out. What is left: the stage's
# parameters, gradients and momentum (3 x 4 bytes per parameter), with
# m > 1 the packed forward weights (one more copy of the stage's linear
# weights, DTRAIN_PIPE_WPACK), activations and the deferred weight
# gradients' stash.
# memrun NAME ARGS... -> every rank's peak RSS in MiB, rank order
memrun() {
  local name=$1
  shift
  "$DT" train "$CFG" "${BASE[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 ||
    { echo "FAILED: $name: $(tail -2 "$OUT/$name.log")" >&2; return; }
  /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join('%.0f' % (w['peak_rss_bytes'] / 1048576) for w in d.get('per_worker') or [d]))" "$OUT/$name/summary.json"
}
# the whole model: 1 process, plain training (18.4M parameters, 3 x 4 bytes each)
/usr/bin/python3 - <<'PY'
n = 784 * 2048 + 2048 + 4 * (2048 * 2048 + 2048) + 2048 * 10 + 10
print("whole model: %.1fM parameters; parameters + gradients + momentum %.0f MiB" % (n / 1e6, 3 * 4 * n / 1048576))
PY
declare -A B
for W in 1 2 3 4; do
  B[$W]=$(memrun "mb$W" --set "model.layers=flatten linear(10)" --set dist.micro_batches=1 --workers "$W")
  echo "baseline ($W worker(s), per rank): ${B[$W]} MiB"
done
memshow() { # LABEL W NAME ARGS...
  local label=$1 w=$2 name=$3
  shift 3
  local r
  r=$(memrun "$name" "$@")
  /usr/bin/python3 - "$label" "$r" "${B[$w]}" "$OUT/$name.log" <<'PY'
import re, sys
label, r, b, log = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
stages = re.findall(r"stage (\d+): layers .*?, ([\d.]+)M params", open(log).read())
above = [int(x) - int(y) for x, y in zip(r, b)]
out = "%-40s peak RSS above baseline per rank: %s MiB" % (label, ", ".join(map(str, above)))
if stages:
    out += "; params+grads+momentum per stage %s MiB" % ", ".join("%.0f" % (12 * float(p) * 1e6 / 1048576) for _, p in stages)
print(out)
PY
}
memshow "1 process (plain, m=1)" 1 w1 --set dist.micro_batches=1
# fixed cuts (the measured balance moves with the load): 2 stages as the
# balanced split cuts (10.0M / 8.4M parameters); 3 stages 5.8M / 8.4M /
# 4.2M (2048 x 2048 layers of 4.2M each allow no better)
S2=(--workers 2 --set dist.pipeline_stages=2 --set model.stages=7 --set dist.micro_batches=16)
S3=(--workers 3 --set dist.pipeline_stages=3 --set model.stages=6,9 --set dist.micro_batches=16)
memshow "2 stages 1f1b m=16" 2 w2 "${S2[@]}" --set dist.schedule=1f1b
DTRAIN_PIPE_WPACK=0 memshow "2 stages 1f1b m=16, no packed weights" 2 w2p "${S2[@]}" --set dist.schedule=1f1b
memshow "2 stages gpipe m=16" 2 w2g "${S2[@]}" --set dist.schedule=gpipe
memshow "3 stages 1f1b m=16" 3 w3 "${S3[@]}" --set dist.schedule=1f1b
DTRAIN_PIPE_WPACK=0 memshow "3 stages 1f1b m=16, no packed weights" 3 w3p "${S3[@]}" --set dist.schedule=1f1b
# hybrid 2 replicas x 2 stages: each stage's momentum over its 2 replicas with dist.zero
S22=(--workers 4 --set dist.pipeline_stages=2 --set model.stages=7 --set dist.micro_batches=16 --set dist.schedule=1f1b)
memshow "2 replicas x 2 stages 1f1b m=16" 4 w22 "${S22[@]}"
memshow "2 x 2, dist.zero=1 (momentum 1/2 per rank)" 4 w22z "${S22[@]}" --set dist.zero=1
echo "activation memory per stage as allocated (rank 0's start line): 2 stages 1f1b, gpipe, 3 stages 1f1b, m = 16"
for n in w2 w2g w3; do grep -h "activation memory" "$OUT/$n.log"; done
fi

if want rss; then
echo "== peak RSS per rank (MiB): minus a baseline run (same data, a 10-output linear model)"
# The data set (Fashion-MNIST as floats, about 220 MiB) is in every rank;
# the baseline takes it out so what is left is the model's memory.
rss() { local r; r=$(run "$@"); echo "${r##* }"; }
base1=$(rss base1 --set "model.layers=flatten linear(10)")
base2=$(rss base2 --set "model.layers=flatten linear(10)" --workers 2)
echo "baseline: 1 process $base1 MiB, 2 workers $base2 MiB per rank"
show() { # LABEL BASE NAME ARGS...
  local label=$1 b=$2 name=$3
  shift 3
  local r
  r=$(run "$name" "$@")
  awk -v l="$label" -v r="$r" -v b="$b" 'BEGIN {split(r, f, " "); printf "%-34s %6.0f MiB above baseline (samples/s %.1f)\n", l, f[3] - b, f[1]}'
}
show "1 process (params+grads+momentum)" "$base1" m1 --set dist.micro_batches=1
show "2 stages 1f1b m=16" "$base2" m2 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=1f1b
# 1f1b within PipeDream's bound (at most P - s micro-batches on stage s,
# nothing step-sized): no deferred weight-gradient stash, no extra warm-up
DTRAIN_PIPE_WGRAD=0 DTRAIN_PIPE_WARMUP=0 show "2 stages 1f1b m=16 bounded" "$base2" m2b --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=1f1b
show "2 stages gpipe m=16" "$base2" m3 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=gpipe
show "2 stages gpipe m=16 recompute" "$base2" m4 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=gpipe --set train.recompute=true
show "2 stages 1f1b m=16 recompute" "$base2" m5 --workers 2 --set dist.pipeline_stages=2 --set dist.micro_batches=16 --set dist.schedule=1f1b --set train.recompute=true
show "ddp 2 workers" "$base2" m6 --workers 2
show "ZeRO-1 2 workers" "$base2" m7 --workers 2 --set dist.zero=1
echo "activation memory per stage as allocated (rank 0's start line):"
for n in m2 m2b m3 m4 m5; do grep -h "activation memory" "$OUT/$n.log"; done
fi

if [ "$ONLY" = wgrad ]; then
PAIRS="${DT_BENCH_PAIRS:-5}"
echo "== deferred weight gradients: 2 stages 1f1b m=8, $STEPS steps, $PAIRS pairs (DTRAIN_PIPE_WGRAD=1 then =0)"
P2=(--workers 2 --set dist.pipeline_stages=2 --set dist.schedule=1f1b --set dist.micro_batches=8)
for i in $(seq "$PAIRS"); do
  DTRAIN_PIPE_WGRAD=1 run "wg1_$i" "${P2[@]}" >/dev/null
  DTRAIN_PIPE_WGRAD=0 run "wg0_$i" "${P2[@]}" >/dev/null
done
/usr/bin/python3 - "$OUT" "$PAIRS" <<'PY'
import json, statistics as st, sys
out, n = sys.argv[1], int(sys.argv[2])
def get(name):
    try:
        d = json.load(open(f"{out}/{name}/summary.json"))
    except OSError:
        return None
    return 1000 * sum(w["cpu_seconds"] for w in d["per_worker"]) / d["train_samples"], d["samples_per_second"]
cpu, sps = [], []
for i in range(1, n + 1):
    a, b = get(f"wg1_{i}"), get(f"wg0_{i}")
    if not a or not b:
        continue
    cpu.append(b[0] / a[0]); sps.append(a[1] / b[1])
    print(f"pair {i}: ranks' CPU ms per sample on {a[0]:.3f} off {b[0]:.3f} (off/on {b[0] / a[0]:.2f}); samples/s on {a[1]:.1f} off {b[1]:.1f} (on/off {a[1] / b[1]:.2f})")
if not cpu:
    sys.exit("wgrad: no complete pair")
print(f"paired medians: CPU per sample off/on {st.median(cpu):.2f}x; samples/s on/off {st.median(sps):.2f}x")
PY
for w in 1 0; do echo "DTRAIN_PIPE_WGRAD=$w: $(grep -h "activation memory" "$OUT/wg${w}_1.log")"; done
fi

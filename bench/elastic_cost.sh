#!/usr/bin/env bash
# bench/elastic_cost.sh — what elastic training costs while nothing fails
# (issue 11: "within 2% of today's data-parallel numbers"), `make
# bench-elastic-cost`. PAIRS (default 6) pairs of the same 2-worker MLP
# job (EPOCHS epochs, default 3), elastic off (plain ddp) and on
# (dist.min_workers = 1: watcher thread, heartbeats, the launcher's store
# serving them), in alternating order. Per run, under `perf stat` (the
# launcher and its workers): task-clock, context switches and, where the
# CPU exposes it, instructions:u (a VM without a PMU says "not supported":
# then n/a); from summary.json the samples/s and the workers' CPU in the
# training loop. Printed: per pair the on/off ratios, then paired medians
# of samples/s (wall clock), CPU per sample (job and workers' loop),
# context switches per sample and instructions per sample; and, from the
# "on" runs, the CPU and wake-ups of elastic's own threads (dt-watch in
# each worker, dt-store in the launcher, read from /proc schedstat over
# the middle of the run) as a share of the workers' CPU: the cost that
# does not depend on how busy the machine is.
# EPOCHS >= 3 (elastic's threads are read from the first epoch's end on).
# STRACE=1 adds one pair under `strace -c -f` (1 epoch): syscalls per
# sample, on and off, and the calls that differ most.
# HB_AMP=T adds a third run to each pair, elastic on with
# dist.heartbeat_timeout = T (the watcher beats every T / 4 instead of every
# 0.5 s): what N times the watcher's wake-ups cost, read against off; the
# default's cost is at most that over N (the wake-ups are its only per-second
# work), which bounds it below what the pairs' scatter can show.
# RT=1 runs each job under `chrt -f 1` (SCHED_FIFO: the machine's other
# processes cannot preempt it; root): wall clock and CPU per sample as on a
# quiet machine while others load it. Keep such runs short: the job's
# spinning workers leave the others only the kernel's RT throttling share.
# ON_SET=KEY=VALUE replaces the "on" run's dist.min_workers=1: with a key
# that changes nothing (ON_SET=train.seed=42) the pairs compare the job with
# itself, which shows the bench's own bias and scatter.
# Takes ~PAIRS x 2 x (EPOCHS x 0.7 s + 2 s) on a quiet machine (~45 s).
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN=${DTRAIN:-$SRC/${BUILD:-build/release}/dtrain} # make build's, as the other benches
PAIRS=${PAIRS:-6}
NAME=$(basename "$DTRAIN" | cut -c1-15) # the processes' name (pgrep -x)
ON_SET=${ON_SET:-dist.min_workers=1} # the "on" run's --set (ON_SET=train.seed=42: an A/A calibration)
OWN_S=${OWN_S:-1.5} # how long elastic's threads are read mid-run, s
EPOCHS=${EPOCHS:-3}
T=$(mktemp -d /tmp/dtrain_bench_elcost.XXXXXX)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1
med() { printf '%s\n' "$@" | grep -v n/a | sort -g | awk '{a[NR]=$1} END{if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2); else print "n/a"}'; }
# ci X... — the median and its 95% bootstrap interval (2000 resamples of
# the pairs): "0.991 [0.975, 1.004]"; 2% is shown when the interval lies
# within [0.98, 1.02]
ci() {
  printf '%s\n' "$@" | grep -v n/a | python3 -c '
import random, statistics, sys
x = [float(v) for v in sys.stdin.read().split()]
if not x: print("n/a"); sys.exit()
rnd = random.Random(1)
m = sorted(statistics.median(rnd.choices(x, k=len(x))) for _ in range(2000))
print("%.4f [%.4f, %.4f]" % (statistics.median(x), m[50], m[1949]))'
}
perf stat -x, -e task-clock true >/dev/null 2>&1 || { echo "perf stat does not work here"; exit 77; }
rt=()
if [ "${RT:-0}" = 1 ]; then
  chrt -f 1 true 2>/dev/null || { echo "RT=1: chrt -f 1 is not allowed here"; exit 77; }
  rt=(chrt -f 1)
fi

# threads NAME PIDS... — "cpu_ns slices" summed over the threads of PIDS
# called NAME (NAME '*': all of them)
threads() {
  local name=$1 p t ns=0 sl=0
  shift
  for p in "$@"; do
    for t in /proc/"$p"/task/*; do
      [ "$name" = '*' ] || [ "$(cat "$t/comm" 2>/dev/null)" = "$name" ] || continue
      set -- $(cat "$t/schedstat" 2>/dev/null) 0 0 0
      ns=$((ns + $1)); sl=$((sl + $3))
    done
  done
  echo "$ns $sl"
}

# run ARM I — one job under perf stat; sets the figures of the run
run() {
  local arm=$1 i=$2 x=() d="$T/$1_$2"
  [ "$arm" = on ] && x=(--set "$ON_SET")
  [ "$arm" = amp ] && x=(--set dist.min_workers=1 --set dist.heartbeat_timeout="$HB_AMP")
  perf stat -x, -o "$d.perf" -e task-clock,context-switches,instructions:u -- \
    ${rt[@]+"${rt[@]}"} "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set train.epochs="$EPOCHS" \
    "${x[@]}" --out "$d" >"$d.log" 2>&1 </dev/null &
  local job=$! launcher="" workers="" a b c
  # the middle of the run: from the first epoch's end, 1.5 s of elastic's threads
  for _ in $(seq 1 1200); do [ -s "$d/events.jsonl" ] && break; sleep 0.05; done
  launcher=$(pgrep -P "$job" -x "$NAME" | head -1)
  workers=$(pgrep -P "$launcher" -x "$NAME" | tr '\n' ' ')
  if [ "$arm" != off ] && [ -n "$workers" ]; then
    a=($(threads dt-watch $workers) $(threads dt-store "$launcher") $(threads '*' $workers))
    sleep "$OWN_S"
    b=($(threads dt-watch $workers) $(threads dt-store "$launcher") $(threads '*' $workers))
    # watcher ns, slices; store ns, slices; workers' ns (void if a worker ended meanwhile)
    for p in $workers; do [ -d "/proc/$p" ] || b[4]=-1; done
    [ "${b[4]}" -gt "${a[4]}" ] && echo "$((b[0] - a[0])) $((b[1] - a[1])) $((b[2] - a[2])) $((b[3] - a[3])) $((b[4] - a[4]))" >"$d.own"
  fi
  wait $job || { echo "$arm run $i failed: $(tail -3 "$d.log")"; return 1; }
}

# figs ARM I — "samples/s job_cpu_ms_per_sample loop_cpu_s cs_per_sample instr_per_sample"
figs() {
  local d="$T/$1_$2"
  python3 - "$d/summary.json" "$d.perf" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
n = s['train_samples']
w = s['per_worker']
f = {}
for line in open(sys.argv[2]):
    p = line.strip().split(',')
    if len(p) > 2 and not line.startswith('#'):
        f[p[2]] = p[0]
num = lambda k: float(f[k]) if k in f and f[k] not in ('<not supported>', '<not counted>', '') else None
tc, cs, ins = num('task-clock'), num('context-switches'), num('instructions:u')
print('%.1f %.5f %.6f %.4f %s' % (s['samples_per_second'], tc / n, sum(x['cpu_seconds'] for x in w) / n * 1e3,
      cs / n, '%.0f' % (ins / n) if ins else 'n/a'))
EOF
}

xcs=(); xown=(); sps=(); cpu=(); loop=(); csw=(); ins=(); own=(); asps=(); aloop=(); acsw=(); awake=(); wake=()
echo "elastic on / off, 2-worker MLP, $EPOCHS epochs, $PAIRS pairs${rt[0]+, under chrt -f 1}; binary $DTRAIN; load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$PAIRS"); do
  order="off on"; [ $((i % 2)) = 0 ] && order="on off"
  [ -n "${HB_AMP:-}" ] && order="$order amp"
  ok=1
  for arm in $order; do run "$arm" "$i" || ok=0; done
  [ $ok = 1 ] || continue
  read -r s0 c0 l0 w0 i0 <<<"$(figs off "$i")"
  read -r s1 c1 l1 w1 i1 <<<"$(figs on "$i")"
  r() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "n/a" || b == "n/a" || a == 0) print "n/a"; else printf "%.4f", b / a }'; }
  sps+=("$(r "$s0" "$s1")"); cpu+=("$(r "$c0" "$c1")"); loop+=("$(r "$l0" "$l1")")
  csw+=("$(r "$w0" "$w1")"); ins+=("$(r "$i0" "$i1")")
  line="pair $i: samples/s off $s0 on $s1 (${sps[-1]}); job CPU ms/sample off $c0 on $c1 (${cpu[-1]}); workers' loop CPU ms/sample ${loop[-1]}; context switches/sample off $w0 on $w1; instructions/sample off $i0 on $i1"
  if [ -s "$T/on_$i.own" ]; then
    read -r wn ws sn ss an <"$T/on_$i.own"
    o=$(awk -v w="$wn" -v s="$sn" -v a="$an" 'BEGIN{ if (a > 0) printf "%.3f", 100 * (w + s) / a; else print "n/a" }')
    own+=("$o")
    line="$line; elastic's threads over ${OWN_S} s: dt-watch $((wn / 1000)) us in $ws wake-ups, dt-store $((sn / 1000)) us in $ss, = $o% of the workers' CPU"
    wake+=("$((ws + ss))")
    # context switches the job gained per second of training, against the
    # switches elastic's own threads make (one per wake-up): on a quiet
    # machine the job switches so rarely that these are the ratio's change
    xcs+=("$(awk -v a="$w0" -v b="$w1" -v s="$s1" 'BEGIN{ printf "%.0f", (b - a) * s }')")
    xown+=("$(awk -v n="$((ws + ss))" -v t="$OWN_S" 'BEGIN{ printf "%.0f", n / t }')")
    line="$line; context switches gained ${xcs[-1]}/s, elastic's wake-ups ${xown[-1]}/s"
  fi
  if [ -n "${HB_AMP:-}" ] && grep -qiE "re-form|generation [1-9]" "$T/amp_$i.log"; then
    line="$line; heartbeat_timeout=$HB_AMP: re-formed (a beat came late), left out"
  elif [ -n "${HB_AMP:-}" ] && [ -s "$T/amp_$i/summary.json" ]; then
    read -r s2 c2 l2 w2 i2 <<<"$(figs amp "$i")"
    asps+=("$(r "$s0" "$s2")"); aloop+=("$(r "$l0" "$l2")"); acsw+=("$(r "$w0" "$w2")")
    line="$line; heartbeat_timeout=$HB_AMP: samples/s ${asps[-1]}, loop CPU/sample ${aloop[-1]}, context switches/sample ${acsw[-1]} of off"
    [ -s "$T/amp_$i.own" ] && { read -r wn ws sn ss an <"$T/amp_$i.own"; awake+=("$((ws + ss))"); line="$line, elastic's wake-ups over ${OWN_S} s $((ws + ss))"; }
  fi
  echo "$line"
done
if [ ${#sps[@]} -gt 0 ]; then
  echo "paired medians over ${#sps[@]} pairs, on / off, [95% bootstrap interval]: samples/s $(ci "${sps[@]}") (target >= 0.98), job CPU per sample $(ci "${cpu[@]}"), workers' loop CPU per sample $(ci "${loop[@]}") (target <= 1.02), context switches per sample $(ci "${csw[@]}"), instructions per sample $(med "${ins[@]}")"
  [ ${#own[@]} -gt 0 ] && echo "elastic's own threads (dt-watch + dt-store) while training: median $(med "${own[@]}")% of the workers' CPU, $(med "${wake[@]}") wake-ups per ${OWN_S} s; context switches on - off per second of training $(med "${xcs[@]}"), of which elastic's own wake-ups $(med "${xown[@]}"); load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ ${#asps[@]} -gt 0 ]; then
    n=$(awk -v a="$(med "${awake[@]}")" -v b="$(med "${wake[@]}")" 'BEGIN{ if (b > 0) printf "%.1f", a / b; else print "n/a" }')
    echo "heartbeat_timeout=$HB_AMP ($n x the wake-ups), paired on / off: samples/s $(ci "${asps[@]}"), workers' loop CPU per sample $(ci "${aloop[@]}"), context switches per sample $(ci "${acsw[@]}"); the default's cost is at most 1/$n of that"
  fi
fi

if [ "${STRACE:-0}" = 1 ] && command -v strace >/dev/null; then
  for arm in off on; do
    x=(); [ "$arm" = on ] && x=(--set dist.min_workers=1)
    strace -c -f -o "$T/strace_$arm" "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 \
      --set train.epochs=1 "${x[@]}" --out "$T/s_$arm" >/dev/null 2>&1 </dev/null
  done
  python3 - "$T/strace_off" "$T/strace_on" "$T/s_off/summary.json" "$T/s_on/summary.json" <<'EOF'
import json, sys
def calls(p):
    d = {}
    for line in open(p):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != 'total':
            d[f[-1]] = int(f[3])
    return d
off, on = calls(sys.argv[1]), calls(sys.argv[2])
n0 = json.load(open(sys.argv[3]))['train_samples']
n1 = json.load(open(sys.argv[4]))['train_samples']
# sched_yield and getpid come from waits (the shm transport yields while a
# peer is late and checks that it lives): they grow with the wait, which
# tracing itself stretches, not with elastic training
spin = ('sched_yield', 'getpid')
rest = lambda d: sum(v for k, v in d.items() if k not in spin)
print('strace -c -f, 1 epoch: syscalls per sample off %.2f, on %.2f; without the waits\' '
      'sched_yield/getpid off %.3f, on %.3f' % (sum(off.values()) / n0, sum(on.values()) / n1,
                                                rest(off) / n0, rest(on) / n1))
diff = sorted(set(off) | set(on), key=lambda k: -abs(on.get(k, 0) / n1 - off.get(k, 0) / n0))
for k in diff[:6]:
    print('  %-16s off %8d  on %8d  (per sample %.3f -> %.3f)' % (k, off.get(k, 0), on.get(k, 0), off.get(k, 0) / n0, on.get(k, 0) / n1))
EOF
fi

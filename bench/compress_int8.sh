#!/usr/bin/env bash
# bench/compress_int8.sh — issue 15's int8 target in one command: time to
# DT_CZ_TARGET (0.88) MLP test accuracy across 3 emulated hosts at
# DT_CZ_RATES (100mbit), dense and int8 (error feedback on), alternating,
# DT_CZ_ROUNDS rounds (3) of bench/compress.sh section 3. Prints each
# round (times, ratio, bytes per step per rank, load average), then the
# medians and the median of the per-round ratios against the target
# (int8 >= 3x faster than dense at 100 Mbit/s).
#
# Env: BUILD (build/release), DT_CZ_ROUNDS, DT_CZ_CODECS ("none int8";
# the first is the baseline), and whatever bench/compress.sh reads
# (DT_CZ_EPOCHS, DT_CZ_TIMEOUT, DT_CZ_EXTRA, DT_CZ_MODEL=cnn for the CNN to
# 0.91, ...). Needs root for the network namespaces (tools/netns.sh). The
# MLP: about 2 min per round quiet (3 min at load 6-10).
set -u
SRC="$(cd "$(dirname "$0")/.." && pwd)"
cd "$SRC" || exit 1
BUILD="${BUILD:-build/release}"
ROUNDS="${DT_CZ_ROUNDS:-3}"
RATE="${DT_CZ_RATES:-100mbit}"
CODECS="${DT_CZ_CODECS:-none int8}"
OUT="$SRC/$BUILD/bench-compress"
mkdir -p "$OUT"
ALL="$OUT/int8_rounds.txt"
: >"$ALL"
for r in $(seq "$ROUNDS"); do
  l0=$(cut -d' ' -f1-3 /proc/loadavg)
  BUILD="$BUILD" DT_CZ_SECTIONS=3 DT_CZ_RATES="$RATE" DT_CZ_CODECS="$CODECS" DT_CZ_NO_TORCH=1 \
    DT_CZ_NO_NOEF=1 bash bench/compress.sh >/dev/null 2>"$OUT/int8_round_$r.err"
  l1=$(cut -d' ' -f1-3 /proc/loadavg)
  # table rows: run t final_acc bytes/step/rank speedup
  awk -v r="$r" -v l0="$l0" -v l1="$l1" 'NR > 1 { printf "round %s %s %s %s %s load %s -> %s\n", r, $1, $2, $3, $4, l0, l1 }' \
    "$OUT/table_$RATE.txt" | tee -a "$ALL"
done
python3 - "$ALL" "$CODECS" <<'EOF'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
codecs = sys.argv[2].split()
base = codecs[0]
t = {}   # codec -> round -> time
b = {}   # codec -> bytes
acc = {}
for w in rows:
    rnd, c, tt, a, bps = w[1], w[2], w[3], w[4], w[5]
    acc.setdefault(c, []).append(a)
    b[c] = bps
    if tt not in ("-", "fail"):
        t.setdefault(c, {})[rnd] = float(tt)
for c in codecs:
    ts = t.get(c, {})
    med = "%.1f" % st.median(ts.values()) if ts else "-"
    ratios = [t[base][r] / ts[r] for r in ts if r in t.get(base, {})]
    rmed = "%.2fx" % st.median(ratios) if ratios and c != base else "-"
    print("median %-6s t(target) %s s over %d rounds, final acc %s, bytes/step/rank %s, vs %s %s (per round %s)"
          % (c, med, len(ts), "/".join(acc.get(c, [])), b.get(c, "-"), base, rmed,
             " ".join("%.2fx" % x for x in ratios) if c != base else "-"))
EOF
echo "load now: $(cut -d' ' -f1-3 /proc/loadavg)"

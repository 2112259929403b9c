#!/usr/bin/env bash
# test_obs_elastic.sh — issue 16: the rank labels follow an elastic
# re-forming. `dtrain train --workers 3 --set dist.min_workers=2` serving
# obs.metrics, rank 0 killed at step 20 (DTRAIN_TEST_KILL): the survivors
# are renumbered (1 -> 0, 2 -> 1), and the exposition must then hold
# exactly ranks 0 and 1 — each once, both at membership generation 1, both
# still counting steps — and no rank 2 (the old name of a page that moved
# on) nor the lost rank's frozen page; `promtool check metrics` accepts it
# (no duplicate series). On disk DIR/obs/rank-0 and rank-1 are the
# survivors' pages. Every process is stopped by pid; files live under $T.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
HAVE_PROMTOOL=0
command -v promtool >/dev/null && HAVE_PROMTOOL=1

JOB=""
cleanup() {
  [ -n "$JOB" ] && kill -9 "$JOB" 2>/dev/null && wait "$JOB" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
now() { date +%s.%N; }
elapsed_ok() { awk -v a="$1" -v b="$2" -v lim="$3" 'BEGIN{exit !(b - a <= lim)}'; }
scrape() { # PORT FILE
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  cat <&3 >"$2.http"
  exec 3<&-
  sed '1,/^\r$/d' "$2.http" >"$2"
}
val() { # FILE NAME RANK — the sample's value
  sed -nE "s/^$2\{job=\"[^\"]*\",rank=\"$3\",host=\"[^\"]*\"\} ([0-9.e+-]+)$/\1/p" "$1"
}

MP=$(free_port 127.0.0.1)
DTRAIN_TEST_KILL=0:20:forward "$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 3 \
  --set dist.min_workers=2 --set train.epochs=100000 --set data.limit_train=3200 \
  --set data.limit_test=200 --set obs.metrics=127.0.0.1:$MP --out "$T/el" \
  >"$T/el.out" 2>"$T/el.err" </dev/null &
JOB=$!

# the re-forming, then the survivors' pages under their new numbers
t0=$(now)
ok=0
while elapsed_ok "$t0" "$(now)" 120; do
  kill -0 $JOB 2>/dev/null || break
  if grep -q "generation 1" "$T/el.out" "$T/el.err" && scrape $MP "$T/s.txt"; then
    g0=$(val "$T/s.txt" dtrain_membership_generation 0)
    g1=$(val "$T/s.txt" dtrain_membership_generation 1)
    [ "$g0" = 1 ] && [ "$g1" = 1 ] && { ok=1; break; }
  fi
  sleep 0.3
done
[ $ok = 1 ] && pass ||
  fail "no exposition with ranks 0 and 1 at generation 1 within 120 s: $(grep -v info "$T/el.err" | tail -3) $(grep -E 'steps_total|generation' "$T/s.txt" 2>/dev/null)"
grep -E '^dtrain_(steps_total|membership_generation)\{' "$T/s.txt"
[ "$(grep -c '^dtrain_steps_total{' "$T/s.txt")" = 2 ] && pass ||
  fail "want 2 dtrain_steps_total series (ranks 0, 1): $(grep '^dtrain_steps_total' "$T/s.txt")"
[ "$(grep -c '^dtrain_steps_total{.*rank="0"' "$T/s.txt")" = 1 ] &&
  [ "$(grep -c '^dtrain_steps_total{.*rank="1"' "$T/s.txt")" = 1 ] && pass ||
  fail "ranks 0 and 1 once each: $(grep '^dtrain_steps_total' "$T/s.txt")"
! grep -q 'rank="2"' "$T/s.txt" && pass || fail "rank 2 still served after the re-forming"
# both survivors go on counting steps under their new labels
a0=$(val "$T/s.txt" dtrain_steps_total 0)
a1=$(val "$T/s.txt" dtrain_steps_total 1)
sleep 2
scrape $MP "$T/s2.txt"
b0=$(val "$T/s2.txt" dtrain_steps_total 0)
b1=$(val "$T/s2.txt" dtrain_steps_total 1)
awk -v a="$a0" -v b="$b0" -v c="$a1" -v d="$b1" 'BEGIN{exit !(a != "" && c != "" && b > a && d > c)}' && pass ||
  fail "steps of ranks 0/1 did not grow: $a0 -> $b0, $a1 -> $b1"
if [ $HAVE_PROMTOOL = 1 ]; then
  promtool check metrics <"$T/s2.txt" >"$T/check.out" 2>&1 && pass || fail "promtool: $(cat "$T/check.out")"
fi
for r in 0 1; do [ -s "$T/el/obs/rank-$r" ] && pass || fail "no DIR/obs/rank-$r"; done
kill -TERM $JOB 2>/dev/null
for _ in $(seq 1 100); do kill -0 $JOB 2>/dev/null || break; sleep 0.1; done
kill -9 $JOB 2>/dev/null
wait $JOB 2>/dev/null
JOB=""
finish

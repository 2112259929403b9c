#!/usr/bin/env bash
# test_obs_prometheus.sh — issue 16: a real Prometheus (Debian's
# `prometheus`, started here on a loopback port with a config that scrapes
# every second) scrapes a 2-worker `dtrain train` whose launcher serves
# obs.metrics; the test asks Prometheus's HTTP API (promtool query) for the
# series and checks their labels (job = the run directory's name, rank 0
# and 1, host) and values (steps counted, a finite loss, step-time
# histograms with observations, bytes and allreduce times present, the
# target up). The exposition itself is fetched with bash's /dev/tcp and
# passed through `promtool check metrics`. Skipped (77) without prometheus.
# Every process started is stopped by pid; its files live under $T.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/lib_obs.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "SKIP: prometheus/promtool not installed (Debian package prometheus)"
  exit 77
fi

MP=$(free_port 127.0.0.1)
PP=$(free_port 127.0.0.1)
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set train.epochs=100000 \
  --set data.limit_train=2000 --set data.limit_test=200 --set obs.metrics=127.0.0.1:$MP \
  --out "$T/promjob" >"$T/train.out" 2>"$T/train.err" </dev/null &
TP=$!
PIDS="$PIDS $TP"

t0=$(now)
while ! grep -q '^metrics: http://127.0.0.1:' "$T/train.out" && elapsed_ok "$t0" "$(now)" 60; do
  kill -0 $TP 2>/dev/null || break
  sleep 0.1
done
grep -q "^metrics: http://127.0.0.1:$MP/metrics" "$T/train.out" && pass ||
  { fail "no metrics line for port $MP: $(cat "$T/train.out" "$T/train.err")"; finish; exit; }

# the exposition as served, through promtool's checker
scrape() {
  exec 3<>"/dev/tcp/127.0.0.1/$MP" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  cat <&3 >"$T/scrape.http"
  exec 3<&-
  sed '1,/^\r$/d' "$T/scrape.http" >"$T/scrape.txt"
}
sleep 1
scrape && pass || fail "cannot fetch /metrics"
head -1 "$T/scrape.http" | grep -q '200 OK' && pass || fail "status: $(head -1 "$T/scrape.http")"
grep -qi '^Content-Type: text/plain; version=0.0.4' "$T/scrape.http" && pass || fail "content type"
promtool check metrics <"$T/scrape.txt" >"$T/check.out" 2>&1 && pass ||
  fail "promtool check metrics: $(cat "$T/check.out")"
[ "$(tail -c 1 "$T/scrape.txt" | od -An -c | tr -d ' ')" = '\n' ] && pass || fail "no final newline"

prom_start "$MP" "$PP"

q() { promtool query instant "http://127.0.0.1:$PP" "$1" 2>/dev/null; }
t0=$(now)
got=""
while elapsed_ok "$t0" "$(now)" 60; do
  got=$(q 'dtrain_steps_total')
  [ "$(echo "$got" | grep -c 'rank="[01]"')" = 2 ] && break
  kill -0 $PR 2>/dev/null || break
  sleep 0.5
done
echo "$got"
[ "$(echo "$got" | grep -c 'rank="[01]"')" = 2 ] && pass ||
  fail "Prometheus has no dtrain_steps_total for ranks 0 and 1 within 60 s: $got $(tail -5 "$T/prom.log")"
echo "$got" | grep -q 'job="promjob"' && pass || fail "job label: $got"
echo "$got" | grep -q "host=\"$(hostname | cut -c1-63)\"" && pass || fail "host label: $got"
# values: counted steps, a sane loss, histograms with observations
v=$(q 'min(dtrain_steps_total)' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
awk -v v="$v" 'BEGIN{exit !(v >= 1)}' && pass || fail "dtrain_steps_total min $v"
v=$(q 'max(dtrain_train_loss)' | sed -nE 's/.*=> ([0-9.e+-]+) @.*/\1/p')
awk -v v="$v" 'BEGIN{exit !(v > 0 && v < 10)}' && pass || fail "dtrain_train_loss $v"
v=$(q 'count(dtrain_step_seconds_count > 0)' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
[ "$v" = 2 ] && pass || fail "step-time histograms with observations: $v"
v=$(q 'histogram_quantile(0.5, sum(dtrain_step_seconds_bucket) by (le))' | sed -nE 's/.*=> ([0-9.e+-]+) @.*/\1/p')
awk -v v="$v" 'BEGIN{exit !(v > 0 && v < 10)}' && pass || fail "median step time $v"
v=$(q 'count(dtrain_allreduce_seconds_count)' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
[ "$v" = 2 ] && pass || fail "allreduce histograms: $v"
v=$(q 'count(dtrain_resident_memory_bytes > 1e6)' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
[ "$v" = 2 ] && pass || fail "resident memory: $v"
v=$(q 'up{job="dtrain"}' | sed -nE 's/.*=> ([0-9.e+]+) @.*/\1/p')
[ "$v" = 1 ] && pass || fail "target not up: $v"

kill $PR 2>/dev/null
kill -TERM $TP 2>/dev/null
wait $TP 2>/dev/null
finish

#!/usr/bin/env bash
# test_obs_trace.sh — issue 16, the timeline: one epoch of the MLP with 2
# workers and obs.trace = true writes DIR/trace.json that parses as JSON
# (Chrome trace event format: an object with traceEvents), where every
# complete event ("ph":"X") has name, ts, dur, pid and tid, the spans of
# each thread nest (a span inside another ends inside it; none straddles
# another's end), both ranks (pid 0 and 1) show their gradient reduction
# ("allreduce") and forward/backward spans, ranks start at a common time
# zero, and the file stays under 50 MB with the default obs.trace_steps.
# With obs.trace_steps = 10 the ring keeps only the last steps. Checked by
# a few lines of Python (python3: tools/setup-deps.sh test).
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }

check() { # FILE MAXSTEPS
  python3 - "$1" "$2" <<'EOF'
import json, sys, collections
path, maxsteps = sys.argv[1], int(sys.argv[2])
d = json.load(open(path))
ev = d["traceEvents"]
x = [e for e in ev if e.get("ph") == "X"]
assert x, "no complete events"
for e in x:
    for k in ("name", "ts", "dur", "pid", "tid"):
        assert k in e, "event without %s: %r" % (k, e)
    assert e["dur"] >= 0, e
threads = collections.defaultdict(list)
for e in x:
    threads[(e["pid"], e["tid"])].append(e)
eps = 0.0015  # us: ts and dur are printed to the nanosecond
for key, spans in threads.items():
    # parents first: earlier start, then the longer span
    spans.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in spans:
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - eps:
            stack.pop()
        if stack:
            top = stack[-1]
            assert e["ts"] + e["dur"] <= top["ts"] + top["dur"] + eps, \
                "thread %r: %s [%.3f +%.3f] straddles the end of %s [%.3f +%.3f]" % (
                    key, e["name"], e["ts"], e["dur"], top["name"], top["ts"], top["dur"])
        stack.append(e)
pids = {e["pid"] for e in x}
assert pids == {0, 1}, "pids %r" % pids
for p in (0, 1):
    names = {e["name"] for e in x if e["pid"] == p}
    for n in ("allreduce", "forward", "backward", "step"):
        assert n in names, "rank %d has no %s span (%r)" % (p, n, names)
steps = collections.Counter(e["pid"] for e in x if e["name"] == "step")
assert max(steps.values()) <= maxsteps, "steps kept %r > %d" % (steps, maxsteps)
# a common time zero: each rank's first step starts within 1 s of the other's
first = [min(e["ts"] for e in x if e["pid"] == p and e["name"] == "step") for p in (0, 1)]
assert abs(first[0] - first[1]) < 1e6, "first steps at %r us" % first
print("%d spans, %d threads, steps per rank %r" % (len(x), len(threads), dict(steps)))
EOF
}

"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set train.epochs=1 \
  --set data.limit_test=1000 --set obs.trace=true --out "$T/full" >"$T/full.out" 2>"$T/full.err" </dev/null
rc=$?
[ $rc = 0 ] && pass || fail "1-epoch traced run exited $rc: $(cat "$T/full.err")"
if [ -s "$T/full/trace.json" ]; then
  pass
  size=$(stat -c %s "$T/full/trace.json")
  echo "trace.json of 1 epoch, 2 workers: $size bytes"
  [ "$size" -lt 50000000 ] && pass || fail "trace.json is $size bytes (limit 50 MB)"
  check "$T/full/trace.json" 1000 && pass || fail "trace.json malformed"
else
  fail "no trace.json"
fi
# each worker's CPU time over the run (bench/obs.py's second view)
python3 -c '
import json, sys
w = json.load(open(sys.argv[1]))["per_worker"]
assert len(w) == 2 and all(0 < x["cpu_seconds"] < 3600 for x in w), w
' "$T/full/summary.json" && pass || fail "summary per_worker cpu_seconds: $(head -c 600 "$T/full/summary.json")"

"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set train.epochs=1 \
  --set data.limit_train=3000 --set data.limit_test=500 --set obs.trace=true \
  --set obs.trace_steps=10 --out "$T/ring" >"$T/ring.out" 2>"$T/ring.err" </dev/null
check "$T/ring/trace.json" 11 && pass || fail "obs.trace_steps = 10 kept more than the last steps"
# untraced runs write no trace; obs.log_format = json: log lines are JSON
# objects with time, level, host, rank and msg (a warning provoked here)
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set train.epochs=1 \
  --set data.limit_train=500 --set data.limit_test=100 --set schedule.warmup_steps=100000 \
  --set obs.log_format=json --out "$T/none" >/dev/null 2>"$T/none.err" </dev/null
[ ! -e "$T/none/trace.json" ] && pass || fail "trace.json written without obs.trace"
grep '^{' "$T/none.err" | python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin]
assert lines, "no JSON log line"
for l in lines:
    assert set(l) == {"time", "level", "host", "rank", "msg"}, l
assert any(l["level"] == "warn" and "warmup_steps" in l["msg"] and l["rank"] == 0 for l in lines), lines
' && pass || fail "obs.log_format = json: $(cat "$T/none.err")"
finish

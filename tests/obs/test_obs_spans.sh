#!/usr/bin/env bash
# test_obs_spans.sh — issue 16, the other strategies' communication in the
# timeline and the metrics:
#  - a parameter-server run (2 workers, ps.servers = 1, obs.trace = true):
#    both workers (pid 0 and 1) have "push" spans (one per key per step,
#    inside "backward" or "reduce+update") and "pull" spans (the wait for
#    parameters, inside "reduce+update"), at least one of each per step;
#  - a 2-stage pipeline: both stages have "send" and "recv" spans;
#  - in both, the spans of a thread nest, and `dtrain report` draws the
#    histograms dtrain_ps_push_seconds / dtrain_ps_pull_wait_seconds and
#    dtrain_pipeline_recv_seconds / _send_wait_seconds for ranks 0 and 1
#    (a chart is drawn only from observations, read from the rank pages).
# Checked by a few lines of Python (python3: tools/setup-deps.sh test).
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
SHORT=(--set train.epochs=1 --set data.limit_train=2000 --set data.limit_test=200 --set obs.trace=true)

check() { # FILE "name,name" STEPS
  python3 - "$@" <<'EOF'
import json, sys, collections
path, want, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
x = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
threads = collections.defaultdict(list)
for e in x:
    threads[(e["pid"], e["tid"])].append(e)
eps = 0.0015
for key, spans in threads.items():
    spans.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in spans:
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - eps:
            stack.pop()
        if stack:
            top = stack[-1]
            assert e["ts"] + e["dur"] <= top["ts"] + top["dur"] + eps, \
                "thread %r: %s straddles the end of %s" % (key, e["name"], top["name"])
        stack.append(e)
n = collections.Counter((e["pid"], e["name"]) for e in x)
for p in (0, 1):
    for w in want:
        assert n[(p, w)] >= steps, "rank %d: %d %s spans, want >= %d (%r)" % (p, n[(p, w)], w, steps, n)
print({k: v for k, v in n.items() if k[1] in want})
EOF
}

# ---- parameter server ---------------------------------------------------------
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set ps.servers=1 "${SHORT[@]}" \
  --out "$T/ps" >"$T/ps.out" 2>"$T/ps.err" </dev/null
rc=$?
[ $rc = 0 ] && pass || fail "ps run exited $rc: $(tail -3 "$T/ps.err")"
STEPS=$(json_num "$T/ps/summary.json" steps)
check "$T/ps/trace.json" push,pull "${STEPS:-1}" && pass || fail "ps trace"
"$DTRAIN" report "$T/ps" >/dev/null 2>"$T/psr.err" && pass || fail "report of the ps run: $(cat "$T/psr.err")"
for t in "Parameter server push time" "Parameter server wait for parameters"; do
  python3 - "$T/ps/report.html" "$t" <<'EOF' && pass || fail "ps report: no '$t' chart with ranks 0 and 1"
import sys, re
html, title = open(sys.argv[1]).read(), sys.argv[2]
i = html.index(title)
chart = html[i:html.index("</svg>", i)]
assert "rank 0" in chart and "rank 1" in chart, chart[:300]
EOF
done

# ---- pipeline -------------------------------------------------------------------
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set dist.pipeline_stages=2 "${SHORT[@]}" \
  --out "$T/pp" >"$T/pp.out" 2>"$T/pp.err" </dev/null
rc=$?
[ $rc = 0 ] && pass || fail "pipeline run exited $rc: $(tail -3 "$T/pp.err")"
STEPS=$(json_num "$T/pp/summary.json" steps)
check "$T/pp/trace.json" send,recv "${STEPS:-1}" && pass || fail "pipeline trace"
"$DTRAIN" report "$T/pp" >/dev/null 2>"$T/ppr.err" && pass || fail "report of the pipeline run: $(cat "$T/ppr.err")"
for t in "Pipeline receive wait" "Pipeline send wait"; do
  python3 - "$T/pp/report.html" "$t" <<'EOF' && pass || fail "pipeline report: no '$t' chart with ranks 0 and 1"
import sys, re
html, title = open(sys.argv[1]).read(), sys.argv[2]
i = html.index(title)
chart = html[i:html.index("</svg>", i)]
assert "rank 0" in chart and "rank 1" in chart, chart[:300]
EOF
done
finish

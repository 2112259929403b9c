#!/usr/bin/env bash
# test_obs_report.sh — issue 16, `dtrain report RUN_DIR`: after a 2-worker
# run, the command writes RUN_DIR/report.html, a self-contained page (no
# script, no stylesheet or image fetched, no external URL but the SVG
# namespace); headless Chromium (Debian's chromium) renders it to a
# screenshot kept under the build folder (obs_report.png), logs no console
# error, and the DOM it builds has the charts (svg.chart) — loss, accuracy,
# samples/s, per-rank breakdown, communication volume, time distributions —
# each with data points. Bad usage and a directory that is not a run's
# exit 2 with one line. Skipped (77) without chromium or python3.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${DT_TEST_BIN:-$(dirname "$DTRAIN")}

"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --workers 2 --set train.epochs=3 \
  --set data.limit_train=3000 --set data.limit_test=500 --out "$T/run" >"$T/train.out" 2>&1 </dev/null ||
  fail "training run failed: $(cat "$T/train.out")"
"$DTRAIN" report "$T/run" >"$T/report.out" 2>&1 && pass || fail "dtrain report: $(cat "$T/report.out")"
H="$T/run/report.html"
[ -s "$H" ] && pass || { fail "no report.html"; finish; exit; }
grep -q "^report: $H" "$T/report.out" && pass || fail "report path not printed: $(cat "$T/report.out")"
# self-contained: nothing to fetch
if grep -Eiq '<script|<link|<img|<iframe|@import|url\(|src=' "$H"; then fail "report loads something"; else pass; fi
[ "$(grep -Eo 'https?://[^"]*' "$H" | sort -u)" = "http://www.w3.org/2000/svg" ] && pass ||
  fail "external URLs: $(grep -Eo 'https?://[^"]*' "$H" | sort -u)"
# bad input
"$DTRAIN" report >/dev/null 2>&1; [ $? = 2 ] && pass || fail "no RUN_DIR: not exit 2"
mkdir -p "$T/empty"
"$DTRAIN" report "$T/empty" >/dev/null 2>"$T/empty.err"; rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$T/empty.err")" = 1 ] && pass || fail "empty dir: exit $rc, $(cat "$T/empty.err")"
[ ! -e "$T/empty/report.html" ] && pass || fail "report written for an empty dir"
"$DTRAIN" report "$T/run" --out "$T/other.html" >/dev/null 2>&1 && [ -s "$T/other.html" ] && pass ||
  fail "--out FILE"

if ! command -v chromium >/dev/null || ! command -v python3 >/dev/null; then
  skip_part chromium "chromium or python3 not installed (Debian packages chromium, python3)"
  finish
  exit
fi
CH="chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
  --disable-background-networking --user-data-dir=$T/profile"
SHOT="$BIN/obs_report.png"
rm -f "$SHOT"
timeout 120 $CH --enable-logging=stderr --v=0 --window-size=1280,2600 --screenshot="$SHOT" \
  "file://$H" >"$T/shot.out" 2>"$T/shot.err" </dev/null
[ -s "$SHOT" ] && pass || fail "no screenshot: $(tail -5 "$T/shot.err")"
echo "screenshot: $SHOT"
# console messages (a page without scripts can still log errors: failed loads)
if grep -E 'CONSOLE|Uncaught|Failed to load resource|net::ERR' "$T/shot.err"; then
  fail "console errors while rendering the report"
else
  pass
fi
timeout 120 $CH --dump-dom "file://$H" >"$T/dom.html" 2>"$T/dom.err" </dev/null
python3 - "$T/dom.html" <<'EOF' && pass || fail "charts without data points"
import re, sys
dom = open(sys.argv[1]).read()
charts = re.findall(r'<svg class="chart".*?</svg>', dom, flags=re.S)
titles = [re.search(r'<title>(.*?)</title>', c).group(1) for c in charts]
print(len(charts), "charts:", "; ".join(titles))
assert len(charts) >= 6, titles
want = ["Loss per epoch", "Accuracy per epoch", "Samples per second", "Step time breakdown",
        "Communication volume", "Step time, fraction"]
for w in want:
    assert any(t.startswith(w) for t in titles), "missing chart " + w
for t, c in zip(titles, charts):
    pts = len(re.findall(r'class="pt"', c))
    assert pts >= 2, "%s: %d data points" % (t, pts)
EOF
finish

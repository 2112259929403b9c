#!/usr/bin/env bash
# test_param_docs.sh — the DTRAIN_* knob list cannot drift:
#  1. docs/config.md carries exactly `dtrain env --markdown` between its
#     begin/end markers (every knob, default and meaning);
#  2. every DTRAIN_* name that src/ mentions is a knob `dtrain env` lists
#     (a knob read by name but missing from the table would be ignored);
#  3. nothing in src/ but src/core/param.c calls getenv on a DTRAIN_ name;
#  4. `dtrain env` shows a set value, never prints the job token, and a
#     malformed value is reported with the variable's name.
set -u
SRC="${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
DTRAIN="${DTRAIN:?DTRAIN must point at the dtrain binary}"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

want=$(sed -n '/<!-- begin: dtrain env --markdown -->/,/<!-- end: dtrain env --markdown -->/p' \
  "$SRC/docs/config.md" | sed '1d;$d')
got=$(env -u DTRAIN_LOG_LEVEL "$DTRAIN" env --markdown)
[ -n "$want" ] || bad "docs/config.md has no 'dtrain env --markdown' block"
if [ "$want" != "$got" ]; then
  bad "docs/config.md differs from 'dtrain env --markdown':"
  diff <(echo "$want") <(echo "$got") | head -20
fi

listed=$("$DTRAIN" env | awk 'NR > 1 {print $1}' | sort -u)
[ "$(echo "$listed" | wc -l)" -ge 30 ] || bad "dtrain env lists too few knobs: $listed"
for n in $(grep -rhoE 'DTRAIN_[A-Z0-9_]+' "$SRC/src" | sort -u); do
  grep -qx "$n" <<<"$listed" || bad "$n is used in src/ but is not in the knob table"
done

raw=$(grep -rnE 'getenv\("DTRAIN|getenv\(env' "$SRC/src" | grep -v '^'"$SRC"'/src/core/param.c:')
[ -z "$raw" ] || bad "getenv of a DTRAIN_ knob outside param.c: $raw"

out=$(DTRAIN_JOB_TOKEN=do-not-print-this-token DTRAIN_CHUNK_BYTES=65536 DTRAIN_TIMEOUT=soon \
  "$DTRAIN" env 2>&1)
grep -q 'do-not-print-this-token' <<<"$out" && bad "dtrain env printed the job token"
grep -qE '^DTRAIN_CHUNK_BYTES +\*65536 ' <<<"$out" || bad "set value not shown: $(grep CHUNK_BYTES <<<"$out")"
grep -qE '^DTRAIN_JOB_TOKEN +\*\(hidden\)' <<<"$out" || bad "token not shown as hidden"
grep -q 'DTRAIN_TIMEOUT=soon is not an integer' <<<"$out" || bad "malformed value not reported"
grep -qE '^DTRAIN_TIMEOUT +60 ' <<<"$out" || bad "malformed value did not fall back to the default"

"$DTRAIN" env --bogus >/dev/null 2>&1
[ $? = 2 ] || bad "unknown option must exit 2"

[ $fail = 0 ] && echo "ok: $(echo "$listed" | wc -l) knobs, docs in step"
exit $fail

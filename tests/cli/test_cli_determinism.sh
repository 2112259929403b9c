#!/usr/bin/env bash
# test_cli_determinism.sh — same seed, same config: bitwise-identical
# params_sha256 over two runs, and again when re-run from the config.ini a
# run wrote; a different seed gives different parameters.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

run() { # run NAME ARGS...
  local name=$1
  shift
  "$DTRAIN" train "$@" --out "$T/$name" >"$T/$name.log" 2>&1 </dev/null || fail "$name: exit $?: $(tail -1 "$T/$name.log")"
  json_str "$T/$name/summary.json" params_sha256
}
args=("$SRC/examples/fashion_mlp.ini" --set train.epochs=2 --set data.limit_train=3000
      --set data.limit_test=500 --set train.seed=7)
a=$(run a "${args[@]}")
b=$(run b "${args[@]}")
[[ $a =~ ^[0-9a-f]{64}$ ]] && pass || fail "no hash: '$a'"
[ "$a" = "$b" ] && pass || fail "same seed, different params: $a vs $b"
c=$(run c "$T/a/config.ini")
[ "$a" = "$c" ] && pass || fail "re-run from config.ini differs: $a vs $c"
d=$(run d "${args[@]}" --set train.seed=8)
[ -n "$d" ] && [ "$a" != "$d" ] && pass || fail "different seed, same params"
# The CNN with dropout-free layers and a shuffled loader, too (tiny).
cnn=(--set "model.layers=conv(4,3,pad=1) relu maxpool(2) flatten linear(10)" --set train.epochs=1
     --set data.limit_train=1000 --set data.limit_test=200 --set train.batch=50)
e=$(run e "${cnn[@]}")
f=$(run f "${cnn[@]}")
[ -n "$e" ] && [ "$e" = "$f" ] && pass || fail "cnn: $e vs $f"
finish

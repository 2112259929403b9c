#!/usr/bin/env bash
# test_cli_train.sh — a short real training run (the MLP on 6000 Fashion-MNIST
# images, 2 epochs) through a pipe: one line per epoch, a final line, a
# summary.json with every field and accuracy far above chance (0.1), an
# events.jsonl record per epoch and the effective config.ini.
. "$(dirname "$0")/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

out="$T/run"
"$DTRAIN" train "$SRC/examples/fashion_mlp.ini" --set train.epochs=2 --set data.limit_train=6000 \
  --set data.limit_test=2000 --set train.eval_every=2 --out "$out" >"$T/stdout" 2>"$T/stderr" </dev/null
rc=$?
[ $rc -eq 0 ] && pass || { fail "exit $rc: $(cat "$T/stderr")"; finish; exit 1; }
[ ! -s "$T/stderr" ] && pass || fail "stderr not empty: $(cat "$T/stderr")"
grep -Eq "^epoch 1  train_loss [0-9.]+  [0-9]+ samples/s" "$T/stdout" && pass || fail "epoch 1 line: $(cat "$T/stdout")"
grep -Eq "^epoch 2  train_loss [0-9.]+  test_loss [0-9.]+  test_acc 0\.[0-9]+  [0-9]+ samples/s" "$T/stdout" && pass || fail "epoch 2 line"
grep -Eq "^test accuracy 0\.[0-9]+  test loss [0-9.]+  [0-9]+ samples/s" "$T/stdout" && pass || fail "final line"
grep -q $'\r' "$T/stdout" && fail "progress bar drawn into a pipe" || pass

S="$out/summary.json"
for k in test_accuracy test_loss epochs steps train_seconds samples_per_second workers params gflops; do
  v=$(json_num "$S" $k)
  [ -n "$v" ] && pass || fail "summary.json lacks number $k"
done
for k in params_sha256 config_sha256 model; do
  [ -n "$(json_str "$S" $k)" ] && pass || fail "summary.json lacks string $k"
done
acc=$(json_num "$S" test_accuracy)
awk -v a="$acc" 'BEGIN{exit !(a > 0.7 && a <= 1)}' && pass || fail "test_accuracy $acc not clearly above chance"
[ "$(json_num "$S" epochs)" = 2 ] && pass || fail "epochs"
[ "$(json_num "$S" steps)" = 188 ] && pass || fail "steps $(json_num "$S" steps), want 2*ceil(6000/64)=188"
[ "$(json_num "$S" workers)" = 1 ] && pass || fail "workers"
[ "$(json_num "$S" params)" = 235146 ] && pass || fail "params $(json_num "$S" params)"
[[ $(json_str "$S" params_sha256) =~ ^[0-9a-f]{64}$ ]] && pass || fail "params_sha256 format"
[ "$(json_str "$S" config_sha256)" = "$(sha256sum "$out/config.ini" | cut -c1-64)" ] && pass || fail "config_sha256 is not the hash of config.ini"
awk -v s="$(json_num "$S" samples_per_second)" 'BEGIN{exit !(s > 100)}' && pass || fail "samples_per_second"
[ ! -e "$S.tmp" ] && pass || fail "summary.json.tmp left behind"

E="$out/events.jsonl"
[ "$(wc -l <"$E")" -eq 2 ] && pass || fail "events.jsonl has $(wc -l <"$E") lines, want 2"
head -1 "$E" | grep -q '"test_accuracy":null' && pass || fail "epoch 1 was not evaluated (eval_every=2) but has a test accuracy"
for k in epoch step train_loss test_loss test_accuracy samples_per_second lr time; do
  tail -1 "$E" | grep -Eq "\"$k\":-?[0-9]" && pass || fail "events record lacks $k"
done
grep -q "^limit_train = 6000$" "$out/config.ini" && grep -q "^epochs = 2$" "$out/config.ini" && pass || fail "config.ini"

# The built-in default is examples/fashion_cnn.ini: same effective config.
"$DTRAIN" train --set train.epochs=1 --set data.limit_train=64 --set data.limit_test=64 \
  --out "$T/default" >/dev/null 2>&1 </dev/null || fail "default run: exit $?"
"$DTRAIN" train "$SRC/examples/fashion_cnn.ini" --set train.epochs=1 --set data.limit_train=64 \
  --set data.limit_test=64 --out "$T/example" >/dev/null 2>&1 </dev/null || fail "example run: exit $?"
cmp -s "$T/default/config.ini" "$T/example/config.ini" && pass || fail "built-in default differs from examples/fashion_cnn.ini"
[ "$(json_str "$T/default/summary.json" params_sha256)" = "$(json_str "$T/example/summary.json" params_sha256)" ] \
  && pass || fail "default and example runs give different parameters"
finish

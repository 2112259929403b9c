#!/usr/bin/env bash
# test_pipeline_resume_mem.sh — `--resume` of a pipeline job streams
# (docs/checkpoint.md "Resuming"): the launcher (the process that forks
# the workers) verifies the checkpoint in chunks and reads only headers
# and trainer.json; each stage reads its own tensors. So:
#  - the launcher's peak RSS (VmHWM, polled while it runs) resuming the
#    deep MLP (examples/fashion_deep_mlp.ini, 18.4M parameters, 2 stages)
#    exceeds the same job's without --resume by less than a quarter of the
#    model's parameter bytes (loading the model in the launcher, as before,
#    costs it the file plus the parameters it copies them into: about
#    twice the model);
#  - the resumed run ends with the uninterrupted run's params_sha256;
#  - bad input is one line and exit 2, naming the file: a truncated
#    model.safetensors, a checkpoint of another model (the fingerprint
#    names model.layers), a model.safetensors without a tensor the model
#    needs (names the tensor).
# Every process started is waited for (or killed by pid); $T is removed.
. "$(dirname "$0")/../cli/lib.sh"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
[ -x /usr/bin/python3 ] || { echo "SKIP: no python3 to read summary.json"; exit 77; }
[ -r /proc/self/status ] || { echo "SKIP: no /proc to read the launcher's VmHWM"; exit 77; }
INI="$(dirname "$0")/../../examples/fashion_deep_mlp.ini"
B=(--set data.limit_train=768 --set data.limit_test=256 --set train.epochs=1
   --set ckpt.keep=0 --set ckpt.epoch_end=false --workers 2 --set dist.pipeline_stages=2
   --set dist.micro_batches=2)
sha() { json_str "$1/summary.json" params_sha256; }
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0:thread_local_quarantine_size_kb=0"

# hwm NAME ARGS... — runs `dtrain train INI ARGS` into $T/NAME, polling the
# launcher's VmHWM (kB) into $T/NAME.hwm; returns its exit status.
hwm() {
  local name=$1 pid v last=0
  shift
  "$DTRAIN" train "$INI" "${B[@]}" "$@" --out "$T/$name" >"$T/$name.out" 2>"$T/$name.err" &
  pid=$!
  PIDS="$PIDS $pid"
  while kill -0 "$pid" 2>/dev/null; do
    v=$(awk '/^VmHWM:/{print $2}' "/proc/$pid/status" 2>/dev/null)
    [ -n "$v" ] && last=$v
    sleep 0.05
  done
  echo "$last" >"$T/$name.hwm"
  wait "$pid"
}

hwm ref --set ckpt.every_steps=1 || { fail "ref: $(tail -1 "$T/ref.err")"; finish; exit 1; }
C="$T/ref/ckpt/step-00000001"
[ -d "$C" ] || { fail "no checkpoint at step 1: $(ls "$T/ref/ckpt" 2>&1)"; finish; exit 1; }
hwm fresh || fail "fresh: $(tail -1 "$T/fresh.err")"
if hwm res --resume "$C"; then
  a=$(cat "$T/fresh.hwm") b=$(cat "$T/res.hwm")
  model=$(( 18415626 * 4 / 1024 ))
  d=$(( b - a ))
  echo "launcher peak RSS: $a kB without --resume, $b kB resuming (+$d kB; the model's parameters are $model kB)"
  [ "$a" -gt 0 ] && [ "$d" -lt $(( model / 4 )) ] && pass \
    || fail "the launcher holds the model while resuming: peak RSS +$d kB, the parameters are $model kB"
  [ "$(sha "$T/res")" = "$(sha "$T/ref")" ] && pass \
    || fail "resumed: $(sha "$T/res") != $(sha "$T/ref")"
else
  fail "res: $(tail -1 "$T/res.err")"
fi

# --- bad input: one line, exit 2, naming the file (and tensor) ---------------
refuse() { # WHAT PATTERN ARGS... — a resume that must fail with exit 2
  local what=$1 pat=$2
  shift 2
  "$DTRAIN" train "$INI" "${B[@]}" "$@" --out "$T/bad" >"$T/bad.out" 2>"$T/bad.err"
  local rc=$? last
  last=$(grep -v " warn: " "$T/bad.err" | tail -1)
  [ $rc -eq 2 ] && [ "$(grep -vc " warn: " "$T/bad.err")" -eq 1 ] && grep -q -- "$pat" <<<"$last" \
    && pass || fail "$what: exit $rc, '$(cat "$T/bad.err")'"
}
mkdir -p "$T/trunc" && cp -r "$C" "$T/trunc/" && truncate -s -4 "$T/trunc/step-00000001/model.safetensors"
refuse "truncated model.safetensors" "model.safetensors" --resume "$T/trunc/step-00000001"
refuse "another model" "model.layers" --resume "$C" \
  --set "model.layers=flatten linear(2048) relu linear(2048) relu linear(10)"
# a model.safetensors without 13.bias, its manifest rewritten to match
mkdir -p "$T/miss" && cp -r "$C" "$T/miss/"
/usr/bin/python3 - "$T/miss/step-00000001" <<'EOF' || fail "could not rewrite the checkpoint"
import hashlib, json, struct, sys
d = sys.argv[1]
b = open(d + "/model.safetensors", "rb").read()
hl = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + hl])
data = b[8 + hl:]
x = h.pop("13.bias")
lo, hi = x["data_offsets"]
out, at = {}, 0
for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"),
                   key=lambda kv: kv[1]["data_offsets"][0]):
    n = v["data_offsets"][1] - v["data_offsets"][0]
    out[k] = dict(v, data_offsets=[at, at + n]); at += n
body = b"".join(data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in
                sorted(((k, v) for k, v in h.items() if k != "__metadata__"),
                       key=lambda kv: kv[1]["data_offsets"][0]))
out["__metadata__"] = h["__metadata__"]
hj = json.dumps(out).encode()
hj += b" " * (-len(hj) % 8)
nb = struct.pack("<Q", len(hj)) + hj + body
open(d + "/model.safetensors", "wb").write(nb)
m = json.load(open(d + "/manifest.json"))
for f in m["files"]:
    if f["name"] == "model.safetensors":
        f["bytes"] = len(nb); f["sha256"] = hashlib.sha256(nb).hexdigest()
m["manifest_sha256"] = "0" * 64
t = json.dumps(m, indent=1)
t = t.replace("0" * 64, hashlib.sha256(t.encode()).hexdigest(), 1)
open(d + "/manifest.json", "w").write(t)
EOF
refuse "missing tensor" "13.bias" --resume "$T/miss/step-00000001"
finish

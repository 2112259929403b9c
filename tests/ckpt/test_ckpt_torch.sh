#!/usr/bin/env bash
# test_ckpt_torch.sh — weights between dtrain and PyTorch 1.13 through
# safetensors (tools/torch_safetensors.py, json + torch.frombuffer):
#  - dtrain trains the MLP and the CNN, `dtrain export` writes the weights,
#    PyTorch builds the same nn.Sequential, loads them with strict=True (the
#    names are state_dict names) and its test accuracy equals dtrain's
#    test_accuracy to 1e-3;
#  - PyTorch initialises each model and writes it; `dtrain train --set
#    model.init=FILE` starts from it: the first step's loss equals
#    PyTorch's on the same batch to 1e-5.
# Skipped (77) without python3-torch.
. "$(dirname "$0")/../cli/lib.sh"
SRC=${DT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TOOL="$SRC/tools/torch_safetensors.py"
[ -r "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST in $FASHION"; exit 77; }
# Debian's interpreter (python3-torch lives there), not a python3 earlier in PATH
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" -c 'import torch' 2>/dev/null || { echo "SKIP: python3-torch is not installed"; exit 77; }
export OMP_NUM_THREADS=1

check() { # check NAME CONFIG LIMIT_TRAIN LIMIT_TEST
  local name=$1 cfg=$2
  "$DTRAIN" train "$cfg" --set train.epochs=1 --set data.limit_train="$3" --set data.limit_test="$4" \
    --out "$T/$name" >/dev/null 2>"$T/$name.err" || { fail "$name: $(cat "$T/$name.err")"; return; }
  "$DTRAIN" export "$T/$name" --out "$T/$name.safetensors" >/dev/null 2>"$T/$name.x.err" \
    || { fail "$name export: $(cat "$T/$name.x.err")"; return; }
  local acc_d acc_t
  acc_d=$(json_num "$T/$name/summary.json" test_accuracy)
  acc_t=$("$PY" "$TOOL" eval "$T/$name.safetensors" --limit "$4" 2>"$T/$name.py.err" | awk '{print $2}')
  [ -n "$acc_t" ] || { fail "$name: PyTorch eval failed: $(cat "$T/$name.py.err")"; return; }
  echo "$name: dtrain test_accuracy $acc_d, PyTorch on the exported weights $acc_t"
  awk -v a="$acc_d" -v b="$acc_t" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d <= 1e-3)}' && pass \
    || fail "$name: accuracy $acc_t (PyTorch) vs $acc_d (dtrain)"
}

first() { # first NAME CONFIG SPEC
  local name=$1 cfg=$2 spec=$3
  "$PY" "$TOOL" init --layers "$spec" --input 1,28,28 --seed 7 --out "$T/$name.init" >/dev/null 2>"$T/$name.i.err" \
    || { fail "$name: PyTorch init: $(cat "$T/$name.i.err")"; return; }
  "$DTRAIN" train "$cfg" --set train.epochs=1 --set data.limit_train=64 --set data.limit_test=64 \
    --set data.shuffle=false --set train.batch=64 --set model.init="$T/$name.init" --out "$T/$name" \
    >/dev/null 2>"$T/$name.err" || { fail "$name: $(cat "$T/$name.err")"; return; }
  local l_d l_t
  l_d=$(json_num "$T/$name/events.jsonl" train_loss)
  l_t=$("$PY" "$TOOL" first-loss "$T/$name.init" --limit 64 --batch 64 2>"$T/$name.py.err" | awk '{print $2}')
  [ -n "$l_t" ] || { fail "$name: PyTorch loss failed: $(cat "$T/$name.py.err")"; return; }
  echo "$name: first-step loss dtrain $l_d, PyTorch $l_t"
  awk -v a="$l_d" -v b="$l_t" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d <= 1e-5)}' && pass \
    || fail "$name: first loss $l_d (dtrain) vs $l_t (PyTorch)"
}

check mlp "$SRC/examples/fashion_mlp.ini" 6000 2000
check cnn "$SRC/examples/fashion_cnn.ini" 2000 1000
first mlp_init "$SRC/examples/fashion_mlp.ini" "flatten linear(256) relu linear(128) relu linear(10)"
first cnn_init "$SRC/examples/fashion_cnn.ini" \
  "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)"
finish

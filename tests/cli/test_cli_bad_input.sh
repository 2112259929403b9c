#!/usr/bin/env bash
# test_cli_bad_input.sh — every kind of bad input ends with exit 2, one line
# on stderr naming the file and line (or --set) and the key, and no output
# directory or summary.json: config syntax and values, missing files, bad
# data files, impossible models, unsupported settings.
. "$(dirname "$0")/lib.sh"

cfg() { printf '%b' "$2" >"$T/$1.ini"; }

cfg unknown_section '[train]\nepochs = 1\n[trainer]\nbatch = 2\n'
expect_bad unknown_section "unknown_section.ini:3: unknown section \[trainer\]" train "$T/unknown_section.ini"
cfg unknown_key '[optim]\nlr = 0.1\nlearnrate = 0.1\n'
expect_bad unknown_key "unknown_key.ini:3: unknown key 'learnrate' in \[optim\]" train "$T/unknown_key.ini"
cfg wrong_type '[train]\nepochs = 1\n\n[optim]\nlr = abc\n'
expect_bad wrong_type "wrong_type.ini:5: optim.lr: not a number: 'abc'" train "$T/wrong_type.ini"
cfg lr_zero '[optim]\nlr = 0\n'
expect_bad lr_zero "lr_zero.ini:2: optim.lr: must be" train "$T/lr_zero.ini"
cfg lr_neg '[optim]\nlr = -0.1\n'
expect_bad lr_neg "lr_neg.ini:2: optim.lr: must be" train "$T/lr_neg.ini"
cfg batch_zero '[train]\nbatch = 0\n'
expect_bad batch_zero "batch_zero.ini:2: train.batch: must be" train "$T/batch_zero.ini"
cfg epochs_zero '; comment\n[train]\nepochs = 0\n'
expect_bad epochs_zero "epochs_zero.ini:3: train.epochs: must be" train "$T/epochs_zero.ini"
cfg malformed '[train]\nepochs: 2\nthis is not a key\n'
expect_bad malformed "malformed.ini:3: malformed line" train "$T/malformed.ini"
cfg bad_bool '[data]\nshuffle = sometimes\n'
expect_bad bad_bool "bad_bool.ini:2: data.shuffle: not a boolean" train "$T/bad_bool.ini"
cfg bad_enum '[optim]\nname = lbfgs\n'
expect_bad bad_enum "bad_enum.ini:2: optim.name: unknown value 'lbfgs'" train "$T/bad_enum.ini"
cfg dup '[train]\nbatch = 2\nbatch = 3\n'
expect_bad duplicate "dup.ini:3: train.batch: given twice" train "$T/dup.ini"
cfg nesterov '[optim]\nmomentum = 0\nnesterov = true\n'
expect_bad nesterov "nesterov.ini:3: optim.nesterov" train "$T/nesterov.ini"
cfg workers '[dist]\nworkers = 0\n'
expect_bad workers_cfg "workers.ini:2: dist.workers: must be in \\[1, 4096\\]" train "$T/workers.ini"

# control bytes from a config or --set are shown escaped (\xNN), never raw
cfg ctrl_key '[train]\n\033[31mepochs = 1\n'
expect_bad ctrl_key "ctrl_key.ini:2: unknown key '\\\\x1b\\[31mepochs' in \\[train\\]" train "$T/ctrl_key.ini"
expect_bad ctrl_set "^dtrain: --set optim.l\\\\x1b\\]0;pwned\\\\x07r: unknown key" train --set "$(printf 'optim.l\033]0;pwned\007r=1')"
for f in ctrl_key ctrl_set; do
  if LC_ALL=C grep -q "$(printf '[\001-\010\013-\037\177]')" "$T/$f.stderr"; then
    fail "$f: raw control bytes on stderr: $(od -c "$T/$f.stderr" | head -3)"
  else
    pass
  fi
done

expect_bad missing_config "config '$T/nope.ini': No such file" train "$T/nope.ini"
expect_bad config_is_dir "config '$T'" train "$T"
expect_bad set_type "^dtrain: --set optim.lr: not a number: 'abc'" train --set optim.lr=abc
expect_bad set_range "^dtrain: --set train.epochs: must be" train --set train.epochs=0
expect_bad set_unknown "^dtrain: --set optim.lrr: unknown key 'lrr'" train --set optim.lrr=1
expect_bad set_syntax "^dtrain: --set 'lr': expected section.key=value" train --set lr
# the --set error comes after a valid file
cfg ok '[train]\nepochs = 1\n'
expect_bad set_after_file "^dtrain: --set train.batch: not an integer" train "$T/ok.ini" --set train.batch=x

expect_bad missing_data "data.train_images '$T/none.gz': No such file" train --set "data.train_images=$T/none.gz"
expect_bad missing_labels "data.test_labels '$T/none.gz': No such file" train --set "data.test_labels=$T/none.gz"
head -c 1000 "$FASHION/t10k-labels-idx1-ubyte.gz" >"$T/trunc.gz"
expect_bad truncated_idx "$T/trunc.gz" train --set "data.test_labels=$T/trunc.gz"
printf 'not an idx file at all' >"$T/junk.idx"
expect_bad wrong_magic "$T/junk.idx" train --set "data.test_images=$T/junk.idx"

expect_bad model_shape "model.layers: layer 4 'maxpool\(2\)'" train --set "model.layers=flatten linear(10) relu maxpool(2)"
expect_bad model_kernel "model.layers: layer 1 'conv\(8,30\)'" train --set "model.layers=conv(8,30) relu linear(10)"
expect_bad model_unknown "model.layers: .*unknown layer 'conv3d'" train --set "model.layers=conv3d(3) linear(10)"
expect_bad model_classes "model.layers: the last layer has 5 outputs but the data has 10 classes" train --set "model.layers=flatten linear(5)"
# an output path under a regular file cannot be created
"$DTRAIN" train --set data.limit_train=100 --set data.limit_test=100 --set train.epochs=1 \
  --out "$T/ok.ini/run" >/dev/null 2>"$T/outfile.err" </dev/null; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/outfile.err")" -eq 1 ] && grep -q "^dtrain: --out: output directory '$T/ok.ini/run': Not a directory" "$T/outfile.err" \
  && pass || fail "--out under a file: exit $rc: $(cat "$T/outfile.err")"
# a CSV value finite as double but not as float32 (used to become inf and
# train to chance with exit 0), and a FIFO as a data path (used to block
# forever in open(); timeout turns a hang into exit 124)
printf '0,1,2\n1,1e300,3\n0,2,2\n' >"$T/big.csv"
expect_bad csv_float32 "big.csv:2:3: field 2 '1e300' is beyond the float32 range" train \
  --set data.format=csv --set "data.train_images=$T/big.csv" --set "data.test_images=$T/big.csv" --set "model.layers=linear(2)"
mkfifo "$T/fifo.csv"
timeout 60 "$DTRAIN" train --set data.format=csv --set "data.train_images=$T/fifo.csv" \
  --set "data.test_images=$T/big.csv" --set "model.layers=linear(2)" --out "$T/out_fifo" \
  >/dev/null 2>"$T/fifo.err" </dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "fifo.csv: not a regular file (a FIFO)" "$T/fifo.err" && [ ! -e "$T/out_fifo" ] \
  && pass || fail "FIFO as data: exit $rc: $(cat "$T/fifo.err")"
finish

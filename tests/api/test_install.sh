#!/bin/bash
# test_install.sh — libdtrain as a user gets it: `cmake --install` into a
# temporary prefix, then every program of examples/c/ built out of tree two
# ways — `cc ... $(pkg-config --cflags --libs dtrain)` (strict warnings, as
# errors) and a small CMake project with find_package(dtrain) linking
# dtrain::dtrain — plus train_mlp against the static libdtrain.a (with
# pkg-config --static, and as dtrain::dtrain_static); each run
# for one epoch must print a test accuracy >= 0.85. The prefix is removed
# on exit. Skips (77) only when the Fashion-MNIST package is missing.
set -u
BUILD=${DT_BUILD_DIR:?}
SRC=${DT_SOURCE_DIR:?}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "SKIP: $DATA missing (dataset-fashion-mnist)"; exit 77; }
tmp=$(mktemp -d /tmp/dt_install_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cmake --install "$BUILD" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1; }
P=$tmp/prefix
for f in bin/dtrain lib/libdtrain.a lib/libdtrain.so lib/libdtrain.so.0 include/dtrain.h \
         include/dtrain/core.h include/dtrain/model.h include/dtrain/data.h include/dtrain/optim.h \
         include/dtrain/comm.h lib/pkgconfig/dtrain.pc lib/cmake/dtrain/dtrainConfig.cmake; do
  [ -e "$P/$f" ] || fail "not installed: $f"
done
# every public header the umbrella includes is installed
for h in $(sed -n 's/^#include "\(dtrain\/[a-z_]*\.h\)"/\1/p' "$SRC/include/dtrain.h"); do
  [ -e "$P/include/$h" ] || fail "dtrain.h includes $h, not installed"
done
export PKG_CONFIG_PATH=$P/lib/pkgconfig
[ "$(pkg-config --modversion dtrain)" = "$(sed -n 's/#define DT_VERSION_STRING "\(.*\)"/\1/p' "$SRC/include/dtrain/core.h")" ] ||
  fail "pkg-config version $(pkg-config --modversion dtrain)"

examples=$(ls "$SRC"/examples/c/*.c)
[ -n "$examples" ] || { echo "FAIL: no examples"; exit 1; }

# 1. pkg-config, shared library
mkdir -p "$tmp/pc"
for ex in $examples; do
  n=$(basename "$ex" .c)
  cc -std=c11 -O2 -Wall -Wextra -Werror "$ex" $(pkg-config --cflags --libs dtrain) \
     -o "$tmp/pc/$n" 2>"$tmp/pc/$n.cc.log" || { cat "$tmp/pc/$n.cc.log"; fail "$n: cc with pkg-config"; }
done
# 2. the static library with pkg-config --static for its dependencies
cc -std=c11 -O2 "$SRC/examples/c/train_mlp.c" $(pkg-config --cflags dtrain) "$P/lib/libdtrain.a" \
   $(pkg-config --static --libs-only-other --libs-only-L dtrain) \
   $(pkg-config --static --libs-only-l dtrain | sed 's/-ldtrain//') -o "$tmp/pc/train_mlp_static" \
   2>"$tmp/static.log" || { cat "$tmp/static.log"; fail "train_mlp: static link"; }
# 3. CMake, find_package(dtrain)
mkdir -p "$tmp/cm"
{
  echo 'cmake_minimum_required(VERSION 3.16)'
  echo 'project(dtrain_examples C)'
  echo 'find_package(dtrain 0.1 REQUIRED)'
  for ex in $examples; do
    n=$(basename "$ex" .c)
    echo "add_executable($n $ex)"
    echo "target_link_libraries($n dtrain::dtrain)"
  done
  echo "add_executable(train_mlp_static $SRC/examples/c/train_mlp.c)"
  echo "target_link_libraries(train_mlp_static dtrain::dtrain_static)"
} >"$tmp/cm/CMakeLists.txt"
if cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$P" >"$tmp/cm.log" 2>&1 &&
   cmake --build "$tmp/cm/build" >>"$tmp/cm.log" 2>&1; then :; else
  cat "$tmp/cm.log"; fail "CMake find_package(dtrain) project"
fi

# Runs a program for one epoch; its last "test accuracy X" line must be >= 0.85.
run() {
  local what=$1 bin=$2 out
  [ -x "$bin" ] || { fail "$what: not built"; return; }
  out=$(LD_LIBRARY_PATH=$P/lib OPENBLAS_NUM_THREADS=1 timeout 240 "$bin" 1 2>&1)
  local rc=$?
  local acc
  acc=$(echo "$out" | sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' | tail -1)
  if [ $rc -ne 0 ] || [ -z "$acc" ]; then
    echo "$out" | tail -5; fail "$what: exit $rc, no test accuracy"; return
  fi
  awk -v a="$acc" 'BEGIN{exit !(a >= 0.85)}' && echo "ok: $what: test accuracy $acc" ||
    fail "$what: test accuracy $acc < 0.85"
}
for ex in $examples; do
  n=$(basename "$ex" .c)
  run "$n (pkg-config)" "$tmp/pc/$n"
  run "$n (CMake)" "$tmp/cm/build/$n"
done
run "train_mlp (static, pkg-config)" "$tmp/pc/train_mlp_static"
run "train_mlp (static, CMake)" "$tmp/cm/build/train_mlp_static"
# the shared build really uses the installed libdtrain.so.0
LD_LIBRARY_PATH=$P/lib ldd "$tmp/pc/train_mlp" 2>/dev/null | grep -q "$P/lib/libdtrain.so.0" ||
  fail "train_mlp (pkg-config) is not linked against $P/lib/libdtrain.so.0"
[ $fails = 0 ] && echo "all ok" || echo "$fails failure(s)"
exit $((fails > 0))

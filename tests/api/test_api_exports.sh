#!/bin/bash
# test_api_exports.sh — libdtrain.so exports exactly the public API: every
# function declared DT_API in include/dtrain/*.h, nothing else (no internal
# dt__ function, no unprefixed helper), under the soname libdtrain.so.<major>.
set -u
lib=${DT_LIBDTRAIN:?}
src=${DT_SOURCE_DIR:?}
command -v nm >/dev/null || { echo "SKIP: no nm"; exit 77; }
fail=0
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sort -u)
# declarations start a line with "DT_API"; the name is the word before "("
declared=$(grep -h '^DT_API ' "$src"/include/dtrain/*.h | sed 's/(.*//' | awk '{print $NF}' |
           tr -d '*' | sort -u)
[ -n "$declared" ] || { echo "FAIL: no DT_API declarations found"; exit 1; }
bad=$(echo "$exported" | grep -v '^dt_' ; echo "$exported" | grep '^dt__')
if [ -n "$(echo "$bad" | tr -d '[:space:]')" ]; then
  echo "FAIL: exported but not public API:"; echo "$bad"; fail=1
fi
extra=$(comm -23 <(echo "$exported") <(echo "$declared"))
if [ -n "$extra" ]; then echo "FAIL: exported but not declared DT_API in include/:"; echo "$extra"; fail=1; fi
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
if [ -n "$missing" ]; then echo "FAIL: declared DT_API but not exported:"; echo "$missing"; fail=1; fi
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
major=$(sed -n 's/#define DT_VERSION_MAJOR \([0-9]*\)/\1/p' "$src/include/dtrain/core.h")
if [ "$soname" != "libdtrain.so.$major" ]; then echo "FAIL: soname '$soname', want libdtrain.so.$major"; fail=1; fi
n=$(echo "$exported" | wc -l)
[ $fail = 0 ] && echo "ok: $n public symbols exported, soname $soname"
exit $fail

#!/bin/bash
# test_api_headers.sh — the public headers as the header-is-the-spec rule
# wants them: each include/dtrain/*.h compiles on its own (self-contained)
# under -std=c11 -pedantic -Werror, and so does dtrain.h (also as C++11);
# every function declared in them is marked DT_API (exported) and has a
# comment right above its declaration (documented where it is declared).
set -u
SRC=${DT_SOURCE_DIR:?}
CC=${CC:-cc}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for h in "$SRC"/include/dtrain/*.h "$SRC"/include/dtrain.h; do
  rel=${h#"$SRC"/include/}
  printf '#include <%s>\nint main(void) { return 0; }\n' "$rel" |
    $CC -std=c11 -Wall -Wextra -pedantic -Werror -fsyntax-only -I "$SRC/include" -x c - 2>"/tmp/dt_hdr_$$.log" ||
    { cat "/tmp/dt_hdr_$$.log"; fail "$rel does not compile alone"; }
done
# and from C++ (the extern "C" guards), when a C++ compiler is here
if command -v c++ >/dev/null; then
  printf '#include <dtrain.h>\nint main() { return dt_version() ? 0 : 1; }\n' |
    c++ -std=c++11 -Wall -Wextra -pedantic -Werror -fsyntax-only -I "$SRC/include" -x c++ - \
      2>"/tmp/dt_hdr_$$.log" || { cat "/tmp/dt_hdr_$$.log"; fail "dtrain.h does not compile as C++"; }
fi
rm -f "/tmp/dt_hdr_$$.log"
# Function declarations: a line at column 0 that is not a directive,
# comment, typedef, struct/enum body or DT_API line, holding "dt_name(".
for h in "$SRC"/include/dtrain/*.h; do
  awk -v f="$(basename "$h")" '
    /^[A-Za-z]/ && /dt_[a-z0-9_]*\(/ && !/^(DT_API|typedef|#|static|struct|enum|union)/ {
      print f ":" NR ": declared without DT_API: " $0; bad = 1 }
    /^DT_API / { if (prev !~ /\*\/[ \t]*$/ && prev !~ /^DT_API / && prev !~ /;[ \t]*$/ && prev !~ /^ \*/)
                   { print f ":" NR ": no comment above: " $0; bad = 1 } }
    { if ($0 !~ /^[ \t]*$/) prev = $0 }
    END { exit bad }' "$h" || fail "$(basename "$h"): see above"
done
[ $fails = 0 ] && echo "ok: public headers self-contained, exported and documented"
exit $((fails > 0))

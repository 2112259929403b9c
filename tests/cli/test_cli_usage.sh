#!/usr/bin/env bash
# test_cli_usage.sh — dtrain --help / --version / train --help and usage
# errors (no command, unknown command, unknown option, missing values).
. "$(dirname "$0")/lib.sh"

out=$("$DTRAIN" --version) && [[ $out =~ ^dtrain\ [0-9]+\.[0-9]+\.[0-9]+$ ]] && pass || fail "--version: '$out'"
out=$("$DTRAIN" --help) && grep -q "train \[CONFIG\]" <<<"$out" && pass || fail "--help: '$out'"
out=$("$DTRAIN" train --help)
if [ $? -eq 0 ] && grep -q -- "--set section.key=value" <<<"$out" && grep -q "optim.lr = " <<<"$out" &&
   grep -q "model.layers = conv(32,3,pad=1)" <<<"$out"; then pass; else fail "train --help: '$out'"; fi

"$DTRAIN" >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q usage "$T/e" && pass || fail "no command: exit $rc"
"$DTRAIN" frobnicate >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" "$T/e" && pass || fail "unknown command: exit $rc"

expect_bad unknown_opt "unknown option '--bogus'" train --bogus
"$DTRAIN" train --set >/dev/null 2>"$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--set: missing value" "$T/e" && pass || fail "--set without value: exit $rc"
expect_bad two_configs "more than one CONFIG" train a.ini b.ini
expect_bad workers_many "--workers '5000'" train --workers 5000
expect_bad workers_bad "--workers 'x'" train --workers x
expect_bad workers_zero "--workers '0'" train --workers=0
finish

/*
 * fuzz_cli_config.c — libFuzzer target for the INI config parser
 * (dt_config_parse, in memory) and `--set` overrides. Besides not crashing,
 * it checks two invariants: every failure leaves a one-line message, and a
 * config that parses dumps to canonical text that parses back to the same
 * dump (or fails only because a value is too long for one line).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/config.h"
#include "core/core.h"

static dt_config a, b;

static void check_msg(void) {
  const char *m = dt_errmsg();
  if (!m[0] || strchr(m, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dt_config_init(&a);
  if (dt_config_parse(&a, (const char *)data, size, "fuzz.ini") < 0) {
    check_msg();
  } else {
    if (dt_config_validate(&a) < 0) check_msg();
    size_t need = dt_config_dump(&a, NULL, 0);
    char *t1 = malloc(need + 1), *t2 = malloc(need + 1);
    if (!t1 || !t2) abort();
    if (dt_config_dump(&a, t1, need + 1) != need) abort();
    dt_config_init(&b);
    if (dt_config_parse(&b, t1, need, "dump.ini") < 0) {
      if (!strstr(dt_errmsg(), "line too long")) abort();
    } else {
      if (dt_config_dump(&b, t2, need + 1) != need || memcmp(t1, t2, need)) abort();
    }
    free(t1);
    free(t2);
  }
  /* The first line as a --set override. */
  char line[512];
  size_t n = 0;
  while (n < size && n < sizeof line - 1 && data[n] != '\n' && data[n] != '\0') {
    line[n] = (char)data[n];
    n++;
  }
  line[n] = '\0';
  dt_config_init(&a);
  if (dt_config_set(&a, line) < 0) check_msg();
  return 0;
}

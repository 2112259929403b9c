/*
 * cmd_env.c — `dtrain env`: every DTRAIN_* environment knob with its
 * current value, default and meaning, straight from the one table in
 * src/core/core.h (DT_PARAM_TABLE), so the list cannot miss a knob.
 * `--markdown` prints the table docs/config.md carries (a test compares
 * the two). The job token's value is never printed, only whether it is
 * set. Not here: changing knobs (they come from the environment only).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/core.h"

static void env_usage(FILE *f) {
  fprintf(f, "usage: dtrain env [--markdown]\n"
             "\n"
             "Every DTRAIN_* environment knob: name, current value, default, meaning.\n"
             "A value marked * is set in the environment. --markdown prints the table of\n"
             "docs/config.md (defaults and meanings, no current values).\n");
}

/* `|` inside a markdown cell would end it. */
static void md_cell(const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputs("\\|", stdout);
    else putchar(*s);
  }
}

int dt__cmd_env(int argc, char **argv) {
  bool md = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      env_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!strcmp(argv[i], "--markdown")) {
      md = true;
      continue;
    }
    fprintf(stderr, "dtrain: env: unknown option '%s' (see dtrain env --help)\n", argv[i]);
    return DT_EXIT_USAGE;
  }
  struct dt_param_info k;
  if (md) {
    printf("| variable | default | meaning |\n| --- | --- | --- |\n");
    for (int i = 0; dt_param_info(i, &k); i++) {
      printf("| `%s` | ", k.name);
      md_cell(k.def);
      printf(" | ");
      md_cell(k.meaning);
      printf(" |\n");
    }
    return DT_EXIT_OK;
  }
  printf("%-30s %-14s %-14s %s\n", "# variable", "value", "default", "meaning");
  for (int i = 0; dt_param_info(i, &k); i++) {
    const char *v = k.value;
    if (!strcmp(k.name, "DTRAIN_JOB_TOKEN") && k.set) v = "(hidden)"; /* never print the secret */
    char val[40];
    snprintf(val, sizeof val, "%s%.36s", k.set ? "*" : "", v);
    printf("%-30s %-14s %-14s %s\n", k.name, val, k.def, k.meaning);
  }
  return DT_EXIT_OK;
}

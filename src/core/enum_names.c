/*
 * enum_names.c — lookups in the NULL-terminated name tables of enums
 * (index = value): the config parser, the records and the launcher read the
 * same tables through these two calls instead of keeping copies. The tables
 * themselves live with what they name (engine/run_cfg.c, comm/comm_create.c).
 */
#include <string.h>

#include "core/core.h"

int dt__enum_parse(const char *const *names, const char *s) {
  if (!names || !s) return -1;
  for (int i = 0; names[i]; i++)
    if (!strcmp(names[i], s)) return i;
  return -1;
}

const char *dt__enum_name(const char *const *names, int v) {
  if (!names || v < 0) return "?";
  for (int i = 0; names[i]; i++)
    if (i == v) return names[i];
  return "?";
}

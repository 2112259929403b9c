/*
 * param.c — tuning knobs read from the environment through one place
 * (NCCL's NCCL_PARAM habit). Config-file settings live in the cli layer;
 * these are for knobs a user sets per machine or per job.
 */
#include "core.h"

#include <errno.h>
#include <stdlib.h>

int64_t dt_param_int(const char *name, int64_t def) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno || *end) {
    dt_log(DT_LOG_WARN, "environment %s=%s is not an integer; using %lld", name, s, (long long)def);
    return def;
  }
  return v;
}

const char *dt_param_str(const char *name, const char *def) {
  const char *s = getenv(name);
  return (s && *s) ? s : def;
}

/*
 * log.c — leveled logging to stderr, one write(2) per line so lines from
 * several threads or processes do not interleave. The level comes from the
 * DTRAIN_LOG_LEVEL parameter.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int current_level(void) {
  const char *s = dt_param_s(DT_PARAM_LOG_LEVEL);
  if (!s) return DT_LOG_INFO;
  if (!strcasecmp(s, "error")) return DT_LOG_ERROR;
  if (!strcasecmp(s, "warn")) return DT_LOG_WARN;
  if (!strcasecmp(s, "info")) return DT_LOG_INFO;
  if (!strcasecmp(s, "debug")) return DT_LOG_DEBUG;
  if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0') return s[0] - '0';
  return DT_LOG_INFO;
}

void dt_log(int level, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (level > current_level()) return;
  char line[1024];
  int n = snprintf(line, sizeof line, "dtrain %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}

/*
 * log.c — leveled logging to stderr, one write(2) per line so lines from
 * several threads or processes do not interleave. The level comes from the
 * DTRAIN_LOG_LEVEL parameter. Each line starts with the UTC time, the host
 * and (once dt_log_set_rank was called) the rank; with dt_log_set_json(1)
 * (obs.log_format = json) each line is one JSON object instead: time,
 * level, host, rank, msg. The rank and format are per process (workers are
 * processes; ranks run as threads in tests share them).
 */
#include "core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
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

static _Atomic int log_rank = -1, log_json = 0;

void dt_log_set_rank(int rank) { atomic_store(&log_rank, rank); }
void dt_log_set_json(int on) { atomic_store(&log_json, on != 0); }

/* "2026-11-23T16:20:01.123Z" */
static void utc_now(char *buf, size_t cap) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* s as the inside of a JSON string */
static size_t json_str(const char *s, char *out, size_t cap) {
  size_t k = 0;
  for (; *s && k + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') out[k++] = '\\', out[k++] = (char)c;
    else if (c < 0x20) k += (size_t)snprintf(out + k, cap - k, "\\u%04x", c);
    else out[k++] = (char)c;
  }
  out[k] = '\0';
  return k;
}

void dt_log(int level, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (level > current_level()) return;
  const char *lv = names[level < 0 ? 0 : level > 3 ? 3 : level];
  char msg[1024], line[2400], when[40], host[64] = "?", rk[24] = "";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  utc_now(when, sizeof when);
  if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "?");
  int rank = atomic_load(&log_rank);
  size_t len;
  if (atomic_load(&log_json)) {
    char m[2100], h[200];
    json_str(msg, m, sizeof m);
    json_str(host, h, sizeof h);
    if (rank >= 0) snprintf(rk, sizeof rk, "%d", rank);
    else snprintf(rk, sizeof rk, "null");
    len = (size_t)snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"host\":\"%s\","
                           "\"rank\":%s,\"msg\":\"%s\"}", when, lv, h, rk, m);
  } else {
    if (rank >= 0) snprintf(rk, sizeof rk, " rank %d", rank);
    len = (size_t)snprintf(line, sizeof line, "%s %s%s dtrain %s: %s", when, host, rk, lv, msg);
  }
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}

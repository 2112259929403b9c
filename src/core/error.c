/*
 * error.c — error names (dt_strerror) and the thread-local last-error
 * message (dt_errmsg). It only records; it never prints or exits.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[512];

const char *dt_strerror(int rc) {
  switch (rc) {
#define DT__ERR_CASE(name, val, msg) \
  case (val):                        \
    return msg;
    DT_ERRNO_MAP(DT__ERR_CASE)
#undef DT__ERR_CASE
  }
  return "unknown error";
}

const char *dt_errmsg(void) { return last_msg; }

const char *dt_version(void) { return DT_VERSION_STRING; }

int dt__seterr(int rc, const char *fmt, ...) {
  /* Formatted aside first: an argument may be dt_errmsg() itself (a reason
   * wrapped with context), and formatting into the buffer being read
   * garbles it ("x: x: 1: ..."). */
  char buf[sizeof last_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(last_msg, buf, sizeof last_msg);
  return rc;
}

int dt__preerr(int rc, const char *fmt, ...) {
  char prefix[256], old[sizeof last_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_msg, sizeof old);
  snprintf(last_msg, sizeof last_msg, "%s: %s", prefix, old[0] ? old : dt_strerror(rc));
  return rc;
}

void dt__clearerr(void) { last_msg[0] = '\0'; }

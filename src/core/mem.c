/*
 * mem.c — aligned allocation and monotonic clocks.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void *dt_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes == 0) bytes = 64;
  bytes = (bytes + 63) & ~(size_t)63;
  if (posix_memalign(&p, 64, bytes) != 0) return NULL;
  return p;
}

void *dt_calloc(size_t bytes) {
  void *p = dt_alloc(bytes);
  if (p) memset(p, 0, bytes ? bytes : 1);
  return p;
}

void dt_free(void *p) { free(p); }

int64_t dt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double dt_now(void) { return (double)dt_now_ns() * 1e-9; }

/*
 * spill.c — the unlinked scratch file a checkpoint streams through on
 * rank 0 (pipeline stages' and ZeRO-1 blocks' state arrive in chunks and
 * are written here instead of gathered in memory; the snapshot then names
 * the file's ranges, see ckpt_state.c). Two calls: open one in the
 * checkpoint root, and write floats at an offset with the first error
 * remembered so a caller checks once at the end.
 */
#define _GNU_SOURCE
#include "engine/spill.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dtrain/engine.h"

int dt__spill_open(const char *dir, const char *tag) {
  int fd = -1;
#ifdef O_TMPFILE
  fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
  if (fd >= 0) return fd;
  char path[DT_CFG_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/.%s-spill-XXXXXX", dir, tag);
  fd = mkstemp(path);
  if (fd < 0) return -1;
  unlink(path);
  return fd;
}

void dt__spill_put(int fd, const float *p, size_t n, uint64_t foff, int *werr) {
  const char *b = (const char *)p;
  size_t len = n * sizeof(float);
  while (len && !*werr) {
    ssize_t w = pwrite(fd, b, len, (off_t)foff);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *werr = w < 0 ? errno : ENOSPC;
      break;
    }
    b += w, len -= (size_t)w, foff += (uint64_t)w;
  }
}

/*
 * file.c — the data layer's shared plumbing: reading a whole file into
 * memory with a size cap, and the size limit every reader enforces. Only
 * regular files are read: a FIFO, device or directory is refused without
 * blocking. It does not parse anything.
 */
#include "data/data_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

size_t dt__data_max_bytes(void) {
  int64_t v = dt_param(DT_PARAM_DATA_MAX_BYTES);
  if (v <= 0) v = (int64_t)1 << 30;
  return (size_t)v;
}

void *dt__data_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes < ((size_t)4 << 20)) return dt_alloc(bytes);
  size_t align = (size_t)2 << 20;
  if (posix_memalign(&p, align, (bytes + align - 1) & ~(align - 1)) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, (bytes + align - 1) & ~(align - 1), MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
  return p;
}

static const char *file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a file";
}

int dt__read_file(const char *path, size_t max, uint8_t **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  if (!path) return dt__seterr(DT_EINVAL, "data: no file name given");
  /* O_NONBLOCK: open() on a FIFO with no writer would block forever; with
   * it the open returns at once and the type check below refuses it. It has
   * no effect on reads of a regular file. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return dt__seterr(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return dt__seterr(DT_EIO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return dt__seterr(DT_EIO, "%s: not a regular file (%s); give the path of a data file", path,
                      file_kind(st.st_mode));
  }
  if ((uint64_t)st.st_size > (uint64_t)max) {
    close(fd);
    return dt__seterr(DT_ERANGE, "%s: file is %lld bytes, larger than the limit %zu (DTRAIN_DATA_MAX_BYTES)",
                      path, (long long)st.st_size, max);
  }
  size_t cap = (size_t)st.st_size;
  uint8_t *p = dt__data_alloc(cap ? cap : 1);
  if (!p) {
    close(fd);
    return dt__seterr(DT_ENOMEM, "%s: cannot allocate %zu bytes", path, cap);
  }
  size_t got = 0;
  while (got < cap) {
    ssize_t r = read(fd, p + got, cap - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      free(p);
      close(fd);
      return dt__seterr(DT_EIO, "%s: read failed: %s", path, strerror(e));
    }
    if (r == 0) break; /* shrank while reading: parse what we have */
    got += (size_t)r;
  }
  close(fd);
  *buf = p;
  *len = got;
  return DT_OK;
}

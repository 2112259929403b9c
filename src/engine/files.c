/*
 * files.c — small file-system and hashing helpers of the engine: mkdir -p,
 * atomic whole-file writes (temporary file, fsync, rename, directory fsync,
 * Redis style). They report errors
 * naming the path; they never retry or print.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine.h"

int dt_mkdirs(const char *path) {
  char p[DT_CFG_PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof p) return dt__seterr(DT_EINVAL, "output directory '%s': bad path", path);
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0777) && errno != EEXIST)
      return dt__seterr(DT_EIO, "output directory '%s': %s", p, strerror(errno));
    p[i] = c;
  }
  struct stat st;
  if (stat(path, &st) || !S_ISDIR(st.st_mode))
    return dt__seterr(DT_EIO, "output directory '%s': not a directory", path);
  return DT_OK;
}

static int fsync_dir_of(const char *path) {
  char d[DT_CFG_PATH_MAX];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (slash == d) d[1] = '\0';
  else if (slash) *slash = '\0';
  else snprintf(d, sizeof d, ".");
  int fd = open(d, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return dt__seterr(DT_EIO, "'%s': %s", d, strerror(errno));
  int rc = fsync(fd);
  close(fd);
  /* Some file systems refuse fsync on directories; the rename is done. */
  (void)rc;
  return DT_OK;
}

int dt_write_file_atomic(const char *path, const void *data, size_t len) {
  char tmp[DT_CFG_PATH_MAX + 16];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return dt__seterr(DT_EINVAL, "'%s': path too long", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return dt__seterr(DT_EIO, "'%s': %s", tmp, strerror(errno));
  const char *p = data;
  size_t left = len;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      unlink(tmp);
      return dt__seterr(DT_EIO, "'%s': write: %s", tmp, strerror(e));
    }
    p += w;
    left -= (size_t)w;
  }
  if (fsync(fd)) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return dt__seterr(DT_EIO, "'%s': fsync: %s", tmp, strerror(e));
  }
  if (close(fd)) {
    unlink(tmp);
    return dt__seterr(DT_EIO, "'%s': close: %s", tmp, strerror(errno));
  }
  if (rename(tmp, path)) {
    int e = errno;
    unlink(tmp);
    return dt__seterr(DT_EIO, "'%s': rename: %s", path, strerror(e));
  }
  return fsync_dir_of(path);
}

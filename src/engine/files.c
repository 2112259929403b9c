/*
 * files.c — small file-system helpers of the engine: mkdir -p, atomic
 * whole-file writes (temporary file, fsync, rename, directory fsync, Redis
 * style), the claim a run holds on its output directory (DIR/.lock, flock),
 * and paths shortened in the middle for messages, so a long path never
 * pushes the reason out of a one-line error. They report errors naming the
 * path; they never retry or print.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine.h"
#include "engine/engine_int.h"

const char *dt__short_path(const char *path, char buf[DT_SHORT_PATH]) {
  size_t n = strlen(path), keep = (DT_SHORT_PATH - 4) / 2;
  if (n < DT_SHORT_PATH) return path;
  memcpy(buf, path, keep);
  memcpy(buf + keep, "...", 3);
  memcpy(buf + keep + 3, path + n - keep, keep + 1);
  return buf;
}

int dt_mkdirs(const char *path) {
  if (!path) return dt__seterr(DT_EINVAL, "output directory: NULL path");
  char p[DT_CFG_PATH_MAX], sp[DT_SHORT_PATH];
  size_t n = strlen(path);
  if (n == 0) return dt__seterr(DT_EINVAL, "output directory '': empty path");
  if (n >= sizeof p)
    return dt__seterr(DT_EINVAL, "output directory '%s': path of %zu bytes is too long (at most "
                      "%d)", dt__short_path(path, sp), n, DT_CFG_PATH_MAX - 1);
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0777) && errno != EEXIST) {
      int e = errno;
      return dt__seterr(DT_EIO, "output directory '%s': %s", dt__short_path(p, sp), strerror(e));
    }
    p[i] = c;
  }
  struct stat st;
  if (stat(path, &st) || !S_ISDIR(st.st_mode))
    return dt__seterr(DT_EIO, "output directory '%s': not a directory", dt__short_path(path, sp));
  return DT_OK;
}

/* The holder's pid as written in the lock file, or 0. */
static long lock_holder(int fd) {
  char b[32] = {0};
  ssize_t r = pread(fd, b, sizeof b - 1, 0);
  return r > 0 ? strtol(b, NULL, 10) : 0;
}

int dt__outdir_claim(const char *dir, int *fd_out) {
  *fd_out = -1;
  DT_CHECK(dt_mkdirs(dir));
  char path[DT_CFG_PATH_MAX + 32], sp[DT_SHORT_PATH];
  snprintf(path, sizeof path, "%s/.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    return dt__seterr(DT_EIO, "'%s': %s", dt__short_path(path, sp), strerror(e));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    long pid = e == EWOULDBLOCK ? lock_holder(fd) : 0;
    close(fd);
    if (e != EWOULDBLOCK)
      return dt__seterr(DT_EIO, "'%s': lock: %s", dt__short_path(path, sp), strerror(e));
    return dt__seterr(DT_EAGAIN, "output directory '%s' is in use by another run (pid %ld holds "
                      "its .lock); wait for it to end or choose another --out",
                      dt__short_path(dir, sp), pid);
  }
  char b[32];
  int len = snprintf(b, sizeof b, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) < 0 || pwrite(fd, b, (size_t)len, 0) != len) {
    int e = errno;
    close(fd);
    return dt__seterr(DT_EIO, "'%s': %s", dt__short_path(path, sp), strerror(e));
  }
  /* What an earlier run left must not pass for this run's result. */
  const char *stale[] = {"summary.json", DT_FAILURE_RECORD};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
    if (unlink(path) < 0 && errno != ENOENT) {
      int e = errno;
      close(fd);
      return dt__seterr(DT_EIO, "'%s': cannot remove the previous run's record: %s",
                        dt__short_path(path, sp), strerror(e));
    }
  }
  *fd_out = fd;
  return DT_OK;
}

static int fsync_dir_of(const char *path) {
  char d[DT_CFG_PATH_MAX + 48], sp[DT_SHORT_PATH];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (slash == d) d[1] = '\0';
  else if (slash) *slash = '\0';
  else snprintf(d, sizeof d, ".");
  int fd = open(d, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return dt__seterr(DT_EIO, "'%s': %s", dt__short_path(d, sp), strerror(errno));
  int rc = fsync(fd);
  close(fd);
  /* Some file systems refuse fsync on directories; the rename is done. */
  (void)rc;
  return DT_OK;
}

int dt_write_file_atomic(const char *path, const void *data, size_t len) {
  char tmp[DT_CFG_PATH_MAX + 48], sp[DT_SHORT_PATH];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return dt__seterr(DT_EINVAL, "'%s': path too long", dt__short_path(path, sp));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return dt__seterr(DT_EIO, "'%s': %s", dt__short_path(tmp, sp), strerror(errno));
  const char *p = data;
  size_t left = len;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      unlink(tmp);
      return dt__seterr(DT_EIO, "'%s': write: %s", dt__short_path(tmp, sp), strerror(e));
    }
    p += w;
    left -= (size_t)w;
  }
  if (fsync(fd)) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return dt__seterr(DT_EIO, "'%s': fsync: %s", dt__short_path(tmp, sp), strerror(e));
  }
  if (close(fd)) {
    unlink(tmp);
    return dt__seterr(DT_EIO, "'%s': close: %s", dt__short_path(tmp, sp), strerror(errno));
  }
  if (rename(tmp, path)) {
    int e = errno;
    unlink(tmp);
    return dt__seterr(DT_EIO, "'%s': rename: %s", dt__short_path(path, sp), strerror(e));
  }
  return fsync_dir_of(path);
}

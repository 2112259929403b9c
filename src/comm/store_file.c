/*
 * store_file.c — a store kept as files in one directory, for tests and
 * single-host jobs without a server. Each key is a file whose name is the
 * key hex-encoded; set writes a temporary file and renames it over the key
 * (readers never see half a value); add, compare-and-set and delete hold an
 * flock(2) on DIR/.lock so processes sharing the directory stay atomic.
 * get/wait poll with a growing sleep (1 ms .. 20 ms) until the deadline.
 * Not here: change notification, cleanup of the directory.
 */
#define _GNU_SOURCE
#include "comm/store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct fstore {
  char dir[4096];
  int lockfd;
};

static void key_path(struct fstore *f, const char *key, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "%s/k_", f->dir);
  for (const unsigned char *p = (const unsigned char *)key; *p && n + 3 < cap; p++)
    n += (size_t)snprintf(out + n, cap - n, "%02x", *p);
}

/* Reads a key's file: DT_OK, DT_ENOENT or DT_EIO. *val is malloc'd. */
static int read_key(struct fstore *f, const char *key, uint8_t **val, size_t *len) {
  char path[8192];
  key_path(f, key, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? DT_ENOENT : dt__seterr(DT_EIO, "file store: %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || st.st_size > DT_STORE_VAL_MAX) {
    close(fd);
    return dt__seterr(DT_EIO, "file store: %s: cannot stat or too large", path);
  }
  uint8_t *b = malloc((size_t)st.st_size + 1);
  ssize_t r = b ? read(fd, b, (size_t)st.st_size) : -1;
  close(fd);
  if (r != st.st_size) {
    free(b);
    return dt__seterr(DT_EIO, "file store: %s: short read", path);
  }
  *val = b;
  *len = (size_t)st.st_size;
  return DT_OK;
}

static int write_key(struct fstore *f, const char *key, const void *val, size_t len) {
  char path[8192], tmp[8300];
  key_path(f, key, path, sizeof path);
  static _Atomic unsigned long ctr;
  snprintf(tmp, sizeof tmp, "%s.tmp.%d.%lu", path, (int)getpid(), ++ctr);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return dt__seterr(DT_EIO, "file store: %s: %s", tmp, strerror(errno));
  ssize_t w = len ? write(fd, val, len) : 0;
  close(fd);
  if (w != (ssize_t)len || rename(tmp, path)) {
    unlink(tmp);
    return dt__seterr(DT_EIO, "file store: cannot write key %s in %s", key, f->dir);
  }
  return DT_OK;
}

static void lock(struct fstore *f) { while (flock(f->lockfd, LOCK_EX) && errno == EINTR) {} }
static void unlock(struct fstore *f) { flock(f->lockfd, LOCK_UN); }

static int fs_set(void *self, const char *key, const void *val, size_t len, double t) {
  return write_key(self, key, val, len);
}

static int fs_get(void *self, const char *key, void *buf, size_t cap, size_t *len, double t) {
  double deadline = dt_now() + t, nap = 0.001;
  for (;;) {
    uint8_t *v;
    size_t l;
    int rc = read_key(self, key, &v, &l);
    if (rc == DT_OK) {
      *len = l;
      if (buf) memcpy(buf, v, l < cap ? l : cap);
      free(v);
      if (buf && l > cap) return dt__seterr(DT_ERANGE, "file store: value of '%s' is %zu bytes, buffer %zu", key, l, cap);
      return DT_OK;
    }
    if (rc != DT_ENOENT) return rc;
    if (dt_now() >= deadline)
      return dt__seterr(DT_ETIMEDOUT, "file store %s: key '%s' not set before the deadline", ((struct fstore *)self)->dir, key);
    struct timespec ts = {0, (long)(nap * 1e9)};
    nanosleep(&ts, NULL);
    if (nap < 0.02) nap *= 1.5;
  }
}

static int fs_add(void *self, const char *key, int64_t d, int64_t *res, double t) {
  struct fstore *f = self;
  lock(f);
  uint8_t *v;
  size_t l;
  long long cur = 0;
  int rc = read_key(f, key, &v, &l);
  if (rc == DT_OK) {
    char tmp[32] = {0};
    memcpy(tmp, v, l < 31 ? l : 31);
    cur = strtoll(tmp, NULL, 10);
    free(v);
  } else if (rc != DT_ENOENT) {
    unlock(f);
    return rc;
  }
  cur = (long long)((unsigned long long)cur + (unsigned long long)d);
  char num[32];
  int n = snprintf(num, sizeof num, "%lld", cur);
  rc = write_key(f, key, num, (size_t)n);
  unlock(f);
  *res = cur;
  return rc;
}

static int fs_cas(void *self, const char *key, const void *exp, size_t elen, const void *des,
                  size_t dlen, bool *swapped, void *cur, size_t cap, size_t *curlen, double t) {
  struct fstore *f = self;
  lock(f);
  uint8_t *v = NULL;
  size_t l = 0;
  int rc = read_key(f, key, &v, &l);
  if (rc < 0 && rc != DT_ENOENT) {
    unlock(f);
    return rc;
  }
  bool exists = rc == DT_OK;
  *swapped = dt__kv_cas_match(v, l, exists, exp, elen);
  if (*swapped) {
    rc = write_key(f, key, des, dlen);
    free(v);
    v = NULL;
    if (rc == DT_OK) {
      *curlen = dlen;
      if (cur) memcpy(cur, des, dlen < cap ? dlen : cap);
    }
  } else {
    rc = DT_OK;
    *curlen = l;
    if (cur && v) memcpy(cur, v, l < cap ? l : cap);
  }
  free(v);
  unlock(f);
  return rc;
}

static int fs_del(void *self, const char *key, bool *existed, double t) {
  struct fstore *f = self;
  char path[8192];
  key_path(f, key, path, sizeof path);
  lock(f);
  int r = unlink(path);
  unlock(f);
  *existed = r == 0;
  if (r && errno != ENOENT) return dt__seterr(DT_EIO, "file store: delete %s: %s", path, strerror(errno));
  return DT_OK;
}

static void fs_destroy(void *self) {
  struct fstore *f = self;
  if (f->lockfd >= 0) close(f->lockfd);
  free(f);
}

static const struct dt_store_backend file_backend = {"file", fs_set, fs_get, fs_add, fs_cas, fs_del, fs_destroy, NULL};

int dt_store_open_file(dt_store **out, const char *dir) {
  if (!out) return dt__seterr(DT_EINVAL, "file store: out is NULL");
  if (!dir || !*dir || strlen(dir) >= 4000) return dt__seterr(DT_EINVAL, "file store: bad directory");
  if (mkdir(dir, 0700) && errno != EEXIST)
    return dt__seterr(DT_EIO, "file store: cannot create %s: %s", dir, strerror(errno));
  struct fstore *f = calloc(1, sizeof *f);
  if (!f) return dt__seterr(DT_ENOMEM, "file store: out of memory");
  snprintf(f->dir, sizeof f->dir, "%s", dir);
  char lp[4200];
  snprintf(lp, sizeof lp, "%s/.lock", dir);
  f->lockfd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (f->lockfd < 0) {
    int e = errno;
    free(f);
    return dt__seterr(DT_EIO, "file store: cannot open %s: %s", lp, strerror(e));
  }
  return dt__store_wrap(out, &file_backend, f);
}

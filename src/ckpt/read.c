/*
 * read.c — checkpoints back from disk, trusting nothing: a checkpoint is
 * valid only if its manifest parses and carries its own hash, and every
 * file it lists is present with the listed size and SHA-256 (safetensors
 * files must also parse, JSON files must be JSON). Under a root holding
 * several checkpoints the newest valid one is chosen; `latest` is read and
 * a dangling or damaged target is reported, and every checkpoint skipped
 * is a warning that names it and the reason.
 *
 * It does not interpret the contents (the engine does) and never writes.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

/* A checkpoint file may be large (optimizer state of a big model). */
#define FILE_MAX ((size_t)1 << 40)

int dt__read_all(const char *path, size_t max, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return dt__seterr(errno == ENOENT ? DT_ENOENT : DT_EIO, "'%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return dt__seterr(DT_EIO, "'%s': not a regular file", path);
  }
  if ((uint64_t)st.st_size > max) {
    close(fd);
    return dt__seterr(DT_ECORRUPT, "'%s': %lld bytes, more than the %zu allowed", path,
                      (long long)st.st_size, max);
  }
  size_t n = (size_t)st.st_size;
  uint8_t *b = malloc(n ? n : 1);
  if (!b) {
    close(fd);
    return dt__seterr(DT_ENOMEM, "'%s': out of memory for %zu bytes", path, n);
  }
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != n) {
    free(b);
    return dt__seterr(DT_EIO, "'%s': read %zu of %zu bytes", path, got, n);
  }
  *out = b;
  *len = n;
  return DT_OK;
}

/* Checks one file's bytes against its manifest entry and its format. */
static int check_bytes(const dt_ckpt_info *info, const dt_ckpt_entry *f, const uint8_t *b,
                       size_t n, const char *path) {
  if (n != f->bytes)
    return dt__seterr(DT_ECORRUPT, "'%s': %zu bytes, the manifest says %llu (truncated or "
                      "extended)", path, n, (unsigned long long)f->bytes);
  char hex[65];
  dt_sha256_hex(b, n, hex);
  if (strcmp(hex, f->sha256))
    return dt__seterr(DT_ECORRUPT, "'%s': SHA-256 mismatch against the manifest (damaged)",
                      path);
  (void)info;
  size_t nl = strlen(f->name);
  if (nl > 12 && !strcmp(f->name + nl - 12, ".safetensors")) {
    dt_st st;
    DT_CHECK(dt__st_parse(&st, b, n, path));
    dt__st_free(&st);
  } else if (nl > 5 && !strcmp(f->name + nl - 5, ".json")) {
    cJSON *j = cJSON_ParseWithLength((const char *)b, n);
    int ok = j != NULL;
    cJSON_Delete(j);
    if (!ok) return dt__seterr(DT_ECORRUPT, "'%s': not JSON", path);
  }
  return DT_OK;
}

int dt__ckpt_load(const dt_ckpt_info *info, const char *name, uint8_t **out, size_t *len) {
  const dt_ckpt_entry *f = NULL;
  for (int i = 0; i < info->nfiles; i++)
    if (!strcmp(info->files[i].name, name)) f = &info->files[i];
  if (!f)
    return dt__seterr(DT_ENOENT, "checkpoint '%s' has no file '%s' in its manifest", info->dir,
                      name);
  char path[DT_CKPT_PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/%s", info->dir, name);
  DT_CHECK(dt__read_all(path, FILE_MAX, out, len));
  int rc = check_bytes(info, f, *out, *len, path);
  if (rc < 0) {
    free(*out);
    *out = NULL;
  }
  return rc;
}

#define HASH_CHUNK ((size_t)1 << 20)
/* JSON files are read whole to be parsed; they are small */
#define JSON_MAX ((size_t)64 << 20)

int dt__ckpt_pread(int fd, void *buf, size_t len, uint64_t off, const char *path) {
  char *b = buf;
  while (len) {
    ssize_t r = pread(fd, b, len, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return dt__seterr(DT_EIO, "'%s': read at byte %llu: %s", path,
                                 (unsigned long long)off, strerror(errno));
    if (r == 0)
      return dt__seterr(DT_ECORRUPT, "'%s': ends before byte %llu (truncated since it was "
                        "verified)", path, (unsigned long long)(off + len));
    b += r, len -= (size_t)r, off += (uint64_t)r;
  }
  return DT_OK;
}

/* The header of the safetensors file fd (len bytes) parsed into st. */
static int read_head(int fd, uint64_t len, dt_st *st, const char *path) {
  uint8_t l8[8] = {0};
  memset(st, 0, sizeof *st);
  if (len < 8) return dt__st_parse_head(st, l8, 0, len, path);
  DT_CHECK(dt__ckpt_pread(fd, l8, 8, 0, path));
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | l8[i];
  if (hl < 2 || hl > DT_ST_HEADER_MAX || hl > len - 8) return dt__st_parse_head(st, l8, 8, len, path);
  uint8_t *h = malloc(8 + (size_t)hl);
  if (!h) return dt__seterr(DT_ENOMEM, "'%s': out of memory for its header", path);
  int rc = dt__ckpt_pread(fd, h, 8 + (size_t)hl, 0, path);
  if (rc == DT_OK) rc = dt__st_parse_head(st, h, 8 + (size_t)hl, len, path);
  free(h);
  return rc;
}

/* One file of a checkpoint against its manifest entry, streamed: size,
 * SHA-256 in chunks, then its format (a safetensors header, JSON). The
 * file's identity goes into f for dt__ckpt_open. */
static int verify_file(dt_ckpt_entry *f, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return dt__seterr(errno == ENOENT ? DT_ENOENT : DT_EIO, "'%s': %s", path, strerror(errno));
  struct stat sb;
  int rc = DT_OK;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode))
    rc = dt__seterr(DT_EIO, "'%s': not a regular file", path);
  else if ((uint64_t)sb.st_size != f->bytes)
    rc = dt__seterr(DT_ECORRUPT, "'%s': %lld bytes, the manifest says %llu (truncated or "
                    "extended)", path, (long long)sb.st_size, (unsigned long long)f->bytes);
  uint8_t *b = rc == DT_OK ? malloc(HASH_CHUNK) : NULL;
  if (rc == DT_OK && !b) rc = dt__seterr(DT_ENOMEM, "'%s': out of memory", path);
  dt_sha256_ctx *h = rc == DT_OK ? dt_sha256_begin() : NULL;
  if (rc == DT_OK && !h) rc = dt__seterr(DT_ENOMEM, "'%s': out of memory", path);
  for (uint64_t at = 0; rc == DT_OK && at < f->bytes; at += HASH_CHUNK) {
    size_t k = f->bytes - at < HASH_CHUNK ? (size_t)(f->bytes - at) : HASH_CHUNK;
    rc = dt__ckpt_pread(fd, b, k, at, path);
    if (rc == DT_OK) dt_sha256_update(h, b, k);
  }
  free(b);
  if (h) {
    uint8_t d[32];
    char hex[65];
    dt_sha256_end(h, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    if (rc == DT_OK && strcmp(hex, f->sha256))
      rc = dt__seterr(DT_ECORRUPT, "'%s': SHA-256 mismatch against the manifest (damaged)",
                      path);
  }
  size_t nl = strlen(f->name);
  if (rc == DT_OK && nl > 12 && !strcmp(f->name + nl - 12, ".safetensors")) {
    dt_st st;
    rc = read_head(fd, f->bytes, &st, path);
    if (rc == DT_OK) dt__st_free(&st);
  } else if (rc == DT_OK && nl > 5 && !strcmp(f->name + nl - 5, ".json")) {
    uint8_t *j = NULL;
    size_t jn = 0;
    rc = dt__read_all(path, JSON_MAX, &j, &jn);
    cJSON *o = rc == DT_OK ? cJSON_ParseWithLength((const char *)j, jn) : NULL;
    if (rc == DT_OK && !o) rc = dt__seterr(DT_ECORRUPT, "'%s': not JSON", path);
    cJSON_Delete(o);
    free(j);
  }
  if (rc == DT_OK) {
    f->dev = (uint64_t)sb.st_dev;
    f->ino = (uint64_t)sb.st_ino;
    f->ctime_ns = (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec;
  }
  close(fd);
  return rc;
}

int dt__ckpt_open(const dt_ckpt_info *info, const char *name, int *fd, char *path, size_t cap) {
  *fd = -1;
  const dt_ckpt_entry *f = NULL;
  for (int i = 0; i < info->nfiles; i++)
    if (!strcmp(info->files[i].name, name)) f = &info->files[i];
  if (!f)
    return dt__seterr(DT_ENOENT, "checkpoint '%s' has no file '%s' in its manifest", info->dir,
                      name);
  snprintf(path, cap, "%s/%s", info->dir, name);
  int d = open(path, O_RDONLY | O_CLOEXEC);
  if (d < 0)
    return dt__seterr(errno == ENOENT ? DT_ENOENT : DT_EIO, "'%s': %s", path, strerror(errno));
  struct stat sb;
  if (fstat(d, &sb)) {
    close(d);
    return dt__seterr(DT_EIO, "'%s': %s", path, strerror(errno));
  }
  const int64_t ct = (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec;
  if ((uint64_t)sb.st_size != f->bytes || (f->ino && ((uint64_t)sb.st_ino != f->ino ||
                                                      (uint64_t)sb.st_dev != f->dev ||
                                                      ct != f->ctime_ns))) {
    close(d);
    return dt__seterr(DT_ECORRUPT, "'%s': changed since it was verified (%lld bytes, the "
                      "manifest says %llu)", path, (long long)sb.st_size,
                      (unsigned long long)f->bytes);
  }
  *fd = d;
  return DT_OK;
}

int dt__ckpt_open_st(const dt_ckpt_info *info, const char *name, dt_st *st, int *fd) {
  char path[DT_CKPT_PATH_MAX + 80];
  memset(st, 0, sizeof *st);
  DT_CHECK(dt__ckpt_open(info, name, fd, path, sizeof path));
  uint64_t len = 0;
  for (int i = 0; i < info->nfiles; i++)
    if (!strcmp(info->files[i].name, name)) len = info->files[i].bytes;
  int rc = read_head(*fd, len, st, path);
  if (rc < 0) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

int dt__ckpt_verify(const char *dir, dt_ckpt_info *info) {
  memset(info, 0, sizeof *info);
  snprintf(info->dir, sizeof info->dir, "%s", dir);
  char path[DT_CKPT_PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_MANIFEST);
  uint8_t *b;
  size_t n;
  int rc = dt__read_all(path, 1u << 20, &b, &n);
  if (rc == DT_ENOENT)
    return dt__seterr(DT_ENOENT, "'%s': no manifest (deleted, or the checkpoint was never "
                      "completed)", path);
  if (rc < 0) return rc;
  rc = dt__manifest_parse((const char *)b, n, path, info);
  free(b);
  if (rc < 0) return rc;
  for (int i = 0; i < info->nfiles; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, info->files[i].name);
    DT_CHECK(verify_file(&info->files[i], path));
  }
  return DT_OK;
}

static int cmp_desc(const void *a, const void *b) { return -strcmp((const char *)a, (const char *)b); }

/* "step-" followed by 8 or more digits and nothing else. */
static int is_step_name(const char *s) {
  if (strncmp(s, "step-", 5)) return 0;
  size_t n = 0;
  for (s += 5; *s; s++, n++)
    if (*s < '0' || *s > '9') return 0;
  return n >= 8 && n <= 18;
}

int dt__ckpt_list(const char *root, char (**names)[32]) {
  *names = NULL;
  DIR *d = opendir(root);
  if (!d)
    return dt__seterr(errno == ENOENT ? DT_ENOENT : DT_EIO, "checkpoint directory '%s': %s",
                      root, strerror(errno));
  int n = 0, cap = 0;
  char (*v)[32] = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_step_name(e->d_name)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char (*nv)[32] = realloc(v, (size_t)cap * sizeof *v);
      if (!nv) {
        free(v);
        closedir(d);
        return dt__seterr(DT_ENOMEM, "checkpoint list: out of memory");
      }
      v = nv;
    }
    snprintf(v[n++], 32, "%s", e->d_name);
  }
  closedir(d);
  /* same digit count (8) sorts as numbers; longer names (bigger steps) first */
  qsort(v, (size_t)n, sizeof *v, cmp_desc);
  for (int i = 0; i + 1 < n; i++)
    for (int j = i + 1; j < n; j++)
      if (strlen(v[j]) > strlen(v[i])) {
        char t[32];
        memcpy(t, v[i], 32);
        memcpy(v[i], v[j], 32);
        memcpy(v[j], t, 32);
      }
  *names = v;
  return n;
}

static int exists(const char *dir, const char *name) {
  char p[DT_CKPT_PATH_MAX + 40];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0;
}

int dt__ckpt_root_of(const char *path, char *root, size_t cap) {
  struct stat st;
  if (stat(path, &st) || !S_ISDIR(st.st_mode))
    return dt__seterr(DT_ENOENT, "checkpoint '%s': %s", path,
                      errno && stat(path, &st) ? strerror(errno) : "not a directory");
  if (exists(path, DT_CKPT_MANIFEST) || is_step_name(strrchr(path, '/') ? strrchr(path, '/') + 1
                                                                         : path)) {
    /* a checkpoint directory: its parent is the root */
    snprintf(root, cap, "%s", path);
    char *s = strrchr(root, '/');
    if (s && s != root) *s = '\0';
    else if (s) s[1] = '\0';
    else snprintf(root, cap, ".");
    return DT_OK;
  }
  char sub[DT_CKPT_PATH_MAX + 8];
  snprintf(sub, sizeof sub, "%s/ckpt", path);
  if (!exists(path, DT_CKPT_LATEST) && stat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(root, cap, "%s", sub);
    return DT_OK;
  }
  snprintf(root, cap, "%s", path);
  return DT_OK;
}

int dt__ckpt_find(const char *path, dt_ckpt_info *info) {
  char root[DT_CKPT_PATH_MAX], p[DT_CKPT_PATH_MAX + 40];
  DT_CHECK(dt__ckpt_root_of(path, root, sizeof root));
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  int explicit_ckpt = exists(path, DT_CKPT_MANIFEST) || is_step_name(base);
  char tried[1024] = "", why[600] = "";
  size_t tl = 0;
  int ntried = 0;
  if (explicit_ckpt) {
    if (dt__ckpt_verify(path, info) == DT_OK) return DT_OK;
    DT_LOG_WARN("checkpoint '%s' skipped: %s", path, dt_errmsg());
    snprintf(why, sizeof why, "%s", dt_errmsg());
    ntried++;
    tl += (size_t)snprintf(tried + tl, sizeof tried - tl, " %s", base);
  }
  /* latest: report what is wrong with it; the choice is the newest valid */
  char latest[64] = "";
  snprintf(p, sizeof p, "%s/%s", root, DT_CKPT_LATEST);
  uint8_t *lb;
  size_t ln;
  if (dt__read_all(p, 63, &lb, &ln) == DT_OK) {
    memcpy(latest, lb, ln);
    latest[ln] = '\0';
    free(lb);
    latest[strcspn(latest, "\n")] = '\0';
    if (!is_step_name(latest) || !exists(root, latest))
      DT_LOG_WARN("'%s' names '%s', which does not exist (dangling); looking for the newest "
                  "valid checkpoint", p, latest);
  }
  char (*names)[32] = NULL;
  int n = dt__ckpt_list(root, &names);
  if (n < 0) return n;
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%s", root, names[i]);
    if (explicit_ckpt && strcmp(names[i], base) > 0 && strlen(names[i]) >= strlen(base))
      continue; /* only older than the one asked for */
    if (explicit_ckpt && !strcmp(names[i], base)) continue;
    if (dt__ckpt_verify(p, info) == DT_OK) {
      if (tried[0]) DT_LOG_WARN("using checkpoint '%s' instead", p);
      free(names);
      return DT_OK;
    }
    DT_LOG_WARN("checkpoint '%s' skipped: %s", p, dt_errmsg());
    if (!ntried++) snprintf(why, sizeof why, "%s", dt_errmsg());
    if (tl < sizeof tried - 40) tl += (size_t)snprintf(tried + tl, sizeof tried - tl, " %s", names[i]);
  }
  free(names);
  if (!tried[0])
    return dt__seterr(DT_ENOENT, "no checkpoint under '%s'", root);
  if (ntried == 1) /* the one reason, naming the file, in the error itself */
    return dt__seterr(DT_ENOENT, "no valid checkpoint under '%s' (tried:%s: %s)", root, tried,
                      why);
  return dt__seterr(DT_ENOENT, "no valid checkpoint under '%s' (tried:%s)", root, tried);
}

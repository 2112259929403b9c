/*
 * write.c — a snapshot on disk, atomically. The files go into
 * ROOT/.tmp-step-NNNNNNNN-PID, each hashed (SHA-256) as it is written and
 * fsynced; then manifest.json, the directory fsynced, renamed to
 * ROOT/step-NNNNNNNN and ROOT fsynced; then ROOT/latest is replaced through
 * a temporary file and a rename (fsynced again), and the oldest checkpoints
 * beyond `keep` are removed. A crash at any moment leaves either the old
 * state or the new one plus, at worst, a .tmp directory the next writer
 * removes; a reader never trusts a directory without a valid manifest.
 *
 * Also the snapshot itself (memory the training thread fills; tensors
 * may instead live in a file, read back in 1 MiB chunks as they are
 * written and hashed) and the file writer with a running hash. It does not decide what is saved or
 * when (the engine does), and it never prints: errors name the path.
 */
#define _GNU_SOURCE /* sync_file_range */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

/* ---- files with a running SHA-256 ------------------------------------------------ */

int dt__wf_open(dt_wfile *w, const char *path) {
  memset(w, 0, sizeof *w);
  w->fd = -1;
  snprintf(w->path, sizeof w->path, "%s", path);
  w->md = EVP_MD_CTX_new();
  if (!w->md || EVP_DigestInit_ex(w->md, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(w->md);
    w->md = NULL;
    return dt__seterr(DT_ENOMEM, "'%s': cannot start SHA-256", path);
  }
  w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    int e = errno;
    EVP_MD_CTX_free(w->md);
    w->md = NULL;
    return dt__seterr(DT_EIO, "'%s': %s", path, strerror(e));
  }
  return DT_OK;
}

/* Hashing a chunk just before writing it keeps it in cache for write().
 * Each written chunk is handed to the disk at once (sync_file_range WRITE,
 * which does not wait), so the device works while the next chunks are
 * hashed and copied and the final fsync has little left to do: the file
 * streams towards the disk's sequential rate instead of taking copy time
 * plus flush time. No waits in between: under CPU contention every block
 * costs a scheduling delay (measured: bench/RESULTS.md, checkpoints). */
#define WF_CHUNK (4u << 20)

static void stream_out(dt_wfile *w, uint64_t end) {
#ifdef SYNC_FILE_RANGE_WRITE
  uint64_t start = end >= WF_CHUNK ? end - WF_CHUNK : 0;
  (void)sync_file_range(w->fd, (off_t)start, (off_t)(end - start), SYNC_FILE_RANGE_WRITE);
#else
  (void)w;
  (void)end;
#endif
}

int dt__wf_write(dt_wfile *w, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    /* chunks end on WF_CHUNK boundaries of the file */
    size_t room = WF_CHUNK - (size_t)(w->bytes % WF_CHUNK);
    size_t n = len < room ? len : room;
    if (w->md) EVP_DigestUpdate(w->md, p, n);
    size_t done = 0;
    while (done < n) {
      ssize_t r = write(w->fd, p + done, n - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        int e = r < 0 ? errno : ENOSPC;
        return dt__seterr(DT_EIO, "'%s': write of %zu bytes at %llu: %s", w->path, n - done,
                          (unsigned long long)(w->bytes + done), strerror(e));
      }
      done += (size_t)r;
    }
    w->bytes += n;
    if (w->bytes % WF_CHUNK == 0) stream_out(w, w->bytes);
    p += n;
    len -= n;
  }
  return DT_OK;
}

int dt__wf_close(dt_wfile *w, char hex[65]) {
  uint8_t d[32];
  unsigned dl = 0;
  int rc = DT_OK;
  if (fsync(w->fd)) rc = dt__seterr(DT_EIO, "'%s': fsync: %s", w->path, strerror(errno));
  if (close(w->fd) && rc == DT_OK)
    rc = dt__seterr(DT_EIO, "'%s': close: %s", w->path, strerror(errno));
  w->fd = -1;
  if (w->md) { /* NULL: hashed elsewhere (dt__wf_hash_elsewhere) */
    EVP_DigestFinal_ex(w->md, d, &dl);
    EVP_MD_CTX_free(w->md);
    w->md = NULL;
    if (hex) dt_hex(d, 32, hex);
  }
  return rc;
}

void dt__wf_hash_elsewhere(dt_wfile *w) {
  EVP_MD_CTX_free(w->md);
  w->md = NULL;
}

void dt__wf_abort(dt_wfile *w) {
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
  if (w->md) EVP_MD_CTX_free(w->md);
  w->md = NULL;
  unlink(w->path);
}

/* ---- snapshots ---------------------------------------------------------------------- */

void dt__snap_reset(dt_ckpt_snap *s, int64_t step, int epoch) {
  for (int i = 0; i < s->nfiles; i++) {
    dt__st_free(&s->files[i].st);
    free(s->files[i].text);
  }
  memset(s->files, 0, sizeof s->files);
  s->nfiles = 0;
  s->used = 0;
  s->step = step;
  s->epoch = epoch;
}

void *dt__snap_alloc(dt_ckpt_snap *s, size_t bytes) {
  if (s->used >= (int)(sizeof s->blk / sizeof s->blk[0])) return NULL;
  int i = s->used;
  if (i >= s->nblk || s->blk[i].cap < bytes) {
    if (i < s->nblk) dt_free(s->blk[i].p);
    else s->nblk = i + 1;
    s->blk[i].p = dt_alloc(bytes ? bytes : 1);
    s->blk[i].cap = s->blk[i].p ? bytes : 0;
    if (!s->blk[i].p) return NULL;
  }
  s->used++;
  return s->blk[i].p;
}

static dt_ckpt_file *new_file(dt_ckpt_snap *s, const char *name, const char *owner,
                              const char *role) {
  if (s->nfiles >= DT_CKPT_FILES_MAX) {
    dt__seterr(DT_EINVAL, "checkpoint: more than %d files", DT_CKPT_FILES_MAX);
    return NULL;
  }
  dt_ckpt_file *f = &s->files[s->nfiles++];
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", name);
  snprintf(f->owner, sizeof f->owner, "%s", owner);
  snprintf(f->role, sizeof f->role, "%s", role);
  return f;
}

int dt__snap_st(dt_ckpt_snap *s, const char *name, const char *owner, const char *role,
                dt_st **st) {
  dt_ckpt_file *f = new_file(s, name, owner, role);
  if (!f) return DT_EINVAL;
  f->is_st = 1;
  *st = &f->st;
  return DT_OK;
}

int dt__snap_text(dt_ckpt_snap *s, const char *name, const char *owner, const char *role,
                  const char *text, size_t len) {
  dt_ckpt_file *f = new_file(s, name, owner, role);
  if (!f) return DT_EINVAL;
  f->text = malloc(len + 1);
  if (!f->text) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
  memcpy(f->text, text, len);
  f->text[len] = '\0';
  f->len = len;
  return DT_OK;
}

void dt__snap_free(dt_ckpt_snap *s) {
  if (!s) return;
  dt__snap_reset(s, 0, 0);
  for (int i = 0; i < s->nblk; i++) dt_free(s->blk[i].p);
  s->nblk = 0;
}

/* ---- directories ------------------------------------------------------------------ */

static int mkdir_p(const char *path) {
  char p[DT_CKPT_PATH_MAX];
  size_t n = strlen(path);
  if (!n || n >= sizeof p)
    return dt__seterr(DT_EINVAL, "checkpoint directory '%.200s': empty or too long", path);
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0777) && errno != EEXIST)
      return dt__seterr(DT_EIO, "checkpoint directory '%s': %s", p, strerror(errno));
    p[i] = c;
  }
  struct stat st;
  if (stat(path, &st) || !S_ISDIR(st.st_mode))
    return dt__seterr(DT_EIO, "checkpoint directory '%s': not a directory", path);
  return DT_OK;
}

static int fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return dt__seterr(DT_EIO, "'%s': %s", path, strerror(errno));
  int rc = DT_OK;
  if (fsync(fd) && errno != EINVAL) rc = dt__seterr(DT_EIO, "'%s': fsync: %s", path, strerror(errno));
  close(fd);
  return rc;
}

/* Removes a directory of plain files (a checkpoint or a temporary one). */
static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    char p[DT_CKPT_PATH_MAX + 300];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", path, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(path);
}

void dt__ckpt_dirname(const char *root, int64_t step, char *out, size_t cap) {
  snprintf(out, cap, "%s/step-%08lld", root, (long long)step);
}

int dt__ckpt_root_check(const char *root) {
  DT_CHECK(mkdir_p(root));
  char p[DT_CKPT_PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/.probe-%ld", root, (long)getpid());
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return dt__seterr(DT_EIO, "checkpoint directory '%s': %s", root, strerror(errno));
  int ok = write(fd, "x", 1) == 1;
  int e = errno;
  close(fd);
  unlink(p);
  if (!ok) return dt__seterr(DT_EIO, "checkpoint directory '%s': %s", root, strerror(e));
  /* a writer killed mid-write left its temporary directory: nobody reads it */
  DIR *d = opendir(root);
  if (d) {
    struct dirent *ent;
    while ((ent = readdir(d))) {
      if (strncmp(ent->d_name, ".tmp-", 5) && strncmp(ent->d_name, ".latest.tmp-", 12)) continue;
      snprintf(p, sizeof p, "%s/%s", root, ent->d_name);
      if (ent->d_name[1] == 't') remove_tree(p);
      else unlink(p);
    }
    closedir(d);
  }
  return DT_OK;
}

/* ---- the write ---------------------------------------------------------------------- */

/* A large tensor file is hashed on a second thread while this one writes
 * it: the snapshot does not change during the write, and SHA-256 (about
 * 1.7 GB/s with SHA-NI here) then overlaps the copy into the page cache
 * instead of adding to it (measured: bench/RESULTS.md, checkpoints). Small
 * files are hashed inline; a thread would cost more than it saves. */
#define HASH_THREAD_MIN (512u << 10)

typedef struct hash_job {
  const dt_ckpt_file *f;
  const char *hdr;
  size_t hl;
  char hex[65];
  int ok;
} hash_job;

/* A tensor held in a file (dt__st_add_fd) goes through a buffer of
 * FD_CHUNK bytes: the writer never holds it whole. */
#define FD_CHUNK (1u << 20)

/* Calls f(ud, bytes, n) over tensor t's bytes, in order. */
static int tensor_each(const dt_st_tensor *t, uint8_t *buf, int (*f)(void *, const void *, size_t),
                       void *ud) {
  const uint64_t len = t->end - t->begin;
  if (!t->from_fd) return len ? f(ud, t->data, (size_t)len) : DT_OK;
  for (uint64_t at = 0; at < len;) {
    size_t n = len - at < FD_CHUNK ? (size_t)(len - at) : FD_CHUNK;
    ssize_t r = pread(t->fd, buf, n, (off_t)(t->foff + at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return dt__seterr(DT_EIO, "tensor '%s': reading its spilled bytes at %llu: %s", t->name,
                        (unsigned long long)(t->foff + at), r < 0 ? strerror(errno) : "short file");
    DT_CHECK(f(ud, buf, (size_t)r));
    at += (uint64_t)r;
  }
  return DT_OK;
}

static int any_from_fd(const dt_st *st) {
  for (int i = 0; i < st->n; i++)
    if (st->t[i].from_fd) return 1;
  return 0;
}

static int hash_chunk(void *ud, const void *p, size_t n) {
  return EVP_DigestUpdate(ud, p, n) == 1 ? DT_OK : DT_ENOMEM;
}

static int write_chunk(void *ud, const void *p, size_t n) { return dt__wf_write(ud, p, n); }

static void *hash_main(void *arg) {
  hash_job *j = arg;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  uint8_t d[32];
  unsigned dl = 0;
  j->ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
          EVP_DigestUpdate(md, j->hdr, j->hl) == 1;
  uint8_t *buf = j->ok && any_from_fd(&j->f->st) ? malloc(FD_CHUNK) : NULL;
  if (j->ok && any_from_fd(&j->f->st) && !buf) j->ok = 0;
  for (int i = 0; i < j->f->st.n && j->ok; i++)
    j->ok = tensor_each(&j->f->st.t[i], buf, hash_chunk, md) == DT_OK;
  free(buf);
  j->ok = j->ok && EVP_DigestFinal_ex(md, d, &dl) == 1 && dl == 32;
  EVP_MD_CTX_free(md);
  if (j->ok) dt_hex(d, 32, j->hex);
  return NULL;
}

static int write_file(const char *dir, const dt_ckpt_file *f, dt_ckpt_entry *out) {
  char path[DT_CKPT_PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/%s", dir, f->name);
  dt_wfile w;
  DT_CHECK(dt__wf_open(&w, path));
  int rc = DT_OK, threaded = 0;
  if (f->is_st) {
    char *hdr = NULL;
    size_t hl = 0;
    rc = dt__st_header(&f->st, &hdr, &hl);
    uint64_t total = hl;
    for (int i = 0; i < f->st.n; i++) total += f->st.t[i].end - f->st.t[i].begin;
    hash_job job = {f, hdr, hl, "", 0};
    pthread_t th;
    threaded = rc == DT_OK && total >= HASH_THREAD_MIN &&
               pthread_create(&th, NULL, hash_main, &job) == 0;
    if (threaded) dt__wf_hash_elsewhere(&w);
    if (rc == DT_OK) rc = dt__wf_write(&w, hdr, hl);
    uint8_t *buf = NULL;
    if (rc == DT_OK && any_from_fd(&f->st) && !(buf = malloc(FD_CHUNK)))
      rc = dt__seterr(DT_ENOMEM, "'%s': out of memory", path);
    for (int i = 0; i < f->st.n && rc == DT_OK; i++)
      rc = tensor_each(&f->st.t[i], buf, write_chunk, &w);
    free(buf);
    if (threaded) {
      pthread_join(th, NULL);
      if (rc == DT_OK && !job.ok) rc = dt__seterr(DT_ENOMEM, "'%s': SHA-256 failed", path);
      memcpy(out->sha256, job.hex, sizeof job.hex);
    }
    free(hdr);
  } else {
    rc = dt__wf_write(&w, f->text, f->len);
  }
  if (rc < 0) {
    dt__wf_abort(&w);
    return rc;
  }
  uint64_t bytes = w.bytes;
  DT_CHECK(dt__wf_close(&w, threaded ? NULL : out->sha256));
  snprintf(out->name, sizeof out->name, "%s", f->name);
  snprintf(out->owner, sizeof out->owner, "%s", f->owner);
  snprintf(out->role, sizeof out->role, "%s", f->role);
  out->bytes = bytes;
  return DT_OK;
}

/* ROOT/latest says "step-NNNNNNNN": replaced through a rename. */
static int point_latest(const char *root, const char *name) {
  char tmp[DT_CKPT_PATH_MAX + 64], dst[DT_CKPT_PATH_MAX + 16];
  snprintf(tmp, sizeof tmp, "%s/.latest.tmp-%ld", root, (long)getpid());
  snprintf(dst, sizeof dst, "%s/%s", root, DT_CKPT_LATEST);
  unlink(tmp);
  dt_wfile w;
  DT_CHECK(dt__wf_open(&w, tmp));
  char line[64];
  int n = snprintf(line, sizeof line, "%s\n", name);
  int rc = dt__wf_write(&w, line, (size_t)n);
  if (rc < 0) {
    dt__wf_abort(&w);
    return rc;
  }
  rc = dt__wf_close(&w, NULL);
  if (rc == DT_OK && rename(tmp, dst))
    rc = dt__seterr(DT_EIO, "'%s': rename: %s", dst, strerror(errno));
  if (rc < 0) {
    unlink(tmp);
    return rc;
  }
  return fsync_dir(root);
}

/* Keeps the newest `keep` checkpoints and always the one `latest` names. */
static void prune(const char *root, int keep, const char *latest) {
  if (keep <= 0) return;
  char (*names)[32] = NULL;
  int n = dt__ckpt_list(root, &names);
  for (int i = keep; i < n; i++) {
    if (!strcmp(names[i], latest)) continue;
    char p[DT_CKPT_PATH_MAX + 40];
    snprintf(p, sizeof p, "%s/%s", root, names[i]);
    remove_tree(p);
  }
  free(names);
}

int dt__ckpt_write(const char *root, const dt_ckpt_snap *s, int keep, char *out, size_t cap) {
  DT_CHECK(mkdir_p(root));
  char final[DT_CKPT_PATH_MAX + 32], tmp[DT_CKPT_PATH_MAX + 64], name[32];
  snprintf(name, sizeof name, "step-%08lld", (long long)s->step);
  snprintf(final, sizeof final, "%s/%s", root, name);
  snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%ld", root, name, (long)getpid());
  if (out) snprintf(out, cap, "%s", final);
  struct stat st;
  if (stat(final, &st) == 0) {
    /* the same step again (an epoch end on a periodic step): same state */
    DT_CHECK(point_latest(root, name));
    prune(root, keep, name);
    return DT_OK;
  }
  remove_tree(tmp);
  if (mkdir(tmp, 0777)) return dt__seterr(DT_EIO, "'%s': %s", tmp, strerror(errno));
  dt_ckpt_info *info = calloc(1, sizeof *info);
  if (!info) {
    rmdir(tmp);
    return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
  }
  int rc = DT_OK;
  for (int i = 0; i < s->nfiles && rc == DT_OK; i++)
    rc = write_file(tmp, &s->files[i], &info->files[i]);
  if (rc == DT_OK) {
    info->nfiles = s->nfiles;
    info->step = s->step;
    info->epoch = s->epoch;
    info->created = (double)time(NULL);
    snprintf(info->dtrain, sizeof info->dtrain, "%s", DT_VERSION_STRING);
    char *text = NULL;
    size_t len = 0;
    rc = dt__manifest_build(info, &text, &len);
    if (rc == DT_OK) {
      dt_ckpt_file mf = {.is_st = 0, .text = text, .len = len};
      snprintf(mf.name, sizeof mf.name, "%s", DT_CKPT_MANIFEST);
      dt_ckpt_entry me;
      rc = write_file(tmp, &mf, &me);
      free(text);
    }
  }
  free(info);
  if (rc == DT_OK) rc = fsync_dir(tmp);
  if (rc == DT_OK && rename(tmp, final))
    rc = dt__seterr(DT_EIO, "'%s': rename: %s", final, strerror(errno));
  if (rc < 0) {
    remove_tree(tmp);
    return rc;
  }
  DT_CHECK(fsync_dir(root));
  DT_CHECK(point_latest(root, name));
  prune(root, keep, name);
  return DT_OK;
}

/*
 * obs.c — one rank's observability page: opening it (a shared file mapping
 * under DIR/obs, or anonymous memory), registering metrics by name,
 * updating them with single atomic operations, and the flight recorder's
 * ring of the last DT_OBS_FR_LEN operations. Readers in other processes
 * see every store as it happens (obs_file.h); nothing here formats,
 * serves or diagnoses (expo.c, http_mhd.c, diag.c), and spans live in trace.c.
 */
#define _GNU_SOURCE
#include "obs/obs_int.h"
#include "obs/obs_diag.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const double dt_obs_seconds_bounds[DT_OBS_MAX_BOUNDS] = {
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

static uint64_t d2b(double d) {
  uint64_t b;
  memcpy(&b, &d, 8);
  return b;
}
double dt__obs_bits_to_d(uint64_t b) {
  double d;
  memcpy(&d, &b, 8);
  return d;
}

void dt__obs_rank_path(const char *obs_dir, int rank, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/rank-%d", obs_dir, rank);
}

static int mkdir_p(const char *dir) {
  char p[4096];
  snprintf(p, sizeof p, "%s", dir);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = '\0';
    if (mkdir(p, 0777) < 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  return mkdir(p, 0777) < 0 && errno != EEXIST ? -1 : 0;
}

int dt_obs_open(dt_obs **out, const char *dir, int rank, int size, const char *job,
                const char *host) {
  if (!out) return dt__seterr(DT_EINVAL, "obs: out is NULL");
  *out = NULL;
  if (size < 1 || rank < 0 || rank >= size)
    return dt__seterr(DT_EINVAL, "obs: rank %d of %d out of range", rank, size);
  dt_obs *o = calloc(1, sizeof *o);
  if (!o) return dt__seterr(DT_ENOMEM, "obs: out of memory");
  pthread_mutex_init(&o->mu, NULL);
  o->fd = -1;
  o->len = (sizeof(struct dt_obs_page) + 4095) & ~(size_t)4095;
  void *p = MAP_FAILED;
  if (dir) {
    char path[4096];
    dt__obs_rank_path(dir, rank, path, sizeof path);
    int fd = -1;
    if (mkdir_p(dir) < 0 || (fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
        ftruncate(fd, (off_t)o->len) < 0) {
      int e = errno;
      if (fd >= 0) close(fd);
      free(o);
      return dt__seterr(DT_EIO, "obs: %s: %s", path, strerror(e));
    }
    p = mmap(NULL, o->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) close(fd);
    else o->fd = fd;
  } else {
    p = mmap(NULL, o->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (p == MAP_FAILED) {
    size_t len = o->len;
    free(o);
    return dt__seterr(DT_ENOMEM, "obs: cannot map %zu bytes: %s", len, strerror(errno));
  }
  o->pg = p;
  o->pg->rank = rank;
  o->pg->size = size;
  o->pg->pid = (int32_t)getpid();
  o->pg->page_bytes = (uint32_t)sizeof(struct dt_obs_page);
  snprintf(o->pg->job, sizeof o->pg->job, "%s", job && *job ? job : "dtrain");
  if (host && *host) snprintf(o->pg->host, sizeof o->pg->host, "%s", host);
  else if (gethostname(o->pg->host, sizeof o->pg->host - 1) < 0) snprintf(o->pg->host, 64, "?");
  o->pg->version = DT_OBS_VERSION;
  atomic_thread_fence(memory_order_release);
  o->pg->magic = DT_OBS_MAGIC; /* last: a reader sees a whole header or none */
  *out = o;
  return DT_OK;
}

void dt_obs_close(dt_obs *o) {
  if (!o) return;
  dt__obs_trace_free(o);
  munmap(o->pg, o->len);
  if (o->fd >= 0) close(o->fd);
  pthread_mutex_destroy(&o->mu);
  free(o);
}

int dt_obs_rank(const dt_obs *o) { return o ? o->pg->rank : -1; }

static void set_rank(struct dt_obs_page *pg, int rank, int size) {
  /* a reader copying meanwhile must still see rank < size */
  if (size >= pg->size) pg->size = size, pg->rank = rank;
  else pg->rank = rank, pg->size = size;
}

/* Whether the file at path holds the page of another running process that
 * still says rank: a member that has not named its own page anew yet. A
 * gone, zombie or stopped process (a frozen member that was evicted) holds
 * nothing. */
static int held_by_other(const char *path, int rank, struct dt_obs_page *q) {
  return dt__obs_read(path, q) == DT_OK && q->rank == rank && q->pid != (int32_t)getpid() &&
         !strchr("XZTt", dt__obs_proc_state(q->pid));
}

int dt_obs_rerank(dt_obs *o, const char *dir, int rank, int size) {
  if (!o) return DT_OK;
  if (size < 1 || rank < 0 || rank >= size)
    return dt__seterr(DT_EINVAL, "obs: rank %d of %d out of range", rank, size);
  struct dt_obs_page *pg = o->pg;
  if (!dir || o->fd < 0 || rank == pg->rank) {
    set_rank(pg, rank, size);
    return DT_OK;
  }
  char self[64], tmp[4200], path[4200];
  snprintf(self, sizeof self, "/proc/self/fd/%d", o->fd);
  dt__obs_rank_path(dir, rank, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  /* Members keep their order, so the new name is a lost rank's or that of
   * an earlier member (new <= old); that one must link its own new name
   * before this one takes its old, or its page would be left without a
   * name to link from. Wait for it (at most 2 s: a stopped member must not
   * hold this one up), then take the name. */
  struct dt_obs_page *q = malloc(sizeof *q);
  for (int i = 0; q && i < 2000 && held_by_other(path, rank, q); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  free(q);
  unlink(tmp);
  int rc = DT_OK;
  if (linkat(AT_FDCWD, self, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) < 0 || rename(tmp, path) < 0) {
    int e = errno;
    unlink(tmp);
    rc = dt__seterr(DT_EIO, "obs: cannot name this rank's page %s: %s", path, strerror(e));
  }
  set_rank(pg, rank, size); /* after the link: the next member waits for this */
  return rc;
}

/* ---- metrics --------------------------------------------------------------- */

static int valid_name(const char *s) {
  if (!s || !*s || strlen(s) >= DT_OBS_NAME_MAX) return 0;
  for (const char *p = s; *p; p++) {
    int ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':' ||
             (p > s && *p >= '0' && *p <= '9');
    if (!ok) return 0;
  }
  return 1;
}

static dt_obs_metric *reg(dt_obs *o, const char *name, const char *help, uint32_t type,
                          const double *bounds, int n) {
  if (!o) return NULL;
  if (!valid_name(name)) {
    DT_LOG_WARN("obs: metric name '%s' is not a Prometheus name; not recorded", name ? name : "");
    return NULL;
  }
  struct dt_obs_page *pg = o->pg;
  pthread_mutex_lock(&o->mu);
  uint32_t k = atomic_load(&pg->nmetrics);
  dt_obs_metric *m = NULL;
  for (uint32_t i = 0; i < k; i++)
    if (!strcmp(pg->slot[i].name, name)) {
      m = pg->slot[i].type == type ? &pg->slot[i] : NULL;
      if (!m) DT_LOG_WARN("obs: metric '%s' registered twice with different types", name);
      pthread_mutex_unlock(&o->mu);
      return m;
    }
  if (k >= DT_OBS_MAX_METRICS) {
    if (!o->full_warned++) DT_LOG_WARN("obs: all %d metric slots taken; '%s' not recorded",
                                       DT_OBS_MAX_METRICS, name);
    pthread_mutex_unlock(&o->mu);
    return NULL;
  }
  m = &pg->slot[k];
  memset(m, 0, sizeof *m);
  snprintf(m->name, sizeof m->name, "%s", name);
  snprintf(m->help, sizeof m->help, "%s", help ? help : "");
  for (char *c = m->help; *c; c++) /* HELP is one line */
    if (*c == '\n' || *c == '\r') *c = ' ';
  m->type = type;
  if (type == DT_OBS_HISTOGRAM) {
    if (!bounds || n <= 0) bounds = dt_obs_seconds_bounds, n = DT_OBS_MAX_BOUNDS;
    if (n > DT_OBS_MAX_BOUNDS) n = DT_OBS_MAX_BOUNDS;
    int j = 0;
    for (int i = 0; i < n; i++) /* increasing and finite only */
      if (isfinite(bounds[i]) && (j == 0 || bounds[i] > m->bounds[j - 1])) m->bounds[j++] = bounds[i];
    m->nbounds = (uint32_t)j;
  }
  atomic_store_explicit(&pg->nmetrics, k + 1, memory_order_release);
  pthread_mutex_unlock(&o->mu);
  return m;
}

dt_obs_metric *dt_obs_counter(dt_obs *o, const char *name, const char *help) {
  return reg(o, name, help, DT_OBS_COUNTER, NULL, 0);
}
dt_obs_metric *dt_obs_gauge(dt_obs *o, const char *name, const char *help) {
  return reg(o, name, help, DT_OBS_GAUGE, NULL, 0);
}
dt_obs_metric *dt_obs_histogram(dt_obs *o, const char *name, const char *help,
                                const double *bounds, int n) {
  return reg(o, name, help, DT_OBS_HISTOGRAM, bounds, n);
}

static void add_double(_Atomic uint64_t *w, double v) {
  uint64_t old = atomic_load_explicit(w, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(w, &old, d2b(dt__obs_bits_to_d(old) + v),
                                                memory_order_relaxed, memory_order_relaxed)) {
  }
}

void dt_obs_add(dt_obs_metric *m, double v) {
  if (!m || !(v >= 0)) return;
  add_double(&m->value, v);
}

void dt_obs_set(dt_obs_metric *m, double v) {
  if (!m) return;
  if (m->type == DT_OBS_COUNTER && !(v >= dt__obs_bits_to_d(atomic_load(&m->value)))) return;
  atomic_store_explicit(&m->value, d2b(v), memory_order_relaxed);
}

void dt_obs_observe(dt_obs_metric *m, double v) {
  if (!m || m->type != DT_OBS_HISTOGRAM || isnan(v)) return;
  uint32_t i = 0;
  while (i < m->nbounds && v > m->bounds[i]) i++;
  atomic_fetch_add_explicit(&m->bucket[i], 1, memory_order_relaxed);
  add_double(&m->value, v);
  atomic_fetch_add_explicit(&m->count, 1, memory_order_release);
}

double dt_obs_value(const dt_obs_metric *m) {
  if (!m) return 0;
  if (m->type == DT_OBS_HISTOGRAM) return (double)atomic_load(&((dt_obs_metric *)m)->count);
  return dt__obs_bits_to_d(atomic_load(&((dt_obs_metric *)m)->value));
}

/* ---- flight recorder ----------------------------------------------------------- */

/* No lock: entries come from the training and the communication thread,
 * and a rank's threads share the cores with other ranks' (a thread
 * preempted holding a lock would stall the other). A ticket is taken with
 * one atomic add; its slot is claimed by setting FR_BUSY in the entry's
 * state with one compare-and-swap (readers take a state they do not know
 * for "being written"), filled, and released by storing the new state. Two
 * writers meet in one slot only when 64 newer operations begin while one
 * of them writes: the later one then waits those few nanoseconds. */
#define FR_BUSY 0x80000000u

static uint32_t fr_claim(struct dt_obs_fr_entry *e) {
  for (int i = 0;; i++) {
    uint32_t s = atomic_load_explicit(&e->state, memory_order_relaxed);
    if (!(s & FR_BUSY) && atomic_compare_exchange_weak_explicit(&e->state, &s, s | FR_BUSY,
                                                                memory_order_acquire,
                                                                memory_order_relaxed))
      return s;
    if (i > 64) sched_yield();
  }
}

/* The note of the next operation this thread begins on handle o: set and
 * taken by the same thread (a strategy notes the bucket, then calls the
 * collective that records it), so it needs no lock and is never taken by
 * the other thread's operation. */
static _Thread_local struct {
  const dt_obs *o;
  const char *word; /* with n >= 0: "word n"; else the text in buf */
  int64_t n;
  char buf[24];
} tl_note;

void dt_obs_fr_note(dt_obs *o, const char *note) {
  if (!o) return;
  size_t i = 0;
  for (; note && note[i] && i < sizeof tl_note.buf - 1; i++) tl_note.buf[i] = note[i];
  tl_note.buf[i] = '\0';
  tl_note.word = NULL;
  tl_note.n = -1;
  tl_note.o = o;
}

void dt_obs_fr_note_n(dt_obs *o, const char *word, int64_t n) {
  if (!o) return;
  tl_note.word = word;
  tl_note.n = n < 0 ? 0 : n;
  tl_note.o = o;
}

/* Copies at most cap-1 characters of s and a NUL; returns the length. */
static size_t put_str(char *d, size_t cap, const char *s) {
  size_t i = 0;
  for (; s && s[i] && i < cap - 1; i++) d[i] = s[i];
  d[i] = '\0';
  return i;
}

/* The pending note of this thread into d (cap bytes), then cleared. No
 * snprintf: this runs per collective. */
static void take_note(const dt_obs *o, char *d, size_t cap) {
  d[0] = '\0';
  if (tl_note.o != o) return;
  tl_note.o = NULL;
  if (!tl_note.word) {
    put_str(d, cap, tl_note.buf);
    return;
  }
  size_t k = put_str(d, cap, tl_note.word);
  char dig[24];
  int nd = 0;
  uint64_t v = (uint64_t)tl_note.n;
  do dig[nd++] = (char)('0' + v % 10), v /= 10; while (v && nd < (int)sizeof dig);
  if (k + 1 + (size_t)nd >= cap) return;
  d[k++] = ' ';
  while (nd) d[k++] = dig[--nd];
  d[k] = '\0';
}

int64_t dt_obs_fr_begin(dt_obs *o, const char *op, uint32_t stream, uint64_t seq,
                        uint64_t bytes, int peer) {
  if (!o) return -1;
  struct dt_obs_page *pg = o->pg;
  uint64_t t = atomic_fetch_add_explicit(&pg->fr_next, 1, memory_order_relaxed);
  struct dt_obs_fr_entry *e = &pg->fr[t % DT_OBS_FR_LEN];
  int64_t now = dt_now_ns();
  fr_claim(e);
  e->stream = stream;
  e->seq = seq;
  e->bytes = bytes;
  e->t0_ns = now;
  e->t1_ns = 0;
  e->peer = peer;
  e->rc = 0;
  e->ticket = t + 1;
  put_str(e->op, sizeof e->op, op ? op : "?");
  take_note(o, e->note, sizeof e->note);
  atomic_store_explicit(&e->state, DT_FR_ENTERED, memory_order_release);
  return (int64_t)t;
}

void dt_obs_fr_end(dt_obs *o, int64_t t, int rc) {
  if (!o || t < 0) return;
  struct dt_obs_fr_entry *e = &o->pg->fr[(uint64_t)t % DT_OBS_FR_LEN];
  int64_t now = dt_now_ns();
  uint32_t s = fr_claim(e);
  if (e->ticket != (uint64_t)t + 1) { /* overwritten: 64 newer operations since */
    atomic_store_explicit(&e->state, s, memory_order_release);
    return;
  }
  e->t1_ns = now;
  e->rc = rc < 0 ? rc : 0;
  atomic_store_explicit(&e->state, rc < 0 ? DT_FR_FAILED : DT_FR_DONE, memory_order_release);
}

void dt_obs_fail(dt_obs *o, int rc, const char *msg) {
  if (!o || rc >= 0) return;
  int32_t expect = 0;
  if (!atomic_compare_exchange_strong(&o->pg->failed_rc, &expect, 1)) return;
  snprintf(o->pg->failed_msg, sizeof o->pg->failed_msg, "%s", msg ? msg : "");
  atomic_store(&o->pg->failed_rc, rc);
}

/* ---- reading ------------------------------------------------------------------ */

int dt__obs_read(const char *path, struct dt_obs_page *out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return dt__seterr(errno == ENOENT ? DT_ENOENT : DT_EIO, "obs: %s: %s", path, strerror(errno));
  static const size_t want = sizeof(struct dt_obs_page);
  char *buf = malloc(want);
  if (!buf) {
    close(fd);
    return dt__seterr(DT_ENOMEM, "obs: out of memory");
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = pread(fd, buf + got, want - got, (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  int rc = dt__obs_parse(buf, got, out);
  free(buf);
  if (rc < 0) return dt__preerr(rc, "obs: %s", path);
  return rc;
}

int dt__obs_parse(const void *buf, size_t len, struct dt_obs_page *out) {
  if (len < sizeof *out) return dt__seterr(DT_ECORRUPT, "page of %zu bytes, expected %zu", len,
                                           sizeof *out);
  memcpy(out, buf, sizeof *out);
  if (out->magic != DT_OBS_MAGIC) return dt__seterr(DT_ECORRUPT, "bad magic");
  if (out->version != DT_OBS_VERSION)
    return dt__seterr(DT_ECORRUPT, "version %u, expected %d", out->version, DT_OBS_VERSION);
  if (out->page_bytes != sizeof *out)
    return dt__seterr(DT_ECORRUPT, "page_bytes %u, expected %zu", out->page_bytes, sizeof *out);
  if (out->size < 1 || out->size > (1 << 20) || out->rank < 0 || out->rank >= out->size)
    return dt__seterr(DT_ECORRUPT, "rank %d of %d", out->rank, out->size);
  out->job[sizeof out->job - 1] = out->host[sizeof out->host - 1] = '\0';
  out->failed_msg[sizeof out->failed_msg - 1] = '\0';
  uint32_t k = atomic_load(&out->nmetrics);
  if (k > DT_OBS_MAX_METRICS) return dt__seterr(DT_ECORRUPT, "nmetrics %u", k);
  for (uint32_t i = 0; i < k; i++) {
    struct dt_obs_slot *s = &out->slot[i];
    s->name[sizeof s->name - 1] = s->help[sizeof s->help - 1] = '\0';
    if (!valid_name(s->name)) return dt__seterr(DT_ECORRUPT, "metric %u: bad name", i);
    for (char *c = s->help; *c; c++)
      if ((unsigned char)*c < 0x20) *c = ' ';
    if (s->type < DT_OBS_COUNTER || s->type > DT_OBS_HISTOGRAM)
      return dt__seterr(DT_ECORRUPT, "metric %s: type %u", s->name, s->type);
    if (s->nbounds > DT_OBS_MAX_BOUNDS)
      return dt__seterr(DT_ECORRUPT, "metric %s: %u bounds", s->name, s->nbounds);
    for (uint32_t j = 0; j < s->nbounds; j++)
      if (!isfinite(s->bounds[j]) || (j && !(s->bounds[j] > s->bounds[j - 1])))
        return dt__seterr(DT_ECORRUPT, "metric %s: bounds not increasing", s->name);
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(out->slot[j].name, s->name))
        return dt__seterr(DT_ECORRUPT, "metric %s twice", s->name);
  }
  for (int i = 0; i < DT_OBS_FR_LEN; i++) {
    struct dt_obs_fr_entry *e = &out->fr[i];
    e->op[sizeof e->op - 1] = e->note[sizeof e->note - 1] = '\0';
    for (char *c = e->op; *c; c++)
      if ((unsigned char)*c < 0x20) *c = '?';
    for (char *c = e->note; *c; c++)
      if ((unsigned char)*c < 0x20) *c = '?';
    if (atomic_load(&e->state) > DT_FR_FAILED) atomic_store(&e->state, 0);
  }
  return DT_OK;
}

int dt__obs_pages_parse(const void *resp, size_t len, struct dt_obs_page *out, int max) {
  const char *b = resp;
  static const char ok10[] = "HTTP/1.0 200 ", ok11[] = "HTTP/1.1 200 ";
  if (len < sizeof ok10 - 1 || (memcmp(b, ok10, sizeof ok10 - 1) && memcmp(b, ok11, sizeof ok11 - 1)))
    return dt__seterr(DT_ECORRUPT, "pages: not an HTTP 200 answer");
  const char *body = NULL;
  for (size_t i = 0; i + 4 <= len; i++)
    if (!memcmp(b + i, "\r\n\r\n", 4)) {
      body = b + i + 4;
      break;
    }
  if (!body) return dt__seterr(DT_ECORRUPT, "pages: no end of the headers");
  size_t n = len - (size_t)(body - b), one = sizeof(struct dt_obs_page);
  if (n % one || n / one > (size_t)(max > 0 ? max : 0))
    return dt__seterr(DT_ECORRUPT, "pages: a body of %zu bytes is not at most %d pages of %zu", n,
                      max, one);
  for (size_t i = 0; i < n / one; i++) {
    int rc = dt__obs_parse(body + i * one, one, &out[i]);
    if (rc < 0) return dt__preerr(rc, "pages: page %zu", i);
  }
  return (int)(n / one);
}

/*
 * window.c — shared-memory windows and their one-pass allreduce (window.h
 * has the protocol). Each rank's segment is a 4 KiB header (one cache line
 * per word peers poll) followed by the data; segments are POSIX shm objects
 * named /dtrain-win-<pid>-<nonce>, unlinked as soon as every rank has mapped
 * them (a crash before that leaves a name behind; creation sweeps names
 * whose pid is gone).
 */
#define _GNU_SOURCE
#include "comm/window.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "comm/proc_watch.h"
#include "core/core.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define WIN_PREFIX "dtrain-win-"
#define HDR_BYTES 4096

struct span_fp {
  uint64_t off, count;
  float scale;
  uint32_t seq;
  uint32_t elem; /* 4: f32 scaled sums, 8: int64 sums */
  uint32_t cut_sum; /* checksum of the slice fractions (0: equal slices) */
  uint32_t apply;   /* 1: reduce-apply (sums stay in each rank's own window) */
  int64_t t_ready; /* CLOCK_MONOTONIC ns when the rank joined the call */
};

struct win_hdr {
  _Alignas(64) _Atomic uint32_t ready; /* last call this rank entered */
  _Alignas(64) _Atomic uint32_t done;  /* last call this rank finished */
  _Alignas(64) _Atomic uint32_t sleepers; /* peers asleep on ready/done */
  _Atomic uint32_t aborted;
  char why[256];
  struct span_fp fp[2]; /* by seq parity: a peer is never two calls ahead */
  int64_t t_done[2];    /* by seq parity: ns when the rank finished its slice */
  uint64_t nonce;
  int32_t pid;
};
_Static_assert(sizeof(struct win_hdr) <= HDR_BYTES, "window header too big");

struct dt_comm_window {
  dt_comm *c;
  int rank, size;
  size_t bytes, map_len;
  struct win_hdr **hdr; /* per rank */
  float **data;         /* per rank */
  int *pidfd;           /* per rank, -1 for self or unknown */
  int32_t *pid;
  uint32_t seq;
  _Atomic int aborted;
  int64_t spin_ns; /* spin this long before sleeping on the futex */
  int yield;       /* sched_yield while spinning (more threads than cores) */
  int64_t live_ns;
  _Atomic uint64_t written, read; /* the same: added while reducing, read by others */
  /* Under a CPU quota below the core count polling is cut to QUOTA_SPIN_NS
   * (every polled microsecond is one less of compute for a throttled
   * rank); re-checked every QUOTA_CHECK_NS because a process can be moved
   * into a cgroup while it runs. */
  int64_t quota_next;
  int quota_bound;
  long cores;
  /* waited for peers that joined or finished later: added by the thread that
   * reduces (ddp's communication thread), read by the training thread */
  _Atomic int64_t blocked_ns;
  /* the allreduce's slices: rank q sums [cut[q], cut[q + 1]) of every span,
   * as fractions (dt_comm_window_set_shares; NULL: equal slices), and a
   * checksum of them every rank publishes, so ranks that cut differently
   * fail instead of leaving a gap */
  double *cut;
  uint32_t cut_sum;
};

#define QUOTA_SPIN_NS 20000
#define QUOTA_CHECK_NS 100000000

static int futex_wait(_Atomic uint32_t *w, uint32_t val, int64_t ns) {
  struct timespec ts = {ns / 1000000000, ns % 1000000000};
  return (int)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void seg_name(char *buf, size_t cap, int32_t pid, uint64_t nonce) {
  snprintf(buf, cap, "/" WIN_PREFIX "%d-%016llx", (int)pid, (unsigned long long)nonce);
}

/* Unlinks window segments left by processes that no longer exist. */
static void sweep_stale(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, WIN_PREFIX, sizeof WIN_PREFIX - 1)) continue;
    long pid = strtol(e->d_name + sizeof WIN_PREFIX - 1, NULL, 10);
    if (pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
      char n[300];
      snprintf(n, sizeof n, "/%s", e->d_name);
      shm_unlink(n);
    }
  }
  closedir(d);
}

static void *map_seg(const char *name, size_t len, int create) {
  int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC : O_RDWR | O_CLOEXEC,
                    0600);
  if (fd < 0) return NULL;
  struct stat st;
  if (create ? ftruncate(fd, (off_t)len) < 0 : fstat(fd, &st) < 0 || (size_t)st.st_size != len) {
    close(fd);
    if (create) shm_unlink(name);
    return NULL;
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name);
    return NULL;
  }
  return p;
}

void dt_comm_window_destroy(dt_comm_window *w) {
  if (!w) return;
  for (int q = 0; q < w->size; q++) {
    if (w->hdr && w->hdr[q]) munmap(w->hdr[q], w->map_len);
    if (w->pidfd && w->pidfd[q] >= 0) close(w->pidfd[q]);
  }
  free(w->hdr);
  free(w->data);
  free(w->pidfd);
  free(w->pid);
  free(w->cut);
  free(w);
}

int dt_comm_window_set_shares(dt_comm_window *w, const double *weights) {
  const int n = w->size;
  double W = 0;
  int ok = weights != NULL;
  for (int q = 0; ok && q < n; q++) {
    if (!(weights[q] >= 0) || !isfinite(weights[q])) ok = 0;
    else W += weights[q];
  }
  if (!ok || !(W > 0) || !isfinite(W)) {
    free(w->cut);
    w->cut = NULL;
    w->cut_sum = 0;
    return DT_OK;
  }
  if (!w->cut && !(w->cut = malloc((size_t)(n + 1) * sizeof *w->cut)))
    return dt__seterr(DT_ENOMEM, "window: out of memory");
  double acc = 0;
  uint32_t h = 2166136261u; /* FNV-1a over the fractions' bytes */
  for (int q = 0; q <= n; q++) {
    w->cut[q] = q == n ? 1.0 : acc / W;
    if (q < n) acc += weights[q];
    const unsigned char *b = (const unsigned char *)&w->cut[q];
    for (size_t i = 0; i < sizeof(double); i++) h = (h ^ b[i]) * 16777619u;
  }
  w->cut_sum = h | 1; /* never 0, which means equal slices */
  return DT_OK;
}

/* Collective verdict: every rank learns whether all ranks passed ok. */
static int all_ok(dt_comm *c, int ok, int *all) {
  int32_t v = ok;
  DT_CHECK(dt_comm_allreduce(c, &v, &v, 1, DT_I32, DT_OP_MIN));
  *all = v;
  return DT_OK;
}

int dt_comm_window_create(dt_comm *c, size_t bytes, dt_comm_window **out) {
  *out = NULL;
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  struct dt_comm_topo topo;
  dt_comm_topology(c, &topo);
  if (topo.nhosts != 1)
    return dt__seterr(DT_ENOTSUP, "window: ranks on %d hosts", topo.nhosts);
  if (!dt_param(DT_PARAM_WINDOW)) return dt__seterr(DT_ENOTSUP, "window: disabled");
  dt_comm_window *w = calloc(1, sizeof *w);
  int rc = DT_ENOMEM;
  if (!w) return dt__seterr(DT_ENOMEM, "window: out of memory");
  w->c = c;
  w->rank = r;
  w->size = n;
  w->bytes = bytes;
  w->map_len = HDR_BYTES + ((bytes + 4095) & ~(size_t)4095);
  w->hdr = calloc((size_t)n, sizeof *w->hdr);
  w->data = calloc((size_t)n, sizeof *w->data);
  w->pidfd = malloc((size_t)n * sizeof *w->pidfd);
  w->pid = calloc((size_t)n, sizeof *w->pid);
  int64_t *info = calloc(2 * (size_t)n, sizeof *info);
  if (!w->hdr || !w->data || !w->pidfd || !w->pid || !info) goto nomem;
  for (int q = 0; q < n; q++) w->pidfd[q] = -1;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  w->cores = cores > 0 ? cores : 1;
  /* ranks x 2 threads (compute + communication) on fewer cores: spinning
   * takes the core from the thread we wait for */
  w->spin_ns = dt_param(DT_PARAM_WINDOW_SPIN_US) * 1000;
  w->yield = (int)dt_param_or(DT_PARAM_WINDOW_YIELD, 2L * n > cores);
  w->live_ns = 2000000;

  sweep_stale();
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) nonce = (uint64_t)dt_now_ns();
  char name[96];
  int32_t me = (int32_t)getpid();
  seg_name(name, sizeof name, me, nonce);
  void *mine = map_seg(name, w->map_len, 1);
  if (mine) {
    w->hdr[r] = mine;
    w->hdr[r]->nonce = nonce;
    w->hdr[r]->pid = me;
  }
  /* only where the job already chose shared memory: a forced tcp or mpi
   * transport is honoured */
  int ok = mine != NULL;
  for (int q = 0; q < n && ok; q++) {
    const char *t = dt_comm_transport_name(c, q);
    ok = q == r || !strcmp(t, "shm") || !strcmp(t, "inproc");
  }
  int all;
  info[2 * r] = me;
  info[2 * r + 1] = (int64_t)nonce;
  if ((rc = all_ok(c, ok, &all)) < 0 ||
      (rc = dt_comm_allgather(c, info + 2 * r, info, 2, DT_I64)) < 0)
    goto fail_unlink;
  if (!all) {
    rc = dt__seterr(DT_ENOTSUP, "window: a rank cannot create a shared segment or talks to a "
                    "peer over a transport other than shm");
    goto fail_unlink;
  }
  ok = 1;
  for (int q = 0; q < n && ok; q++) {
    if (q == r) continue;
    char qn[96];
    seg_name(qn, sizeof qn, (int32_t)info[2 * q], (uint64_t)info[2 * q + 1]);
    w->hdr[q] = map_seg(qn, w->map_len, 0);
    /* same name but another machine's /dev/shm would not carry the nonce */
    ok = w->hdr[q] && w->hdr[q]->nonce == (uint64_t)info[2 * q + 1];
  }
  rc = all_ok(c, ok, &all);
  shm_unlink(name); /* every rank has tried to map it */
  if (rc < 0) goto fail;
  if (!all) {
    rc = dt__seterr(DT_ENOTSUP, "window: a rank cannot map its peers' segments");
    goto fail;
  }
  for (int q = 0; q < n; q++) {
    w->data[q] = (float *)((char *)w->hdr[q] + HDR_BYTES);
    w->pid[q] = (int32_t)info[2 * q];
    if (q != r && w->pid[q] != me) w->pidfd[q] = (int)syscall(SYS_pidfd_open, w->pid[q], 0);
  }
  free(info);
  *out = w;
  return DT_OK;
nomem:
  rc = dt__seterr(DT_ENOMEM, "window: out of memory");
  goto fail;
fail_unlink:
  if (w->hdr && w->hdr[r]) shm_unlink(name);
fail:
  free(info);
  dt_comm_window_destroy(w);
  return rc;
}

void *dt_comm_window_base(dt_comm_window *w) { return w->data[w->rank]; }

void *dt_comm_window_peer(dt_comm_window *w, int q) {
  return q >= 0 && q < w->size ? w->data[q] : NULL;
}

void dt_comm_window_abort(dt_comm_window *w, const char *why) {
  struct win_hdr *h = w->hdr[w->rank];
  if (!atomic_exchange(&w->aborted, 1)) {
    snprintf(h->why, sizeof h->why, "%s", why ? why : "aborted");
    atomic_store(&h->aborted, 1);
  }
  futex_wake(&h->ready);
  futex_wake(&h->done);
}

static void count_bytes(_Atomic uint64_t *c, uint64_t v) {
  atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

double dt_comm_window_blocked(const dt_comm_window *w) {
  return (double)atomic_load_explicit(&w->blocked_ns, memory_order_relaxed) / 1e9;
}

void dt_comm_window_bytes(const dt_comm_window *w, uint64_t *written, uint64_t *read) {
  if (written) *written = atomic_load_explicit(&w->written, memory_order_relaxed);
  if (read) *read = atomic_load_explicit(&w->read, memory_order_relaxed);
}

static int peer_gone(dt_comm_window *w, int q) {
  if (w->pidfd[q] >= 0) {
    struct pollfd p = {w->pidfd[q], POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return w->pid[q] != (int32_t)getpid() && kill(w->pid[q], 0) < 0 && errno == ESRCH;
}

/* Waits until rank q's word (ready or done) reaches seq. */
static int wait_word(dt_comm_window *w, int q, int which, uint32_t seq, int64_t deadline) {
  struct win_hdr *h = w->hdr[q];
  _Atomic uint32_t *word = which ? &h->done : &h->ready;
  const char *what = which ? "finish" : "join";
  /* spin (yielding the core to a runnable thread when oversubscribed) for
   * up to spin_ns (QUOTA_SPIN_NS under a CPU quota), then sleep */
  int64_t spin_end = 0;
  if (w->spin_ns > 0) {
    int64_t now = dt_now_ns();
    if (now >= w->quota_next) {
      double q = dt_cpu_quota();
      w->quota_bound = q > 0 && q < (double)w->cores;
      w->quota_next = now + QUOTA_CHECK_NS;
    }
    int64_t spin = w->quota_bound && w->spin_ns > QUOTA_SPIN_NS ? QUOTA_SPIN_NS : w->spin_ns;
    spin_end = now + spin;
  }
  for (int i = 0; spin_end; i++) {
    if ((int32_t)(atomic_load_explicit(word, memory_order_acquire) - seq) >= 0) return DT_OK;
    if (w->yield) sched_yield();
    else cpu_relax();
    /* a yield is a system call (and may give the core away for a slice):
     * read the clock after each one, or the spin lasts 64 yields, not
     * spin_ns; polling, every 64 rounds */
    if ((w->yield || (i & 63) == 63) && dt_now_ns() >= spin_end) break;
  }
  int64_t next_live = 0;
  struct dt_proc_watch pw = {0};
  for (;;) {
    uint32_t v = atomic_load(word);
    if ((int32_t)(v - seq) >= 0) return DT_OK;
    if (atomic_load(&w->aborted))
      return dt__seterr(DT_EABORTED, "window allreduce #%u: aborted (%s)", seq,
                        w->hdr[w->rank]->why);
    if (atomic_load(&h->aborted))
      return dt__seterr(DT_EABORTED, "window allreduce #%u: rank %d gave up: %s", seq, q, h->why);
    if (dt__comm_aborted(w->c))
      return dt__seterr(DT_EABORTED, "window allreduce #%u: the communicator was aborted (%s)",
                        seq, dt_comm_errmsg(w->c));
    int64_t now = dt_now_ns();
    if (now >= deadline)
      return dt__seterr(DT_ETIMEDOUT, "window allreduce #%u: rank %d did not %s the call within "
                        "%.0f s", seq, q, what, dt_comm_timeout(w->c));
    if (now >= next_live) {
      if (peer_gone(w, q))
        return dt__seterr(DT_EPEERLOST, "window allreduce #%u: rank %d (pid %d) exited", seq, q,
                          (int)w->pid[q]);
      next_live = now + w->live_ns;
      double stopped;
      if (w->pid[q] != (int32_t)getpid() && dt__proc_watch(&pw, w->pid[q], now, &stopped))
        return dt__seterr(DT_ETIMEDOUT,
                          "window allreduce #%u: rank %d (pid %d) is stopped (SIGSTOP?): no progress "
                          "for %.0f s (DTRAIN_SHM_STOPPED_S)", seq, q, (int)w->pid[q], stopped);
    }
    atomic_fetch_add(&h->sleepers, 1);
    if (atomic_load(word) == v) futex_wait(word, v, w->live_ns);
    atomic_fetch_sub(&h->sleepers, 1);
  }
}

static void post(struct win_hdr *h, _Atomic uint32_t *word, uint32_t seq) {
  atomic_store(word, seq);
  if (atomic_load(&h->sleepers)) futex_wake(word);
}

/* dst[i] = sum_q s[q] * src[q][i] over n ranks, in rank order. */
static void reduce_block(float *restrict dst, float *const *src, const float *s, int n, size_t k) {
  if (n == 2) {
    const float *restrict a = src[0], *restrict b = src[1];
    float s0 = s[0], s1 = s[1];
    for (size_t i = 0; i < k; i++) dst[i] = s0 * a[i] + s1 * b[i];
    return;
  }
  float acc[512];
  for (size_t j = 0; j < k; j += 512) {
    size_t m = k - j < 512 ? k - j : 512;
    const float *a = src[0] + j;
    for (size_t i = 0; i < m; i++) acc[i] = s[0] * a[i];
    for (int q = 1; q < n; q++) {
      const float *b = src[q] + j;
      float sq = s[q];
      for (size_t i = 0; i < m; i++) acc[i] += sq * b[i];
    }
    memcpy(dst + j, acc, m * sizeof(float));
  }
}

/* dst[i] = sum over n ranks of src[q][i] (int64: exact, any order). */
static void reduce_block_i64(int64_t *restrict dst, int64_t *const *src, int n, size_t k) {
  if (n == 2) {
    const int64_t *restrict a = src[0], *restrict b = src[1];
    for (size_t i = 0; i < k; i++) dst[i] = a[i] + b[i];
    return;
  }
  int64_t acc[512];
  for (size_t j = 0; j < k; j += 512) {
    size_t m = k - j < 512 ? k - j : 512;
    memcpy(acc, src[0] + j, m * sizeof *acc);
    for (int q = 1; q < n; q++) {
      const int64_t *b = src[q] + j;
      for (size_t i = 0; i < m; i++) acc[i] += b[i];
    }
    memcpy(dst + j, acc, m * sizeof *acc);
  }
}

/* dst[i] = (float)((double)(a[i] (+ b[i])) * kk) for i < k, b NULL for
 * a alone. With AVX2, 4 at a time: AVX2 has no int64 -> double conversion
 * (the compiler converts one value at a time), but for |v| < 2^51 the
 * integer v added to the bits of 1.5 * 2^52 are the bits of the double
 * 1.5 * 2^52 + v, exactly, and subtracting 1.5 * 2^52 leaves (double)v;
 * the product and the rounding to float are the scalar expression's. A
 * block of 64 with some |v| >= 2^51 (v + 2^51 outside [0, 2^52)) is redone
 * in scalar. parallel/fixsum.c's dt_fix_to_float does the same. */
static void i64_to_f32(float *restrict dst, const int64_t *restrict a,
                       const int64_t *restrict b, size_t k, double kk) {
  size_t i = 0;
#if defined(__AVX2__)
  const __m256d magic = _mm256_set1_pd(0x1.8p52), vk = _mm256_set1_pd(kk);
  const __m256i magici = _mm256_castpd_si256(magic), half = _mm256_set1_epi64x(1LL << 51);
  const __m256i hi = _mm256_set1_epi64x(~((1LL << 52) - 1));
  for (; i + 64 <= k; i += 64) {
    __m256i bad = _mm256_setzero_si256();
    for (size_t j = i; j < i + 64; j += 4) {
      __m256i v = _mm256_loadu_si256((const __m256i *)(a + j));
      if (b) v = _mm256_add_epi64(v, _mm256_loadu_si256((const __m256i *)(b + j)));
      bad = _mm256_or_si256(bad, _mm256_add_epi64(v, half));
      __m256d d = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, magici)), magic);
      _mm_storeu_ps(dst + j, _mm256_cvtpd_ps(_mm256_mul_pd(d, vk)));
    }
    if (!_mm256_testz_si256(bad, hi))
      for (size_t j = i; j < i + 64; j++) dst[j] = (float)((double)(a[j] + (b ? b[j] : 0)) * kk);
  }
#endif
  if (b)
    for (; i < k; i++) dst[i] = (float)((double)(a[i] + b[i]) * kk);
  else
    for (; i < k; i++) dst[i] = (float)((double)a[i] * kk);
}

/* dst[i] = (float)((double)(sum over n ranks of src[q][i]) * k): the
 * expression of dt_fix_to_float (parallel/fixsum.c), so the same bits. */
static void reduce_block_i64_f32(float *restrict dst, int64_t **src, int n, size_t k,
                                 double kk) {
  if (n == 2) {
    i64_to_f32(dst, src[0], src[1], k, kk);
    return;
  }
  int64_t acc[512];
  for (size_t j = 0; j < k; j += 512) { /* src advances past each chunk */
    size_t m = k - j < 512 ? k - j : 512;
    reduce_block_i64(acc, src, n, m);
    i64_to_f32(dst + j, acc, NULL, m, kk);
    for (int q = 0; q < n; q++) src[q] += m;
  }
}

/* fo (int64 sums only, allreduce): the span's elements from nint on are
 * written to every window as floats (double)sum * k at foff + 4 * (i -
 * nint) instead of as int64 sums at their place. */
struct f32out {
  size_t nint, foff;
  double k;
};

/* ap (f32 sums by the shares only): the sums of this rank's slice stay in
 * its own window and fn(ud, first, end) is called on them (element indices
 * in the window) before the rank posts `done`. */
struct apply_cb {
  dt_window_apply_fn fn;
  void *ud;
};

static int window_reduce(dt_comm_window *w, size_t off, size_t count, float scale,
                         uint32_t elem, const size_t *ranges, int nranges,
                         const struct f32out *fo, const struct apply_cb *ap) {
  int n = w->size, r = w->rank;
  const char *what = elem == 4 ? "floats" : "int64s";
  if (off % elem || off + count * elem > w->bytes || off + count * elem < off)
    return dt__seterr(DT_EINVAL, "window allreduce: span [%zu, +%zu %s) outside the %zu-byte "
                      "window", off, count, what, w->bytes);
  if (fo && (fo->nint > count || fo->foff % 4 || fo->foff > w->bytes ||
             (count - fo->nint) * 4 > w->bytes - fo->foff))
    return dt__seterr(DT_EINVAL, "window allreduce: float span [%zu, +%zu floats) outside the "
                      "%zu-byte window", fo->foff, count - (fo->nint < count ? fo->nint : count),
                      w->bytes);
  if (atomic_load(&w->aborted))
    return dt__seterr(DT_EABORTED, "window allreduce: aborted (%s)", w->hdr[r]->why);
  uint32_t seq = ++w->seq;
  /* flight recorder: its own numbering (stream "WIN"), one window per world */
  dt_obs *obs = dt_comm_obs(w->c);
  int64_t fr = dt_obs_fr_begin(obs, "allreduce", DT_OBS_STREAM_WINDOW, seq, (uint64_t)count * 4, -1);
  struct win_hdr *me = w->hdr[r];
  const int64_t t_ready = dt_now_ns();
  me->fp[seq & 1] = (struct span_fp){off, count, scale, seq, elem, w->cut_sum, ap != NULL,
                                      t_ready};
  post(me, &me->ready, seq);
  int64_t deadline = dt_now_ns() + (int64_t)(dt_comm_timeout(w->c) * 1e9);
  int64_t last = t_ready; /* the latest peer's join, then finish */
  float scales[64], *sv = n <= 64 ? scales : malloc((size_t)n * sizeof *sv);
  void *stack_src[64], **src = n <= 64 ? stack_src : malloc((size_t)n * sizeof *src);
  int rc = DT_OK;
  if (!sv || !src) {
    rc = dt__seterr(DT_ENOMEM, "window allreduce: out of memory");
    goto out;
  }
  for (int q = 0; q < n; q++) {
    if (q != r && (rc = wait_word(w, q, 0, seq, deadline)) < 0) goto out;
    const struct span_fp *f = &w->hdr[q]->fp[seq & 1];
    if (f->seq == seq && f->cut_sum != w->cut_sum && !ranges) {
      rc = dt__seterr(DT_EMISMATCH, "window allreduce #%u: rank %d cuts the slices with "
                      "shares %08x, rank %d with %08x", seq, q, f->cut_sum, r, w->cut_sum);
      goto out;
    }
    if (f->seq == seq && f->apply != (ap != NULL)) {
      rc = dt__seterr(DT_EMISMATCH, "window allreduce #%u: rank %d %s, rank %d %s", seq, q,
                      f->apply ? "updates its slice in place" : "sums for every rank", r,
                      ap ? "updates its slice in place" : "sums for every rank");
      goto out;
    }
    if (f->seq != seq || f->off != off || f->count != count || f->elem != elem) {
      rc = dt__seterr(DT_EMISMATCH, "window allreduce #%u: rank %d reduces %s [%llu, +%llu) "
                      "but rank %d reduces %s [%zu, +%zu)", seq, q,
                      f->elem == 8 ? "int64s" : "floats",
                      (unsigned long long)(f->off / (f->elem ? f->elem : 4)),
                      (unsigned long long)f->count, r, what, off / elem, count);
      goto out;
    }
    if (elem == 8 && f->scale != scale) { /* int64 sums back as floats on one rank only */
      rc = dt__seterr(DT_EMISMATCH, "window allreduce #%u: rank %d converts the int64 sums "
                      "with %g, rank %d with %g (1: kept as int64; DTRAIN_DET_FWIN differs?)", seq, q,
                      (double)f->scale, r, (double)scale);
      goto out;
    }
    sv[q] = f->scale;
    if (f->t_ready > last) last = f->t_ready;
  }
  atomic_fetch_add_explicit(&w->blocked_ns, last - t_ready, memory_order_relaxed);
  enum { BLOCK_BYTES = 16384 }; /* stays in L1 while copied out */
  const size_t block = BLOCK_BYTES / elem;
  if (ranges) {
    /* each range summed into this rank's window; peers' windows are only
     * read, and the rank-order sum is the allreduce's, bit for bit */
    for (int g = 0; g < nranges; g++) {
      size_t lo = ranges[2 * g], hi = ranges[2 * g + 1] < count ? ranges[2 * g + 1] : count;
      for (size_t j = lo; j < hi; j += block) {
        size_t k = hi - j < block ? hi - j : block;
        for (int q = 0; q < n; q++) src[q] = (char *)w->data[q] + off + j * elem;
        void *dst = (char *)w->data[r] + off + j * elem;
        if (elem == 4) reduce_block(dst, (float *const *)src, sv, n, k);
        else reduce_block_i64(dst, (int64_t *const *)src, n, k);
      }
      if (hi > lo) count_bytes(&w->read, (uint64_t)(n - 1) * (hi - lo) * elem);
    }
  } else {
    /* slice r of the span, in whole cache lines so no two ranks write one:
     * equal, or by the shares set (a slow rank sums less) */
    const size_t line = 64 / elem;
    size_t lo, hi;
    if (w->cut) {
      size_t lines = (count + line - 1) / line;
      lo = (size_t)((double)lines * w->cut[r]) * line;
      hi = r == n - 1 ? count : (size_t)((double)lines * w->cut[r + 1]) * line;
      if (lo > count) lo = count;
      if (hi > count) hi = count;
      if (hi < lo) hi = lo;
    } else {
      size_t per = ((count + (size_t)n * line - 1) / ((size_t)n * line)) * line;
      lo = (size_t)r * per < count ? (size_t)r * per : count;
      hi = lo + per < count ? lo + per : count;
    }
    uint64_t wrote = 0;
    for (size_t j = lo; j < hi; j += block) {
      size_t k = hi - j < block ? hi - j : block;
      /* int64 sums at their place for the first ki elements, floats after */
      size_t ki = !fo || j + k <= fo->nint ? k : j < fo->nint ? fo->nint - j : 0;
      for (int q = 0; q < n; q++) src[q] = (char *)w->data[q] + off + j * elem;
      void *dst = (char *)w->data[r] + off + j * elem;
      if (elem == 4) reduce_block(dst, (float *const *)src, sv, n, k);
      else if (ki) reduce_block_i64(dst, (int64_t *const *)src, n, ki);
      if (ap) continue; /* the sums stay here: fn applies them below */
      for (int q = 0; q < n && ki; q++)
        if (q != r) memcpy((char *)w->data[q] + off + j * elem, dst, ki * elem);
      wrote += ki * elem;
      if (ki == k) continue;
      for (int q = 0; q < n; q++) src[q] = (int64_t *)src[q] + ki;
      size_t fat = fo->foff + (j + ki - fo->nint) * sizeof(float);
      float *fd = (float *)((char *)w->data[r] + fat);
      reduce_block_i64_f32(fd, (int64_t **)src, n, k - ki, fo->k);
      for (int q = 0; q < n; q++)
        if (q != r) memcpy((char *)w->data[q] + fat, fd, (k - ki) * sizeof(float));
      wrote += (k - ki) * sizeof(float);
    }
    count_bytes(&w->read, (uint64_t)(n - 1) * (hi - lo) * elem);
    count_bytes(&w->written, (uint64_t)(n - 1) * wrote);
    if (ap && (rc = ap->fn(ap->ud, off / elem + lo, off / elem + hi)) < 0) goto out;
  }
  const int64_t t_done = dt_now_ns();
  me->t_done[seq & 1] = t_done;
  post(me, &me->done, seq);
  last = t_done;
  for (int q = 0; q < n; q++) {
    if (q == r) continue;
    if ((rc = wait_word(w, q, 1, seq, deadline)) < 0) goto out;
    if (w->hdr[q]->t_done[seq & 1] > last) last = w->hdr[q]->t_done[seq & 1];
  }
  atomic_fetch_add_explicit(&w->blocked_ns, last - t_done, memory_order_relaxed);
out:
  if (sv != scales) free(sv);
  if (src != stack_src) free(src);
  dt_obs_fr_end(obs, fr, rc);
  if (rc < 0) {
    /* peers must not wait for a rank that left the protocol */
    dt_comm_window_abort(w, dt_errmsg());
  }
  return rc;
}

int dt_comm_window_allreduce_f32(dt_comm_window *w, size_t off, size_t count, float scale) {
  return window_reduce(w, off, count, scale, 4, NULL, 0, NULL, NULL);
}

int dt_comm_window_reduce_apply_f32(dt_comm_window *w, size_t off, size_t count, float scale,
                                    dt_window_apply_fn fn, void *ud) {
  if (!fn) return dt__seterr(DT_EINVAL, "window reduce-apply: no function");
  struct apply_cb ap = {fn, ud};
  return window_reduce(w, off, count, scale, 4, NULL, 0, NULL, &ap);
}

int dt_comm_window_reduce_local_f32(dt_comm_window *w, size_t off, size_t count, float scale,
                                    const size_t *ranges, int nranges) {
  if (!ranges || nranges < 0)
    return dt__seterr(DT_EINVAL, "window reduce: %d ranges", nranges);
  for (int g = 0; g < nranges; g++)
    if (ranges[2 * g] > ranges[2 * g + 1] || ranges[2 * g + 1] > count)
      return dt__seterr(DT_EINVAL, "window reduce: range %d [%zu, %zu) outside the span of %zu "
                        "floats", g, ranges[2 * g], ranges[2 * g + 1], count);
  return window_reduce(w, off, count, scale, 4, ranges, nranges, NULL, NULL);
}

int dt_comm_window_allreduce_i64(dt_comm_window *w, size_t off, size_t count) {
  return window_reduce(w, off, count, 1.0f, 8, NULL, 0, NULL, NULL);
}

int dt_comm_window_allreduce_i64_f32(dt_comm_window *w, size_t off, size_t count, size_t nint,
                                     size_t foff, double k) {
  if (!(k > 0) || !isfinite(k) || (float)k == 1.0f || !((float)k > 0))
    return dt__seterr(DT_EINVAL, "window allreduce: scale %g for int64 sums as floats", k);
  struct f32out fo = {nint, foff, k};
  return window_reduce(w, off, count, (float)k, 8, NULL, 0, &fo, NULL);
}

/* A launcher's sweep after it has reaped its workers: the window segments
 * those pids created (normally already unlinked once every rank mapped
 * them; a worker killed before that leaves its name). */
int dt__window_sweep_pids(const int *pids, int npids) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, WIN_PREFIX, sizeof WIN_PREFIX - 1)) continue;
    char *end;
    long pid = strtol(e->d_name + sizeof WIN_PREFIX - 1, &end, 10);
    if (*end != '-') continue;
    for (int i = 0; i < npids; i++)
      if (pids[i] > 0 && pids[i] == pid) {
        char n[300];
        snprintf(n, sizeof n, "/%s", e->d_name);
        if (shm_unlink(n) == 0) removed++;
        break;
      }
  }
  closedir(d);
  return removed;
}

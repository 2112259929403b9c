/*
 * standby.c — the standby copy of an elastic job's state (docs/elastic.md
 * "Standby copy"): one shared anonymous mapping per node launcher, made
 * before the workers and spares are forked (so every one of them maps it,
 * and it vanishes with them: no name, nothing to sweep), holding the
 * parameters, buffers and optimizer state with the position they belong to.
 *
 * A member writes it every dist.standby_refresh_steps steps (whoever of the
 * node's members takes the writer's lock first; the others skip), and on
 * demand when a generation admits a rank that shares the copy but is behind
 * it. A reader (a woken spare) copies it out under a sequence lock: the
 * counter is odd while a write is under way, and a copy whose counter moved
 * or was odd, whose sizes differ or whose position is not the one asked for
 * is not used. A writer killed mid-write leaves the counter odd; the next
 * writer takes its lock over (the pid is gone) and completes a new copy.
 *
 * It does not decide who needs the state or move it between nodes (the
 * admission in elastic_run.c does, falling back to the strategy's
 * broadcast), and it never blocks: a lock held by a live process means
 * "skip".
 */
#include <errno.h>
#include <stdio.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"

#define SB_MAGIC 0x31425344544eULL /* "NTDSB1" */

typedef struct sb_hdr {
  uint64_t magic;
  uint64_t region;           /* random: names this node's copy in an admission */
  _Atomic uint64_t seq;      /* even: consistent; odd: a write is under way */
  _Atomic int lock;          /* pid of the writer, 0: free */
  int pad_;
  int64_t pos, state_gen;    /* the copy's tag (dt__elastic_pos, generation of its last change) */
  int64_t step, optim_step;  /* S->step, the optimizer's step count */
  uint64_t nparams, nbufs, nopt;
  int64_t refreshes, catchups, last_refresh_step;
} sb_hdr;

#define SB_DATA 256 /* payload offset (the header fits, cache-line aligned) */
_Static_assert(sizeof(sb_hdr) <= SB_DATA, "standby header too large");

static size_t sb_floats(const dt_engine *e) {
  return dt_model_nparams(e->model) + dt_model_nbufs(e->model) + dt_optim_state_floats(e->optim);
}

int dt__engine_standby_map(dt_engine *e) { return dt__standby_map(e); }

int dt__standby_map(dt_engine *e) {
  if (!e || !e->model || !e->optim) return dt__seterr(DT_EINVAL, "standby copy: no engine");
  if (e->sb) return DT_OK;
  size_t len = SB_DATA + sb_floats(e) * sizeof(float);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return dt__seterr(DT_ENOMEM, "standby copy of %zu bytes: %s", len, strerror(errno));
  sb_hdr *h = p;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 12) ^
               (uint64_t)(uintptr_t)p;
  h->magic = SB_MAGIC;
  h->region = r | 1; /* never 0: 0 means "no copy" in an admission */
  atomic_init(&h->seq, 0);
  atomic_init(&h->lock, 0);
  h->pos = h->state_gen = -1;
  h->nparams = dt_model_nparams(e->model);
  h->nbufs = dt_model_nbufs(e->model);
  h->nopt = dt_optim_state_floats(e->optim);
  e->sb = p;
  e->sb_len = len;
  return DT_OK;
}

/* Each page of buf written (with what it holds): this process's own copy
 * from now on, not the launcher's shared by copy-on-write. */
static void own_pages(void *buf, size_t bytes) {
  volatile char *p = buf;
  for (size_t i = 0; i < bytes; i += 4096) p[i] = p[i];
  if (bytes) p[bytes - 1] = p[bytes - 1];
}

void dt__engine_standby_warm(dt_engine *e) {
  if (!e || !e->model || !e->optim) return;
  own_pages(dt_model_params(e->model), dt_model_nparams(e->model) * sizeof(float));
  own_pages(dt_model_grads(e->model), dt_model_nparams(e->model) * sizeof(float));
  own_pages(dt_model_bufs(e->model), dt_model_nbufs(e->model) * sizeof(float));
  own_pages(dt_optim_state(e->optim), dt_optim_state_floats(e->optim) * sizeof(float));
}

void dt__standby_unmap(dt_engine *e) {
  if (e && e->sb) munmap(e->sb, e->sb_len);
  if (e) e->sb = NULL, e->sb_len = 0;
}

uint64_t dt__standby_region(const dt_engine *e) {
  return e && e->sb ? ((const sb_hdr *)e->sb)->region : 0;
}

static int sizes_match(const dt_engine *e, const sb_hdr *h) {
  return h->magic == SB_MAGIC && h->nparams == dt_model_nparams(e->model) &&
         h->nbufs == dt_model_nbufs(e->model) && h->nopt == dt_optim_state_floats(e->optim);
}

/* The writer's lock: free, or held by a process that is gone. */
static int take_lock(sb_hdr *h) {
  int me = (int)getpid(), cur = 0;
  if (atomic_compare_exchange_strong(&h->lock, &cur, me)) return 1;
  if (cur == me) return 0; /* cannot happen: one writer per process at a time */
  if (cur > 0 && kill(cur, 0) < 0 && errno == ESRCH)
    return atomic_compare_exchange_strong(&h->lock, &cur, me);
  return 0;
}

int dt__standby_write(dt_engine *e, int periodic) {
  sb_hdr *h = e->sb;
  if (!h || !sizes_match(e, h) || e->el_partial) return -1;
  const int64_t pos = dt__elastic_pos(e);
  if (pos < 0 || !take_lock(h)) return -1;
  uint64_t s = atomic_load_explicit(&h->seq, memory_order_relaxed);
  if (!(s & 1) && h->pos == pos && h->state_gen == e->state_gen) { /* current already */
    atomic_store_explicit(&h->lock, 0, memory_order_release);
    return 0;
  }
  if (!(s & 1)) s++;
  atomic_store_explicit(&h->seq, s, memory_order_relaxed); /* odd: being written */
  atomic_thread_fence(memory_order_release);
  float *d = (float *)((char *)h + SB_DATA);
  const size_t np = h->nparams, nb = h->nbufs, no = h->nopt;
  memcpy(d, dt_model_params(e->model), np * sizeof(float));
  if (nb) memcpy(d + np, dt_model_bufs(e->model), nb * sizeof(float));
  if (no) memcpy(d + np + nb, dt_optim_state(e->optim), no * sizeof(float));
  h->pos = pos;
  h->state_gen = e->state_gen;
  h->step = e->strat.step;
  h->optim_step = *dt_optim_step_count(e->optim);
  if (periodic) h->refreshes++, h->last_refresh_step = e->strat.step;
  else h->catchups++;
  atomic_store_explicit(&h->seq, s + 1, memory_order_release); /* even: consistent */
  atomic_store_explicit(&h->lock, 0, memory_order_release);
  return 1;
}

int dt__standby_load(dt_engine *e, int64_t *pos, int64_t *gen) {
  sb_hdr *h = e->sb;
  *pos = *gen = -1;
  if (!h || !sizes_match(e, h)) return 0;
  uint64_t s1 = atomic_load_explicit(&h->seq, memory_order_acquire);
  if ((s1 & 1) || h->pos < 0) return 0;
  const int64_t p = h->pos, g = h->state_gen, step = h->step, ostep = h->optim_step;
  const float *d = (const float *)((const char *)h + SB_DATA);
  const size_t np = h->nparams, nb = h->nbufs, no = h->nopt;
  e->el_partial = 1; /* until the copy is known whole */
  memcpy(dt_model_params(e->model), d, np * sizeof(float));
  if (nb) memcpy(dt_model_bufs(e->model), d + np, nb * sizeof(float));
  if (no) memcpy(dt_optim_state(e->optim), d + np + nb, no * sizeof(float));
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&h->seq, memory_order_relaxed) != s1) return 0; /* torn: written meanwhile */
  e->strat.step = step;
  *dt_optim_step_count(e->optim) = ostep;
  *pos = p;
  *gen = g;
  return 1;
}

void dt__standby_poke(dt_engine *e, int lock_pid, int make_odd) {
  sb_hdr *h = e->sb;
  if (!h) return;
  atomic_store(&h->lock, lock_pid);
  if (make_odd && !(atomic_load(&h->seq) & 1)) atomic_fetch_add(&h->seq, 1);
}

void dt__standby_describe(const dt_engine *e, char *buf, size_t cap) {
  const sb_hdr *h = e->sb;
  if (!h) {
    snprintf(buf, cap, "no standby copy");
    return;
  }
  snprintf(buf, cap, "%lld periodic refreshes (every %d steps, the last at step %lld), %lld "
           "catch-ups", (long long)h->refreshes, e->cfg.standby_refresh_steps,
           (long long)h->last_refresh_step, (long long)h->catchups);
}

/*
 * direct.c — direct asp (docs/ps.md "Colocated asp on one host: direct
 * pushes"): with colocated servers, asp and shared-memory windows, a
 * worker applies its own pushes. Every key's master parameters, optimizer
 * state, optimizer step count, version and per-worker push clocks live in
 * shared memory (server s's keys in server s's window slot, which every
 * process maps); a push locks the key (a spinlock in that memory), steps
 * the optimizer on the master with the rate divided by the push's
 * staleness (as the server thread would), copies the new parameters into
 * the worker's own and unlocks. Pushes are still applied on arrival, in
 * the order the workers take the lock (asp's semantics); nothing is sent,
 * no thread is woken and no thread switches, which on 2 cores was most of
 * asp's extra CPU (a server thread's sleeps and the communicator's mutex).
 *
 * Layout of a slot (server s's keys, in map order): per key a 64-byte
 * aligned header (lock, version, step count, then one push clock per
 * worker), then the keys' parameters, then their optimizer state (the
 * per-parameter state floats of each key, key after key).
 *
 * It does not wait for peers except for a key's lock (a deadline, then
 * DT_ETIMEDOUT) and in dt_ps_direct_all_in's callers; a dead peer is
 * noticed by the communicator the callers poll.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps.h"

typedef struct dhdr {
  _Atomic uint32_t lock;
  uint32_t pad;
  int64_t version; /* pushes applied (under the lock) */
  int64_t step;    /* the optimizer's step count (under the lock) */
  _Atomic int64_t wclock[]; /* per worker: its pushes applied (its next clock) */
} dhdr;

typedef struct dkey {
  dhdr *h;
  float *p, *st;   /* master parameters, optimizer state (shared) */
} dkey;

struct dt_ps_direct {
  const dt_ps_map *map;
  dt_optim_cfg optim;
  int N, me;
  size_t per;      /* optimizer state floats per parameter */
  double timeout;  /* seconds a lock may be waited for */
  dkey *k;
};

static size_t hstride(int N) { return (sizeof(dhdr) + (size_t)N * sizeof(int64_t) + 63) & ~(size_t)63; }

static size_t per_param(const dt_ps_opts *o) {
  return o->optim.kind == DT_OPT_ADAMW ? 2 : o->optim.momentum != 0.0f ? 1 : 0;
}

static size_t slot_bytes(const dt_ps_map *m, const dt_ps_opts *o, int s) {
  const size_t nk = (size_t)(m->srv_key0[s + 1] - m->srv_key0[s]);
  const size_t fl = (size_t)(m->srv_lo[s + 1] - m->srv_lo[s]);
  return nk * hstride(o->nworkers) + ((fl + 15) & ~(size_t)15) * sizeof(float) * (1 + per_param(o));
}

size_t dt_ps_direct_bytes(const dt_ps_map *m, const dt_ps_opts *o) {
  size_t b = 64;
  for (int s = 0; s < m->nservers; s++)
    if (slot_bytes(m, o, s) > b) b = slot_bytes(m, o, s);
  return b;
}

int dt_ps_direct_create(dt_ps_direct **out, const dt_ps_map *m, const dt_ps_opts *o, int me,
                        void *const *slots, const float *init, double timeout) {
  *out = NULL;
  if (!m || !o || !slots || !init || me < 0 || me >= m->nservers)
    return dt__seterr(DT_EINVAL, "ps direct: bad arguments");
  dt_ps_direct *d = calloc(1, sizeof *d);
  if (d) d->k = calloc((size_t)m->nkeys, sizeof *d->k);
  if (!d || !d->k) {
    free(d);
    return dt__seterr(DT_ENOMEM, "ps direct: out of memory");
  }
  d->map = m;
  d->optim = o->optim;
  d->N = o->nworkers;
  d->me = me;
  d->per = per_param(o);
  d->timeout = timeout > 0 ? timeout : 60;
  const size_t hs = hstride(d->N);
  for (int s = 0; s < m->nservers; s++) {
    char *base = slots[s];
    const int k0 = m->srv_key0[s], k1 = m->srv_key0[s + 1];
    const uint64_t lo = m->srv_lo[s], fl = m->srv_lo[s + 1] - lo;
    float *p = (float *)(void *)(base + (size_t)(k1 - k0) * hs);
    float *st = p + ((fl + 15) & ~(uint64_t)15);
    for (int k = k0; k < k1; k++) {
      const dt_ps_key *K = &m->keys[k];
      d->k[k].h = (dhdr *)(void *)(base + (size_t)(k - k0) * hs);
      d->k[k].p = p + (K->off - lo);
      d->k[k].st = st + d->per * (K->off - lo);
    }
  }
  /* this process's own keys start from init (the window is zeroed: state,
   * versions and clocks are 0); nobody pushes before every worker's start
   * has passed its mark, after this */
  for (int k = m->srv_key0[me]; k < m->srv_key0[me + 1]; k++)
    memcpy(d->k[k].p, init + m->keys[k].off, m->keys[k].len * sizeof(float));
  *out = d;
  return DT_OK;
}

void dt_ps_direct_destroy(dt_ps_direct *d) {
  if (!d) return;
  free(d->k);
  free(d);
}

static int lock(dt_ps_direct *d, int k) {
  _Atomic uint32_t *l = &d->k[k].h->lock;
  int64_t t0 = 0;
  for (unsigned i = 0;; i++) {
    uint32_t z = 0;
    if (!atomic_load_explicit(l, memory_order_relaxed) &&
        atomic_compare_exchange_weak_explicit(l, &z, 1, memory_order_acquire,
                                              memory_order_relaxed))
      return DT_OK;
    if (i < 32) continue;
    /* the holder (another worker, mid-update) may be off its core: let it run */
    if (i < 1024) {
      sched_yield();
      continue;
    }
    if (!t0) t0 = dt_now_ns();
    if ((double)(dt_now_ns() - t0) > d->timeout * 1e9)
      return dt__seterr(DT_ETIMEDOUT, "ps worker %d: key %d (server %d's) stayed locked for %.0f "
                        "s (its holder stopped mid-update?)", d->me, k, d->map->keys[k].server,
                        d->timeout);
    dt__ps_sleep_ns(20000);
  }
}

static void unlock(dt_ps_direct *d, int k) {
  atomic_store_explicit(&d->k[k].h->lock, 0, memory_order_release);
}

static int trylock(dt_ps_direct *d, int k) {
  _Atomic uint32_t *l = &d->k[k].h->lock;
  uint32_t z = 0;
  return !atomic_load_explicit(l, memory_order_relaxed) &&
         atomic_compare_exchange_strong_explicit(l, &z, 1, memory_order_acquire,
                                                 memory_order_relaxed);
}

int dt_ps_direct_push(dt_ps_direct *d, int k, const float *g, float lr, int64_t read,
                      float *out, int64_t *ver, int try) {
  const dt_ps_key *K = &d->map->keys[k];
  dkey *dk = &d->k[k];
  if (try) {
    if (!trylock(d, k)) return 1;
  } else {
    DT_CHECK(lock(d, k));
  }
  /* asp: the rate over the staleness, the pushes this key took since the
   * worker read it */
  int64_t stale = dk->h->version - read;
  if (stale > 1) lr /= (float)stale;
  int rc = dt__optim_step_state(&d->optim, K->len, dk->p, g, lr, dk->st, &dk->h->step, NULL);
  if (rc == DT_OK) {
    dk->h->version++;
    atomic_fetch_add_explicit(&dk->h->wclock[d->me], 1, memory_order_release);
    memcpy(out, dk->p, K->len * sizeof(float));
    *ver = dk->h->version;
  }
  unlock(d, k);
  return rc < 0 ? dt__preerr(rc, "ps worker %d: key %d", d->me, k) : DT_OK;
}

int dt_ps_direct_all_in(const dt_ps_direct *d, int64_t clock) {
  for (int k = 0; k < d->map->nkeys; k++)
    for (int w = 0; w < d->N; w++)
      if (atomic_load_explicit(&d->k[k].h->wclock[w], memory_order_acquire) < clock) return 0;
  return 1;
}

int dt_ps_direct_read(dt_ps_direct *d, int k, float *out, int64_t *ver) {
  DT_CHECK(lock(d, k));
  memcpy(out, d->k[k].p, d->map->keys[k].len * sizeof(float));
  *ver = d->k[k].h->version;
  unlock(d, k);
  return DT_OK;
}

int dt_ps_direct_record(dt_ps_direct *d, int k, float *rec, int64_t *step) {
  const size_t len = d->map->keys[k].len;
  DT_CHECK(lock(d, k));
  memcpy(rec, d->k[k].p, len * sizeof(float));
  if (d->per) memcpy(rec + len, d->k[k].st, d->per * len * sizeof(float));
  *step = d->k[k].h->step;
  unlock(d, k);
  return DT_OK;
}

int dt_ps_direct_restore(dt_ps_direct *d, int k, const float *rec, int64_t step) {
  const size_t len = d->map->keys[k].len;
  DT_CHECK(lock(d, k));
  memcpy(d->k[k].p, rec, len * sizeof(float));
  if (d->per) memcpy(d->k[k].st, rec + len, d->per * len * sizeof(float));
  d->k[k].h->step = step;
  unlock(d, k);
  return DT_OK;
}

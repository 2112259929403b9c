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
#include <math.h>
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

/* One pass over a key for the common optimizers: the gradient scaled by
 * the worker's share w, the optimizer's update of the master (and its
 * state) and the new value stored into the worker's own parameters too —
 * the same IEEE operations, in the same order, as scaling g, then
 * dt__optim_step_state, then a copy (this file is compiled without FMA
 * contraction, as optim.c: the same bits), but the key is read and
 * written once instead of three times (MLP asp: the push was ~17% of a
 * step). 1 when it applied the update, 0 for the optimizers it leaves to
 * the general path (Nesterov, dampening). */
static int fused_step(const dt_optim_cfg *c, size_t n, float *restrict p,
                      const float *restrict g, float w, float lr, float *restrict st,
                      int64_t t, float *restrict out) {
  const float wd = c->weight_decay;
  if (c->kind == DT_OPT_SGD && c->momentum == 0.0f) {
    for (size_t i = 0; i < n; i++) {
      float q = p[i] - lr * (g[i] * w + wd * p[i]);
      p[i] = q;
      out[i] = q;
    }
    return 1;
  }
  if (c->kind == DT_OPT_SGD) {
    if (c->nesterov || c->dampening != 0.0f) return 0;
    const float mom = c->momentum, keep = 1.0f;
    if (t == 1) {
      for (size_t i = 0; i < n; i++) {
        float dd = g[i] * w + wd * p[i];
        st[i] = dd;
        float q = p[i] - lr * dd;
        p[i] = q;
        out[i] = q;
      }
    } else {
      for (size_t i = 0; i < n; i++) {
        float dd = g[i] * w + wd * p[i];
        float b = mom * st[i] + keep * dd;
        st[i] = b;
        float q = p[i] - lr * b;
        p[i] = q;
        out[i] = q;
      }
    }
    return 1;
  }
  /* AdamW: dt__optim_step_span's scalars */
  double td = (double)t;
  double bc1 = 1.0 - pow((double)c->beta1, td);
  double bc2 = 1.0 - pow((double)c->beta2, td);
  const float step_size = (float)((double)lr / bc1);
  const float inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
  const float decay = (float)(1.0 - (double)lr * (double)wd);
  const float b1 = c->beta1, b2 = c->beta2, w1 = 1.0f - b1, w2 = 1.0f - b2, eps = c->eps;
  float *restrict m = st, *restrict v = st + n;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * w;
    float pi = p[i] * decay;
    float mi = m[i] + w1 * (gi - m[i]);
    float vi = b2 * v[i] + w2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float q = pi - step_size * (mi / (sqrtf(vi) * inv_bc2_sqrt + eps));
    p[i] = q;
    out[i] = q;
  }
  return 1;
}

int dt_ps_direct_push(dt_ps_direct *d, int k, float *g, float w, float lr, int64_t read,
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
  int rc = DT_OK;
  if (!(lr >= 0.0f) || isinf(lr))
    rc = dt__seterr(DT_EINVAL, "optimizer step: lr %g must be finite and >= 0", (double)lr);
  else if (fused_step(&d->optim, K->len, dk->p, g, w, lr, dk->st, dk->h->step + 1, out))
    dk->h->step++;
  else {
    /* the general path: scale in place, step, copy */
    for (size_t i = 0; i < K->len; i++) g[i] *= w;
    rc = dt__optim_step_state(&d->optim, K->len, dk->p, g, lr, dk->st, &dk->h->step, NULL);
    if (rc == DT_OK) memcpy(out, dk->p, K->len * sizeof(float));
  }
  if (rc == DT_OK) {
    dk->h->version++;
    atomic_fetch_add_explicit(&dk->h->wclock[d->me], 1, memory_order_release);
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

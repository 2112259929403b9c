/*
 * batch_source.c — the two batch sources built so far (batch_source.h): the
 * prefetching loader of one worker, and the shards of each global batch that
 * data-parallel workers train on (balanced slices, or deterministic mode's
 * fixed micro-shards). It copies samples into its own buffers; it does not
 * decide which strategy uses which source (strategy.h's open_source does).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/balance.h"
#include "engine/batch_source.h"

/* ---- loader: one worker, one piece per step ----------------------------------- */

typedef struct loader_src {
  dt_batch_source base;
  dt_loader *l;
  dt_batch cur;
  int64_t steps;
  int64_t next;  /* the batch the loader hands out next */
} loader_src;

static int loader_bind(dt_batch_source *s, int rank, int nranks) {
  if (nranks != 1)
    return dt__seterr(DT_EINVAL, "batch source 'loader' serves one worker, not rank %d of %d",
                      rank, nranks);
  return DT_OK;
}

static int64_t loader_steps(const dt_batch_source *s) { return ((const loader_src *)s)->steps; }

static int loader_epoch(dt_batch_source *s, int epoch) {
  ((loader_src *)s)->next = 0;
  return dt_loader_start_epoch(((loader_src *)s)->l, (uint64_t)(epoch - 1));
}

static int loader_plan(dt_batch_source *s, int64_t k, dt_step_plan *p) {
  loader_src *L = (loader_src *)s;
  /* a resumed run starts inside an epoch: the loader jumps to batch k */
  if (k != L->next) DT_CHECK(dt_loader_seek(L->l, k));
  L->next = k + 1;
  int more = dt_loader_next(L->l, &L->cur);
  if (more < 0) return more;
  if (!more)
    return dt__seterr(DT_EIO, "loader: epoch ended after %lld of %lld batches", (long long)k,
                      (long long)L->steps);
  p->k = k;
  p->n_local = p->n_global = L->cur.n;
  p->start = L->cur.sample0;
  p->pieces = 1;
  p->pieces_global = 1;
  p->terms = L->steps;
  return DT_OK;
}

static int loader_piece(dt_batch_source *s, int i, dt_batch *b) {
  (void)i;
  *b = ((loader_src *)s)->cur;
  return DT_OK;
}

static void loader_destroy(dt_batch_source *s) {
  loader_src *L = (loader_src *)s;
  dt_loader_destroy(L->l);
  free(L);
}

static const struct dt_batch_source_ops loader_ops = {
    "loader", loader_bind, loader_steps, loader_epoch, loader_plan, loader_piece, loader_destroy,
};

int dt__source_loader(dt_batch_source **out, const dt_dataset *train, int batch, uint64_t seed,
                      int shuffle) {
  *out = NULL;
  loader_src *L = calloc(1, sizeof *L);
  if (!L) return dt__seterr(DT_ENOMEM, "batch source: out of memory");
  L->base.ops = &loader_ops;
  dt_loader_cfg lc = DT_LOADER_CFG_INIT;
  lc.batch = batch;
  lc.drop_last = 0;
  lc.prefetch = 2;
  lc.seed = seed;
  lc.shuffle = shuffle;
  int rc = dt_loader_create(&L->l, train, &lc);
  if (rc < 0) {
    free(L);
    return rc;
  }
  L->steps = dt_loader_batches(L->l);
  *out = &L->base;
  return DT_OK;
}

/* ---- shards: this worker's part of every global batch ------------------------- */

typedef struct shard_src {
  dt_batch_source base;
  const dt_dataset *ds;
  int batch, micro, shuffle;
  uint64_t seed;
  int rank, nranks;
  int64_t steps;
  int64_t *order;  /* the epoch's global order */
  float *xbuf;     /* (batch, dim): the current piece */
  int32_t *ybuf;
  int64_t lo;      /* the planned step: first position of this worker's part */
  int64_t end;     /* one past the global batch's last position */
  int64_t mb;      /* samples per piece (micro-shards); the slice length otherwise */
  double *weights; /* nranks: cut by speed (dist.balance = dynamic); NULL: equal */
  int64_t (*take)(void *ud); /* work stealing: the next micro-shard, -1: none left */
  void *take_ud;
  int64_t start;   /* the planned step's first position */
} shard_src;

static int shard_bind(dt_batch_source *s, int rank, int nranks) {
  shard_src *S = (shard_src *)s;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return dt__seterr(DT_EINVAL, "batch source 'shards': rank %d of %d", rank, nranks);
  S->rank = rank;
  S->nranks = nranks;
  free(S->weights);
  S->weights = NULL;
  return DT_OK;
}

static int64_t shard_steps(const dt_batch_source *s) { return ((const shard_src *)s)->steps; }

static int shard_epoch(dt_batch_source *s, int epoch) {
  shard_src *S = (shard_src *)s;
  dt_epoch_order(S->order, S->ds->n, S->seed, (uint64_t)(epoch - 1), S->shuffle);
  return DT_OK;
}

/* Slices: the global batch's g samples split into nranks contiguous slices
 * whose sizes differ by at most one (the first slices are the shorter ones).
 * Micro-shards: S = ceil(g / mb) shards of mb (the last may be short); worker
 * r of N takes the contiguous shards [S*r/N, S*(r+1)/N). With weights
 * (dist.balance = dynamic) dt__split_range cuts the samples, or the
 * micro-shards, in proportion to them instead. */
static int shard_plan(dt_batch_source *s, int64_t k, dt_step_plan *p) {
  shard_src *S = (shard_src *)s;
  const int64_t B = S->batch, start = k * B;
  const int64_t g = S->ds->n - start < B ? S->ds->n - start : B;
  const int64_t r = S->rank, N = S->nranks;
  p->k = k;
  p->n_global = (int)g;
  p->start = start;
  S->end = start + g;
  if (!S->micro) {
    int64_t lo, hi;
    dt__split_range(S->weights, (int)N, g, (int)r, &lo, &hi);
    lo += start;
    hi += start;
    S->lo = lo;
    S->mb = hi - lo;
    p->n_local = (int)(hi - lo);
    p->pieces = hi > lo;
    p->pieces_global = N;
    p->terms = S->steps;
    return DT_OK;
  }
  const int64_t mb = S->micro < B ? S->micro : B;
  const int64_t shards = (g + mb - 1) / mb;
  S->start = start;
  if (S->take) {
    /* work stealing: pieces come from the shared queue until it is empty;
     * pieces is only a bound and n_local is not known in advance */
    S->lo = start;
    S->mb = mb;
    p->n_local = 0;
    p->pieces = (int)shards;
    p->pieces_global = shards;
    p->terms = S->steps * ((B + mb - 1) / mb);
    return DT_OK;
  }
  int64_t s0, s1;
  dt__split_range(S->weights, (int)N, shards, (int)r, &s0, &s1);
  int64_t lo = start + s0 * mb, hi = start + s1 * mb;
  if (hi > S->end) hi = S->end;
  S->lo = lo;
  S->mb = mb;
  p->n_local = (int)(hi > lo ? hi - lo : 0);
  p->pieces = (int)(s1 - s0);
  p->pieces_global = shards;
  p->terms = S->steps * ((B + mb - 1) / mb);
  return DT_OK;
}

static int shard_piece(dt_batch_source *s, int i, dt_batch *b) {
  shard_src *S = (shard_src *)s;
  int64_t lo = S->lo + (int64_t)i * S->mb;
  if (S->take) {
    int64_t j = S->take(S->take_ud);
    if (j < 0) {
      /* the queue is empty: no more pieces this step */
      b->n = 0;
      b->sample0 = S->end;
      b->x = S->xbuf;
      b->y = S->ybuf;
      return DT_OK;
    }
    lo = S->start + j * S->mb;
  }
  const int64_t dim = S->ds->dim;
  const int n = (int)(S->end - lo < S->mb ? S->end - lo : S->mb);
  for (int j = 0; j < n; j++) {
    int64_t si = S->order[lo + j];
    memcpy(S->xbuf + j * dim, S->ds->x + si * dim, (size_t)dim * sizeof(float));
    S->ybuf[j] = S->ds->y[si];
  }
  b->n = n;
  b->sample0 = lo;
  b->x = S->xbuf;
  b->y = S->ybuf;
  return DT_OK;
}

static void shard_destroy(dt_batch_source *s) {
  shard_src *S = (shard_src *)s;
  dt_free(S->order);
  dt_free(S->xbuf);
  dt_free(S->ybuf);
  free(S->weights);
  free(S);
}

static const struct dt_batch_source_ops shard_ops = {
    "shards", shard_bind, shard_steps, shard_epoch, shard_plan, shard_piece, shard_destroy,
};

int dt__source_shards(dt_batch_source **out, const dt_dataset *train, int batch, uint64_t seed,
                      int shuffle, int micro) {
  *out = NULL;
  if (batch < 1) return dt__seterr(DT_EINVAL, "train.batch = %d: expects at least 1", batch);
  shard_src *S = calloc(1, sizeof *S);
  if (!S) return dt__seterr(DT_ENOMEM, "batch source: out of memory");
  S->base.ops = &shard_ops;
  S->ds = train;
  S->batch = batch;
  S->micro = micro;
  S->seed = seed;
  S->shuffle = shuffle;
  S->nranks = 1;
  S->steps = (train->n + batch - 1) / batch;
  S->order = dt_alloc((size_t)train->n * sizeof *S->order);
  S->xbuf = dt_alloc((size_t)batch * (size_t)train->dim * sizeof(float));
  S->ybuf = dt_alloc((size_t)batch * sizeof(int32_t));
  if (!S->order || !S->xbuf || !S->ybuf) {
    shard_destroy(&S->base);
    return dt__seterr(DT_ENOMEM, "engine: out of memory for %lld samples", (long long)train->n);
  }
  *out = &S->base;
  return DT_OK;
}

int dt__source_set_weights(dt_batch_source *s, const double *weights) {
  if (s->ops != &shard_ops)
    return dt__seterr(DT_EINVAL, "batch source '%s': cannot cut batches by weight",
                      s->ops->name);
  shard_src *S = (shard_src *)s;
  if (!weights) {
    free(S->weights);
    S->weights = NULL;
    return DT_OK;
  }
  if (!S->weights && !(S->weights = malloc((size_t)S->nranks * sizeof *S->weights)))
    return dt__seterr(DT_ENOMEM, "batch source: out of memory");
  memcpy(S->weights, weights, (size_t)S->nranks * sizeof *S->weights);
  return DT_OK;
}

int dt__source_set_taker(dt_batch_source *s, int64_t (*take)(void *ud), void *ud) {
  shard_src *S = (shard_src *)s;
  if (s->ops != &shard_ops || (take && !S->micro))
    return dt__seterr(DT_EINVAL, "batch source '%s': work stealing needs micro-shards",
                      s->ops->name);
  S->take = take;
  S->take_ud = ud;
  return DT_OK;
}

void dt__source_destroy(dt_batch_source *s) {
  if (s) s->ops->destroy(s);
}

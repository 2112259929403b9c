/*
 * loader.c — batches of a dataset in the epoch order, prepared ahead on one
 * background thread. The caller (one thread) calls dt_loader_next; the
 * worker fills a ring of prefetch+1 batch buffers: the one the caller holds
 * plus up to `prefetch` ready ones. A batch is a copy of samples
 * order[sample0 .. sample0+n) of this loader's shard, so batches are the
 * same whatever the prefetch depth (0 = copy synchronously in the caller).
 *
 * Synchronisation is one mutex and two condition variables. An epoch
 * generation counter lets dt_loader_start_epoch and dt_loader_destroy stop
 * the worker at a batch boundary (a batch copy is short), so they never wait
 * for a whole epoch. The order array is only rewritten while the worker is
 * idle. It does not augment, cache or shard across processes by itself.
 */
#include "data/data_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOADER_MAX_PREFETCH 64

struct dt_loader {
  const dt_dataset *ds;
  dt_loader_cfg cfg;
  int64_t begin, end; /* shard positions in the epoch order */
  int64_t nbatches;
  int64_t *order; /* (ds->n) */
  int nslots;
  float *xbuf;   /* (nslots, batch, dim) */
  int32_t *ybuf; /* (nslots, batch) */

  int threaded;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv_work;  /* worker waits: room in the ring, new epoch, stop */
  pthread_cond_t cv_ready; /* caller waits: a batch is ready, worker idle */
  /* Guarded by mu. */
  int stop;
  int active;       /* an epoch is running */
  uint64_t gen;     /* bumped by each start_epoch */
  int busy;         /* the worker is copying a batch */
  int64_t produced; /* batches ready (or held) in this epoch */
  int64_t consumed; /* batches handed to the caller */
  int holding;      /* the caller holds batch consumed-1 */
};

static int64_t batch_len(const dt_loader *l, int64_t i) {
  int64_t s = l->begin + i * l->cfg.batch;
  int64_t e = s + l->cfg.batch;
  return (e > l->end ? l->end : e) - s;
}

/* Copies batch i of the current epoch into its ring slot. */
static void fill(const dt_loader *l, int64_t i) {
  int slot = (int)(i % l->nslots);
  int64_t dim = l->ds->dim, nb = batch_len(l, i), p0 = l->begin + i * l->cfg.batch;
  float *xd = l->xbuf + (size_t)slot * l->cfg.batch * dim;
  int32_t *yd = l->ybuf + (size_t)slot * l->cfg.batch;
  for (int64_t j = 0; j < nb; j++) {
    int64_t s = l->order[p0 + j];
    memcpy(xd + j * dim, l->ds->x + s * dim, (size_t)dim * sizeof(float));
    yd[j] = l->ds->y[s];
  }
}

static void *worker(void *arg) {
  dt_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && !(l->active && l->produced < l->nbatches &&
                         l->produced < (l->consumed - l->holding) + l->nslots))
      pthread_cond_wait(&l->cv_work, &l->mu);
    if (l->stop) break;
    int64_t i = l->produced;
    uint64_t g = l->gen;
    l->busy = 1;
    pthread_mutex_unlock(&l->mu);
    fill(l, i);
    pthread_mutex_lock(&l->mu);
    l->busy = 0;
    if (g == l->gen) l->produced = i + 1;
    pthread_cond_broadcast(&l->cv_ready);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* The worker's mutex and condition variables (threaded loaders only). */
static void sync_destroy(dt_loader *l) {
  pthread_cond_destroy(&l->cv_ready);
  pthread_cond_destroy(&l->cv_work);
  pthread_mutex_destroy(&l->mu);
}

/* The loader's buffers and the loader itself; the thread must be gone. */
static void loader_free(dt_loader *l) {
  dt_free(l->order);
  dt_free(l->xbuf);
  dt_free(l->ybuf);
  free(l);
}

int dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_cfg *cfg) {
  if (!out) return dt__seterr(DT_EINVAL, "dt_loader_create: out is NULL");
  *out = NULL;
  if (!ds || !cfg || !ds->x || !ds->y || ds->n <= 0 || ds->dim <= 0)
    return dt__seterr(DT_EINVAL, "dt_loader_create: empty or missing dataset");
  if (cfg->batch <= 0) return dt__seterr(DT_EINVAL, "loader: batch %d must be positive", cfg->batch);
  if (cfg->prefetch < 0 || cfg->prefetch > LOADER_MAX_PREFETCH)
    return dt__seterr(DT_EINVAL, "loader: prefetch %d outside [0, %d]", cfg->prefetch, LOADER_MAX_PREFETCH);
  int64_t b = cfg->shard_begin, e = cfg->shard_end;
  if (b == 0 && e == 0) e = ds->n;
  if (b < 0 || e < b || e > ds->n)
    return dt__seterr(DT_EINVAL, "loader: shard [%lld, %lld) outside [0, %lld]", (long long)cfg->shard_begin,
                      (long long)cfg->shard_end, (long long)ds->n);
  dt_loader *l = calloc(1, sizeof *l);
  if (!l) return dt__seterr(DT_ENOMEM, "loader: out of memory");
  l->ds = ds;
  l->cfg = *cfg;
  l->begin = b;
  l->end = e;
  int64_t len = e - b;
  l->nbatches = cfg->drop_last ? len / cfg->batch : (len + cfg->batch - 1) / cfg->batch;
  l->nslots = cfg->prefetch + 1;
  l->threaded = cfg->prefetch > 0;
  l->order = dt_alloc((size_t)ds->n * sizeof(int64_t));
  l->xbuf = dt_alloc((size_t)l->nslots * cfg->batch * ds->dim * sizeof(float));
  l->ybuf = dt_alloc((size_t)l->nslots * cfg->batch * sizeof(int32_t));
  if (!l->order || !l->xbuf || !l->ybuf) {
    loader_free(l);
    return dt__seterr(DT_ENOMEM, "loader: cannot allocate %d batches of %d x %lld floats", cfg->prefetch + 1,
                      cfg->batch, (long long)ds->dim);
  }
  if (l->threaded) {
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    int e2 = pthread_create(&l->thread, NULL, worker, l);
    if (e2 != 0) {
      sync_destroy(l);
      loader_free(l);
      return dt__seterr(DT_ENOMEM, "loader: cannot start the prefetch thread (error %d)", e2);
    }
  }
  *out = l;
  return DT_OK;
}

void dt_loader_destroy(dt_loader *l) {
  if (!l) return;
  if (l->threaded) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    sync_destroy(l);
  }
  loader_free(l);
}

int dt_loader_start_epoch(dt_loader *l, uint64_t epoch) {
  if (!l) return dt__seterr(DT_EINVAL, "dt_loader_start_epoch: loader is NULL");
  if (l->threaded) {
    /* Stop the worker at a batch boundary before touching the order. */
    pthread_mutex_lock(&l->mu);
    l->gen++;
    l->active = 0;
    while (l->busy) pthread_cond_wait(&l->cv_ready, &l->mu);
    pthread_mutex_unlock(&l->mu);
  }
  dt_epoch_order(l->order, l->ds->n, l->cfg.seed, epoch, l->cfg.shuffle);
  if (l->threaded) pthread_mutex_lock(&l->mu);
  l->produced = 0;
  l->consumed = 0;
  l->holding = 0;
  l->active = 1;
  if (l->threaded) {
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
  }
  return DT_OK;
}

int dt_loader_seek(dt_loader *l, int64_t first) {
  if (!l) return dt__seterr(DT_EINVAL, "dt_loader_seek: loader is NULL");
  if (first < 0 || first > l->nbatches)
    return dt__seterr(DT_EINVAL, "dt_loader_seek: batch %lld of %lld", (long long)first,
                      (long long)l->nbatches);
  if (l->threaded) {
    /* the worker stops at a batch boundary, as in dt_loader_start_epoch */
    pthread_mutex_lock(&l->mu);
    l->gen++;
    l->active = 0;
    while (l->busy) pthread_cond_wait(&l->cv_ready, &l->mu);
  }
  l->produced = first;
  l->consumed = first;
  l->holding = 0;
  l->active = 1;
  if (l->threaded) {
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
  }
  return DT_OK;
}

int dt_loader_next(dt_loader *l, dt_batch *b) {
  if (!l || !b) return dt__seterr(DT_EINVAL, "dt_loader_next: NULL argument");
  int64_t i;
  if (!l->threaded) {
    if (!l->active) return dt__seterr(DT_EINVAL, "dt_loader_next: call dt_loader_start_epoch first");
    if (l->consumed >= l->nbatches) return 0;
    i = l->consumed++;
    fill(l, i);
  } else {
    pthread_mutex_lock(&l->mu);
    if (!l->active) {
      pthread_mutex_unlock(&l->mu);
      return dt__seterr(DT_EINVAL, "dt_loader_next: call dt_loader_start_epoch first");
    }
    if (l->holding) { /* the previous batch's slot is free again */
      l->holding = 0;
      pthread_cond_broadcast(&l->cv_work);
    }
    if (l->consumed >= l->nbatches) {
      pthread_mutex_unlock(&l->mu);
      return 0;
    }
    while (l->produced <= l->consumed) pthread_cond_wait(&l->cv_ready, &l->mu);
    i = l->consumed++;
    l->holding = 1;
    pthread_mutex_unlock(&l->mu);
  }
  int slot = (int)(i % l->nslots);
  b->n = (int)batch_len(l, i);
  b->sample0 = l->begin + i * l->cfg.batch;
  b->x = l->xbuf + (size_t)slot * l->cfg.batch * l->ds->dim;
  b->y = l->ybuf + (size_t)slot * l->cfg.batch;
  return 1;
}

int64_t dt_loader_batches(const dt_loader *l) { return l ? l->nbatches : 0; }

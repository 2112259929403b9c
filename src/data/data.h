/*
 * data.h — the data layer's interface for the rest of the library: the
 * public datasets and readers (include/dtrain/data.h: IDX with optional
 * gzip, CSV, NumPy .npy, caller memory, normalisation) plus per-epoch
 * shuffling from (seed, epoch), sharding, and a loader that prefetches
 * batches on a background thread.
 *
 * Every reader validates what it reads and fails with DT_EIO / DT_ECORRUPT /
 * DT_EINVAL and a dt_errmsg() line naming the file (and line for CSV). No
 * reader trusts a header's sizes: they are checked against the file length
 * and against limits before anything is allocated.
 */
#ifndef DT_DATA_H
#define DT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/data.h"

/* The global order of epoch `epoch`: a permutation of 0..n-1 as a pure
 * function of (seed, epoch); identity if shuffle is 0. */
void dt_epoch_order(int64_t *order, int64_t n, uint64_t seed, uint64_t epoch, int shuffle);

/* ---- loader --------------------------------------------------------------- */

typedef struct dt_loader dt_loader;

typedef struct dt_batch {
  int n;            /* samples in this batch */
  int64_t sample0;  /* position of the first sample in the epoch order */
  const float *x;   /* (n, dim) */
  const int32_t *y; /* (n) */
} dt_batch;

typedef struct dt_loader_cfg {
  int batch;          /* samples per batch */
  int drop_last;      /* drop a final partial batch */
  int prefetch;       /* batches prepared ahead (>= 1); 0 = synchronous */
  uint64_t seed;
  int shuffle;
  int64_t shard_begin, shard_end; /* positions [begin, end) of the epoch order this loader serves; 0,0 = all */
} dt_loader_cfg;
#define DT_LOADER_CFG_INIT {64, 1, 2, 0, 1, 0, 0}

/* The loader borrows ds (which must outlive it) and copies batches into its
 * own buffers on a background thread. */
int dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_cfg *cfg);
void dt_loader_destroy(dt_loader *l); /* joins the thread; NULL is a no-op */
/* Starts epoch `epoch` (computes its order, restarts prefetching). */
int dt_loader_start_epoch(dt_loader *l, uint64_t epoch);
/* Restarts the current epoch at batch `first` (0-based; a resumed run):
 * the batches before it are never copied. DT_EINVAL past the end. */
int dt_loader_seek(dt_loader *l, int64_t first);
/* Next batch of the current epoch: returns 1 and fills *b, 0 at the end of the
 * epoch, or a negative error. The batch stays valid until the next call. */
int dt_loader_next(dt_loader *l, dt_batch *b);
/* Batches per epoch with this configuration. */
int64_t dt_loader_batches(const dt_loader *l);

#endif /* DT_DATA_H */

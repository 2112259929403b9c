/*
 * data.h — datasets held in memory, their readers (IDX with optional gzip,
 * CSV, NumPy .npy), normalisation, per-epoch shuffling from (seed, epoch),
 * sharding, and a loader that prefetches batches on a background thread.
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

/* A dataset in memory: n samples of dim = c*h*w floats, labels in
 * [0, nclasses). */
typedef struct dt_dataset {
  int64_t n;
  int c, h, w;
  int64_t dim;
  int nclasses;
  float *x;    /* (n, dim), dt_alloc'd */
  int32_t *y;  /* (n), dt_alloc'd */
} dt_dataset;

/* Frees x and y and zeroes the struct. NULL is a no-op. */
void dt_dataset_free(dt_dataset *ds);

/* IDX images (magic 0x00000803, u8, n x rows x cols) + IDX labels (0x00000801,
 * u8): gzip-compressed or raw, detected by content. Pixels scaled to [0,1]. */
int dt_idx_load(dt_dataset *ds, const char *images_path, const char *labels_path);

/* CSV: one sample per line, the label in column label_col (0-based; -1 for
 * the last column), features in the others; an optional header line is
 * skipped when its first field is not a number. Shape is (1,1,dim) unless
 * the caller sets c,h,w afterwards. */
int dt_csv_load(dt_dataset *ds, const char *path, int label_col);

/* NumPy: features .npy (float32/float64/uint8, C order, shape (n, ...)) and
 * labels .npy (integer dtype, shape (n,)). uint8 features are scaled to
 * [0,1]. Shape (n,c,h,w) or (n,h,w) or (n,d) maps to c,h,w. */
int dt_npy_load(dt_dataset *ds, const char *x_path, const char *y_path);

/* Computes mean and std over all of ds->x (double accumulation). */
void dt_dataset_stats(const dt_dataset *ds, float *mean, float *std);
/* x = (x - mean) / std in place. */
void dt_dataset_normalize(dt_dataset *ds, float mean, float std);

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
/* Next batch of the current epoch: returns 1 and fills *b, 0 at the end of the
 * epoch, or a negative error. The batch stays valid until the next call. */
int dt_loader_next(dt_loader *l, dt_batch *b);
/* Batches per epoch with this configuration. */
int64_t dt_loader_batches(const dt_loader *l);

#endif /* DT_DATA_H */

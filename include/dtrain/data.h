/*
 * dtrain/data.h — datasets held in memory: read from IDX (MNIST family,
 * optionally gzip), CSV or NumPy .npy files, or made from the caller's own
 * arrays; their statistics and normalisation.
 *
 * A dataset is a plain struct the caller owns (usually on the stack): n
 * samples of dim = c*h*w floats in x, one integer label per sample in y.
 * Every reader validates what it reads and fails with DT_EIO (cannot read),
 * DT_ECORRUPT (bad contents) or DT_EINVAL, with a dt_errmsg() line naming
 * the file (and the line for CSV). No reader trusts a header's sizes: they
 * are checked against the file length and against limits before anything
 * is allocated. On failure the dataset is left empty (all zero), so
 * dt_dataset_free is always safe.
 */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dataset in memory: n samples of dim = c*h*w floats, labels in
 * [0, nclasses). Fill it only through the functions below; a zeroed struct
 * is an empty dataset. */
typedef struct dt_dataset {
  int64_t n;
  int c, h, w;
  int64_t dim;
  int nclasses;  /* largest label + 1 */
  float *x;      /* (n, dim), row-major */
  int32_t *y;    /* (n) */
  int borrowed;  /* x and y are the caller's (DT_DATA_BORROW): never freed or written */
} dt_dataset;

/* Frees x and y unless borrowed, and zeroes the struct. NULL is a no-op. */
DT_API void dt_dataset_free(dt_dataset *ds);

/* IDX images (magic 0x00000803, u8, n x rows x cols) + IDX labels
 * (0x00000801, u8), each gzip-compressed or raw, detected by content. Pixels
 * are scaled to [0,1]; shape (1, rows, cols). *ds is overwritten (free it
 * first if it held data) and owns its arrays. */
DT_API int dt_idx_load(dt_dataset *ds, const char *images_path, const char *labels_path);

/* CSV: one sample per line, the label in column label_col (0-based; -1 for
 * the last column), features in the others; an optional header line is
 * skipped when its first field is not a number. Shape (1, 1, dim); change it
 * with dt_dataset_reshape. *ds is overwritten and owns its arrays. */
DT_API int dt_csv_load(dt_dataset *ds, const char *path, int label_col);

/* NumPy: features .npy (float32/float64/uint8, C order, shape (n, ...)) and
 * labels .npy (integer dtype, shape (n,)). uint8 features are scaled to
 * [0,1]. Shape (n,c,h,w), (n,h,w) or (n,d) maps to (c,h,w). *ds is
 * overwritten and owns its arrays. */
DT_API int dt_npy_load(dt_dataset *ds, const char *x_path, const char *y_path);

/* How dt_dataset_from_memory treats the caller's arrays. */
enum dt_data_own {
  DT_DATA_COPY = 0,  /* copy them: the caller may free its arrays at once */
  DT_DATA_BORROW = 1 /* point at them: they must outlive the dataset; the
                      * dataset never writes or frees them (so it cannot be
                      * normalised in place) */
};

/* A dataset of n samples from caller memory: x holds n*c*h*w floats
 * (row-major, sample after sample), y holds n labels >= 0 (nclasses is the
 * largest + 1). own is DT_DATA_COPY or DT_DATA_BORROW. *ds is overwritten.
 * DT_EINVAL naming the argument if ds, x or y is NULL, n < 1, a dimension
 * is < 1 or the sizes overflow, a label is negative or above 2^24 (the
 * message names the sample), or own is unknown; *ds is then empty.
 * DT_ENOMEM when copying. */
DT_API int dt_dataset_from_memory(dt_dataset *ds, const float *x, const int32_t *y, int64_t n,
                                  int c, int h, int w, int own);

/* Gives the samples the shape (c,h,w), which must hold the same dim
 * (e.g. a CSV of 784 pixel columns as 1x28x28). DT_EINVAL if ds is NULL or
 * c*h*w differs from ds->dim (both are named). */
DT_API int dt_dataset_reshape(dt_dataset *ds, int c, int h, int w);

/* Mean and standard deviation over all of ds->x (double accumulation; the
 * population std). mean or std may be NULL. An empty dataset gives 0, 0.
 * DT_EINVAL if ds is NULL. */
DT_API int dt_dataset_stats(const dt_dataset *ds, float *mean, float *std);

/* x = (x - mean) / std in place (only centring if std is 0 or not finite),
 * as torchvision's Normalize does; normalise a test set with the training
 * set's statistics. DT_EINVAL if ds is NULL, borrows its arrays, or mean is
 * not finite. */
DT_API int dt_dataset_normalize(dt_dataset *ds, float mean, float std);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DATA_H */

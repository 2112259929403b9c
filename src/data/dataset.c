/*
 * dataset.c — what every dataset shares once it is in memory: making one
 * from caller arrays (copied or borrowed), reshaping, freeing, mean/std
 * statistics, normalisation, and the per-epoch sample order as a pure
 * function of (seed, epoch) via the counter-based RNG. It reads no files
 * and knows nothing about loaders or sharding.
 */
#include "data/data_int.h"

#include <math.h>
#include <string.h>

void dt_dataset_free(dt_dataset *ds) {
  if (!ds) return;
  if (!ds->borrowed) {
    dt_free(ds->x);
    dt_free(ds->y);
  }
  memset(ds, 0, sizeof *ds);
}

/* Labels above this are refused: nclasses sizes a model's output layer. */
#define MAX_LABEL (1 << 24)

int dt_dataset_from_memory(dt_dataset *ds, const float *x, const int32_t *y, int64_t n, int c,
                           int h, int w, int own) {
  if (!ds) return dt__seterr(DT_EINVAL, "dataset from memory: ds is NULL");
  memset(ds, 0, sizeof *ds);
  if (!x) return dt__seterr(DT_EINVAL, "dataset from memory: x is NULL");
  if (!y) return dt__seterr(DT_EINVAL, "dataset from memory: y is NULL");
  if (n < 1) return dt__seterr(DT_EINVAL, "dataset from memory: n %lld must be >= 1", (long long)n);
  if (c < 1 || h < 1 || w < 1)
    return dt__seterr(DT_EINVAL, "dataset from memory: shape %dx%dx%d must be positive", c, h, w);
  if (own != DT_DATA_COPY && own != DT_DATA_BORROW)
    return dt__seterr(DT_EINVAL, "dataset from memory: own %d is neither DT_DATA_COPY nor "
                      "DT_DATA_BORROW", own);
  uint64_t dim = (uint64_t)c * (uint64_t)h * (uint64_t)w;
  if (dim > ((uint64_t)1 << 31) || (uint64_t)n > (SIZE_MAX / sizeof(float)) / dim)
    return dt__seterr(DT_EINVAL, "dataset from memory: %lld samples of %dx%dx%d is too large",
                      (long long)n, c, h, w);
  int32_t maxl = 0;
  for (int64_t i = 0; i < n; i++) {
    if (y[i] < 0 || y[i] > MAX_LABEL)
      return dt__seterr(DT_EINVAL, "dataset from memory: y[%lld] = %d is not a label in [0, %d]",
                        (long long)i, (int)y[i], MAX_LABEL);
    if (y[i] > maxl) maxl = y[i];
  }
  dt_dataset d = {.n = n, .c = c, .h = h, .w = w, .dim = (int64_t)dim, .nclasses = maxl + 1};
  size_t xb = (size_t)n * (size_t)dim * sizeof(float), yb = (size_t)n * sizeof(int32_t);
  if (own == DT_DATA_BORROW) {
    d.x = (float *)x; /* never written: normalize refuses borrowed data */
    d.y = (int32_t *)y;
    d.borrowed = 1;
  } else {
    d.x = dt__data_alloc(xb);
    d.y = dt_alloc(yb);
    if (!d.x || !d.y) {
      dt_free(d.x);
      dt_free(d.y);
      return dt__seterr(DT_ENOMEM, "dataset from memory: out of memory for %lld samples",
                        (long long)n);
    }
    memcpy(d.x, x, xb);
    memcpy(d.y, y, yb);
  }
  *ds = d;
  return DT_OK;
}

int dt_dataset_reshape(dt_dataset *ds, int c, int h, int w) {
  if (!ds) return dt__seterr(DT_EINVAL, "dataset reshape: ds is NULL");
  if (c < 1 || h < 1 || w < 1 || (int64_t)c * h * w != ds->dim)
    return dt__seterr(DT_EINVAL, "dataset reshape: shape %dx%dx%d does not hold the %lld features "
                      "of a sample", c, h, w, (long long)ds->dim);
  ds->c = c, ds->h = h, ds->w = w;
  return DT_OK;
}

int dt_dataset_stats(const dt_dataset *ds, float *mean, float *std) {
  if (!ds) return dt__seterr(DT_EINVAL, "dataset stats: ds is NULL");
  size_t nel = ds->x ? (size_t)ds->n * (size_t)ds->dim : 0;
  if (nel == 0) {
    if (mean) *mean = 0.f;
    if (std) *std = 0.f;
    return DT_OK;
  }
  /* Two passes (mean, then squared deviations) in double, blocked so the
   * inner loops stay in float and vectorise without losing precision. */
  const float *restrict x = ds->x;
  double sum = 0;
  for (size_t i = 0; i < nel; i += 4096) {
    size_t e = i + 4096 < nel ? i + 4096 : nel;
    float s = 0;
    for (size_t j = i; j < e; j++) s += x[j];
    sum += s;
  }
  double m = sum / (double)nel;
  float mf = (float)m;
  double sq = 0;
  for (size_t i = 0; i < nel; i += 4096) {
    size_t e = i + 4096 < nel ? i + 4096 : nel;
    double s = 0;
    for (size_t j = i; j < e; j++) {
      double d = (double)x[j] - m;
      s += d * d;
    }
    sq += s;
  }
  if (mean) *mean = mf;
  if (std) *std = (float)sqrt(sq / (double)nel);
  return DT_OK;
}

int dt_dataset_normalize(dt_dataset *ds, float mean, float std) {
  if (!ds) return dt__seterr(DT_EINVAL, "dataset normalize: ds is NULL");
  if (ds->borrowed)
    return dt__seterr(DT_EINVAL, "dataset normalize: ds borrows the caller's arrays "
                      "(DT_DATA_BORROW); normalise a copy");
  if (!isfinite(mean))
    return dt__seterr(DT_EINVAL, "dataset normalize: mean %g is not finite", (double)mean);
  if (!ds->x) return DT_OK;
  size_t nel = (size_t)ds->n * (size_t)ds->dim;
  /* A constant dataset has std 0: only centre it rather than divide by 0. */
  float d = (std > 0.f && isfinite(std)) ? std : 1.0f;
  float *restrict x = ds->x;
  /* Division, as torchvision's Normalize does, so inputs match bit for bit. */
  for (size_t i = 0; i < nel; i++) x[i] = (x[i] - mean) / d;
  return DT_OK;
}

void dt_epoch_order(int64_t *order, int64_t n, uint64_t seed, uint64_t epoch, int shuffle) {
  if (n <= 0) return;
  if (shuffle) {
    dt_rng_permutation(order, n, seed, DT_RNG_SHUFFLE, epoch);
  } else {
    for (int64_t i = 0; i < n; i++) order[i] = i;
  }
}

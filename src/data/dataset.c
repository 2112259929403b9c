/*
 * dataset.c — what every dataset shares once it is in memory: freeing,
 * mean/std statistics, normalisation, and the per-epoch sample order as a
 * pure function of (seed, epoch) via the counter-based RNG. It reads no
 * files and knows nothing about loaders or sharding.
 */
#include "data/data_int.h"

#include <math.h>
#include <string.h>

void dt_dataset_free(dt_dataset *ds) {
  if (!ds) return;
  dt_free(ds->x);
  dt_free(ds->y);
  memset(ds, 0, sizeof *ds);
}

void dt_dataset_stats(const dt_dataset *ds, float *mean, float *std) {
  size_t nel = ds && ds->x ? (size_t)ds->n * (size_t)ds->dim : 0;
  if (nel == 0) {
    if (mean) *mean = 0.f;
    if (std) *std = 0.f;
    return;
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
}

void dt_dataset_normalize(dt_dataset *ds, float mean, float std) {
  if (!ds || !ds->x) return;
  size_t nel = (size_t)ds->n * (size_t)ds->dim;
  /* A constant dataset has std 0: only centre it rather than divide by 0. */
  float d = (std > 0.f && isfinite(std)) ? std : 1.0f;
  float *restrict x = ds->x;
  /* Division, as torchvision's Normalize does, so inputs match bit for bit. */
  for (size_t i = 0; i < nel; i++) x[i] = (x[i] - mean) / d;
}

void dt_epoch_order(int64_t *order, int64_t n, uint64_t seed, uint64_t epoch, int shuffle) {
  if (n <= 0) return;
  if (shuffle) {
    dt_rng_permutation(order, n, seed, DT_RNG_SHUFFLE, epoch);
  } else {
    for (int64_t i = 0; i < n; i++) order[i] = i;
  }
}

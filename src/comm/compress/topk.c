/*
 * topk.c — DGC-style top-k sparsification of one bucket: the threshold is
 * estimated from a strided sample (offset drawn from the counter-based RNG)
 * instead of a sort of the whole bucket, one pass collects the candidates
 * above it, and an exact selection among those few keeps exactly k (so
 * every rank's frame has the same size and can be allgathered). If the
 * sample guessed too high (fewer than k candidates) the selection runs over
 * the whole bucket instead. Indices go out sorted, which lets the decoder
 * reject a malformed frame (index out of range or out of order) with one
 * check per entry.
 *
 * Not here: momentum correction, clipping and warm-up (reduce.c: they
 * shape the input and the density, not the selection).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/compress/compress_int.h"
#include "core/core.h"

size_t dt__cz_topk_k(size_t n, double density) {
  double k = ceil(density * (double)n);
  if (k < 1) k = 1;
  if (k > (double)n) k = (double)n;
  return (size_t)k;
}

/* Moves the k entries of idx[0..m) with the largest |x[idx]| to the front
 * (quickselect, median-of-three pivots; deterministic). */
static void select_top(uint32_t *idx, size_t m, size_t k, const float *x) {
  size_t lo = 0, hi = m; /* the k-th largest lies in [lo, hi) */
  while (hi - lo > 1 && k > lo && k < hi) {
    size_t mid = lo + (hi - lo) / 2;
    float a = fabsf(x[idx[lo]]), b = fabsf(x[idx[mid]]), c = fabsf(x[idx[hi - 1]]);
    float piv = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
    /* three-way partition: > piv | == piv | < piv */
    size_t i = lo, lt = lo, gt = hi;
    while (i < gt) {
      float v = fabsf(x[idx[i]]);
      if (v > piv) {
        uint32_t t = idx[i]; idx[i] = idx[lt]; idx[lt] = t;
        lt++, i++;
      } else if (v < piv) {
        gt--;
        uint32_t t = idx[i]; idx[i] = idx[gt]; idx[gt] = t;
      } else {
        i++;
      }
    }
    if (k <= lt) hi = lt;
    else if (k >= gt) lo = gt;
    else return; /* the k-th falls among the pivot's equals */
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* The threshold: the ks-th largest |x| of a strided sample of s values. */
static float sample_threshold(const float *x, size_t n, size_t k, dt_cz_rng rng, float *tmp,
                              size_t s) {
  uint32_t r[4];
  dt_rng4(rng.seed, DT_RNG_USER + 7, rng.step, rng.stream, r);
  size_t stride = n / s, start = r[0] % stride;
  for (size_t i = 0; i < s; i++) tmp[i] = fabsf(x[start + i * stride]);
  /* aim a quarter above k so the exact pass rarely has to fall back */
  size_t ks = (size_t)ceil((double)k * 1.25 * (double)s / (double)n);
  if (ks < 1) ks = 1;
  if (ks > s) ks = s;
  /* quickselect on plain floats for the ks-th largest */
  size_t lo = 0, hi = s;
  size_t want = ks - 1;
  while (hi - lo > 1) {
    float piv = tmp[lo + (hi - lo) / 2];
    size_t i = lo, lt = lo, gt = hi;
    while (i < gt) {
      if (tmp[i] > piv) { float t = tmp[i]; tmp[i] = tmp[lt]; tmp[lt] = t; lt++, i++; }
      else if (tmp[i] < piv) { gt--; float t = tmp[i]; tmp[i] = tmp[gt]; tmp[gt] = t; }
      else i++;
    }
    if (want < lt) hi = lt;
    else if (want >= gt) lo = gt;
    else return piv;
  }
  return tmp[lo];
}

int dt__cz_topk_encode(const float *x, size_t n, size_t k, dt_cz_rng rng, void *frame, float *resid,
                       int flags) {
  if (k < 1 || k > n) return dt__seterr(DT_EINVAL, "topk: k = %zu for a bucket of %zu", k, n);
  uint8_t *p = (uint8_t *)frame + DT_CZ_HDR_LEN;
  uint32_t *oidx = (uint32_t *)p;
  float *oval = (float *)(p + 4 * k);
  size_t cap = n;
  uint32_t *idx = malloc(cap * sizeof *idx);
  if (!idx) return dt__seterr(DT_ENOMEM, "topk: out of memory for %zu indices", cap);
  size_t m = 0;
  /* Small buckets, or a density above 1/8: exact selection over all. */
  int sampled = n >= 8192 && k * 8 <= n;
  if (sampled && !flags) {
    size_t s = n / 16 < 4096 ? 4096 : n / 16;
    if (s > n) s = n;
    float *tmp = malloc(s * sizeof *tmp);
    if (!tmp) {
      free(idx);
      return dt__seterr(DT_ENOMEM, "topk: out of memory");
    }
    float t = sample_threshold(x, n, k, rng, tmp, s);
    free(tmp);
    if (t > 0) {
      for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) >= t) idx[m++] = (uint32_t)i;
    }
  }
  if (m < k) {
    m = n;
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
  }
  if (m > k) select_top(idx, m, k, x);
  qsort(idx, k, sizeof *idx, cmp_u32);
  for (size_t j = 0; j < k; j++) {
    oidx[j] = idx[j];
    oval[j] = x[idx[j]];
  }
  free(idx);
  dt__cz_put_hdr(frame, DT_CODEC_TOPK, 0, flags, n, k, 1.0f);
  if (resid) {
    if (resid != x) memcpy(resid, x, n * sizeof *x);
    for (size_t j = 0; j < k; j++) resid[oidx[j]] = 0;
  }
  return DT_OK;
}

int dt__cz_topk_decode_add(const dt_cz_hdr *h, const uint8_t *payload, float *out) {
  size_t k = h->k, n = h->n;
  /* check every index before touching out */
  uint32_t prev = 0;
  for (size_t j = 0; j < k; j++) {
    uint32_t i;
    memcpy(&i, payload + 4 * j, 4);
    if (i >= n)
      return dt__seterr(DT_ECORRUPT, "compressed frame: topk entry %zu has index %u, beyond the "
                        "bucket of %zu values", j, i, n);
    if (j && i <= prev)
      return dt__seterr(DT_ECORRUPT, "compressed frame: topk entry %zu has index %u after %u "
                        "(indices must increase)", j, i, prev);
    prev = i;
  }
  const uint8_t *vals = payload + 4 * k;
  for (size_t j = 0; j < k; j++) {
    uint32_t i;
    float v;
    memcpy(&i, payload + 4 * j, 4);
    memcpy(&v, vals + 4 * j, 4);
    out[i] += v;
  }
  return DT_OK;
}

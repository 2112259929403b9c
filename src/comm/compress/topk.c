/*
 * topk.c — DGC-style top-k sparsification of one bucket: the threshold is
 * estimated from a strided sample (offset drawn from the counter-based RNG)
 * instead of a sort of the whole bucket, one pass collects the candidates
 * above it, and an exact selection among those few keeps exactly k (so
 * every rank's frame has the same size and can be allgathered). If the
 * sample guessed too high (fewer than k candidates) the selection runs over
 * the whole bucket instead. Indices go out sorted, which lets the decoder
 * reject a malformed frame (index out of range or out of order) with one
 * check per entry; they come out in order without a sort (emit: a pass
 * over the candidates, which are collected in index order).
 *
 * Not here: momentum correction, clipping and warm-up (reduce.c: they
 * shape the input and the density, not the selection).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/compress/compress_int.h"
#include "core/core.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

/* The (want+1)-th largest of v[0..m) (want < m), for finite v >= 0; v is
 * overwritten. A radix step first: the bits of a non-negative float grow
 * with its value, so a histogram of the top 12 bits (exponent and 4
 * mantissa bits: bins 1/16 of an octave wide) names the bin that holds the
 * answer in one branch-free pass; a quickselect then runs over that bin's
 * few values only. The same value as a quickselect over all of v (the
 * k-th largest is one value), at a fraction of its mispredicted branches
 * (that quickselect was 85% of the encoder's time on the MLP's buckets). */
#define KTH_BINS 4096
static float kth_largest(float *v, size_t m, size_t want) {
  uint32_t hist[KTH_BINS];
  memset(hist, 0, sizeof hist);
  for (size_t i = 0; i < m; i++) {
    uint32_t b;
    memcpy(&b, &v[i], 4);
    hist[b >> 19]++;
  }
  size_t above = 0;
  uint32_t bin = KTH_BINS - 1;
  for (;; bin--) {
    if (above + hist[bin] > want || bin == 0) break;
    above += hist[bin];
  }
  size_t c = 0;
  for (size_t i = 0; i < m; i++) {
    uint32_t b;
    memcpy(&b, &v[i], 4);
    v[c] = v[i];
    c += (b >> 19) == bin;
  }
  want -= above; /* want < c */
  size_t lo = 0, hi = c;
  while (hi - lo > 1) {
    float piv = v[lo + (hi - lo) / 2];
    size_t i = lo, lt = lo, gt = hi;
    while (i < gt) {
      if (v[i] > piv) { float t = v[i]; v[i] = v[lt]; v[lt] = t; lt++, i++; }
      else if (v[i] < piv) { gt--; float t = v[i]; v[i] = v[gt]; v[gt] = t; }
      else i++;
    }
    if (want < lt) hi = lt;
    else if (want >= gt) lo = gt;
    else return piv;
  }
  return v[lo];
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
  return kth_largest(tmp, s, ks - 1);
}

/* Appends to idx the indices i in [0, n) with |x[i]| >= t, in increasing
 * order, and returns how many; stops (returning cap + 1) once more than cap
 * qualify. AVX-512: 16 compares and one compress-store per step; the
 * portable loop is branch-free. Both give the same list. */
static size_t collect(const float *x, size_t n, float t, uint32_t *idx, size_t cap) {
  size_t m = 0, i = 0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    __mmask16 k = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ);
    if (k) {
      if (m + 16 > cap + 1) break; /* finish this block in the scalar loop */
      _mm512_mask_compressstoreu_epi32(idx + m, k, vi);
      m += (size_t)__builtin_popcount(k);
    }
    vi = _mm512_add_epi32(vi, step);
  }
#endif
  for (; i < n; i++) {
    if (m > cap) return cap + 1;
    idx[m] = (uint32_t)i;
    m += fabsf(x[i]) >= t;
  }
  return m > cap ? cap + 1 : m;
}

/* Writes the k largest-|x| entries of the candidates cand[0..m) (increasing
 * indices) into the frame, in index order, without a sort: find the k-th
 * largest magnitude vk (kth_largest on a copy of the magnitudes when all
 * are finite, a quickselect of the indices otherwise), then one pass over
 * the candidates takes those above vk and the first of those equal to it.
 * sel: room for m words. */
static void emit(const float *x, const uint32_t *cand, size_t m, size_t k, uint32_t *sel,
                 int finite, uint32_t *oidx, float *oval) {
  size_t taken = 0;
  if (m > k) {
    float vk;
    size_t above = 0;
    if (finite) {
      float *mag = (float *)sel;
      for (size_t j = 0; j < m; j++) mag[j] = fabsf(x[cand[j]]);
      vk = kth_largest(mag, m, k - 1);
      for (size_t j = 0; j < m; j++) above += fabsf(x[cand[j]]) > vk;
    } else {
      memcpy(sel, cand, m * sizeof *sel);
      select_top(sel, m, k, x);
      vk = fabsf(x[sel[0]]);
      for (size_t j = 0; j < k; j++) {
        float v = fabsf(x[sel[j]]);
        if (v < vk) vk = v;
      }
      for (size_t j = 0; j < k; j++) above += fabsf(x[sel[j]]) > vk;
    }
    size_t eq_left = k - above;
    for (size_t j = 0; j < m && taken < k; j++) {
      uint32_t i = cand[j];
      float v = fabsf(x[i]);
      if (v > vk || (v == vk && eq_left && eq_left--)) {
        oidx[taken] = i;
        oval[taken++] = x[i];
      }
    }
  } else {
    for (size_t j = 0; j < m; j++) {
      oidx[j] = cand[j];
      oval[j] = x[cand[j]];
    }
  }
}

int dt__cz_topk_encode(const float *x, size_t n, size_t k, dt_cz_rng rng, void *frame, float *resid,
                       int flags) {
  if (k < 1 || k > n) return dt__seterr(DT_EINVAL, "topk: k = %zu for a bucket of %zu", k, n);
  uint8_t *p = (uint8_t *)frame + DT_CZ_HDR_LEN;
  uint32_t *oidx = (uint32_t *)p;
  float *oval = (float *)(p + 4 * k);
  size_t m = 0;
  uint32_t *idx = NULL;
  /* Small buckets, or a density above 1/8: exact selection over all. */
  int sampled = n >= 8192 && k * 8 <= n;
  if (sampled && !flags) {
    size_t s = n / 16 < 4096 ? 4096 : n / 16;
    if (s > n) s = n;
    /* the sample aims 1.25 k candidates; room for 4 k before falling back.
     * One allocation: sample, then candidates and their copy. */
    size_t cap = 4 * k + 64;
    size_t words = s > 2 * (cap + 1) ? s : 2 * (cap + 1);
    float *tmp = malloc(words * sizeof *tmp);
    if (!tmp) return dt__seterr(DT_ENOMEM, "topk: out of memory");
    float t = sample_threshold(x, n, k, rng, tmp, s);
    idx = (uint32_t *)tmp;
    if (t > 0) m = collect(x, n, t, idx, cap);
    if (m > cap) {
      /* the sample guessed low: the same threshold with room for all */
      uint32_t *big = realloc(idx, 2 * (n + 1) * sizeof *big);
      if (!big) {
        free(idx);
        return dt__seterr(DT_ENOMEM, "topk: out of memory for %zu indices", n);
      }
      idx = big;
      cap = n;
      m = collect(x, n, t, idx, cap);
    }
    if (m >= k) {
      emit(x, idx, m, k, idx + cap + 1, 1, oidx, oval);
    } else { /* guessed high: fewer than k above it */
      free(idx);
      idx = NULL;
      m = 0;
    }
  }
  if (!idx) { /* exact over the whole bucket */
    uint32_t *all = malloc(2 * n * sizeof *all);
    if (!all) return dt__seterr(DT_ENOMEM, "topk: out of memory for %zu indices", n);
    for (size_t i = 0; i < n; i++) all[i] = (uint32_t)i;
    emit(x, all, n, k, all + n, !(flags & DT_CZ_FLAG_NONFINITE), oidx, oval);
    idx = all;
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

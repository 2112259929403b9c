/*
 * fixsum.c — float <-> fixed-point int64 conversion for exact sums.
 *
 * Rounding is rint (nearest, ties to even, in the default rounding mode),
 * which compilers turn into a vector round instruction, so the loop
 * vectorises (measured ~15% faster than the 1.5 * 2^52 add-subtract trick;
 * ~0.2 ns per value here). The product x * w * 2^32 is exact in double
 * (24-bit float mantissa times a weight of at most 2^16 times a power of
 * two), so the only rounding is the one to an integer, and a fused
 * multiply-add the compiler may form gives the same bits. Values past the
 * bound (or NaN) are replaced by 0 before the conversion to int64, which
 * is therefore always in range. The bound check is a mask inside the same
 * loop; the index of the first bad value is looked up only when there is
 * one.
 */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/core.h"
#include "parallel/fixsum.h"
#include "tensor/tensor.h"

double dt_fix_bound(int64_t terms) {
  return ldexp(1.0, 62) / (double)(terms > 1 ? terms : 1);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
static size_t add_slots_avx2(int64_t *restrict acc, const float *const *xs, const double *ws,
                             int k, size_t n, double bound, int store);
static int avx2_ok(void);
static int avx512_ok(void);
#endif

size_t dt_fix_add(int64_t *restrict acc, const float *restrict x, size_t n, double w,
                  double bound, int store, size_t *first_bad) {
  const double s = w * ldexp(1.0, DT_FIX_BITS);
  size_t bad = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  /* without AVX-512 the loop below converts one value at a time (AVX2 has
   * no double -> int64 conversion): the AVX2 form, the same bits */
  if (n >= 16 && !avx512_ok() && avx2_ok()) {
    const float *xp = x;
    bad = add_slots_avx2(acc, &xp, &w, 1, n, bound, store);
    goto first;
  }
#endif
  if (store) {
    for (size_t i = 0; i < n; i++) {
      double y = (double)x[i] * s;
      int ok = fabs(y) <= bound; /* false for NaN */
      bad += !ok;
      acc[i] = (int64_t)(ok ? rint(y) : 0.0); /* never converts NaN or a huge y */
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      double y = (double)x[i] * s;
      int ok = fabs(y) <= bound;
      bad += !ok;
      acc[i] += (int64_t)(ok ? rint(y) : 0.0);
    }
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
first:
#endif
  if (bad && first_bad) {
    for (size_t i = 0; i < n; i++)
      if (!(fabs((double)x[i] * s) <= bound)) {
        *first_bad = i;
        break;
      }
  }
  return bad;
}

/* The portable form: dt_fix_add slot by slot over chunks that stay in L1. */
static size_t add_slots_c(int64_t *restrict acc, const float *const *xs, const double *ws, int k,
                          size_t n, double bound, int store, size_t *first_bad, float *bad_value) {
  enum { CH = 1024 };
  size_t bad = 0;
  for (size_t c = 0; c < n; c += CH) {
    size_t len = n - c < CH ? n - c : CH;
    for (int j = 0; j < k; j++) {
      size_t fb = 0;
      size_t b = dt_fix_add(acc + c, xs[j] + c, len, ws[j], bound, store && j == 0, &fb);
      if (b && !bad) {
        if (first_bad) *first_bad = c + fb;
        if (bad_value) *bad_value = xs[j][c + fb];
      }
      bad += b;
    }
  }
  return bad;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512vl")))

/* 16 values at a time, every slot added to two int64 registers, the sums
 * loaded and stored once. A slot whose scale w * 2^32 is a power of two
 * (micro-shards of a power-of-two size, or dist.reduce = sum) is scaled in
 * float — exact: a float times a power of two is a float, barring overflow
 * to inf, which the bound rejects as it would the double — compared with
 * the largest float not above the bound (the same verdict for a float) and
 * converted to int64 in one instruction; the others go through double as
 * dt_fix_add does. Both round in the current mode (nearest, ties to even,
 * like rint), so every term has dt_fix_add's bits. */
AVX512 static size_t add_slots_avx512(int64_t *restrict acc, const float *const *xs,
                                      const double *ws, int k, size_t n, double bound, int store) {
  float sf[64], boundf = (float)bound;
  double sd[64];
  int pow2[64];
  if ((double)boundf > bound) boundf = nextafterf(boundf, 0.0f);
  for (int j = 0; j < k; j++) {
    int e;
    sd[j] = ws[j] * ldexp(1.0, DT_FIX_BITS);
    pow2[j] = frexp(sd[j], &e) == 0.5 && sd[j] < 0x1p100;
    sf[j] = (float)sd[j];
  }
  const __m512 absf = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512d absd = _mm512_castsi512_pd(_mm512_set1_epi64(0x7fffffffffffffffLL));
  const __m512 vbf = _mm512_set1_ps(boundf);
  const __m512d vbd = _mm512_set1_pd(bound);
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 16) {
    size_t left = n - i;
    __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    __mmask8 mlo = (__mmask8)m, mhi = (__mmask8)(m >> 8);
    __m512i lo = store ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi64(mlo, acc + i);
    __m512i hi = store ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi64(mhi, acc + i + 8);
    for (int j = 0; j < k; j++) {
      __m512 x = _mm512_maskz_loadu_ps(m, xs[j] + i);
      if (pow2[j]) {
        __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(sf[j]));
        __mmask16 ok = _mm512_cmp_ps_mask(_mm512_and_ps(y, absf), vbf, _CMP_LE_OQ);
        bad += (size_t)__builtin_popcount((unsigned)(m & ~ok));
        lo = _mm512_add_epi64(lo, _mm512_maskz_cvtps_epi64((__mmask8)ok, _mm512_castps512_ps256(y)));
        hi = _mm512_add_epi64(
            hi, _mm512_maskz_cvtps_epi64((__mmask8)(ok >> 8),
                                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))));
      } else {
        __m512d s = _mm512_set1_pd(sd[j]);
        __m512d ylo = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), s);
        __m512d yhi = _mm512_mul_pd(
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))), s);
        __mmask8 oklo = _mm512_cmp_pd_mask(_mm512_and_pd(ylo, absd), vbd, _CMP_LE_OQ);
        __mmask8 okhi = _mm512_cmp_pd_mask(_mm512_and_pd(yhi, absd), vbd, _CMP_LE_OQ);
        bad += (size_t)__builtin_popcount((unsigned)(mlo & ~oklo)) +
               (size_t)__builtin_popcount((unsigned)(mhi & ~okhi));
        lo = _mm512_add_epi64(lo, _mm512_maskz_cvtpd_epi64(oklo, ylo));
        hi = _mm512_add_epi64(hi, _mm512_maskz_cvtpd_epi64(okhi, yhi));
      }
    }
    _mm512_mask_storeu_epi64(acc + i, mlo, lo);
    _mm512_mask_storeu_epi64(acc + i + 8, mhi, hi);
  }
  return bad;
}

static int avx512_ok(void) {
  static _Atomic int ok = -1; /* resolved once (every thread finds the same) */
  int v = atomic_load_explicit(&ok, memory_order_relaxed);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl");
    atomic_store_explicit(&ok, v, memory_order_relaxed);
  }
  return v;
}

/* The scales of k segments: w * 2^32 in double and in float, and whether it
 * is a power of two (then the float path of add_slots_avx512 is exact). */
static void seg_scales(const dt_fix_wseg *sg, int k, double *sd, float *sf, int *pow2) {
  for (int j = 0; j < k; j++) {
    int e;
    sd[j] = sg[j].w * ldexp(1.0, DT_FIX_BITS);
    pow2[j] = frexp(sd[j], &e) == 0.5 && sd[j] < 0x1p100;
    sf[j] = (float)sd[j];
  }
}

/* Rows o0 .. o0 + R - 1 (R <= 8) of the weight gradient, columns c .. c +
 * 15 (mask m), every segment: per segment a chain of FMAs over its rows
 * (the GEMM micro-kernel's order: broadcast dy, times the row of x, into
 * the accumulator; R independent chains keep both FMA ports busy), then
 * each lane's term as add_slots_avx512 makes it, added to the sums in
 * place (they stay in L1 across the segments). Returns the lanes out of
 * range as a mask (any segment); the caller counts them exactly. */
AVX512 static inline __attribute__((always_inline)) unsigned wgrad_tile(
    int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC, int C, int o0, const int R,
    int c, __mmask16 m, const double *sd, const float *sf, const int *pow2, double bound,
    float boundf, int store) {
  const __m512 absf = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512d absd = _mm512_castsi512_pd(_mm512_set1_epi64(0x7fffffffffffffffLL));
  const __m512 vbf = _mm512_set1_ps(boundf);
  const __m512d vbd = _mm512_set1_pd(bound);
  __mmask8 mlo = (__mmask8)m, mhi = (__mmask8)(m >> 8);
  unsigned badm = 0;
  for (int j = 0; j < k; j++) {
    __m512 f[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    const float *x = sg[j].x + c, *dy = sg[j].dy + o0;
    for (int q = 0; q < sg[j].n; q++) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)q * C);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        f[r] = _mm512_fmadd_ps(_mm512_set1_ps(dy[(size_t)q * OC + r]), xv, f[r]);
    }
    const int st = store && j == 0;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      int64_t *a = acc + (size_t)(o0 + r) * C + c;
      __m512i lo, hi;
      if (pow2[j]) {
        __m512 y = _mm512_mul_ps(f[r], _mm512_set1_ps(sf[j]));
        __mmask16 ok = _mm512_cmp_ps_mask(_mm512_and_ps(y, absf), vbf, _CMP_LE_OQ);
        badm |= (unsigned)(m & ~ok);
        lo = _mm512_maskz_cvtps_epi64((__mmask8)ok, _mm512_castps512_ps256(y));
        hi = _mm512_maskz_cvtps_epi64((__mmask8)(ok >> 8),
                                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
      } else {
        __m512d s = _mm512_set1_pd(sd[j]);
        __m512d ylo = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f[r])), s);
        __m512d yhi = _mm512_mul_pd(
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f[r]), 1))), s);
        __mmask8 oklo = _mm512_cmp_pd_mask(_mm512_and_pd(ylo, absd), vbd, _CMP_LE_OQ);
        __mmask8 okhi = _mm512_cmp_pd_mask(_mm512_and_pd(yhi, absd), vbd, _CMP_LE_OQ);
        badm |= (unsigned)(mlo & ~oklo) | ((unsigned)(mhi & ~okhi) << 8);
        lo = _mm512_maskz_cvtpd_epi64(oklo, ylo);
        hi = _mm512_maskz_cvtpd_epi64(okhi, yhi);
      }
      if (!st) {
        lo = _mm512_add_epi64(lo, _mm512_maskz_loadu_epi64(mlo, a));
        hi = _mm512_add_epi64(hi, _mm512_maskz_loadu_epi64(mhi, a + 8));
      }
      _mm512_mask_storeu_epi64(a, mlo, lo);
      _mm512_mask_storeu_epi64(a + 8, mhi, hi);
    }
  }
  return badm;
}

/* The 8-row tiles below (wgrad_tile8_p2 and its fast variant): the tile's
 * int64 sums into registers (zeros when the tile is stored afresh), and
 * one segment's float products of rows o0..o0+7 and columns c..c+15. */
AVX512 static inline __attribute__((always_inline)) void tile8_load(
    __m512i lo[8], __m512i hi[8], const int64_t *restrict acc, int C, int o0, int c,
    __mmask8 mlo, __mmask8 mhi, int store) {
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++) {
    const int64_t *a = acc + (size_t)(o0 + r) * C + c;
    lo[r] = store ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi64(mlo, a);
    hi[r] = store ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi64(mhi, a + 8);
  }
}

AVX512 static inline __attribute__((always_inline)) void tile8_products(
    __m512 f[8], const dt_fix_wseg *sg, int OC, int C, int o0, int c, __mmask16 m) {
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++) f[r] = _mm512_setzero_ps();
  const float *x = sg->x + c, *dy = sg->dy + o0;
  for (int q = 0; q < sg->n; q++) {
    __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)q * C);
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
      f[r] = _mm512_fmadd_ps(_mm512_set1_ps(dy[(size_t)q * OC + r]), xv, f[r]);
  }
}

/* wgrad_tile for 8 rows when every segment's scale is a power of two (the
 * float path): the int64 sums of the tile stay in registers across the
 * segments (16 of them) and are loaded and stored once, not once per
 * segment. Integer addition in another order: the same sums. */
AVX512 static inline __attribute__((always_inline)) unsigned wgrad_tile8_p2(
    int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC, int C, int o0, int c,
    __mmask16 m, const float *sf, float boundf, int store) {
  const __m512 absf = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 vbf = _mm512_set1_ps(boundf);
  __mmask8 mlo = (__mmask8)m, mhi = (__mmask8)(m >> 8);
  __m512i lo[8], hi[8];
  tile8_load(lo, hi, acc, C, o0, c, mlo, mhi, store);
  __mmask16 okall = m;
  for (int j = 0; j < k; j++) {
    __m512 f[8];
    tile8_products(f, &sg[j], OC, C, o0, c, m);
    const __m512 s = _mm512_set1_ps(sf[j]);
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
      __m512 y = _mm512_mul_ps(f[r], s);
      __mmask16 ok = _mm512_cmp_ps_mask(_mm512_and_ps(y, absf), vbf, _CMP_LE_OQ);
      okall &= ok;
      lo[r] = _mm512_add_epi64(lo[r], _mm512_maskz_cvtps_epi64((__mmask8)ok, _mm512_castps512_ps256(y)));
      hi[r] = _mm512_add_epi64(
          hi[r], _mm512_maskz_cvtps_epi64((__mmask8)(ok >> 8),
                                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++) {
    int64_t *a = acc + (size_t)(o0 + r) * C + c;
    _mm512_mask_storeu_epi64(a, mlo, lo[r]);
    _mm512_mask_storeu_epi64(a + 8, mhi, hi[r]);
  }
  return (unsigned)(m & ~okall);
}

/* wgrad_tile8_p2 when no term of the tile leaves the range (nearly
 * always): the range check is an integer max over the bits of |y| (for
 * non-negative floats the bits order like the values, and NaN's lie above
 * infinity's), checked once for the tile instead of a compare, a mask
 * merge and masked conversions per row. Returns 0 without storing
 * anything when some lane is out of range (or not finite): the caller then
 * runs wgrad_tile8_p2 on the same tile, which counts and zeroes those
 * lanes. Otherwise the same sums, stored. */
AVX512 static inline __attribute__((always_inline)) int wgrad_tile8_p2_fast(
    int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC, int C, int o0, int c,
    __mmask16 m, const float *sf, float boundf, int store) {
  const __m512i absi = _mm512_set1_epi32(0x7fffffff);
  uint32_t bb;
  memcpy(&bb, &boundf, sizeof bb);
  __mmask8 mlo = (__mmask8)m, mhi = (__mmask8)(m >> 8);
  __m512i lo[8], hi[8], mx = _mm512_setzero_si512();
  tile8_load(lo, hi, acc, C, o0, c, mlo, mhi, store);
  for (int j = 0; j < k; j++) {
    __m512 f[8];
    tile8_products(f, &sg[j], OC, C, o0, c, m);
    const __m512 s = _mm512_set1_ps(sf[j]);
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
      __m512 y = _mm512_mul_ps(f[r], s);
      mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_castps_si512(y), absi));
      lo[r] = _mm512_add_epi64(lo[r], _mm512_cvtps_epi64(_mm512_castps512_ps256(y)));
      hi[r] = _mm512_add_epi64(
          hi[r], _mm512_cvtps_epi64(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))));
    }
  }
  if (_mm512_cmpgt_epu32_mask(mx, _mm512_set1_epi32((int)bb))) return 0;
#pragma GCC unroll 8
  for (int r = 0; r < 8; r++) {
    int64_t *a = acc + (size_t)(o0 + r) * C + c;
    _mm512_mask_storeu_epi64(a, mlo, lo[r]);
    _mm512_mask_storeu_epi64(a + 8, mhi, hi[r]);
  }
  return 1;
}

/* Columns in blocks of 128, so every segment's rows of x for the block
 * (k x n x 512 bytes) stay in L1 while all rows of the gradient pass. */
AVX512 static int add_wgrad_avx512(int64_t *restrict acc, const dt_fix_wseg *sg, int k,
                                      int OC, int C, double bound, int store) {
  float sf[64], boundf = (float)bound;
  double sd[64];
  int pow2[64];
  if ((double)boundf > bound) boundf = nextafterf(boundf, 0.0f);
  seg_scales(sg, k, sd, sf, pow2);
  unsigned badm = 0;
  int allp2 = 1;
  for (int j = 0; j < k; j++) allp2 &= pow2[j];
  for (int c0 = 0; c0 < C; c0 += 128) {
    int c1 = C - c0 < 128 ? C : c0 + 128;
    int o0 = 0;
    for (; o0 + 8 <= OC; o0 += 8)
      for (int c = c0; c < c1; c += 16) {
        __mmask16 m = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
        if (allp2) {
          if (!wgrad_tile8_p2_fast(acc, sg, k, OC, C, o0, c, m, sf, boundf, store))
            badm |= wgrad_tile8_p2(acc, sg, k, OC, C, o0, c, m, sf, boundf, store);
        }
        else badm |= wgrad_tile(acc, sg, k, OC, C, o0, 8, c, m, sd, sf, pow2, bound, boundf, store);
      }
    for (; o0 < OC; o0++)
      for (int c = c0; c < c1; c += 16) {
        __mmask16 m = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
        badm |= wgrad_tile(acc, sg, k, OC, C, o0, 1, c, m, sd, sf, pow2, bound, boundf, store);
      }
  }
  return badm != 0;
}
/* AVX2 (no AVX-512: no vector double -> int64 conversion). 4 values at a
 * time, every slot added to one int64 register, the sums loaded and stored
 * once. Each term is y = (double)x * (w * 2^32) as dt_fix_add makes it (an
 * exact product), zeroed when not |y| <= bound (NaN too), and rounded by
 * adding 1.5 * 2^52: for |y| < 2^51 the sum lands in [2^52, 2^53), where
 * doubles are the integers, so the add rounds to nearest, ties to even —
 * rint's result in the default mode — and the sum's bits less the
 * constant's are that integer as an int64. A block of 4 where some term in
 * range is 2^51 or more (a gradient above 2^19 at weight 1: not seen in
 * practice) is redone in scalar with dt_fix_add's own expression. */
#define AVX2 __attribute__((target("avx2")))
/* Value l of every slot, in scalar, with dt_fix_add's expression (sd[j] =
 * ws[j] * 2^32): a block add_slots_avx2 cannot round, and its tail. The
 * number of terms out of range. */
static size_t add_slots_one(int64_t *restrict acc, const float *const *xs, const double *sd,
                            int k, size_t l, double bound, int store) {
  size_t bad = 0;
  int64_t v = store ? 0 : acc[l];
  for (int j = 0; j < k; j++) {
    double y = (double)xs[j][l] * sd[j];
    int ok = fabs(y) <= bound;
    bad += !ok;
    v += (int64_t)(ok ? rint(y) : 0.0);
  }
  acc[l] = v;
  return bad;
}

AVX2 static size_t add_slots_avx2(int64_t *restrict acc, const float *const *xs,
                                  const double *ws, int k, size_t n, double bound, int store) {
  double sd[64];
  for (int j = 0; j < k; j++) sd[j] = ws[j] * ldexp(1.0, DT_FIX_BITS);
  const __m256d absd = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  const __m256d vb = _mm256_set1_pd(bound);
  const __m256d big = _mm256_set1_pd(0x1p51);
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  const __m256i magici = _mm256_castpd_si256(magic);
  size_t bad = 0, i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256i a = store ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)(acc + i));
    unsigned nb = 0;
    int scalar = 0;
    for (int j = 0; j < k; j++) {
      __m256d y = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(xs[j] + i)), _mm256_set1_pd(sd[j]));
      __m256d ay = _mm256_and_pd(y, absd);
      __m256d ok = _mm256_cmp_pd(ay, vb, _CMP_LE_OQ); /* false for NaN */
      int okm = _mm256_movemask_pd(ok);
      if (_mm256_movemask_pd(_mm256_and_pd(ok, _mm256_cmp_pd(ay, big, _CMP_GE_OQ)))) {
        scalar = 1;
        break;
      }
      nb += (unsigned)__builtin_popcount(~okm & 0xf);
      __m256d t = _mm256_add_pd(_mm256_and_pd(y, ok), magic);
      a = _mm256_add_epi64(a, _mm256_sub_epi64(_mm256_castpd_si256(t), magici));
    }
    if (!scalar) {
      _mm256_storeu_si256((__m256i *)(acc + i), a);
      bad += nb;
      continue;
    }
    for (size_t l = i; l < i + 4; l++) bad += add_slots_one(acc, xs, sd, k, l, bound, store);
  }
  for (; i < n; i++) bad += add_slots_one(acc, xs, sd, k, i, bound, store);
  return bad;
}

/* ---- the fused weight gradient with AVX2 + FMA ------------------------ */

#define AVX2F __attribute__((target("avx2,fma")))

/* The largest |G| (as the bits of a non-negative float; -1: none) whose
 * term (double)G * sd is in range and at most cap (below 2^51, where the
 * 1.5 * 2^52 rounding of add_slots_avx2 is exact; below 2^31, where a
 * float converts to int32): a product no larger in magnitude rounds to no
 * more (rounding is monotonic), so a tile whose |G| bits all lie at or
 * below it needs no per-lane check. Not-finite G have larger bits. */
static int32_t wgrad_thr_avx2(double sd, double bound, double cap) {
  if (!(bound >= 0.0)) return -1;
  const double lim = bound < cap ? bound : cap;
  const double as = fabs(sd);
  float f = as > 0.0 ? (float)(lim / as) : FLT_MAX;
  if (!(f <= FLT_MAX)) f = FLT_MAX;
  while (f > 0.0f && !((double)f * as <= lim)) f = nextafterf(f, 0.0f);
  int32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

/* One lane's term, dt_fix_add's expression; *bad set when out of range. */
static inline int64_t wgrad_term(float g, double sd, double bound, unsigned *bad) {
  double y = (double)g * sd;
  int ok = fabs(y) <= bound;
  *bad |= !ok;
  return (int64_t)(ok ? rint(y) : 0.0);
}

/* One segment's products of rows 0 .. R - 1 of dy (rows of OC, from dy)
 * and columns 0 .. nc - 1 of x (rows of C, from x; nc <= 16, lanes past
 * nc zero): f[r][v] lane l is column 8 * v + l, the FMA chain of the AVX2
 * GEMM micro-kernel (from +0, rows in order, broadcast dy times x into the
 * accumulator). A function of its own per R, so its 2R accumulators stay
 * in registers through the loop. */
AVX2F static inline __attribute__((always_inline)) void wg_products_r(
    const int R, const float *x, const float *dy, int n, int OC, int C, int nc, __m256 out[6][2]) {
  __m256 f[6][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
  if (nc == 16) {
    for (int q = 0; q < n; q++) {
      const float *xq = x + (size_t)q * C;
      __m256 x0 = _mm256_loadu_ps(xq), x1 = _mm256_loadu_ps(xq + 8);
      const float *d = dy + (size_t)q * OC;
#pragma GCC unroll 6
      for (int r = 0; r < R; r++) {
        __m256 a = _mm256_broadcast_ss(d + r);
        f[r][0] = _mm256_fmadd_ps(a, x0, f[r][0]);
        f[r][1] = _mm256_fmadd_ps(a, x1, f[r][1]);
      }
    }
  } else {
    static const int32_t lt[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    const __m256i m0 = _mm256_loadu_si256((const __m256i *)(lt + 8 - (nc < 8 ? nc : 8)));
    const __m256i m1 = _mm256_loadu_si256((const __m256i *)(lt + 8 - (nc > 8 ? nc - 8 : 0)));
    for (int q = 0; q < n; q++) {
      const float *xq = x + (size_t)q * C;
      __m256 x0 = _mm256_maskload_ps(xq, m0), x1 = _mm256_maskload_ps(xq + 8, m1);
      const float *d = dy + (size_t)q * OC;
#pragma GCC unroll 6
      for (int r = 0; r < R; r++) {
        __m256 a = _mm256_broadcast_ss(d + r);
        f[r][0] = _mm256_fmadd_ps(a, x0, f[r][0]);
        f[r][1] = _mm256_fmadd_ps(a, x1, f[r][1]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) out[r][0] = f[r][0], out[r][1] = f[r][1];
}

#define WG_PROD(R)                                                                                 \
  AVX2F static __attribute__((noinline)) void wg_products_##R(                                    \
      const float *x, const float *dy, int n, int OC, int C, int nc, __m256 out[6][2]) {           \
    wg_products_r(R, x, dy, n, OC, C, nc, out);                                                    \
  }
WG_PROD(6)
WG_PROD(4)
WG_PROD(2)
WG_PROD(1)
#undef WG_PROD

AVX2F static inline __attribute__((always_inline)) void wg_products(
    const int R, const float *x, const float *dy, int n, int OC, int C, int nc, __m256 out[6][2]) {
  switch (R) {
  case 6: wg_products_6(x, dy, n, OC, C, nc, out); break;
  case 4: wg_products_4(x, dy, n, OC, C, nc, out); break;
  case 2: wg_products_2(x, dy, n, OC, C, nc, out); break;
  default: wg_products_1(x, dy, n, OC, C, nc, out); break;
  }
}

/* The int32 sums of a tile (R rows x 16 columns) widened and added to
 * the int64 sums. */
AVX2F static inline __attribute__((always_inline)) void wg_flush32(int64_t *restrict acc, int C,
                                                                  int o0, const int R, int c,
                                                                  __m256i s32[6][2]) {
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
    int64_t *a = acc + (size_t)(o0 + r) * C + c;
#pragma GCC unroll 2
    for (int v = 0; v < 2; v++) {
      __m256i t0 = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(s32[r][v]));
      __m256i t1 = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(s32[r][v], 1));
      t0 = _mm256_add_epi64(t0, _mm256_loadu_si256((const __m256i *)(a + 8 * v)));
      t1 = _mm256_add_epi64(t1, _mm256_loadu_si256((const __m256i *)(a + 8 * v + 4)));
      _mm256_storeu_si256((__m256i *)(a + 8 * v), t0);
      _mm256_storeu_si256((__m256i *)(a + 8 * v + 4), t1);
    }
  }
}

/* Rows o0 .. o0 + R - 1 (R <= 6) of the weight gradient, columns c .. c +
 * nc - 1 (nc <= 16), every segment. Per segment the products as the AVX2
 * GEMM micro-kernel makes them for K = n <= 256 (one K block: a chain of
 * FMAs from +0 over the rows in row order, broadcast dy times the row of x
 * into the accumulator; alpha 1 and beta 0 leave it as is), then each
 * lane's term — rint(G * w * 2^32), dt_fix_add's — by the cheapest exact
 * form the tile's largest |G| allows (the thresholds of add_wgrad_avx2):
 *  - a power-of-two scale and every |term| below 2^31 (the usual case):
 *    scaled in float (exact), rounded to int32 (the current mode: rint's
 *    bits) and summed in int32 over the segments, widened and added to the
 *    int64 sums once per tile — or earlier, whenever the next segment's
 *    largest term could take the int32 sums past INT32_MAX (a bound kept
 *    from each segment's largest |G|: never an overflow);
 *  - |term| < 2^51: the exact double product rounded by adding 1.5 * 2^52
 *    (add_slots_avx2's form);
 *  - else (a large or not finite gradient), and column tails (nc < 16):
 *    lane by lane, dt_fix_add's expression, counting the terms out of
 *    range (returned nonzero).
 * Integer sums in any grouping: the same int64 sums. */
AVX2F static inline __attribute__((always_inline)) unsigned wgrad_tile_avx2(
    int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC, int C, int o0, const int R,
    int c, int nc, const double *sd, const float *sf, const int32_t *thr, const int32_t *thr32,
    double bound, int store) {
  const __m256i absi = _mm256_set1_epi32(0x7fffffff);
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  const __m256i magici = _mm256_castpd_si256(magic);
  unsigned bad = 0;
  __m256i s32[6][2]; /* the int32 sums (spilled to L1: 12 registers hold the products) */
  int have32 = 0;
  double budget = 0.0; /* a bound on the int32 sums' magnitude */
  if (store) /* the sums start at 0; every form below adds */
    for (int r = 0; r < R; r++) {
      int64_t *a = acc + (size_t)(o0 + r) * C + c;
      if (nc == 16)
        for (int v = 0; v < 4; v++) _mm256_storeu_si256((__m256i *)(a + 4 * v), _mm256_setzero_si256());
      else
        memset(a, 0, sizeof *a * (size_t)nc);
    }
  for (int j = 0; j < k; j++) {
    __m256 f[6][2];
    wg_products(R, sg[j].x + c, sg[j].dy + o0, sg[j].n, OC, C, nc, f);
    __m256i mx = _mm256_setzero_si256();
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
      mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_castps_si256(f[r][0]), absi));
      mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_castps_si256(f[r][1]), absi));
    }
#define WG_LE(t) (!_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(mx, _mm256_set1_epi32(t)))))
    if (nc == 16 && WG_LE(thr32[j])) {
      /* every |term| of the tile at most tmax + 0.5 (tmax: the largest |G|
       * times the scale, exact): the int32 sums take it unless they could
       * then pass INT32_MAX, in which case they go into the int64 sums
       * first and start again */
      __m128i h = _mm_max_epi32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
      h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
      h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
      int32_t hb = _mm_cvtsi128_si32(h);
      float gm;
      memcpy(&gm, &hb, sizeof gm);
      const double tmax = (double)gm * fabs(sd[j]) + 1.0;
      if (have32 && budget + tmax > (double)INT32_MAX) {
        wg_flush32(acc, C, o0, R, c, s32);
        have32 = 0;
      }
      if (!have32) budget = 0.0;
      const __m256 s = _mm256_set1_ps(sf[j]);
#pragma GCC unroll 6
      for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) {
          __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(f[r][v], s));
          s32[r][v] = have32 ? _mm256_add_epi32(s32[r][v], q) : q;
        }
      have32 = 1;
      budget += tmax;
      continue;
    }
    if (nc == 16 && WG_LE(thr[j])) {
      const __m256d s = _mm256_set1_pd(sd[j]);
#pragma GCC unroll 6
      for (int r = 0; r < R; r++) {
        int64_t *a = acc + (size_t)(o0 + r) * C + c;
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) {
          __m256d y0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f[r][v])), s);
          __m256d y1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(f[r][v], 1)), s);
          /* the products rounded as doubles before the add (with FMA
           * enabled GCC would fuse the two: another rounding) */
          __asm__("" : "+x"(y0), "+x"(y1));
          __m256i t0 = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(y0, magic)), magici);
          __m256i t1 = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(y1, magic)), magici);
          t0 = _mm256_add_epi64(t0, _mm256_loadu_si256((const __m256i *)(a + 8 * v)));
          t1 = _mm256_add_epi64(t1, _mm256_loadu_si256((const __m256i *)(a + 8 * v + 4)));
          _mm256_storeu_si256((__m256i *)(a + 8 * v), t0);
          _mm256_storeu_si256((__m256i *)(a + 8 * v + 4), t1);
        }
      }
      continue;
    }
#undef WG_LE
    float t[6][16];
    for (int r = 0; r < R; r++) {
      _mm256_storeu_ps(t[r], f[r][0]);
      _mm256_storeu_ps(t[r] + 8, f[r][1]);
      int64_t *a = acc + (size_t)(o0 + r) * C + c;
      for (int l = 0; l < nc; l++) a[l] += wgrad_term(t[r][l], sd[j], bound, &bad);
    }
  }
  if (have32) wg_flush32(acc, C, o0, R, c, s32);
  return bad;
}

/* Columns in blocks of 128 (every segment's rows of x for the block stay
 * in L1 for the usual micro-shards of 8 rows while all rows of the
 * gradient pass), rows in tiles of 6 (12 accumulators: the GEMM's own
 * register budget), then 4, 2, 1. */
AVX2F static int add_wgrad_avx2(int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC,
                                int C, double bound, int store) {
  double sd[64];
  float sf[64];
  int32_t thr[64], thr32[64];
  int pow2[64];
  seg_scales(sg, k, sd, sf, pow2);
  for (int j = 0; j < k; j++) {
    thr[j] = wgrad_thr_avx2(sd[j], bound, nextafter(0x1p51, 0.0));
    thr32[j] = pow2[j] ? wgrad_thr_avx2(sd[j], bound, 0x1p31 - 128) : -1;
  }
  unsigned bad = 0;
  for (int c0 = 0; c0 < C; c0 += 128) {
    int c1 = C - c0 < 128 ? C : c0 + 128;
    int o0 = 0;
    for (; o0 + 6 <= OC; o0 += 6)
      for (int c = c0; c < c1; c += 16)
        bad |= wgrad_tile_avx2(acc, sg, k, OC, C, o0, 6, c, c1 - c < 16 ? c1 - c : 16, sd, sf, thr,
                               thr32, bound, store);
    for (; o0 + 4 <= OC; o0 += 4)
      for (int c = c0; c < c1; c += 16)
        bad |= wgrad_tile_avx2(acc, sg, k, OC, C, o0, 4, c, c1 - c < 16 ? c1 - c : 16, sd, sf, thr,
                               thr32, bound, store);
    for (; o0 + 2 <= OC; o0 += 2)
      for (int c = c0; c < c1; c += 16)
        bad |= wgrad_tile_avx2(acc, sg, k, OC, C, o0, 2, c, c1 - c < 16 ? c1 - c : 16, sd, sf, thr,
                               thr32, bound, store);
    for (; o0 < OC; o0++)
      for (int c = c0; c < c1; c += 16)
        bad |= wgrad_tile_avx2(acc, sg, k, OC, C, o0, 1, c, c1 - c < 16 ? c1 - c : 16, sd, sf, thr,
                               thr32, bound, store);
  }
  return bad != 0;
}

static int avx2_ok(void) {
  static _Atomic int ok = -1;
  int v = atomic_load_explicit(&ok, memory_order_relaxed);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") && dt_param(DT_PARAM_DET_AVX2);
    atomic_store_explicit(&ok, v, memory_order_relaxed);
  }
  return v;
}
#endif

size_t dt_fix_add_slots(int64_t *restrict acc, const float *const *xs, const double *ws, int k,
                        size_t n, double bound, int store, size_t *first_bad, float *bad_value) {
  if (k < 1) {
    if (store) memset(acc, 0, n * sizeof *acc);
    return 0;
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (k <= 64 && (avx512_ok() || avx2_ok())) {
    size_t bad = avx512_ok() ? add_slots_avx512(acc, xs, ws, k, n, bound, store)
                             : add_slots_avx2(acc, xs, ws, k, n, bound, store);
    if (bad) { /* the first bad value, for the message: index order, then slot order */
      for (size_t i = 0; i < n; i++)
        for (int j = 0; j < k; j++)
          if (!(fabs((double)xs[j][i] * (ws[j] * ldexp(1.0, DT_FIX_BITS))) <= bound)) {
            if (first_bad) *first_bad = i;
            if (bad_value) *bad_value = xs[j][i];
            return bad;
          }
    }
    return bad;
  }
#endif
  return add_slots_c(acc, xs, ws, k, n, bound, store, first_bad, bad_value);
}

int dt_fix_wgrad_ok(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  /* the fused path makes the bits of our GEMM kernels (AVX-512 or AVX2 +
   * FMA: dt__gemm_own only picks a table the CPU runs), not OpenBLAS's or
   * the portable kernel's */
  const dt__gemm_kern *k = dt__gemm_own();
  return (k == &dt__gemm_kern_avx512 && avx512_ok()) || k == &dt__gemm_kern_avx2;
#else
  return 0;
#endif
}

size_t dt_fix_add_wgrad(int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC, int C,
                        double bound, int store, size_t *first_bad, float *bad_value) {
  if (k < 1 || k > 64) {
    if (store) memset(acc, 0, (size_t)OC * C * sizeof *acc);
    return 0;
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  size_t bad = 0;
  int some_bad = dt__gemm_own() == &dt__gemm_kern_avx2
                     ? add_wgrad_avx2(acc, sg, k, OC, C, bound, store)
                     : add_wgrad_avx512(acc, sg, k, OC, C, bound, store);
  if (some_bad) {
    /* some term was out of range (rare): count them, and find the first
     * for the message (index order, then segment order), from the same
     * products (fmaf is the fused multiply-add of the chain) */
    for (size_t i = 0; i < (size_t)OC * C; i++)
      for (int j = 0; j < k; j++) {
        size_t o = i / (size_t)C, c = i % (size_t)C;
        float v = 0.0f;
        for (int q = 0; q < sg[j].n; q++)
          v = fmaf(sg[j].dy[(size_t)q * OC + o], sg[j].x[(size_t)q * C + c], v);
        if (!(fabs((double)v * (sg[j].w * ldexp(1.0, DT_FIX_BITS))) <= bound)) {
          if (!bad) {
            if (first_bad) *first_bad = i;
            if (bad_value) *bad_value = v;
          }
          bad++;
        }
      }
  }
  return bad;
#else
  (void)acc, (void)sg, (void)OC, (void)C, (void)bound, (void)store, (void)first_bad, (void)bad_value;
  return 0;
#endif
}

void dt_fix_sub(int64_t *restrict acc, const float *restrict x, size_t n, double w,
                double bound) {
  const double s = w * ldexp(1.0, DT_FIX_BITS);
  for (size_t i = 0; i < n; i++) {
    double y = (double)x[i] * s;
    acc[i] -= (int64_t)(fabs(y) <= bound ? rint(y) : 0.0);
  }
}

double dt_fix_scale(double divisor) {
  /* one scale for all values: a power of two over the divisor, rounded once */
  return ldexp(1.0, -DT_FIX_BITS) / divisor;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* out[i] = (float)((double)acc[i] * k), 4 at a time: AVX2 has no int64 ->
 * double conversion (GCC converts one value at a time), but for |v| <
 * 2^51 the integer v added to the bits of 1.5 * 2^52 are the bits of the
 * double 1.5 * 2^52 + v, exactly; subtracting 1.5 * 2^52 leaves (double)v.
 * The product by k and the rounding to float are then the scalar
 * expression's. A block of 64 with some |v| >= 2^51 (checked: v + 2^51
 * outside [0, 2^52)) is redone in scalar. Returns how many were done. */
AVX2F static size_t to_float_avx2(float *restrict out, const int64_t *restrict acc, size_t n,
                                  double k) {
  const __m256d magic = _mm256_set1_pd(0x1.8p52), vk = _mm256_set1_pd(k);
  const __m256i magici = _mm256_castpd_si256(magic), half = _mm256_set1_epi64x(1LL << 51);
  const __m256i hi = _mm256_set1_epi64x(~((1LL << 52) - 1));
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256i bad = _mm256_setzero_si256();
    for (size_t j = i; j < i + 64; j += 4) {
      __m256i v = _mm256_loadu_si256((const __m256i *)(acc + j));
      bad = _mm256_or_si256(bad, _mm256_add_epi64(v, half));
      __m256d d = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, magici)), magic);
      _mm_storeu_ps(out + j, _mm256_cvtpd_ps(_mm256_mul_pd(d, vk)));
    }
    if (!_mm256_testz_si256(bad, hi))
      for (size_t j = i; j < i + 64; j++) out[j] = (float)((double)acc[j] * k);
  }
  return i;
}
#endif

void dt_fix_to_float(float *restrict out, const int64_t *restrict acc, size_t n,
                     double divisor) {
  const double k = dt_fix_scale(divisor);
  size_t i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (n >= 64 && avx2_ok()) i = to_float_avx2(out, acc, n, k);
#endif
  for (; i < n; i++) out[i] = (float)((double)acc[i] * k);
}

/*
 * pool.c — 2-D max and average pooling over NCHW, square kernel k, stride s,
 * no padding, floor mode (PyTorch defaults apart from stride). Max pooling
 * keeps the first maximum in scan order (PyTorch's rule: a NaN beats any
 * number, a later NaN beats an earlier one) and records its index within the
 * input plane for backward.
 *
 * The 2x2 stride-2 case (every CNN here) has its own route: one output row
 * per pair of input rows, the max taken across each row's pair first and then
 * between the two rows. The pairwise rule "take the later element if it is
 * greater or NaN" is associative, so this order gives exactly the scan-order
 * result. On AVX-512 a row is done 16 outputs at a time (even/odd lanes
 * split with one permute, masked tails, no branches); elsewhere a plain
 * scalar loop does the same. Its backward writes every input gradient once
 * (routed value or zero) instead of a memset followed by a scatter.
 *
 * dt_relu_maxpool2x2_* fuse the ReLU that precedes such a pool: ReLU and max
 * commute, so the pool reads the raw input, clamps at zero on the fly and
 * never writes the 4x larger ReLU output; its backward routes the gradient
 * only where the pooled value is positive. They keep the maximum's position
 * in its window in one byte instead of a plane index in four. Results are
 * bitwise those of
 * dt_relu_forward + dt_maxpool2d_forward and their backward composition.
 *
 * Overlapping max pools (k > s) and average pooling take the generic loops.
 */
#include "nn/kernels.h"

#include <math.h>
#include <string.h>

/* DT_NN_PORTABLE forces the plain C route (its tests build it that way). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    !defined(DT_NN_PORTABLE)
#define USE_AVX512 1
#include <immintrin.h>
#else
#define USE_AVX512 0
#endif
/* AVX2 without AVX-512 (AMD EPYC before Zen 4): 8 outputs at a time, the
 * tail of a row masked. The scalar forward's data-dependent branches
 * cost as much as the second convolution's forward on such a machine. */
#if !USE_AVX512 && defined(__AVX2__) && !defined(DT_NN_PORTABLE)
#define USE_AVX2 1
#include <immintrin.h>
#else
#define USE_AVX2 0
#endif

/* ---- 2x2 stride 2 ------------------------------------------------------ */

/* A window's maximum is found as a position code: 0 top-left, 1 top-right,
 * 2 bottom-left, 3 bottom-right. The plain pool stores it as the index in
 * the input plane (am32); the fused one as the code itself in a byte (am8,
 * 4 where the ReLU zeroes the output), a quarter of the memory traffic. */
#define BLOCKED 4

#if !USE_AVX512
#if !USE_AVX2
/* The pairwise rule: is y (later in scan order) the new maximum over x? */
static inline int takes(float y, float x) { return (y > x) | (y != y); }

/* Scalar row: the OW outputs of one output row. r0, r1: the two input rows;
 * base: plane index of r0[0]. am8 set: fused ReLU (clamp inputs at 0). */
static void mp2_row(float *restrict o, int32_t *restrict am32, uint8_t *restrict am8,
                    const float *restrict r0, const float *restrict r1, int OW, int32_t base,
                    int W) {
  for (int ow = 0; ow < OW; ow++) {
    float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
    if (am8) {
      a = a > 0.0f ? a : 0.0f, b = b > 0.0f ? b : 0.0f;
      c = c > 0.0f ? c : 0.0f, d = d > 0.0f ? d : 0.0f;
    }
    int t = takes(b, a);
    float m0 = t ? b : a;
    int k0 = t;
    t = takes(d, c);
    float m1 = t ? d : c;
    int k1 = 2 + t;
    t = takes(m1, m0);
    float m = t ? m1 : m0;
    int k = t ? k1 : k0;
    o[ow] = m;
    if (am8)
      am8[ow] = (uint8_t)(m > 0.0f ? k : BLOCKED);
    else
      am32[ow] = base + 2 * ow + (k & 1) + (k >> 1) * W;
  }
}

/* Scalar backward row: input gradients of both rows, columns [0, 2*OW). */
static void mp2_back_row(float *restrict d0, float *restrict d1, const float *restrict g,
                         const int32_t *restrict am32, const uint8_t *restrict am8, int OW,
                         int32_t base, int W) {
  for (int ow = 0; ow < OW; ow++) {
    int k;
    if (am8) {
      k = am8[ow];
    } else {
      int32_t r = am32[ow] - (base + 2 * ow);
      k = r == 0 ? 0 : r == 1 ? 1 : r == W ? 2 : r == W + 1 ? 3 : BLOCKED;
    }
    /* 0 + g, as the reference's memset + scatter computes it (-0 -> +0). */
    float v = 0.0f + g[ow];
    d0[2 * ow] = k == 0 ? v : 0.0f;
    d0[2 * ow + 1] = k == 1 ? v : 0.0f;
    d1[2 * ow] = k == 2 ? v : 0.0f;
    d1[2 * ow + 1] = k == 3 ? v : 0.0f;
  }
}
#else /* USE_AVX2 */
/* 8 outputs per step: vshufps of two loads splits even/odd columns with
 * the outputs in the order 0,1,4,5,2,3,6,7 (per 128-bit half), the same
 * for every operand, and one vpermq puts results back in order. The same
 * comparisons and blends as the AVX-512 route, so the same bits. A row's
 * last n < 8 outputs take the same path with masked loads (vmaskmovps;
 * masked-off lanes read nothing and compute on zeros that are never
 * stored) and stores through a stack buffer and a short copy, as masked
 * stores are slow on AMD cores (pool2 backward, rows of 7: 0.85-0.95 ->
 * 0.67-0.68 ms per 64 samples): the CNN's second pool has rows of 7
 * outputs, which the scalar loop, with its data-dependent branches, used
 * to take whole. */
static inline __attribute__((always_inline)) __m256i lanes_below(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __attribute__((always_inline)) void
mp2_8(float *restrict o, int32_t *restrict am32, uint8_t *restrict am8, const float *restrict p0,
      const float *restrict p1, int ow, int32_t base, int W, int n) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2),
                blocked = _mm256_set1_epi32(BLOCKED),
                ev = _mm256_setr_epi32(0, 2, 8, 10, 4, 6, 12, 14); /* 2 x output, shuffled */
  const int relu = am8 != NULL;
  __m256 l0, h0, l1, h1;
  if (n == 8) {
    l0 = _mm256_loadu_ps(p0), h0 = _mm256_loadu_ps(p0 + 8);
    l1 = _mm256_loadu_ps(p1), h1 = _mm256_loadu_ps(p1 + 8);
  } else {
    __m256i ml = lanes_below(2 * n), mh = lanes_below(2 * n - 8);
    l0 = _mm256_maskload_ps(p0, ml), h0 = _mm256_maskload_ps(p0 + 8, mh);
    l1 = _mm256_maskload_ps(p1, ml), h1 = _mm256_maskload_ps(p1 + 8, mh);
  }
  __m256 a = _mm256_shuffle_ps(l0, h0, 0x88), b = _mm256_shuffle_ps(l0, h0, 0xdd);
  __m256 c = _mm256_shuffle_ps(l1, h1, 0x88), d = _mm256_shuffle_ps(l1, h1, 0xdd);
  __m256 t0, t1, t;
  if (relu) {
    /* maxps gives its second operand for NaN and +-0 pairs: x > 0 ? x : +0 */
    a = _mm256_max_ps(a, zero), b = _mm256_max_ps(b, zero);
    c = _mm256_max_ps(c, zero), d = _mm256_max_ps(d, zero);
    t0 = _mm256_cmp_ps(b, a, _CMP_GT_OQ);
    t1 = _mm256_cmp_ps(d, c, _CMP_GT_OQ);
  } else {
    t0 = _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    t1 = _mm256_or_ps(_mm256_cmp_ps(d, c, _CMP_GT_OQ), _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
  }
  __m256 m0 = _mm256_blendv_ps(a, b, t0), m1 = _mm256_blendv_ps(c, d, t1);
  t = _mm256_cmp_ps(m1, m0, _CMP_GT_OQ);
  if (!relu) t = _mm256_or_ps(t, _mm256_cmp_ps(m1, m1, _CMP_UNORD_Q));
  __m256 m = _mm256_blendv_ps(m0, m1, t);
  /* column bit from t0 or t1, row bit from t */
  __m256i ti = _mm256_castps_si256(t);
  __m256i col = _mm256_castps_si256(_mm256_blendv_ps(t0, t1, t));
  __m256i k = _mm256_add_epi32(_mm256_and_si256(col, one), _mm256_and_si256(ti, two));
  __m256 mo = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), 0xd8));
  if (n == 8) {
    _mm256_storeu_ps(o + ow, mo);
  } else { /* through the stack: masked stores are slow on AMD cores */
    float t[8];
    _mm256_storeu_ps(t, mo);
    for (int j = 0; j < n; j++) o[ow + j] = t[j];
  }
  if (relu) {
    k = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(blocked), _mm256_castsi256_ps(k),
                                             _mm256_cmp_ps(m, zero, _CMP_GT_OQ)));
    k = _mm256_permute4x64_epi64(k, 0xd8);
    __m128i k16 = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
    __m128i k8 = _mm_packus_epi16(k16, k16);
    if (n == 8) {
      _mm_storel_epi64((__m128i *)(am8 + ow), k8);
    } else {
      uint8_t tmp[16];
      _mm_storeu_si128((__m128i *)tmp, k8);
      memcpy(am8 + ow, tmp, (size_t)n);
    }
  } else {
    /* index = base + 2*ow' + (k & 1) + (k >> 1) * W */
    __m256i ia = _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow), ev);
    ia = _mm256_add_epi32(ia, _mm256_and_si256(k, one));
    ia = _mm256_add_epi32(ia, _mm256_and_si256(ti, _mm256_set1_epi32(W)));
    ia = _mm256_permute4x64_epi64(ia, 0xd8);
    if (n == 8) _mm256_storeu_si256((__m256i *)(am32 + ow), ia);
    else _mm256_maskstore_epi32((int *)(am32 + ow), lanes_below(n), ia);
  }
}

static void mp2_row(float *restrict o, int32_t *restrict am32, uint8_t *restrict am8,
                    const float *restrict r0, const float *restrict r1, int OW, int32_t base,
                    int W) {
  int ow = 0;
  for (; ow + 8 <= OW; ow += 8) mp2_8(o, am32, am8, r0 + 2 * ow, r1 + 2 * ow, ow, base, W, 8);
  if (ow < OW) mp2_8(o, am32, am8, r0 + 2 * ow, r1 + 2 * ow, ow, base, W, OW - ow);
}

static inline __attribute__((always_inline)) void
mp2_back_8(float *restrict d0, float *restrict d1, const float *restrict g,
           const int32_t *restrict am32, const uint8_t *restrict am8, int ow, int32_t base, int W,
           int n) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_set1_epi32(1), p2 = _mm256_set1_epi32(2),
          p3 = _mm256_set1_epi32(3);
  /* 0 + g, as the reference's memset + scatter computes it (-0 -> +0) */
  __m256 v = _mm256_add_ps(n == 8 ? _mm256_loadu_ps(g + ow)
                                  : _mm256_maskload_ps(g + ow, lanes_below(n)), zero);
  __m256i a;
  if (am8) {
    if (n == 8) {
      a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(am8 + ow)));
    } else {
      uint8_t tmp[16] = {0};
      memcpy(tmp, am8 + ow, (size_t)n);
      a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)tmp));
    }
  } else {
    a = n == 8 ? _mm256_loadu_si256((const __m256i *)(am32 + ow))
               : _mm256_maskload_epi32((const int *)(am32 + ow), lanes_below(n));
    p0 = _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow), ev);
    p1 = _mm256_add_epi32(p0, _mm256_set1_epi32(1));
    p2 = _mm256_add_epi32(p0, _mm256_set1_epi32(W));
    p3 = _mm256_add_epi32(p2, _mm256_set1_epi32(1));
  }
  __m256 e0 = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, p0)));
  __m256 o0 = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, p1)));
  __m256 e1 = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, p2)));
  __m256 o1 = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, p3)));
  /* interleave even/odd columns: unpack within halves, then swap halves */
  __m256 lo0 = _mm256_unpacklo_ps(e0, o0), hi0 = _mm256_unpackhi_ps(e0, o0);
  __m256 lo1 = _mm256_unpacklo_ps(e1, o1), hi1 = _mm256_unpackhi_ps(e1, o1);
  float *q0 = d0 + 2 * ow, *q1 = d1 + 2 * ow;
  __m256 s00 = _mm256_permute2f128_ps(lo0, hi0, 0x20), s01 = _mm256_permute2f128_ps(lo0, hi0, 0x31);
  __m256 s10 = _mm256_permute2f128_ps(lo1, hi1, 0x20), s11 = _mm256_permute2f128_ps(lo1, hi1, 0x31);
  if (n == 8) {
    _mm256_storeu_ps(q0, s00), _mm256_storeu_ps(q0 + 8, s01);
    _mm256_storeu_ps(q1, s10), _mm256_storeu_ps(q1 + 8, s11);
  } else { /* through the stack: masked stores are slow on AMD cores */
    float t[32];
    _mm256_storeu_ps(t, s00), _mm256_storeu_ps(t + 8, s01);
    _mm256_storeu_ps(t + 16, s10), _mm256_storeu_ps(t + 24, s11);
    for (int j = 0; j < 2 * n; j++) q0[j] = t[j], q1[j] = t[16 + j];
  }
}

static void mp2_back_row(float *restrict d0, float *restrict d1, const float *restrict g,
                         const int32_t *restrict am32, const uint8_t *restrict am8, int OW,
                         int32_t base, int W) {
  int ow = 0;
  for (; ow + 8 <= OW; ow += 8) mp2_back_8(d0, d1, g, am32, am8, ow, base, W, 8);
  if (ow < OW) mp2_back_8(d0, d1, g, am32, am8, ow, base, W, OW - ow);
}
#endif
#else
static inline __mmask16 lanes(int n) {
  return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* 16 outputs at a time; the even/odd input columns are split by one
 * two-source permute per row, tails are masked. */
static void mp2_row(float *o, int32_t *am32, uint8_t *am8, const float *r0, const float *r1,
                    int OW, int32_t base, int W) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
  const __m512 zero = _mm512_setzero_ps();
  const int relu = am8 != NULL;
  for (int ow = 0; ow < OW; ow += 16) {
    int n = OW - ow;
    __mmask16 klo = lanes(2 * n), khi = lanes(2 * n - 16), ko = lanes(n);
    const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
    __m512 l0 = _mm512_maskz_loadu_ps(klo, p0), h0 = _mm512_maskz_loadu_ps(khi, p0 + 16);
    __m512 l1 = _mm512_maskz_loadu_ps(klo, p1), h1 = _mm512_maskz_loadu_ps(khi, p1 + 16);
    __m512 a = _mm512_permutex2var_ps(l0, ev, h0), b = _mm512_permutex2var_ps(l0, od, h0);
    __m512 c = _mm512_permutex2var_ps(l1, ev, h1), d = _mm512_permutex2var_ps(l1, od, h1);
    __mmask16 t0, t1, t;
    if (relu) {
      /* maxps returns its second operand for NaN and for +-0 pairs, so this
       * is exactly x > 0 ? x : +0, and no NaN is left. */
      a = _mm512_max_ps(a, zero), b = _mm512_max_ps(b, zero);
      c = _mm512_max_ps(c, zero), d = _mm512_max_ps(d, zero);
      t0 = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
      t1 = _mm512_cmp_ps_mask(d, c, _CMP_GT_OQ);
    } else {
      t0 = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
      t1 = _mm512_cmp_ps_mask(d, c, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
    }
    __m512 m0 = _mm512_mask_blend_ps(t0, a, b), m1 = _mm512_mask_blend_ps(t1, c, d);
    t = _mm512_cmp_ps_mask(m1, m0, _CMP_GT_OQ);
    if (!relu) t |= _mm512_cmp_ps_mask(m1, m1, _CMP_UNORD_Q);
    __m512 m = _mm512_mask_blend_ps(t, m0, m1);
    /* column bit from t0 or t1, row bit from t */
    __m512i k = _mm512_maskz_mov_epi32((__mmask16)((t & t1) | (~t & t0)), one);
    k = _mm512_mask_add_epi32(k, t, k, two);
    _mm512_mask_storeu_ps(o + ow, ko, m);
    if (relu) {
      k = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(m, zero, _CMP_GT_OQ),
                                  _mm512_set1_epi32(BLOCKED), k);
      _mm512_mask_cvtepi32_storeu_epi8(am8 + ow, ko, k);
    } else {
      /* index = base + 2*ow' + (k & 1) + (k >> 1) * W */
      __m512i ia = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ow), ev);
      ia = _mm512_add_epi32(ia, _mm512_and_si512(k, one));
      ia = _mm512_mask_add_epi32(ia, t, ia, _mm512_set1_epi32(W));
      _mm512_mask_storeu_epi32(am32 + ow, ko, ia);
    }
  }
}

static void mp2_back_row(float *d0, float *d1, const float *g, const int32_t *am32,
                         const uint8_t *am8, int OW, int32_t base, int W) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i ilo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i ihi = _mm512_add_epi32(ilo, _mm512_set1_epi32(8));
  const __m512 zero = _mm512_setzero_ps();
  /* the four positions of each window, as codes or as plane indices */
  __m512i p0 = _mm512_setzero_si512(), p1 = _mm512_set1_epi32(1), p2 = _mm512_set1_epi32(2),
          p3 = _mm512_set1_epi32(3);
  for (int ow = 0; ow < OW; ow += 16) {
    int n = OW - ow;
    __mmask16 klo = lanes(2 * n), khi = lanes(2 * n - 16), ko = lanes(n);
    __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(ko, g + ow), zero);
    __m512i a;
    if (am8) {
      a = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(ko, am8 + ow));
    } else {
      a = _mm512_maskz_loadu_epi32(ko, am32 + ow);
      p0 = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ow), ev);
      p1 = _mm512_add_epi32(p0, _mm512_set1_epi32(1));
      p2 = _mm512_add_epi32(p0, _mm512_set1_epi32(W));
      p3 = _mm512_add_epi32(p2, _mm512_set1_epi32(1));
    }
    __m512 e0 = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(a, p0), v);
    __m512 o0 = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(a, p1), v);
    __m512 e1 = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(a, p2), v);
    __m512 o1 = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(a, p3), v);
    float *q0 = d0 + 2 * ow, *q1 = d1 + 2 * ow;
    _mm512_mask_storeu_ps(q0, klo, _mm512_permutex2var_ps(e0, ilo, o0));
    _mm512_mask_storeu_ps(q0 + 16, khi, _mm512_permutex2var_ps(e0, ihi, o0));
    _mm512_mask_storeu_ps(q1, klo, _mm512_permutex2var_ps(e1, ilo, o1));
    _mm512_mask_storeu_ps(q1 + 16, khi, _mm512_permutex2var_ps(e1, ihi, o1));
  }
}
#endif

static void mp2_forward(float *out, int32_t *am32, uint8_t *am8, const float *inp, int B, int C,
                        int H, int W) {
  int OH = H / 2, OW = W / 2;
  for (size_t p = 0; p < (size_t)B * C; p++) {
    const float *plane = inp + p * H * W;
    for (int oh = 0; oh < OH; oh++) {
      const float *r0 = plane + (size_t)(2 * oh) * W;
      size_t off = (p * OH + oh) * OW;
      mp2_row(out + off, am32 ? am32 + off : NULL, am8 ? am8 + off : NULL, r0, r0 + W, OW,
              2 * oh * W, W);
    }
  }
}

static void mp2_backward(float *dinp, const float *dout, const int32_t *am32, const uint8_t *am8,
                         int B, int C, int H, int W) {
  int OH = H / 2, OW = W / 2;
  for (size_t p = 0; p < (size_t)B * C; p++) {
    float *plane = dinp + p * H * W;
    for (int oh = 0; oh < OH; oh++) {
      float *d0 = plane + (size_t)(2 * oh) * W;
      size_t off = (p * OH + oh) * OW;
      mp2_back_row(d0, d0 + W, dout + off, am32 ? am32 + off : NULL, am8 ? am8 + off : NULL, OW,
                   2 * oh * W, W);
      if (W & 1) d0[W - 1] = d0[2 * W - 1] = 0.0f; /* floor mode: uncovered column */
    }
    if (H & 1) memset(plane + (size_t)(H - 1) * W, 0, sizeof(float) * W);
  }
}

void dt_relu_maxpool2x2_forward(float *out, uint8_t *code, const float *inp, int B, int C, int H,
                                int W) {
  mp2_forward(out, NULL, code, inp, B, C, H, W);
}

void dt_relu_maxpool2x2_backward(float *dinp, const float *dout, const uint8_t *code, int B, int C,
                                 int H, int W) {
  if (dinp) mp2_backward(dinp, dout, NULL, code, B, C, H, W);
}

/* ---- generic ----------------------------------------------------------- */

void dt_maxpool2d_forward(float *out, int32_t *argmax, const float *inp, int B, int C, int H,
                          int W, int k, int s) {
  if (k == 2 && s == 2) {
    mp2_forward(out, argmax, NULL, inp, B, C, H, W);
    return;
  }
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  for (size_t p = 0; p < (size_t)B * C; p++) {
    const float *plane = inp + p * H * W;
    float *o = out + p * OH * OW;
    int32_t *am = argmax + p * OH * OW;
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        int h0 = oh * s, w0 = ow * s;
        int32_t mi = h0 * W + w0;
        float m = plane[mi];
        for (int i = 0; i < k; i++) {
          for (int j = 0; j < k; j++) {
            int32_t idx = (h0 + i) * W + (w0 + j);
            float v = plane[idx];
            if (v > m || isnan(v)) { m = v; mi = idx; }
          }
        }
        o[oh * OW + ow] = m;
        am[oh * OW + ow] = mi;
      }
    }
  }
}

void dt_maxpool2d_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int C,
                           int H, int W, int k, int s) {
  if (!dinp) return;
  if (k == 2 && s == 2) {
    mp2_backward(dinp, dout, argmax, NULL, B, C, H, W);
    return;
  }
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  memset(dinp, 0, sizeof(float) * (size_t)B * C * H * W);
  for (size_t p = 0; p < (size_t)B * C; p++) {
    float *d = dinp + p * H * W;
    const float *g = dout + p * OH * OW;
    const int32_t *am = argmax + p * OH * OW;
    for (int i = 0; i < OH * OW; i++) d[am[i]] += g[i];
  }
}

void dt_avgpool2d_forward(float *out, const float *inp, int B, int C, int H, int W, int k, int s) {
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  float inv = 1.0f / (float)(k * k);
  for (size_t p = 0; p < (size_t)B * C; p++) {
    const float *plane = inp + p * H * W;
    float *o = out + p * OH * OW;
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        float acc = 0.0f;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) acc += plane[(oh * s + i) * W + ow * s + j];
        o[oh * OW + ow] = acc * inv;
      }
    }
  }
}

void dt_avgpool2d_backward(float *dinp, const float *dout, int B, int C, int H, int W, int k,
                           int s) {
  if (!dinp) return;
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  float inv = 1.0f / (float)(k * k);
  memset(dinp, 0, sizeof(float) * (size_t)B * C * H * W);
  for (size_t p = 0; p < (size_t)B * C; p++) {
    float *d = dinp + p * H * W;
    const float *g = dout + p * OH * OW;
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        float v = g[oh * OW + ow] * inv;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) d[(oh * s + i) * W + ow * s + j] += v;
      }
    }
  }
}

/*
 * codec_simd.c — the vector kernels of codec.c: Philox4x32-10 over 16
 * counters (and int8/qsgd's quantisation of whole uniform blocks, which
 * takes its uniforms straight from Philox's registers), the f32<->f16
 * conversions, the max |x| pass, and the sign bits' packing and
 * unpacking. AVX-512 where the build's target has it, else AVX2 (with
 * F16C for f16 and FMA for the quantisation); on a target with neither
 * this file compiles to nothing and codec.c runs its portable loops.
 *
 * Each kernel does what its vectors can (whole vectors, whole blocks) and
 * returns how far it got; codec.c finishes the tail. Every kernel gives
 * the portable loop's bits (tests/compress/test_codec_simd.c); the
 * comments say how where it is not obvious.
 *
 * Not here: the portable loops, the frames, anything that decides (all in
 * codec.c); top-k's and PowerSGD's kernels (topk.c, powersgd.c).
 */
#include "comm/compress/codec_simd.h"

#if DT_CZ_V_PHILOX || DT_CZ_V_F16 || DT_CZ_V_QUANT
#include <immintrin.h>
#endif

#define LANES DT_CZ_LANES
#define UBLOCK DT_CZ_UBLOCK
typedef dt__cz_phx phx_args;
#define block_args dt__cz_block_args

/* ---- Philox ---------------------------------------------------------------- */

#if DT_CZ_V_PHILOX
#if defined(__AVX512F__)
/* The 16 lanes as two registers of 8 (lanes 0-7, 8-15), one lane in the
 * low word of each 64-bit slot: vpmuludq then gives a lane's whole
 * 32x32->64 product in its slot (low word = lo, high word shifted down =
 * hi) and the high words are never read (the multiply ignores them), so a
 * round is 2 multiplies, 2 shifts and 2 three-way xors (vpternlogd) per
 * register, without the blends that splitting the products of 16 packed
 * lanes needs. The same bits as the portable loop. */
#define PHX_ROUND(a0, a1, a2, a3, K0, K1)                                          \
  do {                                                                             \
    __m512i p0_ = _mm512_mul_epu32(a0, m0), p2_ = _mm512_mul_epu32(a2, m1);        \
    a0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p2_, 32), a1, K0, 0x96);       \
    a2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0_, 32), a3, K1, 0x96);       \
    a1 = p2_;                                                                      \
    a3 = p0_;                                                                      \
  } while (0)

static inline __attribute__((always_inline)) void philox16v(uint32_t k0, uint32_t k1,
                                                            uint32_t c0base, uint32_t c1,
                                                            uint32_t c2, uint32_t c3,
                                                            __m512i o[4]) {
  const __m512i base = _mm512_set1_epi64((long long)c0base);
  __m512i a0 = _mm512_add_epi32(base, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  __m512i b0 = _mm512_add_epi32(base, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15));
  __m512i a1 = _mm512_set1_epi32((int)c1), a2 = _mm512_set1_epi32((int)c2),
          a3 = _mm512_set1_epi32((int)c3);
  __m512i b1 = a1, b2 = a2, b3 = a3;
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  for (int r = 0; r < 10; r++) {
    const __m512i K0 = _mm512_set1_epi32((int)k0), K1 = _mm512_set1_epi32((int)k1);
    PHX_ROUND(a0, a1, a2, a3, K0, K1);
    PHX_ROUND(b0, b1, b2, b3, K0, K1);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  /* the low words of the slots of a and b: lanes 0-15 of each word */
  const __m512i lows = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  o[0] = _mm512_permutex2var_epi32(a0, lows, b0);
  o[1] = _mm512_permutex2var_epi32(a1, lows, b1);
  o[2] = _mm512_permutex2var_epi32(a2, lows, b2);
  o[3] = _mm512_permutex2var_epi32(a3, lows, b3);
}
#undef PHX_ROUND

void dt__cz_philox16_v(uint32_t k0, uint32_t k1, uint32_t c0base, uint32_t c1, uint32_t c2,
                       uint32_t c3, uint32_t out[4][LANES]) {
  __m512i o[4];
  philox16v(k0, k1, c0base, c1, c2, c3, o);
  for (int w = 0; w < 4; w++) _mm512_storeu_si512(out[w], o[w]);
}
#elif defined(__AVX2__)
/* AVX2 (no AVX-512): the same slot trick with 4 lanes per register, so a
 * word of the 16 lanes is 4 registers: g = 0..3 hold lanes (0,1,4,5),
 * (2,3,6,7), (8,9,12,13), (10,11,14,15) in the low words of their 64-bit
 * slots, the order in which one vshufps of two registers' low words gives
 * 8 lanes in order. A round is vpmuludq, a shift and two xors per word
 * pair and register (no three-way xor without AVX-512). The same bits as
 * the portable loop (tests/compress/test_codec_simd.c). o[2w + h] = word
 * w of lanes 8h..8h+7. */
#define PHX_ROUND2(a0, a1, a2, a3, K0, K1)                                         \
  do {                                                                             \
    __m256i p0_ = _mm256_mul_epu32(a0, m0), p2_ = _mm256_mul_epu32(a2, m1);        \
    a0 = _mm256_xor_si256(_mm256_srli_epi64(p2_, 32), _mm256_xor_si256(a1, K0));    \
    a2 = _mm256_xor_si256(_mm256_srli_epi64(p0_, 32), _mm256_xor_si256(a3, K1));    \
    a1 = p2_;                                                                      \
    a3 = p0_;                                                                      \
  } while (0)

static inline __attribute__((always_inline)) void philox16v(uint32_t k0, uint32_t k1,
                                                            uint32_t c0base, uint32_t c1,
                                                            uint32_t c2, uint32_t c3,
                                                            __m256i o[8]) {
  const __m256i base = _mm256_set1_epi32((int)c0base);
  __m256i x0[4], x1[4], x2[4], x3[4];
  x0[0] = _mm256_add_epi32(base, _mm256_setr_epi32(0, 0, 1, 0, 4, 0, 5, 0));
  x0[1] = _mm256_add_epi32(base, _mm256_setr_epi32(2, 0, 3, 0, 6, 0, 7, 0));
  x0[2] = _mm256_add_epi32(base, _mm256_setr_epi32(8, 0, 9, 0, 12, 0, 13, 0));
  x0[3] = _mm256_add_epi32(base, _mm256_setr_epi32(10, 0, 11, 0, 14, 0, 15, 0));
  for (int g = 0; g < 4; g++) {
    x1[g] = _mm256_set1_epi32((int)c1);
    x2[g] = _mm256_set1_epi32((int)c2);
    x3[g] = _mm256_set1_epi32((int)c3);
  }
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
  for (int r = 0; r < 10; r++) {
    const __m256i K0 = _mm256_set1_epi32((int)k0), K1 = _mm256_set1_epi32((int)k1);
    for (int g = 0; g < 4; g++) PHX_ROUND2(x0[g], x1[g], x2[g], x3[g], K0, K1);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
#define LOWS(a, b) _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), \
                                                         _mm256_castsi256_ps(b), 0x88))
  for (int h = 0; h < 2; h++) {
    o[0 + h] = LOWS(x0[2 * h], x0[2 * h + 1]);
    o[2 + h] = LOWS(x1[2 * h], x1[2 * h + 1]);
    o[4 + h] = LOWS(x2[2 * h], x2[2 * h + 1]);
    o[6 + h] = LOWS(x3[2 * h], x3[2 * h + 1]);
  }
#undef LOWS
}
#undef PHX_ROUND2

void dt__cz_philox16_v(uint32_t k0, uint32_t k1, uint32_t c0base, uint32_t c1, uint32_t c2,
                       uint32_t c3, uint32_t out[4][LANES]) {
  __m256i o[8];
  philox16v(k0, k1, c0base, c1, c2, c3, o);
  for (int w = 0; w < 4; w++) {
    _mm256_storeu_si256((__m256i *)out[w], o[2 * w]);
    _mm256_storeu_si256((__m256i *)(out[w] + 8), o[2 * w + 1]);
  }
}
#endif
#endif

/* ---- f32 <-> f16 ----------------------------------------------------------- */

#if DT_CZ_V_F16
size_t dt__cz_to_f16_v(const float *restrict x, uint16_t *restrict h, float *resid, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    __m256i p = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i *)(h + i), p);
    if (resid) _mm512_storeu_ps(resid + i, _mm512_sub_ps(v, _mm512_cvtph_ps(p)));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  /* F16C rounds to nearest even like dt_f32_to_f16, subnormals and
   * overflow to Inf included; a NaN keeps its payload's top bits where
   * dt_f32_to_f16 gives 0x7e00 (either is NaN, and a frame or sum with a
   * NaN is NaN whatever its bits) */
  for (; i + 16 <= n; i += 16) {
    __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    __m128i p0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i p1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(h + i), p0);
    _mm_storeu_si128((__m128i *)(h + i + 8), p1);
    if (resid) {
      _mm256_storeu_ps(resid + i, _mm256_sub_ps(v0, _mm256_cvtph_ps(p0)));
      _mm256_storeu_ps(resid + i + 8, _mm256_sub_ps(v1, _mm256_cvtph_ps(p1)));
    }
  }
#endif
  return i;
}

size_t dt__cz_from_f16_v(const uint16_t *restrict h, float *restrict out, size_t n, int add) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i)));
    /* 0 + v when !add, as the scalar loop (-0 becomes +0) */
    v = _mm512_add_ps(add ? _mm512_loadu_ps(out + i) : _mm512_setzero_ps(), v);
    _mm512_storeu_ps(out + i, v);
  }
#elif defined(__AVX2__) && defined(__F16C__)
  /* out + v in the scalar loop's order, and 0 + v when !add (as the
   * scalar loop: -0 becomes +0) */
  for (; i + 16 <= n; i += 16) {
    __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
    __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + 8)));
    __m256 o0 = add ? _mm256_loadu_ps(out + i) : _mm256_setzero_ps();
    __m256 o1 = add ? _mm256_loadu_ps(out + i + 8) : _mm256_setzero_ps();
    _mm256_storeu_ps(out + i, _mm256_add_ps(o0, v0));
    _mm256_storeu_ps(out + i + 8, _mm256_add_ps(o1, v1));
  }
#endif
  return i;
}
#endif

/* ---- max |x| ---------------------------------------------------------------- */

#if DT_CZ_V_MAXABS
uint32_t dt__cz_maxabs_bits_v(const uint32_t *restrict xb, size_t n, size_t *done) {
  uint32_t m = 0;
  size_t i = 0;
#if defined(__AVX512F__)
  const __m512i mag = _mm512_set1_epi32(0x7fffffff);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_loadu_si512(xb + i), mag));
    a1 = _mm512_max_epu32(a1, _mm512_and_si512(_mm512_loadu_si512(xb + i + 16), mag));
  }
  m = _mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1));
#elif defined(__AVX2__)
  const __m256i mag = _mm256_set1_epi32(0x7fffffff);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + i)), mag));
    a1 = _mm256_max_epu32(a1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + i + 8)), mag));
    a2 = _mm256_max_epu32(a2, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + i + 16)), mag));
    a3 = _mm256_max_epu32(a3, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + i + 24)), mag));
  }
  __m256i a = _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3));
  __m128i c = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  c = _mm_max_epu32(c, _mm_shuffle_epi32(c, 0x4e));
  c = _mm_max_epu32(c, _mm_shuffle_epi32(c, 0xb1));
  m = (uint32_t)_mm_cvtsi128_si32(c);
#endif
  *done = i;
  return m;
}
#endif

/* ---- int8 / qsgd quantisation ------------------------------------------------ */

#if DT_CZ_V_QUANT
/* magnitude a constant in each copy: no branch between the modes in the
 * loops */
static inline __attribute__((always_inline)) size_t
quantize_v(const float *restrict x, int8_t *restrict q, float *resid, size_t n, float inv,
           float step, float lim, dt_cz_rng rng, uint64_t block0, int magnitude) {
  size_t b = 0;
#if defined(__AVX512F__)
  /* gcc leaves the scalar loop below scalar (the float -> int8 narrowing);
   * here whole blocks take their uniforms straight from Philox's
   * registers (no array of floats in between), the same bits */
  {
    const __m512 vinv = _mm512_set1_ps(inv), vlim = _mm512_set1_ps(lim),
                 vnlim = _mm512_set1_ps(-lim), vstep = _mm512_set1_ps(step),
                 us = _mm512_set1_ps(1.0f / 65536.0f), uh = _mm512_set1_ps(0.5f / 65536.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), low16 = _mm512_set1_epi32(0xffff);
    for (; (b + 1) * UBLOCK <= n; b++) {
      const float *restrict xs = x + b * UBLOCK;
      int8_t *restrict qs = q + b * UBLOCK;
      float *rs = resid ? resid + b * UBLOCK : NULL;
      __m512i o[4];
      phx_args a = block_args(rng, block0 + b);
      philox16v(a.k0, a.k1, a.c0, a.c1, a.c2, a.c3, o);
      for (int i = 0; i < UBLOCK; i += 16) {
        __m512i r = i & 16 ? _mm512_srli_epi32(o[i >> 5], 16) : _mm512_and_si512(o[i >> 5], low16);
        __m512 u = _mm512_fmadd_ps(_mm512_cvtepi32_ps(r), us, uh);
        __m512 v = _mm512_loadu_ps(xs + i), l;
        if (magnitude) {
          __m512 av = _mm512_abs_ps(v);
          l = _mm512_roundscale_ps(_mm512_fmadd_ps(av, vinv, u),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
          l = _mm512_min_ps(l, vlim);
          l = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(l),
                                                  _mm512_and_si512(_mm512_castps_si512(v), sign)));
        } else {
          l = _mm512_roundscale_ps(_mm512_fmadd_ps(v, vinv, u),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
          l = _mm512_max_ps(_mm512_min_ps(l, vlim), vnlim);
        }
        __m512i qi = _mm512_cvtps_epi32(l);
        _mm_storeu_si128((__m128i *)(qs + i), _mm512_cvtepi32_epi8(qi));
        /* the int8 value back in float, as the scalar loop (qsgd: -0 -> +0) */
        if (rs) _mm512_storeu_ps(rs + i, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qi), vstep, v));
      }
    }
  }
#elif defined(__AVX2__) && defined(__FMA__)
  /* AVX2: whole blocks as above, 32 values (one Philox word: the low
   * halves of lanes 0-15, then the high halves) per step, narrowed to
   * int8 by two saturating packs and one lane permute. The residual uses
   * the int8 value back in float, as the scalar loop does (qsgd's -0
   * becomes +0). The same fused multiply-adds as the scalar loops, which
   * gcc contracts (gnu11, -march=native with FMA). */
  {
    const __m256 vinv = _mm256_set1_ps(inv), vlim = _mm256_set1_ps(lim),
                 vnlim = _mm256_set1_ps(-lim), vstep = _mm256_set1_ps(step),
                 us = _mm256_set1_ps(1.0f / 65536.0f), uh = _mm256_set1_ps(0.5f / 65536.0f),
                 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)),
                 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i low16 = _mm256_set1_epi32(0xffff), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; (b + 1) * UBLOCK <= n; b++) {
      const float *restrict xs = x + b * UBLOCK;
      int8_t *restrict qs = q + b * UBLOCK;
      float *rs = resid ? resid + b * UBLOCK : NULL;
      __m256i o[8];
      phx_args a = block_args(rng, block0 + b);
      philox16v(a.k0, a.k1, a.c0, a.c1, a.c2, a.c3, o);
      for (int w = 0; w < 4; w++) {
        __m256i qi[4];
        for (int g = 0; g < 4; g++) { /* values w*32 + 8g .. +8 */
          __m256i ow = o[2 * w + (g & 1)];
          __m256i r = g & 2 ? _mm256_srli_epi32(ow, 16) : _mm256_and_si256(ow, low16);
          __m256 u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r), us, uh);
          __m256 v = _mm256_loadu_ps(xs + w * 32 + 8 * g), l;
          if (magnitude) {
            l = _mm256_floor_ps(_mm256_fmadd_ps(_mm256_and_ps(v, absm), vinv, u));
            l = _mm256_min_ps(l, vlim);
            l = _mm256_or_ps(l, _mm256_and_ps(v, sign));
          } else {
            l = _mm256_floor_ps(_mm256_fmadd_ps(v, vinv, u));
            l = _mm256_max_ps(_mm256_min_ps(l, vlim), vnlim);
          }
          qi[g] = _mm256_cvtps_epi32(l);
          if (rs) _mm256_storeu_ps(rs + w * 32 + 8 * g, _mm256_fnmadd_ps(_mm256_cvtepi32_ps(qi[g]), vstep, v));
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        _mm256_storeu_si256((__m256i *)(qs + w * 32), _mm256_permutevar8x32_epi32(p, order));
      }
    }
  }
#endif
  return b;
}

size_t dt__cz_quantize_v(const float *x, int8_t *q, float *resid, size_t n, float inv, float step,
                         float lim, dt_cz_rng rng, uint64_t block0, int magnitude) {
  return magnitude ? quantize_v(x, q, resid, n, inv, step, lim, rng, block0, 1)
                   : quantize_v(x, q, resid, n, inv, step, lim, rng, block0, 0);
}
#endif

/* ---- sign bits ----------------------------------------------------------------- */

#if DT_CZ_V_SIGN
size_t dt__cz_sign_pack_v(const float *restrict x, uint8_t *restrict bits, float *resid, size_t n,
                          float s) {
  size_t i = 0;
#if defined(__AVX512F__)
  __m512 zero = _mm512_setzero_ps(), ps = _mm512_set1_ps(s), ns = _mm512_set1_ps(-s);
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    __mmask16 m = _mm512_cmp_ps_mask(v, zero, _CMP_GE_OQ);
    bits[i / 8] = (uint8_t)m;
    bits[i / 8 + 1] = (uint8_t)(m >> 8);
    if (resid) _mm512_storeu_ps(resid + i, _mm512_sub_ps(v, _mm512_mask_blend_ps(m, ns, ps)));
  }
#elif defined(__AVX2__)
  /* x >= 0 (ordered: NaN is 0, -0 is 1) as in the scalar loop; lo is a
   * multiple of 8, so every 8 values are one whole byte */
  __m256 zero = _mm256_setzero_ps(), ps = _mm256_set1_ps(s), ns = _mm256_set1_ps(-s);
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 m = _mm256_cmp_ps(v, zero, _CMP_GE_OQ);
    bits[i / 8] = (uint8_t)_mm256_movemask_ps(m);
    if (resid) _mm256_storeu_ps(resid + i, _mm256_sub_ps(v, _mm256_blendv_ps(ns, ps, m)));
  }
#endif
  return i;
}

size_t dt__cz_sign_unpack_add_v(const uint8_t *restrict bits, float *restrict out, size_t n,
                                float s) {
  size_t i = 0;
#if defined(__AVX512F__)
  __m512 ps = _mm512_set1_ps(s), ns = _mm512_set1_ps(-s);
  for (; i + 16 <= n; i += 16) {
    __mmask16 m = (__mmask16)(bits[i / 8] | (unsigned)bits[i / 8 + 1] << 8);
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), _mm512_mask_blend_ps(m, ns, ps)));
  }
#elif defined(__AVX2__)
  /* byte -> 8 lane masks: broadcast, and with each lane's bit, compare */
  __m256 ps = _mm256_set1_ps(s), ns = _mm256_set1_ps(-s);
  const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (; i + 8 <= n; i += 8) {
    __m256i b = _mm256_and_si256(_mm256_set1_epi32(bits[i / 8]), sel);
    __m256 m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, sel));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_blendv_ps(ns, ps, m)));
  }
#endif
  return i;
}
#endif

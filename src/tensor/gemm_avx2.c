/*
 * gemm_avx2.c — single-precision GEMM with AVX2 + FMA (ymm), the port of
 * gemm_avx512.c for CPUs without AVX-512: C(M,N) = alpha * op(A) * op(B) +
 * beta * C, row-major, any transpose, any leading dimensions, with the same
 * operand model — dense matrices, the "implicit" row-offset / segmented B
 * operands of conv2d.c's im2col-free convolution, the dot-product form for
 * short N, and B packed ahead of time (pipeline stages' and deterministic
 * mode's forward weights, src/nn/wpack.c).
 *
 * Structure (Goto/BLIS, as gemm_avx512.c): K cut into blocks of at most KC
 * (gemm_kblock: a function of K alone), M into blocks of at most MC; A
 * packed into 6- or 4-row panels ([k][h]), B into NR-column panels ([k][NR]) —
 * a dense B stored K x N is read in place for full-width panels, unless its
 * leading dimension is a multiple of 512 floats (then G panels are packed
 * together, row by row: pack_b_group). The next B panel is prefetched
 * spread over all the row tiles that use the current one. The
 * micro-kernel is MR x NR = 6 x 16: per k, 2 loads of B, 6 broadcasts of A,
 * 12 independent FMAs into 12 ymm accumulators (16 registers in all); a
 * block whose rows do not divide by 6 ends in 4-row tiles (panel_h: 8 rows
 * run as 4 + 4, deterministic mode's micro-shards).
 *
 * Fixed order: every element of C is alpha * (an FMA chain over its K
 * block, from 0) then combined with beta * c, block after block, whatever
 * M, N, its place in a tile or the thread — deterministic mode
 * (DT_GEMM_FIXED) relies on it. Every tile runs the same per-element
 * operations, narrow edge tiles on a copy of C, so they round exactly as
 * full tiles do for every alpha and beta.
 *
 * Everything is compiled for AVX2 + FMA with target attributes, so the file
 * builds without -march flags; the caller checks the CPU (dt__gemm_own)
 * before calling in. Stubs elsewhere. Not here: threading, other precisions.
 */
#include "tensor/gemm_int.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

enum { MR = 6, NR = 16, NV = NR / 8, KC = 256, MC = 96, G = 8 };

/* ---- packing -------------------------------------------------------------- */

/* A mask of the first n (0..8) lanes, for maskload. */
AVX2 static inline __m256i lanes(int n) {
  static const int32_t t[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(t + 8 - n));
}

AVX2 static inline void tr8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; h++) {
    s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
  }
}

/* Stores the first w lanes of v (w = 8, or MR for an A panel). */
AVX2 static inline void store_w(float *d, __m256 v, int w) {
  if (w == 8) {
    _mm256_storeu_ps(d, v);
    return;
  }
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  _mm_storeu_ps(d, lo);
  if (w == 6) _mm_storel_pi((__m64 *)(d + 4), hi);
  else if (w > 4) {
    float t[4];
    _mm_storeu_ps(t, hi);
    memcpy(d + 4, t, sizeof(float) * (size_t)(w - 4));
  }
}

/* Transposing pack: rows r0..r0+nrows-1 of o (nrows <= 8, contiguous along
 * x), elements x0..x0+len-1, into dst[x][W]: lane i of dst + x*W is row i
 * (w lanes stored, those beyond nrows zero). */
AVX2 static void pack_t8(float *dst, int W, int w, const dt__gemm_op *o, int r0, int nrows, int x0,
                         int len) {
  int x = 0;
  while (x < len) {
    int run = op_run(o, x0 + x, len - x);
    const float *src[8], *base = o->p + pos_off(o, x0 + x);
    for (int i = 0; i < 8; i++) src[i] = i < nrows ? base + row_off(o, r0 + i) : NULL;
    for (int j = 0; j < run; j += 8) {
      int n = run - j < 8 ? run - j : 8;
      __m256 v[8];
      if (n == 8) {
        for (int i = 0; i < 8; i++) v[i] = src[i] ? _mm256_loadu_ps(src[i] + j) : _mm256_setzero_ps();
      } else {
        __m256i m = lanes(n);
        for (int i = 0; i < 8; i++)
          v[i] = src[i] ? _mm256_maskload_ps(src[i] + j, m) : _mm256_setzero_ps();
      }
      tr8(v);
      for (int q = 0; q < n; q++) store_w(dst + (size_t)(x + j + q) * W, v[q], w);
    }
    x += run;
  }
}

/* Contiguous pack: element (r, x) for r in [r0, r0+kc) (the K index) and x
 * in [x0, x0+n) into dst[r][W], zero-padded to W. */
AVX2 static void pack_n(float *dst, int W, const dt__gemm_op *o, int r0, int kc, int x0, int n) {
  int x = 0;
  while (x < n) { /* runs of contiguous x (at most a few per panel) */
    int run = op_run(o, x0 + x, n - x);
    const float *base = o->p + pos_off(o, x0 + x);
    int full = run & ~7;
    for (int k = 0; k < kc; k++) {
      float *d = dst + (size_t)k * W + x;
      const float *s = base + row_off(o, r0 + k);
      for (int j = 0; j < full; j += 8) _mm256_storeu_ps(d + j, _mm256_loadu_ps(s + j));
      for (int j = full; j < run; j++) d[j] = s[j];
    }
    x += run;
  }
  if (n < W)
    for (int k = 0; k < kc; k++)
      for (int j = n; j < W; j++) dst[(size_t)k * W + j] = 0.0f;
}

/* Height of the next A panel (and row tile) with rem rows of the block
 * left: 6, except that 8 and 7 rows go as 4 + 4 and 4 + 3, and at most 4
 * as one panel of 4 — so a micro-shard of 8 rows (deterministic mode's
 * default) runs two full 4-row tiles instead of 6 rows and a 6-row tile
 * two-thirds empty. Which tile computes a row does not change its bits. */
static inline int panel_h(int rem) { return rem >= 9 || rem == 6 || rem == 5 ? 6 : 4; }

/* Packs the A block rows [m0, m0+mc) x k [k0, k0+kc) into panels of
 * panel_h rows ([k][h]), one after the other (panel i at ap + i * kc). */
AVX2 static void pack_a(float *ap, const dt__gemm_op *A, int m0, int mc, int k0, int kc) {
  for (int i = 0, h; i < mc; i += h) {
    h = panel_h(mc - i);
    int n = mc - i < h ? mc - i : h;
    if (A->trans) pack_n(ap + (size_t)i * kc, h, A, k0, kc, m0 + i, n); /* rows are k */
    else pack_t8(ap + (size_t)i * kc, h, h, A, m0 + i, n, k0, kc);      /* rows are m */
  }
}

/* Packs one B panel: k [k0, k0+kc) x n [n0, n0+nr) into bp[k][NR]. */
AVX2 static void pack_b(float *bp, const dt__gemm_op *B, int k0, int kc, int n0, int nr) {
  if (!B->trans) { /* stored K x N: rows are k */
    pack_n(bp, NR, B, k0, kc, n0, nr);
    return;
  }
  for (int j = 0; j < NR; j += 8) { /* stored N x K: rows are n */
    int n = nr - j;
    if (n > 8) n = 8;
    if (n <= 0) {
      for (int k = 0; k < kc; k++) _mm256_storeu_ps(bp + (size_t)k * NR + j, _mm256_setzero_ps());
      continue;
    }
    pack_t8(bp + j, NR, 8, B, n0 + j, n, k0, kc);
  }
}

/* Packs the panels of columns [n0, n0+n) (n <= G * NR) of a dense B
 * stored K x N (rows are k), k in [k0, k0+kc), into dst: panel g at
 * dst + g * kc * NR, each [k][NR], zero-padded to whole panels. Row by row
 * (each row of B read as one run of n floats, PFD rows ahead prefetched),
 * for a B whose leading dimension is a multiple of 512 floats: read in
 * place, a panel's kc rows of 64 bytes lie 2^11+ bytes apart, so they map
 * to a few cache sets and do not stay in L1 or L2 for the next row tile
 * (the deep MLP's weight gradients dY^T X, X 256 x 2048: 63 GFLOP/s in
 * place, 76 packed here, OpenBLAS 80). */
enum { PFD = 4 };
AVX2 static void pack_b_group(float *dst, const dt__gemm_op *B, int k0, int kc, int n0, int n) {
  const int full = n / NR, rest = n - full * NR;
  const size_t ps = (size_t)kc * NR;
  for (int k = 0; k < kc; k++) {
    const float *s = B->p + (size_t)(k0 + k) * B->ld + n0;
    if (k == 0)
      for (int q = 1; q < PFD && q < kc; q++)
        for (int j = 0; j < n; j += 16) _mm_prefetch((const char *)(s + (size_t)q * B->ld + j), _MM_HINT_T0);
    if (k + PFD < kc)
      for (int j = 0; j < n; j += 16) _mm_prefetch((const char *)(s + (size_t)PFD * B->ld + j), _MM_HINT_T0);
    float *d = dst + (size_t)k * NR;
    for (int g = 0; g < full; g++, s += NR, d += ps) {
      _mm256_storeu_ps(d, _mm256_loadu_ps(s));
      _mm256_storeu_ps(d + 8, _mm256_loadu_ps(s + 8));
    }
    if (rest)
      for (int j = 0; j < NR; j++) d[j] = j < rest ? s[j] : 0.0f;
  }
}

/* ---- micro-kernel ------------------------------------------------------- */

/* c(R x NR, ldc) = alpha * ap * bp + beta * c, with beta == 0 meaning "do
 * not read c"; ap a panel of h >= R rows ([k][h]), B rows bs floats apart;
 * pf, if set, is the next B panel (rows bs apart), prefetched into L1
 * meanwhile. Every element: an FMA chain over k from 0, times alpha (if not
 * 1), plus c (beta 1) or fma(beta, c, .) — whatever R and h. */
AVX2 static inline __attribute__((always_inline)) void kernel_pf(
    const int R, const int h, int kc, const float *restrict ap, const float *restrict bp,
    size_t bs, float *c, size_t ldc, float alpha, float beta, const float *pf, int pfn, int pfe) {
  __m256 acc[MR][NV];
  int cd = 1;
#pragma GCC unroll 8
  for (int i = 0; i < R; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = _mm256_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m256 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) b[v] = _mm256_loadu_ps(bp + 8 * v);
    if (pfn && --cd == 0) { /* one row of the next panel every pfe k */
      _mm_prefetch((const char *)pf, _MM_HINT_T0);
      _mm_prefetch((const char *)(pf + NR - 1), _MM_HINT_T0);
      pf += bs;
      pfn--;
      cd = pfe;
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
      __m256 a = _mm256_broadcast_ss(ap + i);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
    ap += h;
    bp += bs;
  }
  __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < R; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      float *p = c + (size_t)i * ldc + 8 * v;
      __m256 r = alpha == 1.0f ? acc[i][v] : _mm256_mul_ps(va, acc[i][v]);
      if (beta == 1.0f) r = _mm256_add_ps(r, _mm256_loadu_ps(p));
      else if (beta != 0.0f) r = _mm256_fmadd_ps(vb, _mm256_loadu_ps(p), r);
      _mm256_storeu_ps(p, r);
    }
}

/* The row tiles: R rows of a panel of h (6 or 4; R < h only at the end of
 * a block). */
#define TILE(R, H)                                                                                 \
  AVX2 static void tile_##R##_##H(int kc, const float *ap, const float *bp, size_t bs, float *c,  \
                                  size_t ldc, float alpha, float beta, const float *pf, int pfn,   \
                                  int pfe) {                                                       \
    kernel_pf(R, H, kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe);                            \
  }
TILE(6, 6)
TILE(5, 6)
TILE(4, 4)
TILE(3, 4)
TILE(2, 4)
TILE(1, 4)

AVX2 static void tile(int R, int h, int kc, const float *ap, const float *bp, size_t bs, float *c,
                      size_t ldc, float alpha, float beta, const float *pf, int pfn, int pfe) {
  switch (h == 6 ? R + 4 : R) {
  case 10: tile_6_6(kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe); break;
  case 9: tile_5_6(kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe); break;
  case 4: tile_4_4(kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe); break;
  case 3: tile_3_4(kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe); break;
  case 2: tile_2_4(kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe); break;
  default: tile_1_4(kc, ap, bp, bs, c, ldc, alpha, beta, pf, pfn, pfe); break;
  }
}

/* Edge tile: R x nr of C (nr < NR) through a copy, by the same kernel, so
 * the same roundings as in a full tile for every alpha and beta. */
AVX2 static void tile_edge(int R, int h, int kc, const float *ap, const float *bp, size_t bs,
                           float *c, size_t ldc, int nr, float alpha, float beta) {
  float t[MR * NR];
  memset(t, 0, sizeof t);
  if (beta != 0.0f)
    for (int i = 0; i < R; i++) memcpy(t + i * NR, c + (size_t)i * ldc, sizeof(float) * (size_t)nr);
  tile(R, h, kc, ap, bp, bs, t, NR, alpha, beta, NULL, 0, 1);
  for (int i = 0; i < R; i++) memcpy(c + (size_t)i * ldc, t + i * NR, sizeof(float) * (size_t)nr);
}

/* ---- driver ----------------------------------------------------------- */

/* The driver; bpre, if not NULL, is B packed by dt__gemm_avx2_packb (then
 * B is not read): the same panels, so the same bits. */
AVX2 static void drive(int M, int N, int K, float alpha, const dt__gemm_op *A,
                       const dt__gemm_op *B, const float *bpre, int direct, float beta, float *C,
                       int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_scale_c(M, N, beta, C, ldc);
    return;
  }
  _Alignas(64) float apack[(MC + 4) * KC]; /* the last panel may be up to 3 rows short */
  _Alignas(64) float bpack[KC * NR];
  _Alignas(64) float bgrp[G * KC * NR]; /* G panels of a dense B, packed together */
  const int kcb = gemm_kblock(K, KC);
  const size_t npad = (size_t)(N + NR - 1) / NR * NR;
  int nmb = (M + MC - 1) / MC;
  int mcb = (M + nmb - 1) / nmb;
  mcb = (mcb + MR - 1) / MR * MR;
  if (mcb > MC) mcb = MC;
  for (int k0 = 0; k0 < K; k0 += kcb) {
    int kc = K - k0 < kcb ? K - k0 : kcb;
    float be = k0 == 0 ? beta : 1.0f;
    for (int m0 = 0; m0 < M; m0 += mcb) {
      int mc = M - m0 < mcb ? M - m0 : mcb;
      pack_a(apack, A, m0, mc, k0, kc);
      int nt = 0;
      for (int i = 0; i < mc; i += panel_h(mc - i)) nt++;
      for (int n0 = 0; n0 < N; n0 += NR) {
        int nr = N - n0 < NR ? N - n0 : NR;
        const float *bp = bpack, *next = NULL;
        size_t bs = NR;
        if (bpre) {
          bp = bpre + (size_t)k0 * npad + (size_t)n0 * kc;
          next = bp + (size_t)kc * NR;
        } else if (direct && B->ld % 512 == 0) {
          const int g = (n0 / NR) % G;
          if (g == 0) pack_b_group(bgrp, B, k0, kc, n0, N - n0 < G * NR ? N - n0 : G * NR);
          bp = bgrp + (size_t)g * kc * NR;
          next = g + 1 < G ? bp + (size_t)kc * NR : NULL;
        } else if (direct && nr == NR) {
          bp = B->p + (size_t)k0 * B->ld + n0;
          bs = (size_t)B->ld;
          next = bp + NR;
        } else {
          pack_b(bpack, B, k0, kc, n0, nr);
        }
        if (n0 + NR >= N) next = NULL;
        /* The next panel's kc rows are prefetched spread over the block's
         * nt row tiles (tile t: rows [t kc / nt, (t+1) kc / nt), one every
         * nt k): a few rows at a time rather than all in the first tile,
         * which with 32 rows (6 tiles) asked for 16 KiB within 1/6 of the
         * panel's compute. */
        for (int i = 0, h, t = 0; i < mc; i += h, t++) {
          h = panel_h(mc - i);
          int mr = mc - i < h ? mc - i : h;
          float *c = C + (size_t)(m0 + i) * ldc + n0;
          const float *ap = apack + (size_t)i * kc;
          if (nr == NR) {
            int r0 = t * kc / nt, r1 = (t + 1) * kc / nt;
            tile(mr, h, kc, ap, bp, bs, c, ldc, alpha, be, next ? next + (size_t)r0 * bs : NULL,
                 next ? r1 - r0 : 0, nt);
          } else {
            tile_edge(mr, h, kc, ap, bp, bs, c, ldc, nr, alpha, be);
          }
        }
      }
    }
  }
}

AVX2 void dt__gemm_avx2_op(int M, int N, int K, float alpha, const dt__gemm_op *A,
                           const dt__gemm_op *B, float beta, float *C, int ldc) {
  /* B dense along n (not transposed, no row table or segments): its
   * full-width panels are read in place, no copy */
  drive(M, N, K, alpha, A, B, NULL, !B->trans && !B->rowoff && !B->seg, beta, C, ldc);
}

size_t dt__gemm_avx2_packb_floats(int K, int N) {
  return K > 0 && N > 0 ? (size_t)K * ((size_t)(N + NR - 1) / NR * NR) : 0;
}

/* Every panel of B in the driver's order: K block by K block, each a row
 * of N panels of kc x NR. */
AVX2 void dt__gemm_avx2_packb(int K, int N, const dt__gemm_op *B, float *dst) {
  const int kcb = gemm_kblock(K, KC);
  const size_t npad = (size_t)(N + NR - 1) / NR * NR;
  for (int k0 = 0; k0 < K; k0 += kcb) {
    int kc = K - k0 < kcb ? K - k0 : kcb;
    for (int n0 = 0; n0 < N; n0 += NR)
      pack_b(dst + (size_t)k0 * npad + (size_t)n0 * kc, B, k0, kc, n0, N - n0 < NR ? N - n0 : NR);
  }
}

AVX2 void dt__gemm_avx2_op_packed(int M, int N, int K, float alpha, const dt__gemm_op *A,
                                  const float *bp, float beta, float *C, int ldc) {
  drive(M, N, K, alpha, A, NULL, bp, 0, beta, C, ldc);
}

/* ---- dot-product form for short N ------------------------------------- */

enum { DM = 2, DN = 6 };

AVX2 static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

/* out[i*DN + j] = sum_x A(m0+i, x) * B(n0+j, x) for i < DM, j < DN; rows
 * beyond mb / nb repeat the last valid row (their sums are dropped). Each
 * sum is 8 FMA chains (lane l takes x = l mod 8 of each run, the tail of a
 * run masked to zeros) then one fixed horizontal sum: a function of the
 * two rows and of the runs, never of the block. */
AVX2 static void dot_block(const dt__gemm_op *A, int m0, int mb, const dt__gemm_op *B, int n0,
                           int nb, int X, float *out) {
  __m256 acc[DM][DN];
#pragma GCC unroll 2
  for (int i = 0; i < DM; i++)
#pragma GCC unroll 6
    for (int j = 0; j < DN; j++) acc[i][j] = _mm256_setzero_ps();
  int x = 0;
  while (x < X) {
    int ra = op_run(A, x, X - x), rb = op_run(B, x, X - x), run = ra < rb ? ra : rb;
    const float *a[DM], *b[DN];
    for (int i = 0; i < DM; i++) a[i] = A->p + pos_off(A, x) + row_off(A, m0 + (i < mb ? i : mb - 1));
    for (int j = 0; j < DN; j++) b[j] = B->p + pos_off(B, x) + row_off(B, n0 + (j < nb ? j : nb - 1));
    int full = run & ~7;
    for (int q = 0; q < full; q += 8) {
      __m256 va[DM];
#pragma GCC unroll 2
      for (int i = 0; i < DM; i++) va[i] = _mm256_loadu_ps(a[i] + q);
#pragma GCC unroll 6
      for (int j = 0; j < DN; j++) {
        __m256 vb = _mm256_loadu_ps(b[j] + q);
#pragma GCC unroll 2
        for (int i = 0; i < DM; i++) acc[i][j] = _mm256_fmadd_ps(va[i], vb, acc[i][j]);
      }
    }
    if (full < run) {
      __m256i m = lanes(run - full);
      __m256 va[DM];
      for (int i = 0; i < DM; i++) va[i] = _mm256_maskload_ps(a[i] + full, m);
      for (int j = 0; j < DN; j++) {
        __m256 vb = _mm256_maskload_ps(b[j] + full, m);
        for (int i = 0; i < DM; i++) acc[i][j] = _mm256_fmadd_ps(va[i], vb, acc[i][j]);
      }
    }
    x += run;
  }
  for (int i = 0; i < DM; i++)
    for (int j = 0; j < DN; j++) out[i * DN + j] = hsum8(acc[i][j]);
}

AVX2 void dt__gemm_avx2_dot(int M, int N, int X, float alpha, const dt__gemm_op *A,
                            const dt__gemm_op *B, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  float t[DM * DN];
  for (int m0 = 0; m0 < M; m0 += DM) {
    int mb = M - m0 < DM ? M - m0 : DM;
    for (int n0 = 0; n0 < N; n0 += DN) {
      int nb = N - n0 < DN ? N - n0 : DN;
      if (X > 0) dot_block(A, m0, mb, B, n0, nb, X, t);
      else memset(t, 0, sizeof t);
      for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) {
          float *p = C + (size_t)(m0 + i) * ldc + n0 + j;
          float r = alpha * t[i * DN + j];
          /* the tiles' fma(beta, c, r), not left to the compiler's contraction */
          *p = beta == 0.0f ? r : fmaf(beta, *p, r);
        }
    }
  }
}

int dt__gemm_avx2_ok(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

#else /* no x86-64 intrinsics: never called (dt__gemm_avx2_ok is 0) */

void dt__gemm_avx2_op(int M, int N, int K, float alpha, const dt__gemm_op *A,
                      const dt__gemm_op *B, float beta, float *C, int ldc) {
  (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)B; (void)beta; (void)C; (void)ldc;
}
void dt__gemm_avx2_dot(int M, int N, int X, float alpha, const dt__gemm_op *A,
                       const dt__gemm_op *B, float beta, float *C, int ldc) {
  (void)M; (void)N; (void)X; (void)alpha; (void)A; (void)B; (void)beta; (void)C; (void)ldc;
}
int dt__gemm_avx2_ok(void) { return 0; }
size_t dt__gemm_avx2_packb_floats(int K, int N) {
  (void)K; (void)N;
  return 0;
}
void dt__gemm_avx2_packb(int K, int N, const dt__gemm_op *B, float *dst) {
  (void)K; (void)N; (void)B; (void)dst;
}
void dt__gemm_avx2_op_packed(int M, int N, int K, float alpha, const dt__gemm_op *A,
                             const float *bp, float beta, float *C, int ldc) {
  (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)bp; (void)beta; (void)C; (void)ldc;
}

#endif

const dt__gemm_kern dt__gemm_kern_avx2 = {
    .name = "avx2",
    .ok = dt__gemm_avx2_ok,
    .op = dt__gemm_avx2_op,
    .dot = dt__gemm_avx2_dot,
    .packb_floats = dt__gemm_avx2_packb_floats,
    .packb = dt__gemm_avx2_packb,
    .op_packed = dt__gemm_avx2_op_packed,
};

/* ---- A packed once, B dense in place (Winograd's 16 products) ----------
 *
 * src/nn/winograd.c multiplies the same 16 transformed kernels U_xi
 * (M x K, small: 64 x 32 for the CNN) by block after block of transformed
 * inputs (K x N, N ~ 64): packing A on every call (dt__gemm_avx2_op) cost
 * as much as a tenth of the product. Here A is packed once
 * (dt__gemm_avx2_packa, the driver's own panels) and C = A * B (alpha 1,
 * beta 0) runs its tiles over a B read in place (edge panel packed), K in
 * one block (K <= 256). Same tiles, so the same bits as dt__gemm_avx2_op
 * for these shapes. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

size_t dt__gemm_avx2_packa_floats(int M, int K) {
  return M > 0 && K > 0 ? (size_t)(M + 4) * K : 0;
}

AVX2 void dt__gemm_avx2_packa(int M, int K, const float *A, int lda, float *dst) {
  dt__gemm_op a = {.p = A, .trans = 0, .ld = lda};
  pack_a(dst, &a, 0, M, 0, K);
}

AVX2 void dt__gemm_avx2_apacked(int M, int N, int K, const float *ap, const float *B, int ldb,
                                float *C, int ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || K > KC) return;
  _Alignas(64) float bpack[KC * NR];
  int nt = 0;
  for (int i = 0; i < M; i += panel_h(M - i)) nt++;
  for (int n0 = 0; n0 < N; n0 += NR) {
    int nr = N - n0 < NR ? N - n0 : NR;
    if (nr < NR) {
      dt__gemm_op b = {.p = B, .trans = 0, .ld = ldb};
      pack_b(bpack, &b, 0, K, n0, nr);
    }
    const float *bp = nr == NR ? B + n0 : bpack;
    const size_t bs = nr == NR ? (size_t)ldb : NR;
    const float *next = n0 + 2 * NR <= N ? B + n0 + NR : NULL;
    for (int i = 0, h, t = 0; i < M; i += h, t++) {
      h = panel_h(M - i);
      int mr = M - i < h ? M - i : h;
      float *c = C + (size_t)i * ldc + n0;
      const float *ap1 = ap + (size_t)i * K;
      if (nr == NR) {
        int r0 = t * K / nt, r1 = (t + 1) * K / nt;
        tile(mr, h, K, ap1, bp, bs, c, ldc, 1.0f, 0.0f, next ? next + (size_t)r0 * bs : NULL,
             next ? r1 - r0 : 0, nt);
      } else {
        tile_edge(mr, h, K, ap1, bp, bs, c, ldc, nr, 1.0f, 0.0f);
      }
    }
  }
}

#else

size_t dt__gemm_avx2_packa_floats(int M, int K) {
  (void)M; (void)K;
  return 0;
}
void dt__gemm_avx2_packa(int M, int K, const float *A, int lda, float *dst) {
  (void)M; (void)K; (void)A; (void)lda; (void)dst;
}
void dt__gemm_avx2_apacked(int M, int N, int K, const float *ap, const float *B, int ldb,
                           float *C, int ldc) {
  (void)M; (void)N; (void)K; (void)ap; (void)B; (void)ldb; (void)C; (void)ldc;
}

#endif

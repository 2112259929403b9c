/*
 * gemm_avx512.c — single-precision GEMM with AVX-512 (zmm FMA) for the
 * shapes dtrain's layers produce: C(M,N) = alpha * op(A) * op(B) + beta * C,
 * row-major, any transpose, any leading dimensions.
 *
 * Structure (Goto/BLIS): K is cut into blocks of at most KC, M into blocks of
 * at most MC; each A block is packed into MR-row panels laid out k-major
 * ([k][MR]) and each B block into NR-column panels ([k][NR], NR = 3 zmm) —
 * except a dense B stored K x N, whose full-width panels are read in place
 * (rows ldb apart), with the next panel prefetched while the first A panel
 * multiplies the current one (measured, 32 x 2048 x 2048: 22.5 instead of
 * 26.8 ms per 8 products; fewer rows of A leave fewer FMAs to hide B's
 * fetch behind) — so
 * the micro-kernel streams both with unit stride: per k it loads 3 vectors of
 * B, broadcasts 8 values of A and issues 24 independent FMAs into 24 zmm
 * accumulators (8 x 48 tile of C). A B panel (KC x NR, 48 KiB at most) stays
 * in L1 while it is multiplied by every A panel of the block (L2). Edges are
 * zero-padded in the packed panels; partial C tiles go through a small
 * buffer. Operands whose contiguous dimension is K (A not transposed, B
 * transposed) are packed with 16x16 in-register transposes.
 *
 * Besides dense matrices, the B operand may be "implicit": rows (or columns)
 * given by a table of offsets into one array, optionally segmented in blocks
 * of `seg` along the contiguous index. This is im2col on a padded grid
 * without the im2col buffer (see conv2d.c): the conv kernels pack straight
 * from padded image planes.
 *
 * dt__gemm_avx512_dot is the other form for short N (e.g. a weight gradient
 * with 9 columns): C(m, n) = sum_x A(m, x) B(n, x) with both operands
 * contiguous along x, 2 x 12 accumulators of 16 lanes, one horizontal sum per
 * output. No packing, no wasted tile columns.
 *
 * B may also be packed ahead of time into the caller's buffer
 * (dt__gemm_avx512_packb) and used for many products (dt__gemm_avx512_op_packed):
 * a pipeline stage's weights, packed once per step instead of once per
 * micro-batch. The packing buffers live on the stack (at most ~150 KiB);
 * nothing is allocated. gemm_avx2.c is the port of this file to AVX2 +
 * FMA; the operand helpers and the K blocking they share are in
 * gemm_int.h. Everything here is compiled for AVX-512 with target attributes,
 * so the file builds without -march flags; the caller must check the CPU
 * (dt_sgemm does) before calling in. Not here: threading, other precisions.
 */
#include "tensor/gemm_int.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,fma")))

enum { MR = 8, NR = 48, NV = NR / 16, KC = 256, MC = 96 };

/* ---- 16x16 transpose -------------------------------------------------- */

AVX512 static inline void tr16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; j++) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
  for (int j = 0; j < 4; j++) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
  }
}

/* Transposing pack: rows r0..r0+nrows-1 of o (nrows <= 16, contiguous along
 * x), elements x0..x0+len-1, into dst[x][w]: dst + x*W + lane, lanes beyond
 * nrows get zeros. If half is set (W == 8 panels), lanes 0..7 go to dst and
 * lanes 8..15 to dst2. */
AVX512 static void pack_t16(float *dst, float *dst2, int W, int half, const dt__gemm_op *o, int r0,
                            int nrows, int x0, int len) {
  int x = 0;
  while (x < len) {
    int run = op_run(o, x0 + x, len - x);
    const float *src[16], *base = o->p + pos_off(o, x0 + x);
    for (int i = 0; i < 16; i++) src[i] = i < nrows ? base + row_off(o, r0 + i) : NULL;
    for (int j = 0; j < run; j += 16) {
      int n = run - j < 16 ? run - j : 16;
      __mmask16 m = (__mmask16)((1u << n) - 1);
      __m512 v[16];
      for (int i = 0; i < 16; i++)
        v[i] = src[i] ? _mm512_maskz_loadu_ps(m, src[i] + j) : _mm512_setzero_ps();
      tr16(v);
      for (int q = 0; q < n; q++) {
        size_t row = (size_t)(x + j + q) * W;
        if (half) {
          _mm256_storeu_ps(dst + row, _mm512_castps512_ps256(v[q]));
          _mm256_storeu_ps(dst2 + row, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[q]), 1)));
        } else {
          _mm512_storeu_ps(dst + row, v[q]);
        }
      }
    }
    x += run;
  }
}

/* pack_t16 for at most 8 rows into one MR = 8 panel (half set, lanes 8..15
 * not wanted): an 8 x 16 transpose (unpack, shuffle, one two-source
 * permute per two columns) instead of a 16 x 16 one half of zeros, and
 * 256-bit stores of the 8 lanes only. The same panel bytes (rows beyond
 * nrows zero), so the same products: the micro-shards of deterministic
 * mode are 8-row products. */
AVX512 static void pack_t8(float *dst, const dt__gemm_op *o, int r0, int nrows, int x0, int len) {
  const __m512i lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  int x = 0;
  while (x < len) {
    int run = op_run(o, x0 + x, len - x);
    const float *src[8], *base = o->p + pos_off(o, x0 + x);
    for (int i = 0; i < 8; i++) src[i] = i < nrows ? base + row_off(o, r0 + i) : NULL;
    for (int j = 0; j < run; j += 16) {
      int n = run - j < 16 ? run - j : 16;
      __mmask16 m = (__mmask16)((1u << n) - 1);
      __m512 a[8], t[8], r[8];
      for (int i = 0; i < 8; i++)
        a[i] = src[i] ? _mm512_maskz_loadu_ps(m, src[i] + j) : _mm512_setzero_ps();
      for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
      }
      /* r[c] (c < 4): rows 0..3 of column 4L + c in 128-bit lane L; r[4 + c]: rows 4..7 */
      for (int h = 0; h < 2; h++) {
        r[4 * h + 0] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        r[4 * h + 1] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        r[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        r[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
      }
      float *d = dst + (size_t)(x + j) * MR;
      for (int c = 0; c < 4; c++) {
        /* columns c and 4 + c, then 8 + c and 12 + c, each rows 0..7 */
        __m512 p = _mm512_permutex2var_ps(r[c], lo, r[4 + c]);
        __m512 q = _mm512_permutex2var_ps(r[c], hi, r[4 + c]);
        if (c < n) _mm256_storeu_ps(d + (size_t)c * MR, _mm512_castps512_ps256(p));
        if (4 + c < n) _mm256_storeu_ps(d + (size_t)(4 + c) * MR, _mm512_extractf32x8_ps(p, 1));
        if (8 + c < n) _mm256_storeu_ps(d + (size_t)(8 + c) * MR, _mm512_castps512_ps256(q));
        if (12 + c < n) _mm256_storeu_ps(d + (size_t)(12 + c) * MR, _mm512_extractf32x8_ps(q, 1));
      }
    }
    x += run;
  }
}

/* Contiguous pack: element (r, x) for r in [r0, r0+kc) (the K index) and x
 * in [x0, x0+n) into dst[r][W], zero-padded to W. */
AVX512 static void pack_n(float *dst, int W, const dt__gemm_op *o, int r0, int kc, int x0, int n) {
  int x = 0;
  while (x < n) { /* runs of contiguous x (at most a few per panel) */
    int run = op_run(o, x0 + x, n - x);
    const float *base = o->p + pos_off(o, x0 + x);
    int full = run & ~15;
    __mmask16 m = (__mmask16)((1u << (run - full)) - 1);
    for (int k = 0; k < kc; k++) {
      float *d = dst + (size_t)k * W + x;
      const float *s = base + row_off(o, r0 + k);
      for (int j = 0; j < full; j += 16) _mm512_storeu_ps(d + j, _mm512_loadu_ps(s + j));
      if (m) _mm512_mask_storeu_ps(d + full, m, _mm512_maskz_loadu_ps(m, s + full));
    }
    x += run;
  }
  if (n < W)
    for (int k = 0; k < kc; k++)
      for (int j = n; j < W; j++) dst[(size_t)k * W + j] = 0.0f;
}

/* Packs the A block rows [m0, m0+mc) x k [k0, k0+kc) into MR-row panels. */
AVX512 static void pack_a(float *ap, const dt__gemm_op *A, int m0, int mc, int k0, int kc) {
  if (A->trans) { /* stored K x M: rows are k, contiguous along m */
    for (int i = 0; i < mc; i += MR) {
      int n = mc - i < MR ? mc - i : MR;
      pack_n(ap + (size_t)i * kc, MR, A, k0, kc, m0 + i, n);
    }
    return;
  }
  /* stored M x K: rows are m, contiguous along k; 16 rows = 2 panels */
  for (int i = 0; i < mc; i += 16) {
    int n = mc - i < 16 ? mc - i : 16;
    float *p0 = ap + (size_t)i * kc;
    if (MR == 8 && n <= 8) pack_t8(p0, A, m0 + i, n, k0, kc); /* the second panel is unused */
    else pack_t16(p0, p0 + (size_t)MR * kc, MR, 1, A, m0 + i, n, k0, kc);
  }
}

/* Packs one B panel: k [k0, k0+kc) x n [n0, n0+nr) into bp[k][NR]. */
AVX512 static void pack_b(float *bp, const dt__gemm_op *B, int k0, int kc, int n0, int nr) {
  if (!B->trans) { /* stored K x N: rows are k */
    pack_n(bp, NR, B, k0, kc, n0, nr);
    return;
  }
  for (int j = 0; j < NR; j += 16) { /* stored N x K: rows are n */
    int n = nr - j;
    if (n > 16) n = 16;
    if (n <= 0) {
      for (int k = 0; k < kc; k++) _mm512_storeu_ps(bp + (size_t)k * NR + j, _mm512_setzero_ps());
      continue;
    }
    pack_t16(bp + j, NULL, NR, 0, B, n0 + j, n, k0, kc);
  }
}

/* ---- micro-kernel ------------------------------------------------------- */

/* c(MR x NR, ldc) = alpha * ap * bp + beta * c, with beta == 0 meaning "do
 * not read c". */
AVX512 static inline __attribute__((always_inline)) void kernel_pf(
    int kc, const float *restrict ap, const float *restrict bp, size_t bs, float *c, size_t ldc,
    float alpha, float beta, const float *pf) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(bp + 16 * v);
    if (pf) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm_prefetch((const char *)(pf + 16 * v), _MM_HINT_T0);
      pf += bs;
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m512 a = _mm512_set1_ps(ap[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
    ap += MR;
    bp += bs;
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      float *p = c + (size_t)i * ldc + 16 * v;
      __m512 r = alpha == 1.0f ? acc[i][v] : _mm512_mul_ps(va, acc[i][v]);
      if (beta == 1.0f) r = _mm512_add_ps(r, _mm512_loadu_ps(p));
      else if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_loadu_ps(p), r);
      _mm512_storeu_ps(p, r);
    }
}

AVX512 static void kernel(int kc, const float *restrict ap, const float *restrict bp, float *c,
                          size_t ldc, float alpha, float beta) {
  kernel_pf(kc, ap, bp, NR, c, ldc, alpha, beta, NULL);
}

/* The same, prefetching pf's kc x NR panel (the next packed B panel) into
 * L1 while it computes: with B packed ahead of time and few rows of A, the
 * B panels stream from L3 and are used by few A panels, so fetching them is
 * not hidden behind the FMAs unless asked for. */
AVX512 static void kernel_next(int kc, const float *restrict ap, const float *restrict bp,
                               size_t bs, float *c, size_t ldc, float alpha, float beta,
                               const float *pf) {
  kernel_pf(kc, ap, bp, bs, c, ldc, alpha, beta, pf);
}

/* Edge tile: mr x nr of C through a buffer. */
AVX512 static void kernel_edge(int kc, const float *ap, const float *bp, size_t bs, float *c,
                               size_t ldc, int mr, int nr, float alpha, float beta) {
  float t[MR * NR];
  kernel_pf(kc, ap, bp, bs, t, NR, 1.0f, 0.0f, NULL);
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) {
      float r = alpha * t[i * NR + j];
      float *p = c + (size_t)i * ldc + j;
      /* the tiles' fma(beta, c, r), not left to the compiler's contraction */
      *p = beta == 0.0f ? r : fmaf(beta, *p, r);
    }
}

/* ---- driver ----------------------------------------------------------- */

/* The driver; bpre, if not NULL, is B packed by dt__gemm_avx512_packb
 * (then B is not read): the same panels, so the same bits. */
AVX512 static void drive(int M, int N, int K, float alpha, const dt__gemm_op *A,
                         const dt__gemm_op *B, const float *bpre, int direct, float beta, float *C,
                         int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_scale_c(M, N, beta, C, ldc);
    return;
  }
  _Alignas(64) float apack[((MC + MR - 1) / MR) * MR * KC];
  _Alignas(64) float bpack[KC * NR];
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
      for (int n0 = 0; n0 < N; n0 += NR) {
        int nr = N - n0 < NR ? N - n0 : NR;
        const float *bp = bpack, *next = NULL;
        size_t bs = NR;
        if (bpre) {
          bp = bpre + (size_t)k0 * npad + (size_t)n0 * kc;
          next = bp + (size_t)kc * NR;
        } else if (direct && nr == NR) {
          bp = B->p + (size_t)k0 * B->ld + n0;
          bs = (size_t)B->ld;
          next = bp + NR;
        } else {
          pack_b(bpack, B, k0, kc, n0, nr);
        }
        if (n0 + NR >= N) next = NULL;
        for (int i = 0; i < mc; i += MR) {
          int mr = mc - i < MR ? mc - i : MR;
          float *c = C + (size_t)(m0 + i) * ldc + n0;
          const float *ap = apack + (size_t)i * kc;
          if (mr == MR && nr == NR && next && i == 0)
            kernel_next(kc, ap, bp, bs, c, ldc, alpha, be, next);
          else if (mr == MR && nr == NR && bs != NR) kernel_pf(kc, ap, bp, bs, c, ldc, alpha, be, NULL);
          else if (mr == MR && nr == NR) kernel(kc, ap, bp, c, ldc, alpha, be);
          else kernel_edge(kc, ap, bp, bs, c, ldc, mr, nr, alpha, be);
        }
      }
    }
  }
}

AVX512 void dt__gemm_avx512_op(int M, int N, int K, float alpha, const dt__gemm_op *A,
                               const dt__gemm_op *B, float beta, float *C, int ldc) {
  /* B dense along n (not transposed, no row table or segments): its
   * full-width panels are read in place, no copy */
  drive(M, N, K, alpha, A, B, NULL, !B->trans && !B->rowoff && !B->seg, beta, C, ldc);
}

size_t dt__gemm_avx512_packb_floats(int K, int N) {
  return K > 0 && N > 0 ? (size_t)K * ((size_t)(N + NR - 1) / NR * NR) : 0;
}

/* Every panel of B in the driver's order: K block by K block, each a row
 * of N panels of kc x NR. */
AVX512 void dt__gemm_avx512_packb(int K, int N, const dt__gemm_op *B, float *dst) {
  const int kcb = gemm_kblock(K, KC);
  const size_t npad = (size_t)(N + NR - 1) / NR * NR;
  for (int k0 = 0; k0 < K; k0 += kcb) {
    int kc = K - k0 < kcb ? K - k0 : kcb;
    for (int n0 = 0; n0 < N; n0 += NR)
      pack_b(dst + (size_t)k0 * npad + (size_t)n0 * kc, B, k0, kc, n0, N - n0 < NR ? N - n0 : NR);
  }
}

AVX512 void dt__gemm_avx512_op_packed(int M, int N, int K, float alpha, const dt__gemm_op *A,
                                      const float *bp, float beta, float *C, int ldc) {
  drive(M, N, K, alpha, A, NULL, bp, 0, beta, C, ldc);
}

/* ---- dot-product form for short N ------------------------------------- */

enum { DM = 2, DN = 12 };

/* out[i*DN + j] = sum_x A(m0+i, x) * B(n0+j, x) for i < DM, j < DN; rows
 * beyond mb / nb repeat the last valid row (their sums are dropped). */
AVX512 static void dot_block(const dt__gemm_op *A, int m0, int mb, const dt__gemm_op *B, int n0,
                             int nb, int X, float *out) {
  __m512 acc[DM][DN];
#pragma GCC unroll 2
  for (int i = 0; i < DM; i++)
#pragma GCC unroll 12
    for (int j = 0; j < DN; j++) acc[i][j] = _mm512_setzero_ps();
  int x = 0;
  while (x < X) {
    int ra = op_run(A, x, X - x), rb = op_run(B, x, X - x), run = ra < rb ? ra : rb;
    const float *a[DM], *b[DN];
    for (int i = 0; i < DM; i++) a[i] = A->p + pos_off(A, x) + row_off(A, m0 + (i < mb ? i : mb - 1));
    for (int j = 0; j < DN; j++) b[j] = B->p + pos_off(B, x) + row_off(B, n0 + (j < nb ? j : nb - 1));
    for (int q = 0; q < run; q += 16) {
      int n = run - q < 16 ? run - q : 16;
      __mmask16 m = (__mmask16)((1u << n) - 1);
      __m512 va[DM];
#pragma GCC unroll 2
      for (int i = 0; i < DM; i++) va[i] = _mm512_maskz_loadu_ps(m, a[i] + q);
#pragma GCC unroll 12
      for (int j = 0; j < DN; j++) {
        __m512 vb = _mm512_maskz_loadu_ps(m, b[j] + q);
#pragma GCC unroll 2
        for (int i = 0; i < DM; i++) acc[i][j] = _mm512_fmadd_ps(va[i], vb, acc[i][j]);
      }
    }
    x += run;
  }
  for (int i = 0; i < DM; i++)
    for (int j = 0; j < DN; j++) out[i * DN + j] = _mm512_reduce_add_ps(acc[i][j]);
}

AVX512 void dt__gemm_avx512_dot(int M, int N, int X, float alpha, const dt__gemm_op *A,
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

int dt__gemm_avx512_ok(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
}

#else /* no x86-64 intrinsics: the BLAS path is the only one */

void dt__gemm_avx512_op(int M, int N, int K, float alpha, const dt__gemm_op *A,
                        const dt__gemm_op *B, float beta, float *C, int ldc) {
  (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)B; (void)beta; (void)C; (void)ldc;
}
void dt__gemm_avx512_dot(int M, int N, int X, float alpha, const dt__gemm_op *A,
                         const dt__gemm_op *B, float beta, float *C, int ldc) {
  (void)M; (void)N; (void)X; (void)alpha; (void)A; (void)B; (void)beta; (void)C; (void)ldc;
}
int dt__gemm_avx512_ok(void) { return 0; }
size_t dt__gemm_avx512_packb_floats(int K, int N) {
  (void)K; (void)N;
  return 0;
}
void dt__gemm_avx512_packb(int K, int N, const dt__gemm_op *B, float *dst) {
  (void)K; (void)N; (void)B; (void)dst;
}
void dt__gemm_avx512_op_packed(int M, int N, int K, float alpha, const dt__gemm_op *A,
                               const float *bp, float beta, float *C, int ldc) {
  (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)bp; (void)beta; (void)C; (void)ldc;
}

#endif

const dt__gemm_kern dt__gemm_kern_avx512 = {
    .name = "avx512",
    .ok = dt__gemm_avx512_ok,
    .op = dt__gemm_avx512_op,
    .dot = dt__gemm_avx512_dot,
    .packb_floats = dt__gemm_avx512_packb_floats,
    .packb = dt__gemm_avx512_packb,
    .op_packed = dt__gemm_avx512_op_packed,
};

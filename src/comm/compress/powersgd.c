/*
 * powersgd.c — PowerSGD (Vogels et al., 2019) for one bucket: every weight
 * matrix M of the bucket large enough to gain (rank x (rows + cols) below
 * half of rows x cols) is sent as two thin factors: P = M Q is allreduced,
 * orthonormalised, Q = M^T P is allreduced, and M ~ P Q^T (Q kept as r
 * contiguous columns). Q is
 * warm-started from the previous step's (the first comes from the
 * counter-based RNG keyed by seed and matrix, the same on every rank).
 * What is not in such a matrix (biases, small layers) rides dense in the
 * first allreduce. Error feedback keeps M - P Q_local^T, this rank's own
 * share of the approximation, so the bookkeeping is exact.
 *
 * The products are plain loops (rank is small: a few multiply-adds per
 * value); no BLAS, so the comm layer needs no tensor layer.
 * Not here: the residual and scaling of the value (reduce.c).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/compress/compress_int.h"
#include "core/core.h"

void dt__cz_orthonormalize(float *p, int m, int r) {
  double *col = malloc((size_t)m * sizeof *col);
  double *cols = malloc((size_t)m * (size_t)r * sizeof *cols);
  if (!col || !cols) {
    /* cannot allocate: fall back to single precision in place */
    free(col);
    free(cols);
    for (int j = 0; j < r; j++) {
      for (int i2 = 0; i2 < j; i2++) {
        double d = 0;
        for (int i = 0; i < m; i++) d += (double)p[i * r + j] * p[i * r + i2];
        for (int i = 0; i < m; i++) p[i * r + j] -= (float)d * p[i * r + i2];
      }
      double s = 0;
      for (int i = 0; i < m; i++) s += (double)p[i * r + j] * p[i * r + j];
      float f = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
      for (int i = 0; i < m; i++) p[i * r + j] *= f;
    }
    return;
  }
  for (int j = 0; j < r; j++)
    for (int i = 0; i < m; i++) cols[(size_t)j * m + i] = p[(size_t)i * r + j];
  for (int j = 0; j < r; j++) {
    double *v = cols + (size_t)j * m;
    double n0 = 0;
    for (int i = 0; i < m; i++) n0 += v[i] * v[i];
    /* modified Gram-Schmidt, twice ("twice is enough"): ill-conditioned
     * input loses orthogonality in one pass */
    for (int pass = 0; pass < 2; pass++)
      for (int k = 0; k < j; k++) {
        const double *u = cols + (size_t)k * m;
        double d = 0;
        for (int i = 0; i < m; i++) d += v[i] * u[i];
        for (int i = 0; i < m; i++) v[i] -= d * u[i];
      }
    double s = 0;
    for (int i = 0; i < m; i++) s += v[i] * v[i];
    /* what is left is rounding noise of a dependent column: drop it */
    double f = s > 1e-24 * (n0 > 0 ? n0 : 1) && s > 0 ? 1.0 / sqrt(s) : 0.0;
    for (int i = 0; i < m; i++) v[i] *= f;
  }
  for (int j = 0; j < r; j++)
    for (int i = 0; i < m; i++) p[(size_t)i * r + j] = (float)cols[(size_t)j * m + i];
  free(col);
  free(cols);
}

/* The four products of a matrix M (rows x cols, row-major), P (rows x r)
 * and Q (r x cols):
 *   dt__cz_psgd_pmq:  P = M Q (each P[a][j] a dot product of row a and Q_j)
 *   dt__cz_psgd_qmtp: Q = M^T P
 *   dt__cz_psgd_pq:   E = M - P Q^T (the residual) or G = P Q^T (the sum)
 * The portable versions (after #else) go one dot or axpy at a time. The
 * AVX-512 versions block them: up to 8 columns of P/Q at once, so a
 * value of M is loaded once per 8 multiply-adds instead of once per one;
 * Q's partial sums stay in registers across all rows, and E's and G's
 * chunks across all j and 4 rows, instead of being loaded and stored for
 * every row (the axpy loops were bound by those loads and stores: 19.6%
 * of a rank-6 MLP run's CPU samples against 29.5% for the layers' GEMMs;
 * after, 15.5% against 30.9%: bench/RESULTS.md, eighth session). Each
 * output element sees the same fused multiply-adds in the same order as
 * the portable loops (the axpys run over rows a, or columns j, in order;
 * the dot keeps its 16 lane sums and adds them up in lane order), so both
 * give the same bits. */
#if defined(__AVX512F__)
#include <immintrin.h>

static inline __mmask16 tail_mask(int left) {
  return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* P[a*r + j0 + jb] for jb < JB: JB dot products of row a with Q's columns */
static inline __attribute__((always_inline)) void p_block(const float *restrict row,
                                                          const float *restrict Q, int cols,
                                                          float *restrict P, int JB) {
  __m512 acc[8];
  for (int jb = 0; jb < JB; jb++) acc[jb] = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= cols; i += 16) {
    __m512 m = _mm512_loadu_ps(row + i);
    for (int jb = 0; jb < JB; jb++)
      acc[jb] = _mm512_fmadd_ps(m, _mm512_loadu_ps(Q + (size_t)jb * cols + i), acc[jb]);
  }
  for (int jb = 0; jb < JB; jb++) {
    float t[16];
    _mm512_storeu_ps(t, acc[jb]);
    float s = 0;
    for (int l = 0; l < 16; l++) s += t[l];
    const float *b = Q + (size_t)jb * cols;
    for (int k = i; k < cols; k++) s = fmaf(row[k], b[k], s);
    P[jb] = s;
  }
}

void dt__cz_psgd_pmq(const float *M, int rows, int cols, const float *Q, int r, float *P) {
  for (int a = 0; a < rows; a++) {
    const float *row = M + (size_t)a * cols;
    float *pa = P + (size_t)a * r;
    for (int j = 0; j < r; j += 8) {
      const float *qj = Q + (size_t)j * cols;
      switch (r - j >= 8 ? 8 : r - j) {
      case 1: p_block(row, qj, cols, pa + j, 1); break;
      case 2: p_block(row, qj, cols, pa + j, 2); break;
      case 3: p_block(row, qj, cols, pa + j, 3); break;
      case 4: p_block(row, qj, cols, pa + j, 4); break;
      case 5: p_block(row, qj, cols, pa + j, 5); break;
      case 6: p_block(row, qj, cols, pa + j, 6); break;
      case 7: p_block(row, qj, cols, pa + j, 7); break;
      default: p_block(row, qj, cols, pa + j, 8); break;
      }
    }
  }
}

/* Q_j[c..c+32) = sum over rows a of P[a][j] M[a][c..], j in j0..j0+JB */
static inline __attribute__((always_inline)) void q_block(const float *restrict M, int rows,
                                                          int cols, const float *restrict P,
                                                          int r, int j0, int c,
                                                          float *restrict Q, int JB) {
  __mmask16 k0 = tail_mask(cols - c), k1 = cols - c > 16 ? tail_mask(cols - c - 16) : 0;
  __m512 a0[8], a1[8];
  for (int jb = 0; jb < JB; jb++) a0[jb] = a1[jb] = _mm512_setzero_ps();
  for (int a = 0; a < rows; a++) {
    const float *mr = M + (size_t)a * cols + c;
    __m512 m0 = _mm512_maskz_loadu_ps(k0, mr), m1 = _mm512_maskz_loadu_ps(k1, mr + 16);
    const float *pa = P + (size_t)a * r + j0;
    for (int jb = 0; jb < JB; jb++) {
      __m512 p = _mm512_set1_ps(pa[jb]);
      a0[jb] = _mm512_fmadd_ps(p, m0, a0[jb]);
      a1[jb] = _mm512_fmadd_ps(p, m1, a1[jb]);
    }
  }
  for (int jb = 0; jb < JB; jb++) {
    float *q = Q + (size_t)(j0 + jb) * cols + c;
    _mm512_mask_storeu_ps(q, k0, a0[jb]);
    _mm512_mask_storeu_ps(q + 16, k1, a1[jb]);
  }
}

void dt__cz_psgd_qmtp(const float *M, int rows, int cols, const float *P, int r, float *Q) {
  for (int j = 0; j < r; j += 8)
    for (int c = 0; c < cols; c += 32) {
      switch (r - j >= 8 ? 8 : r - j) {
      case 1: q_block(M, rows, cols, P, r, j, c, Q, 1); break;
      case 2: q_block(M, rows, cols, P, r, j, c, Q, 2); break;
      case 3: q_block(M, rows, cols, P, r, j, c, Q, 3); break;
      case 4: q_block(M, rows, cols, P, r, j, c, Q, 4); break;
      case 5: q_block(M, rows, cols, P, r, j, c, Q, 5); break;
      case 6: q_block(M, rows, cols, P, r, j, c, Q, 6); break;
      case 7: q_block(M, rows, cols, P, r, j, c, Q, 7); break;
      default: q_block(M, rows, cols, P, r, j, c, Q, 8); break;
      }
    }
}

/* out = (M ? M : 0) + sgn * P Q^T for NB rows from row a0: each chunk of
 * Q is loaded once for the NB rows; j in order within each element */
static inline __attribute__((always_inline)) void pq_block(const float *M, int a0, int cols,
                                                           const float (*pk)[64], int r,
                                                           const float *Q, float *out, int NB) {
  for (int c = 0; c < cols; c += 16) {
    __mmask16 k = tail_mask(cols - c);
    __m512 e[4];
    for (int b = 0; b < NB; b++)
      e[b] = M ? _mm512_maskz_loadu_ps(k, M + (size_t)(a0 + b) * cols + c) : _mm512_setzero_ps();
    for (int j = 0; j < r; j++) {
      __m512 q = _mm512_maskz_loadu_ps(k, Q + (size_t)j * cols + c);
      for (int b = 0; b < NB; b++) e[b] = _mm512_fmadd_ps(_mm512_set1_ps(pk[b][j]), q, e[b]);
    }
    for (int b = 0; b < NB; b++) _mm512_mask_storeu_ps(out + (size_t)(a0 + b) * cols + c, k, e[b]);
  }
}

/* out = (M ? M : 0) + sgn * P Q^T: the residual (M, sgn = -1) or the
 * decoded sum (no M, sgn = +1); r <= 64 */
void dt__cz_psgd_pq(const float *M, int rows, int cols, const float *P, int r, const float *Q,
                    float sgn, float *out) {
  float pk[4][64];
  for (int a0 = 0; a0 < rows; a0 += 4) {
    int nb = rows - a0 >= 4 ? 4 : rows - a0;
    for (int b = 0; b < nb; b++)
      for (int j = 0; j < r; j++) pk[b][j] = sgn * P[(size_t)(a0 + b) * r + j];
    switch (nb) {
    case 1: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 1); break;
    case 2: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 2); break;
    case 3: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 3); break;
    default: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 4); break;
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* AVX2 (16 registers of 8 lanes): the same blocking with up to 4 columns
 * of P/Q per pass (two registers hold a dot's 16 lane sums), Q's partial
 * sums in 16-column chunks and E's/G's in 8-column chunks; each element
 * sees the same fused multiply-adds in the same order as above. */
static inline __m256i tail8(int left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __attribute__((always_inline)) void p_block(const float *restrict row,
                                                          const float *restrict Q, int cols,
                                                          float *restrict P, int JB) {
  __m256 lo[4], hi[4];
  for (int jb = 0; jb < JB; jb++) lo[jb] = hi[jb] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= cols; i += 16) {
    __m256 m0 = _mm256_loadu_ps(row + i), m1 = _mm256_loadu_ps(row + i + 8);
    for (int jb = 0; jb < JB; jb++) {
      lo[jb] = _mm256_fmadd_ps(m0, _mm256_loadu_ps(Q + (size_t)jb * cols + i), lo[jb]);
      hi[jb] = _mm256_fmadd_ps(m1, _mm256_loadu_ps(Q + (size_t)jb * cols + i + 8), hi[jb]);
    }
  }
  for (int jb = 0; jb < JB; jb++) {
    float t[16];
    _mm256_storeu_ps(t, lo[jb]);
    _mm256_storeu_ps(t + 8, hi[jb]);
    float s = 0;
    for (int l = 0; l < 16; l++) s += t[l];
    const float *b = Q + (size_t)jb * cols;
    for (int k = i; k < cols; k++) s = fmaf(row[k], b[k], s);
    P[jb] = s;
  }
}

void dt__cz_psgd_pmq(const float *M, int rows, int cols, const float *Q, int r, float *P) {
  for (int a = 0; a < rows; a++) {
    const float *row = M + (size_t)a * cols;
    float *pa = P + (size_t)a * r;
    for (int j = 0; j < r; j += 4) {
      const float *qj = Q + (size_t)j * cols;
      switch (r - j >= 4 ? 4 : r - j) {
      case 1: p_block(row, qj, cols, pa + j, 1); break;
      case 2: p_block(row, qj, cols, pa + j, 2); break;
      case 3: p_block(row, qj, cols, pa + j, 3); break;
      default: p_block(row, qj, cols, pa + j, 4); break;
      }
    }
  }
}

/* Q_j[c..c+16) = sum over rows a of P[a][j] M[a][c..], j in j0..j0+JB */
static inline __attribute__((always_inline)) void q_block(const float *restrict M, int rows,
                                                          int cols, const float *restrict P,
                                                          int r, int j0, int c,
                                                          float *restrict Q, int JB) {
  __m256i k0 = tail8(cols - c), k1 = tail8(cols - c - 8);
  __m256 a0[4], a1[4];
  for (int jb = 0; jb < JB; jb++) a0[jb] = a1[jb] = _mm256_setzero_ps();
  for (int a = 0; a < rows; a++) {
    const float *mr = M + (size_t)a * cols + c;
    __m256 m0 = _mm256_maskload_ps(mr, k0), m1 = _mm256_maskload_ps(mr + 8, k1);
    const float *pa = P + (size_t)a * r + j0;
    for (int jb = 0; jb < JB; jb++) {
      __m256 p = _mm256_set1_ps(pa[jb]);
      a0[jb] = _mm256_fmadd_ps(p, m0, a0[jb]);
      a1[jb] = _mm256_fmadd_ps(p, m1, a1[jb]);
    }
  }
  for (int jb = 0; jb < JB; jb++) {
    float *q = Q + (size_t)(j0 + jb) * cols + c;
    _mm256_maskstore_ps(q, k0, a0[jb]);
    _mm256_maskstore_ps(q + 8, k1, a1[jb]);
  }
}

void dt__cz_psgd_qmtp(const float *M, int rows, int cols, const float *P, int r, float *Q) {
  for (int j = 0; j < r; j += 4)
    for (int c = 0; c < cols; c += 16) {
      switch (r - j >= 4 ? 4 : r - j) {
      case 1: q_block(M, rows, cols, P, r, j, c, Q, 1); break;
      case 2: q_block(M, rows, cols, P, r, j, c, Q, 2); break;
      case 3: q_block(M, rows, cols, P, r, j, c, Q, 3); break;
      default: q_block(M, rows, cols, P, r, j, c, Q, 4); break;
      }
    }
}

/* out = (M ? M : 0) + sgn * P Q^T for NB rows from row a0 (as above) */
static inline __attribute__((always_inline)) void pq_block(const float *M, int a0, int cols,
                                                           const float (*pk)[64], int r,
                                                           const float *Q, float *out, int NB) {
  for (int c = 0; c < cols; c += 8) {
    __m256i k = tail8(cols - c);
    __m256 e[4];
    for (int b = 0; b < NB; b++)
      e[b] = M ? _mm256_maskload_ps(M + (size_t)(a0 + b) * cols + c, k) : _mm256_setzero_ps();
    for (int j = 0; j < r; j++) {
      __m256 q = _mm256_maskload_ps(Q + (size_t)j * cols + c, k);
      for (int b = 0; b < NB; b++) e[b] = _mm256_fmadd_ps(_mm256_set1_ps(pk[b][j]), q, e[b]);
    }
    for (int b = 0; b < NB; b++) _mm256_maskstore_ps(out + (size_t)(a0 + b) * cols + c, k, e[b]);
  }
}

void dt__cz_psgd_pq(const float *M, int rows, int cols, const float *P, int r, const float *Q,
                    float sgn, float *out) {
  float pk[4][64];
  for (int a0 = 0; a0 < rows; a0 += 4) {
    int nb = rows - a0 >= 4 ? 4 : rows - a0;
    for (int b = 0; b < nb; b++)
      for (int j = 0; j < r; j++) pk[b][j] = sgn * P[(size_t)(a0 + b) * r + j];
    switch (nb) {
    case 1: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 1); break;
    case 2: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 2); break;
    case 3: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 3); break;
    default: pq_block(M, a0, cols, (const float(*)[64])pk, r, Q, out, 4); break;
    }
  }
}
#else
/* The portable products: the same chains of fused multiply-adds as the
 * AVX-512 kernels (explicit fmaf, so the bits do not depend on whether the
 * compiler contracts; one instruction where the CPU has FMA), hence the
 * same bits on every machine. */
static float dot(const float *restrict a, const float *restrict b, int n) {
  float acc[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
  float s = 0;
  for (int l = 0; l < 16; l++) s += acc[l];
  for (; i < n; i++) s = fmaf(a[i], b[i], s);
  return s;
}

static void axpy(float *restrict y, const float *restrict x, float a, int n) {
  for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

void dt__cz_psgd_pmq(const float *M, int rows, int cols, const float *Q, int r, float *P) {
  for (int a = 0; a < rows; a++) {
    const float *row = M + (size_t)a * cols;
    for (int j = 0; j < r; j++) P[(size_t)a * r + j] = dot(row, Q + (size_t)j * cols, cols);
  }
}

void dt__cz_psgd_qmtp(const float *M, int rows, int cols, const float *P, int r, float *Q) {
  memset(Q, 0, (size_t)cols * r * sizeof *Q);
  for (int a = 0; a < rows; a++) {
    const float *row = M + (size_t)a * cols;
    for (int j = 0; j < r; j++) axpy(Q + (size_t)j * cols, row, P[(size_t)a * r + j], cols);
  }
}

void dt__cz_psgd_pq(const float *M, int rows, int cols, const float *P, int r, const float *Q,
                    float sgn, float *out) {
  for (int a = 0; a < rows; a++) {
    float *e = out + (size_t)a * cols;
    if (M) memcpy(e, M + (size_t)a * cols, (size_t)cols * sizeof *e);
    else memset(e, 0, (size_t)cols * sizeof *e);
    for (int j = 0; j < r; j++) axpy(e, Q + (size_t)j * cols, sgn * P[(size_t)a * r + j], cols);
  }
}
#endif

static int pays(const dt_cz_matrix *mt, int r) {
  return (double)r * (mt->rows + mt->cols) * 2 < (double)mt->rows * mt->cols;
}

/* The sum of buf[0..len) over the ranks, in place, the same bits on every
 * rank. Small vectors (len x 4 x ranks <= 64 KiB, where allgather is a
 * direct exchange) go by one allgather and are summed here in rank order:
 * one round in which every rank must be scheduled, where the allreduce's
 * recursive doubling takes three for 3 ranks (fold, exchange, unfold).
 * Larger ones by allreduce. */
#define SUM_DIRECT_MAX (64 << 10)
static int sum_ranks(dt_compress *z, dt_comm *c, float *buf, size_t len) {
  size_t N = (size_t)z->nranks;
  if (N == 1 || len == 0) return DT_OK;
  if (len * sizeof(float) * N > SUM_DIRECT_MAX)
    return dt_comm_allreduce(c, buf, buf, len, DT_F32, DT_OP_SUM);
  size_t need = len * sizeof(float) * N;
  if (z->frames_cap < need) {
    uint8_t *f = realloc(z->frames, need);
    if (!f) return dt__seterr(DT_ENOMEM, "powersgd: out of memory for %zu bytes", need);
    z->frames = f;
    z->frames_cap = need;
  }
  float *all = (float *)z->frames;
  int rc = dt_comm_allgather(c, buf, all, len, DT_F32);
  if (rc < 0) return rc;
  memcpy(buf, all, len * sizeof *buf);
  for (size_t r = 1; r < N; r++) {
    const float *restrict a = all + r * len;
    float *restrict b = buf;
    for (size_t i = 0; i < len; i++) b[i] += a[i];
  }
  return DT_OK;
}

/* The next step's Q: this step's summed Q with each column scaled to unit
 * length. Q = M^T P carries M's magnitude, so warm-started as it was, the
 * next P = M Q grew like |M|^2 and overflowed for |M| ~ 1e19 (the sum
 * was NaN though every gradient was finite). P is orthonormalised, which
 * undoes any positive scaling of its columns, so this changes P only by
 * rounding; a zero column (dropped as dependent) stays zero. */
static void warm_start(float *restrict dst, const float *restrict Q, int cols, int r) {
  for (int j = 0; j < r; j++) {
    const float *q = Q + (size_t)j * cols;
    double s = 0;
    for (int i = 0; i < cols; i++) s += (double)q[i] * q[i];
    double f = s > 0 && s <= DBL_MAX ? 1.0 / sqrt(s) : 0.0;
    for (int i = 0; i < cols; i++) dst[(size_t)j * cols + i] = (float)(q[i] * f);
  }
}

int dt__cz_powersgd_reduce(dt_compress *z, dt_comm *c, float *g, size_t off, size_t n) {
  /* the warm rank for the first steps (dist.powersgd_warm_rank), then the
   * rank: Q keeps the larger count of columns, and a step at the lower
   * rank warm-starts from Q's first ones (the subspace iteration keeps
   * its leading columns a subspace iteration of their own) */
  const int r = z->cfg.warm_rank > 0 && z->step < z->cfg.warm_steps ? z->cfg.warm_rank : z->cfg.rank;
  float *w = z->work + off;
  float *resid = z->resid ? z->resid + off : NULL;
  /* the matrices inside this span that gain */
  int m0 = 0, m1;
  while (m0 < z->nmats && z->mats[m0].off < off) m0++;
  m1 = m0;
  size_t plen = 0, qlen = 0, inmat = 0;
  while (m1 < z->nmats && z->mats[m1].off + (size_t)z->mats[m1].rows * z->mats[m1].cols <= off + n) {
    if (pays(&z->mats[m1], r)) {
      plen += (size_t)z->mats[m1].rows * r;
      qlen += (size_t)z->mats[m1].cols * r;
      inmat += (size_t)z->mats[m1].rows * z->mats[m1].cols;
    }
    m1++;
  }
  size_t dense = n - inmat;
  /* P, the dense rest, rank 0's checkpoint note (one float), Q */
  size_t need = (plen + dense + 1 + qlen) * sizeof(float);
  if (z->pq_cap < need) {
    float *q = realloc(z->pq, need);
    if (!q) return dt__seterr(DT_ENOMEM, "powersgd: out of memory for %zu bytes", need);
    z->pq = q;
    z->pq_cap = need;
  }
  float *pbuf = z->pq, *dbuf = z->pq + plen, *note = z->pq + plen + dense, *qbuf = note + 1;
  /* P = M Q for each matrix; the rest of the span into dbuf, in order */
  size_t at = 0, pat = 0, dat = 0;
  for (int i = m0; i < m1; i++) {
    const dt_cz_matrix *mt = &z->mats[i];
    if (!pays(mt, r)) continue;
    size_t lo = mt->off - off;
    memcpy(dbuf + dat, w + at, (lo - at) * sizeof *w);
    dat += lo - at;
    const float *M = w + lo, *Q = z->q[i];
    float *P = pbuf + pat;
    dt__cz_psgd_pmq(M, mt->rows, mt->cols, Q, r, P);
    pat += (size_t)mt->rows * r;
    at = lo + (size_t)mt->rows * mt->cols;
  }
  memcpy(dbuf + dat, w + at, (n - at) * sizeof *w);
  *note = z->note_out ? 1.0f : 0.0f;
  int rc = sum_ranks(z, c, z->pq, plen + dense + 1);
  if (rc < 0) return dt__seterr(rc, "powersgd P: %s", dt_comm_errmsg(c));
  if (*note != 0.0f) z->note_in = 1;
  /* Q = M^T P (P orthonormal); the local share's error feeds back */
  pat = 0;
  size_t qat = 0;
  for (int i = m0; i < m1; i++) {
    const dt_cz_matrix *mt = &z->mats[i];
    if (!pays(mt, r)) continue;
    float *P = pbuf + pat, *Q = qbuf + qat;
    dt__cz_orthonormalize(P, mt->rows, r);
    const float *M = w + (mt->off - off);
    dt__cz_psgd_qmtp(M, mt->rows, mt->cols, P, r, Q);
    if (resid) dt__cz_psgd_pq(M, mt->rows, mt->cols, P, r, Q, -1.0f, resid + (mt->off - off));
    pat += (size_t)mt->rows * r;
    qat += (size_t)mt->cols * r;
  }
  if (qlen) {
    rc = sum_ranks(z, c, qbuf, qlen);
    if (rc < 0) return dt__seterr(rc, "powersgd Q: %s", dt_comm_errmsg(c));
  }
  z->st.bytes_sent += (plen + dense + 1 + qlen) * sizeof(float);
  /* the sum: P Q_sum^T in the matrices, the dense values elsewhere; the
   * dense part was sent exactly, so its residual is 0 */
  at = dat = pat = qat = 0;
  for (int i = m0; i < m1; i++) {
    const dt_cz_matrix *mt = &z->mats[i];
    if (!pays(mt, r)) continue;
    size_t lo = mt->off - off;
    memcpy(g + at, dbuf + dat, (lo - at) * sizeof *g);
    if (resid) memset(resid + at, 0, (lo - at) * sizeof *resid);
    dat += lo - at;
    const float *P = pbuf + pat, *Q = qbuf + qat;
    float *G = g + lo;
    dt__cz_psgd_pq(NULL, mt->rows, mt->cols, P, r, Q, 1.0f, G);
    warm_start(z->q[i], Q, mt->cols, r);
    pat += (size_t)mt->rows * r;
    qat += (size_t)mt->cols * r;
    at = lo + (size_t)mt->rows * mt->cols;
  }
  memcpy(g + at, dbuf + dat, (n - at) * sizeof *g);
  if (resid) memset(resid + at, 0, (n - at) * sizeof *resid);
  return DT_OK;
}

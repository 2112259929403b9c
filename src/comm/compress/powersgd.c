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

/* Q is kept as r contiguous columns (r x cols), so both products are dot
 * products and axpys over contiguous rows that vectorise. */
static float dot(const float *restrict a, const float *restrict b, int n) {
  float acc[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (int l = 0; l < 16; l++) s += acc[l];
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

static void axpy(float *restrict y, const float *restrict x, float a, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

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

int dt__cz_powersgd_reduce(dt_compress *z, dt_comm *c, float *g, size_t off, size_t n) {
  const int r = z->cfg.rank;
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
    for (int a = 0; a < mt->rows; a++) {
      const float *row = M + (size_t)a * mt->cols;
      for (int j = 0; j < r; j++) P[(size_t)a * r + j] = dot(row, Q + (size_t)j * mt->cols, mt->cols);
    }
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
    memset(Q, 0, (size_t)mt->cols * r * sizeof *Q);
    for (int a = 0; a < mt->rows; a++) {
      const float *row = M + (size_t)a * mt->cols;
      for (int j = 0; j < r; j++) axpy(Q + (size_t)j * mt->cols, row, P[(size_t)a * r + j], mt->cols);
    }
    if (resid) {
      float *E = resid + (mt->off - off);
      for (int a = 0; a < mt->rows; a++) {
        float *e = E + (size_t)a * mt->cols;
        memcpy(e, M + (size_t)a * mt->cols, (size_t)mt->cols * sizeof *e);
        for (int j = 0; j < r; j++) axpy(e, Q + (size_t)j * mt->cols, -P[(size_t)a * r + j], mt->cols);
      }
    }
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
    for (int a = 0; a < mt->rows; a++) {
      float *gr = G + (size_t)a * mt->cols;
      memset(gr, 0, (size_t)mt->cols * sizeof *gr);
      for (int j = 0; j < r; j++) axpy(gr, Q + (size_t)j * mt->cols, P[(size_t)a * r + j], mt->cols);
    }
    memcpy(z->q[i], Q, (size_t)mt->cols * r * sizeof *Q); /* warm start */
    pat += (size_t)mt->rows * r;
    qat += (size_t)mt->cols * r;
    at = lo + (size_t)mt->rows * mt->cols;
  }
  memcpy(g + at, dbuf + dat, (n - at) * sizeof *g);
  if (resid) memset(resid + at, 0, (n - at) * sizeof *resid);
  return DT_OK;
}

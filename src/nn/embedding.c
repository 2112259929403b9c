/*
 * embedding.c — the embedding kernel: rows of a (V, D) table looked up by
 * integer index, as torch.nn.functional.embedding. Backward scatters the
 * output gradient into the rows that were read, so the weight gradient is
 * nonzero only on the batch's rows; dt_embedding_rows lists them (sorted,
 * unique), which is what a parameter server pushes and pulls for this layer
 * (sparse rows, docs/ps.md).
 *
 * Also the `dot` layer's kernels (the inner product of a sample's two
 * halves, matrix factorisation's user . item, plus a bias), which the
 * recommender workload puts after an embedding (docs/ps.md).
 *
 * It does not check indices in the hot loop (dt_embedding_check and
 * dt_embedding_ids do, once per batch, naming the first bad one); the layer
 * itself (the model spec's `embedding(V,D)`) is in model.c.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/kernels.h"

int dt_embedding_check(const int32_t *idx, int N, int V) {
  for (int i = 0; i < N; i++)
    if (idx[i] < 0 || idx[i] >= V)
      return dt__seterr(DT_EINVAL, "embedding: index %d at position %d is outside the table of "
                        "%d rows", idx[i], i, V);
  return DT_OK;
}

void dt_embedding_forward(float *out, const int32_t *idx, const float *weight, int N, int D) {
  for (int i = 0; i < N; i++)
    memcpy(out + (size_t)i * D, weight + (size_t)idx[i] * D, (size_t)D * sizeof(float));
}

void dt_embedding_backward(float *dweight, const float *dout, const int32_t *idx, int N, int V,
                           int D) {
  memset(dweight, 0, (size_t)V * D * sizeof(float));
  for (int i = 0; i < N; i++) {
    float *restrict dw = dweight + (size_t)idx[i] * D;
    const float *restrict g = dout + (size_t)i * D;
    for (int d = 0; d < D; d++) dw[d] += g[d];
  }
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int dt_embedding_rows(const int32_t *idx, int N, int32_t *rows) {
  if (N <= 0) return 0;
  memcpy(rows, idx, (size_t)N * sizeof *rows);
  qsort(rows, (size_t)N, sizeof *rows, cmp_i32);
  int n = 1;
  for (int i = 1; i < N; i++)
    if (rows[i] != rows[n - 1]) rows[n++] = rows[i];
  return n;
}

void dt_embedding_backward_add(float *dweight, const float *dout, const int32_t *idx, int N,
                               int D) {
  for (int i = 0; i < N; i++) {
    float *restrict dw = dweight + (size_t)idx[i] * D;
    const float *restrict g = dout + (size_t)i * D;
    for (int d = 0; d < D; d++) dw[d] += g[d];
  }
}

int dt_embedding_ids(int32_t *idx, const float *x, int N, int V) {
  for (int i = 0; i < N; i++) {
    float v = x[i];
    if (!(v >= 0.0f && v < (float)V) || v != (float)(int32_t)v)
      return dt__seterr(DT_EINVAL, "embedding: id %d of the batch is %g, not a row of the "
                        "table of %d rows", i, (double)v, V);
    idx[i] = (int32_t)v;
  }
  return DT_OK;
}

void dt_dot_forward(float *out, const float *x, float bias, int B, int D) {
  for (int b = 0; b < B; b++) {
    const float *u = x + (size_t)b * 2 * D, *v = u + D;
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += u[d] * v[d];
    out[b] = s + bias;
  }
}

void dt_dot_backward(float *dinp, float *dbias, const float *dout, const float *x, int B, int D) {
  float db = 0.0f;
  for (int b = 0; b < B; b++) {
    const float *u = x + (size_t)b * 2 * D, *v = u + D;
    const float g = dout[b];
    db += g;
    if (!dinp) continue;
    float *du = dinp + (size_t)b * 2 * D, *dv = du + D;
    for (int d = 0; d < D; d++) du[d] = g * v[d], dv[d] = g * u[d];
  }
  *dbias = db;
}

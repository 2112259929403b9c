/*
 * embedding.c — the embedding kernel: rows of a (V, D) table looked up by
 * integer index, as torch.nn.functional.embedding. Backward scatters the
 * output gradient into the rows that were read, so the weight gradient is
 * nonzero only on the batch's rows; dt_embedding_rows lists them (sorted,
 * unique), which is what a parameter server pushes and pulls for this layer
 * (sparse rows, docs/ps.md).
 *
 * It does not check indices in the hot loop (dt_embedding_check does, once
 * per batch, naming the first bad one) and is not yet a layer of the model
 * spec: the kernel and its PyTorch golden test come first.
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

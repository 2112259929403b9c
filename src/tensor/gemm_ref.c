/*
 * gemm_ref.c — the portable GEMM with a fixed summation order, used for
 * every shape when a caller asks for DT_GEMM_FIXED on a CPU without our
 * AVX-512 or AVX2 kernels (or with DTRAIN_GEMM=blas). Each element is
 *   c = beta * c (0 when beta == 0), then c += (alpha * a_ik) * b_kj for
 *   k = 0, 1, ..., K-1, in that order,
 * so the result depends only on this binary, never on which CPU runs it or
 * on OpenBLAS's kernel choice (OPENBLAS_CORETYPE). It is plain C the
 * compiler may vectorise across j (each element's own order does not
 * change); it does not tile, block or allocate, and is not fast.
 */
#include "tensor/tensor.h"

#include <stddef.h>

static inline float a_at(int ta, const float *A, int lda, int i, int k) {
  return ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
}

void dt__sgemm_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  for (int i = 0; i < M; i++) {
    float *restrict c = C + (size_t)i * ldc;
    for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    if (K <= 0) continue;
    if (!tb) {
      for (int k = 0; k < K; k++) {
        const float aik = alpha * a_at(ta, A, lda, i, k);
        const float *restrict b = B + (size_t)k * ldb;
        for (int j = 0; j < N; j++) c[j] += aik * b[j];
      }
    } else {
      for (int j = 0; j < N; j++) {
        const float *restrict b = B + (size_t)j * ldb;
        float acc = c[j];
        for (int k = 0; k < K; k++) acc += (alpha * a_at(ta, A, lda, i, k)) * b[k];
        c[j] = acc;
      }
    }
  }
}

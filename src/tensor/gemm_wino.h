/*
 * gemm_wino.h — the AVX2 products with A packed once (gemm_avx2.c, end of
 * the file), for src/nn/winograd.c: C(M,N) = A(M,K) * B(K,N), B dense
 * (row-major, ldb) read in place, K <= 256, beta 0. Callers check
 * dt__gemm_avx2_ok() first.
 */
#ifndef DT_TENSOR_GEMM_WINO_H
#define DT_TENSOR_GEMM_WINO_H

#include <stddef.h>

size_t dt__gemm_avx2_packa_floats(int M, int K);
void dt__gemm_avx2_packa(int M, int K, const float *A, int lda, float *dst);
void dt__gemm_avx2_apacked(int M, int N, int K, const float *ap, const float *B, int ldb,
                           float *C, int ldc);

#endif

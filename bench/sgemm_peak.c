/*
 * sgemm_peak.c — measures the single-threaded sgemm rate on this machine:
 * OpenBLAS through CBLAS (as the environment configures it) and dtrain's own
 * dt_sgemm (its AVX-512 kernels where the CPU has them). These are the
 * practical ceilings for GEMM-bound layers. Prints "sgemm_gflops <median>"
 * (OpenBLAS) and "dt_sgemm_gflops <median> <impl>" for `make bench`.
 * Usage: sgemm_peak [M N K] (default 1024 1024 1024)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"
#include "tensor/tensor.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int M = 1024, N = 1024, K = 1024;
  if (argc == 4) {
    M = atoi(argv[1]);
    N = atoi(argv[2]);
    K = atoi(argv[3]);
  }
  openblas_set_num_threads(1);
  float *A = dt_alloc((size_t)M * K * 4), *B = dt_alloc((size_t)K * N * 4), *C = dt_alloc((size_t)M * N * 4);
  if (!A || !B || !C) return 1;
  dt_rng_uniform(A, (size_t)M * K, -1, 1, 1, DT_RNG_USER, 0);
  dt_rng_uniform(B, (size_t)K * N, -1, 1, 1, DT_RNG_USER, 1);
  for (int which = 0; which < 2; which++) {
    double rates[9];
    for (int r = 0; r < 9; r++) {
      int reps = 0;
      double t0 = dt_now(), t;
      do {
        if (which == 0)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
        else
          dt_sgemm(0, 0, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
        reps++;
        t = dt_now() - t0;
      } while (t < 0.2);
      rates[r] = 2.0 * M * N * K * reps / t * 1e-9;
    }
    qsort(rates, 9, sizeof rates[0], cmp);
    if (which == 0)
      printf("sgemm_gflops %.1f %s\n", rates[4], dt_tensor_blas_core());
    else
      printf("dt_sgemm_gflops %.1f %s\n", rates[4], dt_tensor_gemm_impl());
  }
  dt_free(A);
  dt_free(B);
  dt_free(C);
  return 0;
}

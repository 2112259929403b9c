/*
 * gemm.c — the CBLAS (OpenBLAS) GEMM wrapper and thread control. Row-major
 * only; this file does not pick algorithms or tile anything itself.
 */
#include "tensor/tensor.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

/* OpenBLAS DYNAMIC_ARCH entry points; weak so other builds still link. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

void dt_tensor_set_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

const char *dt_tensor_blas_core(void) { return openblas_get_corename(); }

int dt_tensor_blas_underpowered(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")))
    return 0;
  const char *core = openblas_get_corename();
  if (!core) return 0;
  static const char *const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
  for (size_t i = 0; i < sizeof avx512 / sizeof avx512[0]; i++)
    if (strcasecmp(core, avx512[i]) == 0) return 0;
  return 1;
#else
  return 0;
#endif
}

int dt_tensor_blas_upgrade(int override_env) {
  if ((getenv("OPENBLAS_CORETYPE") && !override_env) || !dt_tensor_blas_underpowered()) return 0;
  if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) return 0;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  return dt_tensor_blas_underpowered() ? 0 : 1;
}

void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    /* CBLAS leaves C untouched when K == 0 in some builds; define it. */
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/*
 * gemm.c — dt_sgemm: the choice between the CBLAS (OpenBLAS) back end and
 * our AVX-512 kernels (gemm_avx512.c), or with DT_GEMM_FIXED between our
 * AVX-512 and portable (gemm_ref.c) kernels, plus OpenBLAS thread control.
 * Row-major only; this file does not tile anything itself.
 */
#include "tensor/tensor.h"

#include "core/core.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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

void dt__sgemm_blas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
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

/* The back-end choice is a per-process tuning knob (like OpenBLAS's own
 * kernel choice): resolved once from the CPU and DTRAIN_GEMM, then only read.
 * 0 = not yet resolved, 1 = blas, 2 = avx512. */
static _Atomic int gemm_choice;

int dt__gemm_use_avx512(void) {
  int c = atomic_load_explicit(&gemm_choice, memory_order_relaxed);
  if (c == 0) {
    const char *env = dt_param_s(DT_PARAM_GEMM);
    int want = dt__gemm_avx512_ok();
    if (env && strcmp(env, "blas") == 0) want = 0;
    else if (env && strcmp(env, "avx512") != 0)
      dt_log(DT_LOG_WARN, "environment DTRAIN_GEMM=%s is not blas or avx512; ignored", env);
    c = want ? 2 : 1;
    atomic_store_explicit(&gemm_choice, c, memory_order_relaxed);
  }
  return c == 2;
}

const char *dt_tensor_gemm_impl(void) { return dt__gemm_use_avx512() ? "avx512" : "blas"; }

void dt_sgemm_f(int flags, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
  int avx = dt__gemm_use_avx512();
  if (flags & DT_GEMM_FIXED) {
    /* Every floating-point sum ours: no CBLAS, whatever the shape. */
    if (avx) dt__sgemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else dt__sgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  /* N < 16 fills less than a third of the 48-wide register tile; OpenBLAS's
   * narrow kernels win there (measured: 64x10x128 NT, bench_kernels). */
  if (avx && N >= 16)
    dt__sgemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    dt__sgemm_blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  dt_sgemm_f(0, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

size_t dt_sgemm_packb_floats(int tb, int K, int N) {
  (void)tb;
  /* the shapes dt_sgemm_f(0, ...) sends to the AVX-512 kernels */
  return dt__gemm_use_avx512() && N >= 16 ? dt__gemm_packb_floats(K, N) : 0;
}

void dt_sgemm_packb(int tb, int K, int N, const float *B, int ldb, float *dst) {
  dt__gemm_op b = {.p = B, .trans = tb, .ld = ldb};
  dt__gemm_avx512_packb(K, N, &b, dst);
}

void dt_sgemm_packed(int M, int N, int K, float alpha, const float *A, int lda, const float *Bp,
                     float beta, float *C, int ldc) {
  dt__gemm_op a = {.p = A, .trans = 0, .ld = lda};
  dt__gemm_avx512_op_packed(M, N, K, alpha, &a, Bp, beta, C, ldc);
}

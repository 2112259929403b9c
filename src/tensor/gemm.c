/*
 * gemm.c — dt_sgemm: the choice between the CBLAS (OpenBLAS) back end and
 * our own kernels (gemm_avx512.c, else gemm_avx2.c: dt__gemm_own), or with
 * DT_GEMM_FIXED between our kernels and the portable one (gemm_ref.c),
 * plus OpenBLAS thread control. Row-major only; this file does not tile
 * anything itself.
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
 * 0 = not yet resolved, 1 = blas, 2 = avx2, 3 = avx512. */
static _Atomic int gemm_choice;

static int resolve_choice(void) {
  const int best = dt__gemm_avx512_ok() ? 3 : dt__gemm_avx2_ok() ? 2 : 1;
  const char *env = dt_param_s(DT_PARAM_GEMM);
  if (!env) return best;
  if (strcmp(env, "blas") == 0) return 1;
  int want = strcmp(env, "avx512") == 0 ? 3 : strcmp(env, "avx2") == 0 ? 2 : 0;
  if (!want) {
    dt_log(DT_LOG_WARN, "environment DTRAIN_GEMM=%s is not blas, avx2 or avx512; ignored", env);
    return best;
  }
  if (want > best) { /* avx512 on an AVX2 CPU, or ours on a CPU with neither */
    dt_log(DT_LOG_WARN, "DTRAIN_GEMM=%s: this CPU cannot run those kernels; using blas", env);
    return 1;
  }
  return want;
}

const dt__gemm_kern *dt__gemm_own(void) {
  int c = atomic_load_explicit(&gemm_choice, memory_order_relaxed);
  if (c == 0) {
    c = resolve_choice();
    atomic_store_explicit(&gemm_choice, c, memory_order_relaxed);
  }
  return c == 3 ? &dt__gemm_kern_avx512 : c == 2 ? &dt__gemm_kern_avx2 : NULL;
}

const char *dt_tensor_gemm_impl(void) {
  const dt__gemm_kern *k = dt__gemm_own();
  return k ? k->name : "blas";
}

void dt__sgemm_kern(const dt__gemm_kern *k, int ta, int tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  dt__gemm_op a = {.p = A, .trans = ta, .ld = lda};
  dt__gemm_op b = {.p = B, .trans = tb, .ld = ldb};
  k->op(M, N, K, alpha, &a, &b, beta, C, ldc);
}

/* Normal mode: the shapes our kernels k run faster than OpenBLAS (one
 * thread, bench_kernels). N < 16 fills less than a third of the 48-wide
 * AVX-512 tile; OpenBLAS's narrow kernels win there (measured: 64x10x128
 * NT). The AVX2 kernels match or beat OpenBLAS (Zen core) up to ~128 rows
 * and on short K (K <= 256: the layers' weight gradients, 1.1-1.3x), but
 * lose ~20% on large products (512^3; 256 x 2048 x 2048: 59-70 against
 * 77-89 GFLOP/s; 32 x 2048 x 2048 NN: 49-54 against 55-64), where their
 * one-level blocking streams B from memory once per block of rows. The
 * deep MLP's 2048 x 2048 weight gradients (K = 256 rows, dY^T X) are one of
 * those: 79-81 against 85-87 GFLOP/s (2048 x 784: equal, 86-89). */
static int own_wins(const dt__gemm_kern *k, int M, int N, int K) {
  if (!k || N < 16) return 0;
  if (k == &dt__gemm_kern_avx2)
    return (K <= 256 && !(M > 128 && N >= 2048 && K >= 128)) || (M <= 128 && N <= 1024);
  return 1;
}

void dt_sgemm_f(int flags, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
  const dt__gemm_kern *k = dt__gemm_own();
  if (flags & DT_GEMM_FIXED) {
    /* Every floating-point sum ours: no CBLAS, whatever the shape. */
    if (k) dt__sgemm_kern(k, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else dt__sgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (own_wins(k, M, N, K))
    dt__sgemm_kern(k, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    dt__sgemm_blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  dt_sgemm_f(0, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

size_t dt_sgemm_packb_floats(int tb, int K, int N) {
  (void)tb;
  /* the products of a packed B have few rows (micro-batches): our kernels
   * win there (x W^T, W packed once: AVX2 74-92 against OpenBLAS's 53-58
   * GFLOP/s at 32 x 2048 x 2048, 86-99 against 41 at 8 x 256 x 784) */
  const dt__gemm_kern *k = dt__gemm_own();
  return k && N >= 16 ? k->packb_floats(K, N) : 0;
}

void dt_sgemm_packb(int tb, int K, int N, const float *B, int ldb, float *dst) {
  dt__gemm_op b = {.p = B, .trans = tb, .ld = ldb};
  dt__gemm_own()->packb(K, N, &b, dst);
}

void dt_sgemm_packed(int M, int N, int K, float alpha, const float *A, int lda, const float *Bp,
                     float beta, float *C, int ldc) {
  dt__gemm_op a = {.p = A, .trans = 0, .ld = lda};
  dt__gemm_own()->op_packed(M, N, K, alpha, &a, Bp, beta, C, ldc);
}

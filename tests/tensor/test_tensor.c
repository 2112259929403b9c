/*
 * test_tensor.c — the tensor layer: dt_sgemm against a naive triple loop for
 * every transpose combination with padded leading dimensions and beta != 0;
 * dt_im2col against a direct definition (stride, padding, non-square
 * kernels, side-by-side images via ldcol); dt_col2im as the exact adjoint of
 * im2col (<col, im2col(x)> == <col2im(col), x>) and as an overwrite.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/core.h"
#include "tensor/tensor.h"

static float *rnd(size_t n, uint64_t a) {
  float *p = malloc(n * sizeof(float) + 16);
  dt_rng_uniform(p, n, -1.0f, 1.0f, 3, DT_RNG_USER, a);
  return p;
}

static void test_sgemm(void **st) {
  (void)st;
  dt_tensor_set_threads(1);
  const int M = 7, N = 9, K = 13, pad = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      float *A = rnd((size_t)(ta ? K : M) * lda, 1), *B = rnd((size_t)(tb ? N : K) * ldb, 2);
      float *C = rnd((size_t)M * ldc, 3), *C0 = malloc((size_t)M * ldc * sizeof(float));
      memcpy(C0, C, (size_t)M * ldc * sizeof(float));
      dt_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, ldc);
      for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
          double s = 0;
          for (int k = 0; k < K; k++)
            s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
          double ref = 0.5 * s + 2.0 * C0[i * ldc + j];
          if (fabs(C[i * ldc + j] - ref) > 1e-5) fail_msg("sgemm ta=%d tb=%d (%d,%d): %g vs %g", ta, tb, i, j, C[i * ldc + j], ref);
        }
        for (int j = N; j < ldc; j++) assert_true(C[i * ldc + j] == C0[i * ldc + j]); /* padding untouched */
      }
      free(A); free(B); free(C); free(C0);
    }
  /* K = 0: C = beta * C */
  float c[2] = {1.0f, 2.0f};
  dt_sgemm(0, 0, 1, 2, 0, 1.0f, c, 1, c, 2, 0.0f, c, 2);
  assert_true(c[0] == 0.0f && c[1] == 0.0f);
  assert_non_null(dt_tensor_blas_core());
}

typedef struct { int C, H, W, KH, KW, s, p; } geo;

static void im2col_case(geo g) {
  int OH = (g.H + 2 * g.p - g.KH) / g.s + 1, OW = (g.W + 2 * g.p - g.KW) / g.s + 1;
  int S = OH * OW, K = g.C * g.KH * g.KW, nimg = 2;
  size_t ld = (size_t)nimg * S + 5, nx = (size_t)g.C * g.H * g.W;
  float *x = rnd(nimg * nx, 10), *col = rnd((size_t)K * ld, 11);
  float *col0 = malloc((size_t)K * ld * sizeof(float));
  memcpy(col0, col, (size_t)K * ld * sizeof(float));
  for (int i = 0; i < nimg; i++)
    dt_im2col(col + (size_t)i * S, ld, x + i * nx, g.C, g.H, g.W, g.KH, g.KW, g.s, g.p, OH, OW);
  for (int i = 0; i < nimg; i++)
    for (int c = 0; c < g.C; c++)
      for (int kh = 0; kh < g.KH; kh++)
        for (int kw = 0; kw < g.KW; kw++)
          for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
              int ih = oh * g.s - g.p + kh, iw = ow * g.s - g.p + kw;
              float ref = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) ? x[i * nx + (c * g.H + ih) * g.W + iw] : 0.0f;
              size_t r = (size_t)(c * g.KH + kh) * g.KW + kw;
              float got = col[r * ld + (size_t)i * S + oh * OW + ow];
              if (got != ref) fail_msg("im2col C%d %dx%d k%dx%d s%d p%d: mismatch", g.C, g.H, g.W, g.KH, g.KW, g.s, g.p);
            }
  for (int r = 0; r < K; r++) /* columns past the images untouched */
    for (size_t j = (size_t)nimg * S; j < ld; j++) assert_true(col[r * ld + j] == col0[r * ld + j]);
  /* adjoint: <dcol, im2col(x)> == <col2im(dcol), x> for image 0 */
  float *dcol = rnd((size_t)K * ld, 12), *dx = rnd(nx, 13); /* dx garbage: must be overwritten */
  dt_col2im(dx, dcol, ld, g.C, g.H, g.W, g.KH, g.KW, g.s, g.p, OH, OW);
  double lhs = 0, rhs = 0;
  for (int r = 0; r < K; r++)
    for (int j = 0; j < S; j++) lhs += (double)dcol[(size_t)r * ld + j] * col[(size_t)r * ld + j];
  for (size_t j = 0; j < nx; j++) rhs += (double)dx[j] * x[j];
  if (fabs(lhs - rhs) > 1e-4 * (1 + fabs(lhs))) fail_msg("col2im not the adjoint: %g vs %g", lhs, rhs);
  free(x); free(col); free(col0); free(dcol); free(dx);
}

static void test_im2col(void **st) {
  (void)st;
  geo cases[] = {{3, 7, 6, 3, 3, 1, 1}, {2, 9, 8, 3, 3, 2, 0}, {1, 5, 5, 5, 5, 1, 2},
                 {2, 7, 7, 2, 3, 2, 1}, {4, 4, 6, 1, 1, 1, 0}, {1, 8, 3, 3, 1, 3, 1},
                 {2, 6, 6, 3, 3, 2, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) im2col_case(cases[i]);
}

static void test_vec(void **st) {
  (void)st;
  float x[19], y[19];
  for (int i = 0; i < 19; i++) { x[i] = (float)i; y[i] = 1.0f; }
  assert_true(dt_vec_sum(x, 19) == 171.0f);
  dt_vec_add(y, x, 19);
  assert_true(y[18] == 19.0f && y[0] == 1.0f);
  dt_vec_zero(y, 19);
  assert_true(dt_vec_sum(y, 19) == 0.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgemm), cmocka_unit_test(test_im2col), cmocka_unit_test(test_vec)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

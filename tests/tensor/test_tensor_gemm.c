/*
 * test_tensor_gemm.c — our own GEMM kernels (every set this CPU runs:
 * AVX-512, AVX2 + FMA; dt__gemm_kern tables, called through
 * dt__sgemm_kern and the operand forms) against a double-precision
 * reference: every transpose combination, beta 0 / 1 / other, alpha != 1,
 * padded leading dimensions, shapes from 1 to beyond every blocking size
 * (MR 8 / 6, NR 48 / 16, KC 256, MC 96) with odd remainders, K = 0, the
 * conv/linear shapes, and the implicit (row-offset, segmented) operands the
 * conv kernels use, in both the packed GEMM and the dot-product form; B
 * packed ahead of time gives the bits of B packed in the call; and the
 * fixed-order contract of DT_GEMM_FIXED: a row's (and a column's) bits do
 * not depend on M, N or the position inside the product (test_rows,
 * test_fixed_position).
 *
 * Tolerance: |C - ref| <= 1e-5 * (sum_k |a_ik b_kj| * |alpha| + |beta c|) + 1e-6,
 * a float accumulation bound (K * eps * sum of magnitudes is the worst case;
 * blocked FMA accumulation stays far inside it). NaN canaries beyond ldc
 * check nothing outside C is written. On a CPU with none of our kernel sets
 * those cases skip (and say so) and the binary exits 77 (reported as
 * skipped); dt_sgemm itself is checked in either case.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/core.h"
#include "tensor/tensor.h"
#include "../dt_skip.h"

static float *rnd(size_t n, uint64_t a) {
  float *p = malloc(n * sizeof(float) + 64);
  dt_rng_uniform(p, n, -1.0f, 1.0f, 11, DT_RNG_USER, a);
  return p;
}

typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int,
                        float, float *, int);

/* Runs one case; returns the number of bad elements. */
static int check_case(gemm_fn f, int ta, int tb, int M, int N, int K, float alpha, float beta,
                      int pad, uint64_t seed) {
  int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  size_t na = (size_t)(ta ? K : M) * (lda ? lda : 1), nb = (size_t)(tb ? N : K) * (ldb ? ldb : 1);
  float *A = rnd(na ? na : 1, seed), *B = rnd(nb ? nb : 1, seed + 1);
  float *C = rnd((size_t)M * ldc, seed + 2), *C0 = malloc((size_t)M * ldc * sizeof(float));
  for (int i = 0; i < M; i++)
    for (int j = N; j < ldc; j++) C[(size_t)i * ldc + j] = NAN; /* canaries */
  if (beta == 0.0f) /* beta == 0 must not read C: NaN there must not leak */
    for (int i = 0; i < M; i++) C[(size_t)i * ldc] = NAN;
  memcpy(C0, C, (size_t)M * ldc * sizeof(float));
  f(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  int bad = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double s = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
        s += a * b;
        mag += fabs(a * b);
      }
      double c0 = beta == 0.0f ? 0.0 : C0[(size_t)i * ldc + j];
      double ref = alpha * s + beta * c0;
      double tol = 1e-5 * (mag * fabs(alpha) + fabs(beta * c0)) + 1e-6;
      double got = C[(size_t)i * ldc + j];
      if (!(fabs(got - ref) <= tol)) {
        if (bad < 3)
          print_error("ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g: C(%d,%d)=%.9g ref %.9g\n", ta,
                      tb, M, N, K, alpha, beta, i, j, got, ref);
        bad++;
      }
    }
    for (int j = N; j < ldc; j++)
      if (!isnan(C[(size_t)i * ldc + j])) bad++;
  }
  free(A); free(B); free(C); free(C0);
  return bad;
}

/* The kernel sets this CPU runs; cur is the one under test (own_sgemm). */
static const dt__gemm_kern *kerns[2];
static int nkerns;
static const dt__gemm_kern *cur;

static void own_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
  dt__sgemm_kern(cur, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static int find_kerns(void) {
  nkerns = 0;
  if (dt__gemm_kern_avx512.ok()) kerns[nkerns++] = &dt__gemm_kern_avx512;
  if (dt__gemm_kern_avx2.ok()) kerns[nkerns++] = &dt__gemm_kern_avx2;
  return nkerns;
}

/* for (each kernel set the CPU runs) { cur = it; ... }, or skip the case */
#define FOR_KERNS                                                                                  \
  if (!find_kerns()) DT_SKIP("neither AVX-512 nor AVX2+FMA on this CPU: our GEMM not run");        \
  for (int ki_ = 0; ki_ < nkerns && (cur = kerns[ki_], print_message("# %s\n", cur->name), 1); ki_++)

/* Small and edge shapes: every M, N, K in a set around the blocking sizes. */
static void shapes_one(void) {
  static const int ms[] = {1, 2, 7, 8, 9, 15, 16, 17, 33, 95, 96, 97, 200};
  static const int ns[] = {1, 5, 16, 31, 47, 48, 49, 97, 130};
  static const int ks[] = {0, 1, 3, 9, 16, 17, 255, 256, 257, 600};
  int bad = 0, cases = 0;
  uint64_t seed = 100;
  for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
    for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
      for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
        int M = ms[a], N = ns[b], K = ks[c];
        if ((double)M * N * K > 3e6) continue; /* keep the reference loop short */
        int t = (int)(seed % 4);
        float beta = (seed % 3 == 0) ? 0.0f : (seed % 3 == 1) ? 1.0f : -0.5f;
        float alpha = (seed % 5 == 0) ? 0.25f : 1.0f;
        bad += check_case(own_sgemm, t >> 1, t & 1, M, N, K, alpha, beta, (int)(seed % 3), seed);
        seed += 7;
        cases++;
      }
  print_message("%d shape cases\n", cases);
  assert_int_equal(bad, 0);
}
static void test_shapes(void **st) {
  (void)st;
  FOR_KERNS shapes_one();
}

/* Every transpose pair and beta at the layer shapes (or cut-down versions). */
static void layer_shapes_one(void) {
  static const int sh[][3] = {
      {64, 256, 784},  /* linear 784->256 forward */
      {64, 896, 288},  /* conv2 forward, 4 samples on the grid */
      {32, 840, 9},    /* conv1 forward, one sample */
      {64, 288, 448},  /* conv2 weight gradient, 2 samples */
      {288, 224, 64},  /* conv2 input gradient (TN) */
      {10, 128, 64},   /* linear 128->10 weight gradient */
      {64, 10, 128},   /* linear 128->10 forward */
  };
  int bad = 0;
  for (size_t s = 0; s < sizeof sh / sizeof *sh; s++)
    for (int t = 0; t < 4; t++)
      for (int b = 0; b < 2; b++)
        bad += check_case(own_sgemm, t >> 1, t & 1, sh[s][0], sh[s][1], sh[s][2], 1.0f,
                          (float)b, 0, 1000 + s * 8 + t * 2 + b);
  assert_int_equal(bad, 0);
}
static void test_layer_shapes(void **st) {
  (void)st;
  FOR_KERNS layer_shapes_one();
}

/* The operand form with row offsets and segments (conv's implicit im2col):
 * B rows at arbitrary offsets, columns cut in segments of `seg` spaced
 * `segstride` apart, both for B not transposed and transposed. */
static void implicit_one(void) {
  const int M = 21, K = 37, seg = 29, nseg = 3, N = seg * nseg, segstride = 400;
  int rowoff[64];
  for (int r = 0; r < 64; r++) rowoff[r] = (r * 37) % 300; /* overlapping, unordered rows */
  float *X = rnd((size_t)segstride * nseg + 64, 5), *A = rnd((size_t)M * K, 6);
  float *C = rnd((size_t)M * N, 7), *ref = malloc((size_t)M * N * sizeof(float));
  /* B(k, n) = X[(n/seg)*segstride + rowoff[k] + n%seg] */
  dt__gemm_op a = {.p = A, .trans = 0, .ld = K};
  dt__gemm_op b = {.p = X, .trans = 0, .rowoff = rowoff, .seg = seg, .segstride = segstride};
  cur->op(M, N, K, 1.0f, &a, &b, 0.0f, C, N);
  int bad = 0;
  for (int i = 0; i < M; i++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += (double)A[i * K + k] * X[(n / seg) * segstride + rowoff[k] + n % seg];
      if (fabs(C[i * N + n] - s) > 1e-5 * K) bad++;
    }
  /* Transposed form: B(k, n) = X[(k/seg)*segstride + rowoff[n] + k%seg], K = seg*nseg */
  const int K2 = seg * nseg, N2 = 50;
  float *A2 = rnd((size_t)M * K2, 8), *C2 = malloc((size_t)M * N2 * sizeof(float));
  dt__gemm_op a2 = {.p = A2, .trans = 0, .ld = K2};
  dt__gemm_op b2 = {.p = X, .trans = 1, .rowoff = rowoff, .seg = seg, .segstride = segstride};
  cur->op(M, N2, K2, 1.0f, &a2, &b2, 0.0f, C2, N2);
  for (int i = 0; i < M; i++)
    for (int n = 0; n < N2; n++) {
      double s = 0;
      for (int k = 0; k < K2; k++)
        s += (double)A2[i * K2 + k] * X[(k / seg) * segstride + rowoff[n] + k % seg];
      if (fabs(C2[i * N2 + n] - s) > 1e-5 * K2) bad++;
    }
  /* The dot-product form on the same operands (B's rows are n either way). */
  float *C3 = rnd((size_t)M * N2, 9), *C30 = malloc((size_t)M * N2 * sizeof(float));
  memcpy(C30, C3, (size_t)M * N2 * sizeof(float));
  cur->dot(M, N2, K2, 0.5f, &a2, &b2, 1.0f, C3, N2);
  for (int i = 0; i < M; i++)
    for (int n = 0; n < N2; n++) {
      double s = 0;
      for (int k = 0; k < K2; k++)
        s += (double)A2[i * K2 + k] * X[(k / seg) * segstride + rowoff[n] + k % seg];
      if (fabs(C3[i * N2 + n] - (0.5 * s + C30[i * N2 + n])) > 1e-5 * K2) bad++;
    }
  assert_int_equal(bad, 0);
  free(X); free(A); free(C); free(ref); free(A2); free(C2); free(C3); free(C30);
}
static void test_implicit(void **st) {
  (void)st;
  FOR_KERNS implicit_one();
}

/* dt_sgemm (whichever back end is active) and the BLAS back end directly. */
/* B packed ahead of time (dt__gemm_avx512_packb, used by a pipeline
 * stage's forward products over its micro-batches) gives the bits of the
 * same product with B packed inside the call, for both layouts of B and
 * shapes around the blocking sizes; several products reuse one packing. */
static void packed_one(void) {
  static const int sh[][3] = {{1, 1, 1},   {7, 47, 17},  {8, 48, 256}, {9, 49, 257},
                              {33, 97, 600}, {96, 130, 255}, {200, 16, 9}, {32, 2048, 300}};
  int bad = 0;
  for (size_t s = 0; s < sizeof sh / sizeof *sh; s++)
    for (int tb = 0; tb < 2; tb++) {
      int M = sh[s][0], N = sh[s][1], K = sh[s][2], ldb = (tb ? K : N) + 3;
      float *A = rnd((size_t)M * K * 2, 500 + s), *B = rnd((size_t)(tb ? N : K) * ldb, 600 + s);
      float *C1 = rnd((size_t)M * N, 700 + s), *C2 = malloc((size_t)M * N * sizeof(float));
      float *bp = malloc(cur->packb_floats(K, N) * sizeof(float));
      dt__gemm_op b = {.p = B, .trans = tb, .ld = ldb};
      cur->packb(K, N, &b, bp);
      for (int rep = 0; rep < 2; rep++) { /* two products from one packing */
        const float *Ar = A + (size_t)rep * M * K;
        float beta = rep ? 1.0f : 0.0f;
        memcpy(C2, C1, (size_t)M * N * sizeof(float));
        own_sgemm(0, tb, M, N, K, 0.5f, Ar, K, B, ldb, beta, C1, N);
        dt__gemm_op a = {.p = Ar, .trans = 0, .ld = K};
        cur->op_packed(M, N, K, 0.5f, &a, bp, beta, C2, N);
        if (memcmp(C1, C2, (size_t)M * N * sizeof(float))) {
          print_error("packed B: M=%d N=%d K=%d tb=%d rep %d differs\n", M, N, K, tb, rep);
          bad++;
        }
      }
      free(A), free(B), free(C1), free(C2), free(bp);
    }
  assert_int_equal(bad, 0);
}
static void test_packed(void **st) {
  (void)st;
  FOR_KERNS packed_one();
}

/* A pipeline stage's micro-batch products (32 rows of the deep MLP's 256,
 * m = 8): M = 1, 31, 32, 33 (one tile, and 32 rows' 6-6-6-6-4-4 tiles one
 * short and one over), N at the 16-column panel edges and over many panels
 * (the driver prefetches each next panel spread over the block's row
 * tiles), one and two K blocks, B packed ahead (the forward, x W^T) and B
 * dense K x N read by the driver (the input gradient, dY W; with ldb 512
 * the driver packs its panels together): against the
 * double reference, and each product's rows are the bits of the same rows
 * of a 64-row product. */
static void micro_rows_one(void) {
  static const int ms[] = {1, 31, 32, 33};
  static const int ns[] = {15, 16, 17, 33, 149};
  static const int ks[] = {1, 256, 300};
  enum { MB = 64 };
  int bad = 0;
  uint64_t seed = 5000;
  for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
      for (int tb = 0; tb < 2; tb++) {
        /* ldb 512: the driver packs a dense B's panels together */
        const int N = ns[ni], K = ks[ki], ldb = tb ? K : ni % 2 ? 512 : N;
        float *A = rnd((size_t)MB * K, seed), *B = rnd((size_t)(tb ? N : K) * ldb, seed + 1);
        float *Cb = malloc((size_t)MB * N * sizeof(float)), *C = malloc((size_t)MB * N * sizeof(float));
        float *bp = malloc(cur->packb_floats(K, N) * sizeof(float));
        dt__gemm_op b = {.p = B, .trans = tb, .ld = ldb};
        cur->packb(K, N, &b, bp);
        own_sgemm(0, tb, MB, N, K, 1.0f, A, K, B, ldb, 0.0f, Cb, N);
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
          const int M = ms[mi], r0 = (M * 5) % (MB - M + 1);
          const float *Ar = A + (size_t)r0 * K;
          for (int packed = 0; packed < 2; packed++) {
            if (packed) {
              dt__gemm_op a = {.p = Ar, .trans = 0, .ld = K};
              cur->op_packed(M, N, K, 1.0f, &a, bp, 0.0f, C, N);
            } else {
              own_sgemm(0, tb, M, N, K, 1.0f, Ar, K, B, ldb, 0.0f, C, N);
            }
            if (memcmp(C, Cb + (size_t)r0 * N, (size_t)M * N * sizeof(float))) {
              if (bad < 3)
                print_error("micro rows %d+%d: N=%d K=%d tb=%d packed=%d: not the 64-row product's bits\n",
                            r0, M, N, K, tb, packed);
              bad++;
            }
          }
          /* and the values, with beta and alpha, padded ldc */
          bad += check_case(own_sgemm, 0, tb, M, N, K, 0.5f, (M & 1) ? 1.0f : 0.0f, 1, seed + 7 + M);
        }
        free(A), free(B), free(Cb), free(C), free(bp);
        seed += 13;
      }
  assert_int_equal(bad, 0);
}
static void test_micro_rows(void **st) {
  (void)st;
  FOR_KERNS micro_rows_one();
}

/* Rows r0 .. r0 + M - 1 of a 48-row product, computed as an M-row product
 * (A not transposed: the 8-row and 16-row packing paths), bit for bit. */
static void rows_one(void) {
  static const int sh[][2] = {{48, 17}, {64, 200}, {10, 128}, {97, 300}};
  static const int ms[] = {1, 3, 7, 8, 9, 15, 16, 17, 32, 40};
  int bad = 0;
  for (size_t s = 0; s < sizeof sh / sizeof *sh; s++)
    for (int tb = 0; tb < 2; tb++) {
      const int MB = 48, N = sh[s][0], K = sh[s][1], ldb = tb ? K : N;
      float *A = rnd((size_t)MB * K, 800 + s), *B = rnd((size_t)N * K, 900 + s);
      float *Cb = malloc((size_t)MB * N * sizeof(float)), *C = malloc((size_t)MB * N * sizeof(float));
      own_sgemm(0, tb, MB, N, K, 1.0f, A, K, B, ldb, 0.0f, Cb, N);
      for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        int M = ms[mi], r0 = (M * 7) % (MB - M + 1);
        own_sgemm(0, tb, M, N, K, 1.0f, A + (size_t)r0 * K, K, B, ldb, 0.0f, C, N);
        if (memcmp(C, Cb + (size_t)r0 * N, (size_t)M * N * sizeof(float))) {
          if (bad < 3) print_error("rows %d..%d: N=%d K=%d tb=%d differ\n", r0, r0 + M - 1, N, K, tb);
          bad++;
        }
      }
      free(A), free(B), free(Cb), free(C);
    }
  assert_int_equal(bad, 0);
}
static void test_rows(void **st) {
  (void)st;
  FOR_KERNS rows_one();
}

/* The fixed-order contract of DT_GEMM_FIXED (src/parallel/ddp_det.c splits
 * a batch into micro-shards of any size): element (i, j) of a product
 * depends on row i of op(A), column j of op(B) and K only. Rows r0..r0+M-1
 * and columns n0..n0+N-1 of a 50 x 53 product, computed as an M x N
 * product (other M, N, ldc, so other tile positions and edge tiles), give
 * the same bits, for every transpose, alpha, beta and one or several K
 * blocks. */
static int fixed_position(gemm_fn f) {
  static const int ks[] = {17, 300, 600};
  static const int sub[][4] = {/* r0, M, n0, N */ {0, 50, 0, 53}, {0, 1, 0, 1}, {5, 7, 3, 16},
                               {13, 6, 16, 17}, {1, 49, 1, 52}, {44, 6, 37, 16},
                               {3, 8, 5, 48}, {20, 30, 0, 49}, {7, 12, 9, 11}};
  static const float betas[] = {0.0f, 1.0f, 0.7f}; /* 0.7: beta * c rounds (-0.5 would not) */
  const int MB = 50, NB = 53;
  int bad = 0;
  for (size_t kk = 0; kk < sizeof ks / sizeof *ks; kk++)
    for (int t = 0; t < 4; t++)
      for (int bi = 0; bi < 3; bi++) {
        const int K = ks[kk], ta = t >> 1, tb = t & 1, lda = ta ? MB : K, ldb = tb ? K : NB;
        const float alpha = bi == 2 ? 0.75f : 1.0f, beta = betas[bi];
        uint64_t seed = 3000 + kk * 100 + t * 10 + bi;
        float *A = rnd((size_t)MB * K, seed), *B = rnd((size_t)NB * K, seed + 1);
        float *C0 = rnd((size_t)MB * NB, seed + 2), *Cb = malloc((size_t)MB * NB * sizeof(float));
        float *C = malloc((size_t)MB * (NB + 1) * sizeof(float));
        memcpy(Cb, C0, (size_t)MB * NB * sizeof(float));
        f(ta, tb, MB, NB, K, alpha, A, lda, B, ldb, beta, Cb, NB);
        for (size_t q = 0; q < sizeof sub / sizeof *sub; q++) {
          const int r0 = sub[q][0], M = sub[q][1], n0 = sub[q][2], N = sub[q][3], ldc = N + 1;
          for (int i = 0; i < M; i++)
            memcpy(C + (size_t)i * ldc, C0 + (size_t)(r0 + i) * NB + n0, sizeof(float) * N);
          const float *As = ta ? A + r0 : A + (size_t)r0 * K;
          const float *Bs = tb ? B + (size_t)n0 * K : B + n0;
          f(ta, tb, M, N, K, alpha, As, lda, Bs, ldb, beta, C, ldc);
          for (int i = 0; i < M; i++)
            if (memcmp(C + (size_t)i * ldc, Cb + (size_t)(r0 + i) * NB + n0, sizeof(float) * N)) {
              if (bad < 3)
                print_error("K=%d ta=%d tb=%d beta=%g: rows %d+%d cols %d+%d: row %d differs\n", K,
                            ta, tb, beta, r0, M, n0, N, r0 + i);
              bad++;
              break;
            }
        }
        free(A), free(B), free(C0), free(Cb), free(C);
      }
  return bad;
}

static void fixed_flags(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
  dt_sgemm_f(DT_GEMM_FIXED, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void test_fixed_position(void **st) {
  (void)st;
  print_message("# dt_sgemm_f(DT_GEMM_FIXED) (%s)\n", dt_tensor_gemm_impl());
  assert_int_equal(fixed_position(fixed_flags), 0);
  FOR_KERNS assert_int_equal(fixed_position(own_sgemm), 0);
}

static void test_dispatch(void **st) {
  (void)st;
  dt_tensor_set_threads(1);
  const char *impl = dt_tensor_gemm_impl();
  assert_true(strcmp(impl, "blas") == 0 || strcmp(impl, "avx512") == 0 || strcmp(impl, "avx2") == 0);
  const char *env = getenv("DTRAIN_GEMM");
  if (env && strcmp(env, "blas") == 0) assert_string_equal(impl, "blas");
  if (!env && dt__gemm_avx512_ok()) assert_string_equal(impl, "avx512");
  else if (!env && dt__gemm_avx2_ok()) assert_string_equal(impl, "avx2");
  else if (!env) assert_string_equal(impl, "blas");
  int bad = 0;
  for (int t = 0; t < 4; t++) {
    bad += check_case(dt_sgemm, t >> 1, t & 1, 33, 70, 45, 1.0f, 1.0f, 2, 77 + t);
    bad += check_case(dt__sgemm_blas, t >> 1, t & 1, 33, 70, 45, 1.0f, 0.0f, 1, 99 + t);
  }
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_layer_shapes),
      cmocka_unit_test(test_implicit),
      cmocka_unit_test(test_packed),
      cmocka_unit_test(test_rows),
      cmocka_unit_test(test_micro_rows),
      cmocka_unit_test(test_fixed_position),
      cmocka_unit_test(test_dispatch),
  };
  return dt_skip_status(cmocka_run_group_tests(tests, NULL, NULL));
}

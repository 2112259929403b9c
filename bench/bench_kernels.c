/*
 * bench_kernels.c — microbenchmark of the layer kernels at the shapes of the
 * issue-2 models (batch 64, one thread): conv fwd/bwd of both CNN convs, the
 * MLP's linear layers, raw sgemm at matching sizes (the practical ceiling),
 * and a kernels-only CNN / MLP training step (no optimizer, no data loading)
 * in samples/s. Not built by default. Build and run (after building dt_nn in
 * build/kern, or any build dir):
 *
 *   cc -O3 -march=native -Iinclude -Isrc bench/bench_kernels.c \
 *      build/kern/libdt_nn.a build/kern/libdt_tensor.a build/kern/libdt_core.a \
 *      $(pkg-config --cflags --libs openblas) -lm -lpthread -o build/kern/bench_kernels
 *   build/kern/bench_kernels [seconds-per-item]
 * (or `cmake --build BUILD --target bench_kernels`); `bench_kernels SECONDS conv` runs the
 * conv layers and the CNN step only. Raw GEMM shapes run
 * through every back end the CPU has (blas, avx512, avx2); the layers use dt_sgemm's choice (DTRAIN_GEMM).
 * The environment's OPENBLAS_CORETYPE is left as it is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "nn/kernels.h"
#include "tensor/tensor.h"

static double T = 0.5; /* seconds per measurement */

static float *buf(size_t n) {
  float *p = dt_alloc(n * sizeof(float) + 64);
  dt_rng_uniform(p, n, -1.0f, 1.0f, 7, DT_RNG_USER, n);
  return p;
}

/* CPU time of this thread: on a shared, oversubscribed machine wall time
 * mostly measures the other processes. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The machine is shared and noisy: report the fastest single call, timed in
 * thread CPU time. */
#define TIMEIT(secs_out, body)                                                                     \
  do {                                                                                             \
    body;                                                                                          \
    double t0_ = dt_now(), best_ = 1e30;                                                           \
    do {                                                                                           \
      double s_ = cpu_now();                                                                       \
      body;                                                                                        \
      s_ = cpu_now() - s_;                                                                         \
      if (s_ < best_) best_ = s_;                                                                  \
    } while (dt_now() - t0_ < T);                                                                  \
    secs_out = best_;                                                                              \
  } while (0)

/* x W^T with W (N x K) packed ahead of time (a pipeline stage's forward
 * over its micro-batches: dt_sgemm_packb once, dt_sgemm_packed per
 * micro-batch) against CBLAS on the unpacked W. */
static void bench_packed(int M, int N, int K) {
  float *A = buf((size_t)M * K), *W = buf((size_t)K * N), *C = buf((size_t)M * N);
  size_t nf = dt_sgemm_packb_floats(1, K, N);
  double s1, s2 = 0;
  TIMEIT(s1, dt__sgemm_blas(0, 1, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N));
  if (nf) {
    float *bp = dt_alloc(nf * sizeof(float));
    dt_sgemm_packb(1, K, N, W, K, bp);
    TIMEIT(s2, dt_sgemm_packed(M, N, K, 1.0f, A, K, bp, 0.0f, C, N));
    dt_free(bp);
  }
  double f = 2.0 * M * N * K / 1e9;
  printf("  x W^T %5d x %5d x %5d   blas %6.1f   %s packed %6.1f GFLOP/s\n", M, N, K, f / s1,
         dt_tensor_gemm_impl(), s2 > 0 ? f / s2 : 0.0);
  dt_free(A); dt_free(W); dt_free(C);
}

/* One GEMM shape through every back end this CPU runs (t = "NN", "NT",
 * "TN"); 0 for a kernel set the CPU lacks. */
static void bench_sgemm(const char *t, int M, int N, int K) {
  int ta = t[0] == 'T', tb = t[1] == 'T';
  float *A = buf((size_t)M * K), *B = buf((size_t)K * N), *C = buf((size_t)M * N);
  int lda = ta ? M : K, ldb = tb ? K : N;
  double s1, s2 = 0, s3 = 0;
  const dt__gemm_kern *k512 = &dt__gemm_kern_avx512, *k2 = &dt__gemm_kern_avx2;
  TIMEIT(s1, dt__sgemm_blas(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N));
  if (k512->ok()) TIMEIT(s2, dt__sgemm_kern(k512, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N));
  if (k2->ok()) TIMEIT(s3, dt__sgemm_kern(k2, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N));
  double f = 2.0 * M * N * K / 1e9;
  printf("  sgemm %s %5d x %5d x %5d   blas %6.1f   avx512 %6.1f   avx2 %6.1f GFLOP/s\n", t, M, N,
         K, f / s1, s2 > 0 ? f / s2 : 0.0, s3 > 0 ? f / s3 : 0.0);
  dt_free(A); dt_free(B); dt_free(C);
}

static void bench_conv(const char *name, int B, int C, int H, int W, int OC, int k, int pad,
                       int need_dinp) {
  dt_conv2d_geom g = {.B = B, .C = C, .H = H, .W = W, .OC = OC, .KH = k, .KW = k, .stride = 1, .pad = pad};
  dt_conv2d_geom_init(&g);
  size_t nin = (size_t)B * C * H * W, nout = (size_t)B * OC * g.OH * g.OW, nw = (size_t)OC * C * k * k;
  float *x = buf(nin), *w = buf(nw), *b = buf(OC), *y = buf(nout), *dy = buf(nout);
  float *dx = buf(nin), *dw = buf(nw), *db = buf(OC), *ws = buf(dt_conv2d_ws_floats(&g));
  double fl = 2.0 * B * OC * g.OH * g.OW * (double)C * k * k, sf, sb, sw;
  TIMEIT(sf, dt_conv2d_forward(y, x, w, b, &g, ws));
  TIMEIT(sb, dt_conv2d_backward(need_dinp ? dx : NULL, dw, db, dy, x, w, &g, ws));
  TIMEIT(sw, dt_conv2d_backward(NULL, dw, db, dy, x, w, &g, ws));
  double flb = need_dinp ? 2 * fl : fl;
  printf("  %-28s fwd %7.3f ms %6.1f GFLOP/s | bwd%s %7.3f ms %6.1f GFLOP/s | ws %.1f MB\n", name,
         sf * 1e3, fl / sf / 1e9, need_dinp ? "" : "(no dinp)", sb * 1e3, flb / sb / 1e9,
         dt_conv2d_ws_floats(&g) * 4.0 / 1e6);
  if (need_dinp)
    printf("  %-28s bwd: dweight %7.3f ms %6.1f GFLOP/s, dinp %7.3f ms %6.1f GFLOP/s\n", "", sw * 1e3,
           fl / sw / 1e9, (sb - sw) * 1e3, fl / (sb - sw) / 1e9);
  dt_free(x); dt_free(w); dt_free(b); dt_free(y); dt_free(dy); dt_free(dx); dt_free(dw);
  dt_free(db); dt_free(ws);
}

static void bench_linear(int B, int C, int OC, int need_dinp) {
  float *x = buf((size_t)B * C), *w = buf((size_t)OC * C), *b = buf(OC), *y = buf((size_t)B * OC);
  float *dx = buf((size_t)B * C), *dw = buf((size_t)OC * C), *db = buf(OC);
  double fl = 2.0 * B * C * OC, sf, sb;
  TIMEIT(sf, dt_linear_forward(y, x, w, b, B, C, OC));
  TIMEIT(sb, dt_linear_backward(need_dinp ? dx : NULL, dw, db, y, x, w, B, C, OC));
  double flb = need_dinp ? 2 * fl : fl;
  printf("  linear %4d -> %-4d (B=%d)      fwd %7.3f ms %6.1f GFLOP/s | bwd %7.3f ms %6.1f GFLOP/s\n",
         C, OC, B, sf * 1e3, fl / sf / 1e9, sb * 1e3, flb / sb / 1e9);
  dt_free(x); dt_free(w); dt_free(b); dt_free(y); dt_free(dx); dt_free(dw); dt_free(db);
}

/* Kernels-only CNN step: conv(32,3,p1) relu pool2 conv(64,3,p1) relu pool2
 * flatten linear(128) relu linear(10) xent, forward + backward. */
static void bench_cnn_step(int B) {
  dt_conv2d_geom g1 = {.B = B, .C = 1, .H = 28, .W = 28, .OC = 32, .KH = 3, .KW = 3, .stride = 1, .pad = 1};
  dt_conv2d_geom g2 = {.B = B, .C = 32, .H = 14, .W = 14, .OC = 64, .KH = 3, .KW = 3, .stride = 1, .pad = 1};
  dt_conv2d_geom_init(&g1);
  dt_conv2d_geom_init(&g2);
  size_t ws1 = dt_conv2d_ws_floats(&g1), ws2 = dt_conv2d_ws_floats(&g2);
  float *ws = buf(ws1 > ws2 ? ws1 : ws2);
  float *x = buf((size_t)B * 784), *w1 = buf(32 * 9), *b1 = buf(32), *w2 = buf(64 * 288), *b2 = buf(64);
  float *w3 = buf(128 * 3136), *b3 = buf(128), *w4 = buf(10 * 128), *b4 = buf(10);
  float *dw1 = buf(32 * 9), *db1 = buf(32), *dw2 = buf(64 * 288), *db2 = buf(64);
  float *dw3 = buf(128 * 3136), *db3 = buf(128), *dw4 = buf(1280), *db4 = buf(10);
  float *a1 = buf((size_t)B * 32 * 784), *p1 = buf((size_t)B * 32 * 196);
  float *a2 = buf((size_t)B * 64 * 196), *p2 = buf((size_t)B * 3136);
  float *h3 = buf((size_t)B * 128), *h4 = buf((size_t)B * 10);
  float *d1 = buf((size_t)B * 32 * 784), *dp1 = buf((size_t)B * 32 * 196);
  float *d2 = buf((size_t)B * 64 * 196), *dp2 = buf((size_t)B * 3136);
  float *dh3 = buf((size_t)B * 128), *dh4 = buf((size_t)B * 10);
  int32_t *am1 = dt_alloc((size_t)B * 32 * 196 * 4), *am2 = dt_alloc((size_t)B * 3136 * 4);
  int32_t *tg = dt_alloc((size_t)B * 4);
  for (int i = 0; i < B; i++) tg[i] = i % 10;
  double tc[8] = {0}, best[8], bestall = 1e30;
  for (int i = 0; i < 8; i++) best[i] = 1e30;
  int iters = 0;
  double t0 = dt_now();
  while (dt_now() - t0 < 4 * T) {
    double t = dt_now(), u;
    dt_conv2d_forward(a1, x, w1, b1, &g1, ws);
    u = dt_now(); tc[0] += u - t; t = u;
    dt_relu_forward(a1, a1, (size_t)B * 32 * 784);
    dt_maxpool2d_forward(p1, am1, a1, B, 32, 28, 28, 2, 2);
    u = dt_now(); tc[1] += u - t; t = u;
    dt_conv2d_forward(a2, p1, w2, b2, &g2, ws);
    u = dt_now(); tc[2] += u - t; t = u;
    dt_relu_forward(a2, a2, (size_t)B * 64 * 196);
    dt_maxpool2d_forward(p2, am2, a2, B, 64, 14, 14, 2, 2);
    dt_linear_forward(h3, p2, w3, b3, B, 3136, 128);
    dt_relu_forward(h3, h3, (size_t)B * 128);
    dt_linear_forward(h4, h3, w4, b4, B, 128, 10);
    dt_softmax_xent(dh4, NULL, h4, tg, B, 10);
    dt_linear_backward(dh3, dw4, db4, dh4, h3, w4, B, 128, 10);
    dt_relu_backward(dh3, dh3, h3, (size_t)B * 128);
    dt_linear_backward(dp2, dw3, db3, dh3, p2, w3, B, 3136, 128);
    dt_maxpool2d_backward(d2, dp2, am2, B, 64, 14, 14, 2, 2);
    dt_relu_backward(d2, d2, a2, (size_t)B * 64 * 196);
    u = dt_now(); tc[3] += u - t; t = u;
    dt_conv2d_backward(dp1, dw2, db2, d2, p1, w2, &g2, ws);
    u = dt_now(); tc[4] += u - t; t = u;
    dt_maxpool2d_backward(d1, dp1, am1, B, 32, 28, 28, 2, 2);
    dt_relu_backward(d1, d1, a1, (size_t)B * 32 * 784);
    u = dt_now(); tc[5] += u - t; t = u;
    dt_conv2d_backward(NULL, dw1, db1, d1, x, w1, &g1, ws);
    u = dt_now(); tc[6] += u - t; t = u;
    double all = 0;
    for (int i = 0; i < 7; i++) {
      if (tc[i] < best[i]) best[i] = tc[i];
      all += tc[i];
      tc[i] = 0;
    }
    if (all < bestall) bestall = all;
    iters++;
  }
  double el = dt_now() - t0;
  printf("  CNN step (kernels only, B=%d): %.0f samples/s average, %.0f best step\n", B,
         B * iters / el, B / bestall);
  const char *nm[] = {"conv1 fwd", "relu+pool1 fwd", "conv2 fwd", "rest fwd+bwd (pool2..fc)",
                      "conv2 bwd", "pool1+relu bwd", "conv1 bwd"};
  for (int i = 0; i < 7; i++) printf("    %-26s %6.1f us/sample (best)\n", nm[i], best[i] / B * 1e6);
}

static void bench_mlp_step(int B) {
  float *x = buf((size_t)B * 784), *w1 = buf(256 * 784), *b1 = buf(256), *w2 = buf(128 * 256);
  float *b2 = buf(128), *w3 = buf(1280), *b3 = buf(10);
  float *dw1 = buf(256 * 784), *db1 = buf(256), *dw2 = buf(128 * 256), *db2 = buf(128);
  float *dw3 = buf(1280), *db3 = buf(10);
  float *h1 = buf((size_t)B * 256), *h2 = buf((size_t)B * 128), *h3 = buf((size_t)B * 10);
  float *d1 = buf((size_t)B * 256), *d2 = buf((size_t)B * 128), *d3 = buf((size_t)B * 10);
  int32_t *tg = dt_alloc((size_t)B * 4);
  for (int i = 0; i < B; i++) tg[i] = i % 10;
  int iters = 0;
  double t0 = dt_now();
  while (dt_now() - t0 < 2 * T) {
    dt_linear_forward(h1, x, w1, b1, B, 784, 256);
    dt_relu_forward(h1, h1, (size_t)B * 256);
    dt_linear_forward(h2, h1, w2, b2, B, 256, 128);
    dt_relu_forward(h2, h2, (size_t)B * 128);
    dt_linear_forward(h3, h2, w3, b3, B, 128, 10);
    dt_softmax_xent(d3, NULL, h3, tg, B, 10);
    dt_linear_backward(d2, dw3, db3, d3, h2, w3, B, 128, 10);
    dt_relu_backward(d2, d2, h2, (size_t)B * 128);
    dt_linear_backward(d1, dw2, db2, d2, h1, w2, B, 256, 128);
    dt_relu_backward(d1, d1, h1, (size_t)B * 256);
    dt_linear_backward(NULL, dw1, db1, d1, x, w1, B, 784, 256);
    iters++;
  }
  printf("  MLP step (kernels only, B=%d): %.0f samples/s\n", B, B * iters / (dt_now() - t0));
}

int main(int argc, char **argv) {
  if (argc > 1) T = atof(argv[1]);
  /* argv[2] "conv": only the conv2d shapes and the CNN step (paired A/B
   * of the conv layers against an older build of this same file) */
  if (argc > 2 && strcmp(argv[2], "conv") == 0) {
    dt_tensor_set_threads(1);
    printf("conv2d (batch 64), GEMM %s:\n", dt_tensor_gemm_impl());
    bench_conv("conv1 1->32 28x28 k3 p1", 64, 1, 28, 28, 32, 3, 1, 0);
    bench_conv("conv2 32->64 14x14 k3 p1", 64, 32, 14, 14, 64, 3, 1, 1);
    bench_cnn_step(64);
    return 0;
  }
  dt_tensor_set_threads(1);
  printf("OpenBLAS core: %s%s\n", dt_tensor_blas_core(),
         dt_tensor_blas_underpowered() ? " (AVX-512 CPU: unset OPENBLAS_CORETYPE or set it to SkylakeX)" : "");
  printf("GEMM back end for the layers: %s (DTRAIN_GEMM=blas|avx2|avx512 to choose)\n", dt_tensor_gemm_impl());
  printf("raw sgemm, every back end (the layer shapes):\n");
  bench_sgemm("NN", 64, 12544, 288);
  bench_sgemm("NN", 64, 896, 288);
  bench_sgemm("NT", 64, 288, 896);
  bench_sgemm("TN", 288, 896, 64);
  bench_sgemm("NN", 32, 840, 9);
  bench_sgemm("NN", 32, 50176, 9);
  bench_sgemm("NT", 64, 256, 784);
  bench_sgemm("NN", 64, 784, 256);
  bench_sgemm("TN", 256, 784, 64);
  bench_sgemm("NT", 64, 128, 3136);
  bench_sgemm("TN", 128, 3136, 64);
  bench_sgemm("NN", 64, 3136, 128);
  bench_sgemm("NT", 64, 128, 256);
  bench_sgemm("NT", 64, 10, 128);
  bench_sgemm("NN", 64, 128, 10);
  bench_sgemm("TN", 10, 128, 64);
  bench_sgemm("NT", 32, 9, 1680);
  bench_sgemm("NN", 512, 512, 512);
  printf("raw sgemm, the pipeline's deep MLP (2048-wide layers; 32-row micro-batches, 256-row batch):\n");
  bench_sgemm("NT", 32, 2048, 2048);
  bench_sgemm("NN", 32, 2048, 2048);
  bench_sgemm("TN", 2048, 2048, 32);
  bench_sgemm("NT", 256, 2048, 2048);
  bench_sgemm("NN", 256, 2048, 2048);
  bench_sgemm("TN", 2048, 2048, 256);
  bench_packed(32, 2048, 2048);
  bench_packed(8, 256, 784);
  printf("raw sgemm, deterministic mode's micro-shards of 8 rows (MLP):\n");
  bench_sgemm("NT", 8, 256, 784);
  bench_sgemm("NN", 8, 784, 256);
  bench_sgemm("NT", 8, 128, 256);
  bench_sgemm("TN", 256, 784, 8);
  printf("conv2d (batch 64):\n");
  bench_conv("conv1 1->32 28x28 k3 p1", 64, 1, 28, 28, 32, 3, 1, 0);
  bench_conv("conv2 32->64 14x14 k3 p1", 64, 32, 14, 14, 64, 3, 1, 1);
  printf("linear (batch 64):\n");
  bench_linear(64, 784, 256, 0);
  bench_linear(64, 256, 128, 1);
  bench_linear(64, 128, 10, 1);
  bench_linear(64, 3136, 128, 1);
  printf("steps:\n");
  bench_mlp_step(64);
  bench_cnn_step(64);
  return 0;
}

/*
 * test_conv_routes.c — conv2d forward and backward against a plain
 * double-precision convolution over the shapes that stress the routes'
 * layouts: the implicit route's shifted planes (stride 1, square kernels,
 * every padding 0 .. K-1: shifts that leave the image on either side,
 * kernels as wide as the padded input, 1x1, even kernels, non-square and
 * odd images), its chunking (batches that leave a short last chunk, wide
 * channel counts that cut the batch into chunks of one or two), the
 * 9-column weight gradient (one input channel), and the generic route
 * (strides 2 and 3). On CPUs without our GEMM kernels every shape takes
 * the other routes, which are checked the same way.
 *
 * Also: the weight gradient is bit for bit the same with and without the
 * input gradient (the model's first conv asks for none), and dbias is the
 * sum of dout.
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
#include "nn/kernels.h"

static float *rnd(size_t n, uint64_t a) {
  float *p = malloc(n * sizeof(float) + 16);
  dt_rng_uniform(p, n, -1.0f, 1.0f, 7, DT_RNG_USER, a);
  return p;
}

/* |got - want| <= 1e-4 * (sum of |terms| of that element) + 1e-6 */
static void close_to(const char *what, const char *shape, const float *got, const double *want,
                     const double *scale, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= 1e-4 * scale[i] + 1e-6))
      fail_msg("%s %s: element %zu is %.9g, want %.9g", shape, what, i, got[i], want[i]);
}

static void conv_case(int B, int C, int H, int W, int OC, int K, int s, int pad) {
  dt_conv2d_geom g = {.B = B, .C = C, .H = H, .W = W, .OC = OC, .KH = K, .KW = K, .stride = s,
                      .pad = pad};
  assert_int_equal(dt_conv2d_geom_init(&g), 0);
  const int OH = g.OH, OW = g.OW;
  char shape[96];
  snprintf(shape, sizeof shape, "B%d C%d %dx%d OC%d k%d s%d p%d", B, C, H, W, OC, K, s, pad);
  size_t nx = (size_t)B * C * H * W, nw = (size_t)OC * C * K * K, ny = (size_t)B * OC * OH * OW;
  float *x = rnd(nx, 1), *w = rnd(nw, 2), *b = rnd(OC, 3), *dy = rnd(ny, 4);
  float *y = rnd(ny, 5), *dx = rnd(nx, 6), *dw = rnd(nw, 7), *db = rnd(OC, 8), *dw2 = rnd(nw, 9);
  float *ws = rnd(dt_conv2d_ws_floats(&g), 10); /* garbage scratch */
  double *ry = calloc(ny, sizeof(double)), *sy = calloc(ny, sizeof(double));
  double *rdx = calloc(nx, sizeof(double)), *sdx = calloc(nx, sizeof(double));
  double *rdw = calloc(nw, sizeof(double)), *sdw = calloc(nw, sizeof(double));
  double *rdb = calloc(OC, sizeof(double)), *sdb = calloc(OC, sizeof(double));
  for (int n = 0; n < B; n++)
    for (int o = 0; o < OC; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          size_t yi = (((size_t)n * OC + o) * OH + oh) * OW + ow;
          double acc = b[o], sc = fabs(b[o]), g1 = dy[yi];
          rdb[o] += g1, sdb[o] += fabs(g1);
          for (int c = 0; c < C; c++)
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++) {
                int ih = oh * s - pad + kh, iw = ow * s - pad + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                size_t xi = (((size_t)n * C + c) * H + ih) * W + iw;
                size_t wi = (((size_t)o * C + c) * K + kh) * K + kw;
                acc += (double)w[wi] * x[xi], sc += fabs((double)w[wi] * x[xi]);
                rdx[xi] += (double)w[wi] * g1, sdx[xi] += fabs((double)w[wi] * g1);
                rdw[wi] += (double)x[xi] * g1, sdw[wi] += fabs((double)x[xi] * g1);
              }
          ry[yi] = acc, sy[yi] = sc;
        }
  dt_conv2d_forward(y, x, w, b, &g, ws);
  close_to("out", shape, y, ry, sy, ny);
  dt_conv2d_backward(dx, dw, db, dy, x, w, &g, ws);
  close_to("dinp", shape, dx, rdx, sdx, nx);
  close_to("dweight", shape, dw, rdw, sdw, nw);
  close_to("dbias", shape, db, rdb, sdb, OC);
  float *db2 = rnd(OC, 11);
  dt_conv2d_backward(NULL, dw2, db2, dy, x, w, &g, ws);
  if (memcmp(dw, dw2, nw * sizeof(float)) != 0)
    fail_msg("%s: dweight differs without dinp", shape);
  if (memcmp(db, db2, OC * sizeof(float)) != 0) fail_msg("%s: dbias differs without dinp", shape);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(dw2), free(db2);
  free(ws), free(ry), free(sy), free(rdx), free(sdx), free(rdw), free(sdw), free(rdb), free(sdb);
}

static void test_stride1_paddings(void **st) {
  (void)st;
  for (int k = 1; k <= 5; k++)
    for (int pad = 0; pad < k; pad++) conv_case(3, 2, 7, 5, 3, k, 1, pad);
  conv_case(2, 3, 5, 9, 4, 5, 1, 0); /* kernel as tall as the image */
  conv_case(1, 1, 1, 1, 2, 1, 1, 0); /* one pixel */
  conv_case(2, 2, 3, 3, 2, 3, 1, 2); /* output larger than the input */
}

static void test_one_channel(void **st) {
  (void)st;
  conv_case(5, 1, 28, 28, 32, 3, 1, 1); /* a first layer: 9-column dweight */
  conv_case(3, 1, 11, 6, 5, 3, 1, 0);
}

static void test_chunks(void **st) {
  (void)st;
  conv_case(13, 40, 13, 11, 20, 3, 1, 1); /* chunks of a few samples, short last one */
  conv_case(5, 96, 14, 14, 64, 3, 1, 1);  /* chunks of one or two samples */
  conv_case(9, 32, 14, 14, 64, 3, 1, 1);  /* the CNN's second conv */
}

/* 3x3 stride-1 convolutions with 4+ channels take Winograd's F(2x2,3x3)
 * in normal mode on AVX2 (winograd.c): every padding (0..2: the input
 * gradient's is 2 - pad), odd sizes (tiles cut by the image edge, the
 * 8-lane tile rows partly empty), rows of more than one register (W 40),
 * an odd number of tile rows (a 8-column edge panel), one output pixel,
 * more than 256 channels into a product (the unpacked GEMM), and
 * channels cut by the L2 blocks. */
static void test_winograd(void **st) {
  (void)st;
  for (int pad = 0; pad <= 2; pad++) conv_case(3, 4, 7, 5, 5, 3, 1, pad);
  conv_case(3, 4, 5, 7, 6, 3, 1, 1);    /* 9 tile rows: an edge panel */
  conv_case(2, 5, 9, 40, 6, 3, 1, 1);   /* 20 tiles a row: 3 registers */
  conv_case(3, 6, 3, 3, 4, 3, 1, 0);    /* one output pixel */
  conv_case(2, 4, 28, 28, 8, 3, 1, 1);
  conv_case(2, 260, 4, 4, 4, 3, 1, 1);  /* forward K = 260 */
  conv_case(2, 4, 5, 5, 260, 3, 1, 1);  /* input gradient K = 260 */
  conv_case(7, 16, 28, 28, 32, 3, 1, 1); /* the deep CNN's second conv */
}

static void test_generic_route(void **st) {
  (void)st;
  conv_case(2, 3, 9, 8, 4, 3, 2, 1);
  conv_case(3, 2, 10, 7, 3, 2, 3, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stride1_paddings),
      cmocka_unit_test(test_one_channel),
      cmocka_unit_test(test_chunks),
      cmocka_unit_test(test_generic_route),
      cmocka_unit_test(test_winograd),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_kernels_gradcheck.c — central finite differences against every
 * backward kernel (input and parameter gradients), plus the behaviour of
 * dropout (determinism, independence from how the batch is split, keep
 * rate, p = 0 identity, backward through the mask) and batchnorm eval mode;
 * the dot layer and the mean squared error too.
 *
 * Each check uses the scalar L = sum_i r_i * out_i (r fixed random, so dL/dout
 * = r) accumulated in double from the float kernel outputs, perturbs up to
 * 24 spread-out elements of one tensor by +-eps and compares
 * (L+ - L-)/(x+ - x-) with the analytic gradient. Error is
 * |fd - g| / max(max|g| over the checked elements, 1e-3) <= 1e-2: float32
 * forward rounding limits what a finite difference can resolve, and
 * normalising by the gradient's scale keeps near-zero entries from
 * producing meaningless ratios. Piecewise-linear layers (relu, maxpool) get
 * inputs kept away from their kinks by more than eps.
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

#define FD_TOL 1e-2

static float *rnd(size_t n, float lo, float hi, uint64_t a) {
  float *p = malloc(n * sizeof(float) + 16);
  dt_rng_uniform(p, n, lo, hi, 99, DT_RNG_USER, a);
  return p;
}

static double dot(const float *r, const float *y, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)r[i] * y[i];
  return s;
}

typedef double (*lossfn)(void *ctx);

static void fdcheck(const char *what, lossfn f, void *ctx, float *x, const float *g, size_t n,
                    float eps) {
  size_t step = n > 24 ? n / 24 : 1;
  double maxg = 1e-3, maxe = 0.0;
  size_t worst = 0;
  for (size_t i = (n > 24 ? step / 2 : 0); i < n; i += step) {
    float save = x[i];
    x[i] = save + eps;
    float xp = x[i];
    double lp = f(ctx);
    x[i] = save - eps;
    float xm = x[i];
    double lm = f(ctx);
    x[i] = save;
    double fd = (lp - lm) / ((double)xp - (double)xm);
    double e = fabs(fd - (double)g[i]);
    if (fabs(g[i]) > maxg) maxg = fabs(g[i]);
    if (!(e <= maxe)) { maxe = e; worst = i; }
  }
  if (!(maxe / maxg <= FD_TOL))
    fail_msg("%s: finite-difference error %.3g (element %zu: analytic %g) > %g", what,
             maxe / maxg, worst, g[worst], FD_TOL);
}

/* ---- linear ---- */
typedef struct { int B, C, OC; float *x, *w, *b, *y, *r; } lin_ctx;
static double lin_loss(void *p) {
  lin_ctx *c = p;
  dt_linear_forward(c->y, c->x, c->w, c->b, c->B, c->C, c->OC);
  return dot(c->r, c->y, (size_t)c->B * c->OC);
}
static void test_linear(void **st) {
  (void)st;
  lin_ctx c = {.B = 3, .C = 11, .OC = 5};
  c.x = rnd(33, -1, 1, 1); c.w = rnd(55, -1, 1, 2); c.b = rnd(5, -1, 1, 3);
  c.y = rnd(15, 0, 0, 0); c.r = rnd(15, -1, 1, 4);
  float *dx = rnd(33, 0, 0, 0), *dw = rnd(55, 0, 0, 0), *db = rnd(5, 0, 0, 0);
  dt_linear_backward(dx, dw, db, c.r, c.x, c.w, c.B, c.C, c.OC);
  fdcheck("linear dinp", lin_loss, &c, c.x, dx, 33, 1e-2f);
  fdcheck("linear dweight", lin_loss, &c, c.w, dw, 55, 1e-2f);
  fdcheck("linear dbias", lin_loss, &c, c.b, db, 5, 1e-2f);
  free(c.x); free(c.w); free(c.b); free(c.y); free(c.r); free(dx); free(dw); free(db);
}

/* ---- conv2d ---- */
typedef struct { dt_conv2d_geom g; float *x, *w, *b, *y, *r, *ws; } conv_ctx;
static double conv_loss(void *p) {
  conv_ctx *c = p;
  dt_conv2d_forward(c->y, c->x, c->w, c->b, &c->g, c->ws);
  return dot(c->r, c->y, (size_t)c->g.B * c->g.OC * c->g.OH * c->g.OW);
}
static void conv_case(int B, int C, int H, int W, int OC, int KH, int KW, int s, int pad) {
  conv_ctx c = {.g = {.B = B, .C = C, .H = H, .W = W, .OC = OC, .KH = KH, .KW = KW, .stride = s, .pad = pad}};
  assert_int_equal(dt_conv2d_geom_init(&c.g), 0);
  size_t nx = (size_t)B * C * H * W, nw = (size_t)OC * C * KH * KW, ny = (size_t)B * OC * c.g.OH * c.g.OW;
  c.x = rnd(nx, -1, 1, 10); c.w = rnd(nw, -1, 1, 11); c.b = rnd(OC, -1, 1, 12);
  c.y = rnd(ny, 0, 0, 0); c.r = rnd(ny, -1, 1, 13);
  c.ws = rnd(dt_conv2d_ws_floats(&c.g), -9, 9, 14);
  float *dx = rnd(nx, 0, 0, 0), *dw = rnd(nw, 0, 0, 0), *db = rnd(OC, 0, 0, 0);
  dt_conv2d_backward(dx, dw, db, c.r, c.x, c.w, &c.g, c.ws);
  char what[96];
  snprintf(what, sizeof what, "conv2d %dx%dx%dx%d k%dx%d s%d p%d", B, C, H, W, KH, KW, s, pad);
  fdcheck(what, conv_loss, &c, c.x, dx, nx, 1e-2f);
  fdcheck(what, conv_loss, &c, c.w, dw, nw, 1e-2f);
  fdcheck(what, conv_loss, &c, c.b, db, OC, 1e-2f);
  free(c.x); free(c.w); free(c.b); free(c.y); free(c.r); free(c.ws); free(dx); free(dw); free(db);
}
static void test_conv2d(void **st) {
  (void)st;
  conv_case(2, 3, 6, 5, 4, 3, 3, 1, 1); /* padded-grid route */
  conv_case(2, 2, 7, 8, 3, 3, 3, 2, 0); /* generic route, stride 2 */
  conv_case(1, 2, 5, 6, 2, 2, 3, 2, 1);
  conv_case(3, 1, 6, 6, 2, 3, 3, 1, 0);
}

/* ---- pooling ---- */
typedef struct { int B, C, H, W, k, s, max; float *x, *y, *r; int32_t *am; } pool_ctx;
static size_t pool_out(pool_ctx *c) {
  return (size_t)c->B * c->C * ((c->H - c->k) / c->s + 1) * ((c->W - c->k) / c->s + 1);
}
static double pool_loss(void *p) {
  pool_ctx *c = p;
  if (c->max) dt_maxpool2d_forward(c->y, c->am, c->x, c->B, c->C, c->H, c->W, c->k, c->s);
  else dt_avgpool2d_forward(c->y, c->x, c->B, c->C, c->H, c->W, c->k, c->s);
  return dot(c->r, c->y, pool_out(c));
}
static void pool_case(int max, int B, int C, int H, int W, int k, int s) {
  pool_ctx c = {.B = B, .C = C, .H = H, .W = W, .k = k, .s = s, .max = max};
  size_t nx = (size_t)B * C * H * W, ny = pool_out(&c);
  /* distinct values 0.05 apart (a shuffled ramp), so eps = 1e-2 never
   * changes which element is the maximum */
  c.x = malloc(nx * sizeof(float));
  int64_t *perm = malloc(nx * sizeof(int64_t));
  dt_rng_permutation(perm, (int64_t)nx, 5, DT_RNG_USER, nx);
  for (size_t i = 0; i < nx; i++) c.x[i] = 0.05f * (float)perm[i] - 1.0f;
  c.y = rnd(ny, 0, 0, 0); c.r = rnd(ny, -1, 1, 20);
  c.am = malloc(ny * sizeof(int32_t));
  float *dx = rnd(nx, 0, 0, 0);
  pool_loss(&c);
  if (max) dt_maxpool2d_backward(dx, c.r, c.am, B, C, H, W, k, s);
  else dt_avgpool2d_backward(dx, c.r, B, C, H, W, k, s);
  fdcheck(max ? "maxpool2d dinp" : "avgpool2d dinp", pool_loss, &c, c.x, dx, nx, 1e-2f);
  free(c.x); free(perm); free(c.y); free(c.r); free(c.am); free(dx);
}
static void test_pool(void **st) {
  (void)st;
  pool_case(1, 2, 3, 6, 7, 2, 2);
  pool_case(1, 1, 2, 7, 7, 3, 2);
  pool_case(1, 1, 2, 6, 6, 3, 1); /* overlapping windows */
  pool_case(0, 2, 3, 6, 7, 2, 2);
  pool_case(0, 1, 2, 7, 7, 3, 1);
}

/* ---- activations ---- */
typedef struct { size_t n; int gelu; float *x, *y, *r; } act_ctx;
static double act_loss(void *p) {
  act_ctx *c = p;
  if (c->gelu) dt_gelu_forward(c->y, c->x, c->n);
  else dt_relu_forward(c->y, c->x, c->n);
  return dot(c->r, c->y, c->n);
}
static void test_act(void **st) {
  (void)st;
  for (int gelu = 0; gelu < 2; gelu++) {
    act_ctx c = {.n = 40, .gelu = gelu};
    c.x = rnd(40, -3, 3, 30); c.y = rnd(40, 0, 0, 0); c.r = rnd(40, -1, 1, 31);
    for (size_t i = 0; i < 40; i++) /* keep relu inputs away from the kink */
      if (fabsf(c.x[i]) < 0.05f) c.x[i] = c.x[i] < 0 ? -0.05f : 0.05f;
    float *dx = rnd(40, 0, 0, 0);
    act_loss(&c);
    if (gelu) dt_gelu_backward(dx, c.r, c.x, 40);
    else dt_relu_backward(dx, c.r, c.y, 40);
    c.n = 40;
    /* every element: pass n as the check count */
    fdcheck(gelu ? "gelu dinp" : "relu dinp", act_loss, &c, c.x, dx, 40, 1e-2f);
    free(c.x); free(c.y); free(c.r); free(dx);
  }
}

/* ---- layernorm ---- */
typedef struct { int B, D; float *x, *w, *b, *y, *m, *rs, *r; } ln_ctx;
static double ln_loss(void *p) {
  ln_ctx *c = p;
  dt_layernorm_forward(c->y, c->m, c->rs, c->x, c->w, c->b, c->B, c->D, 1e-5f);
  return dot(c->r, c->y, (size_t)c->B * c->D);
}
static void test_layernorm(void **st) {
  (void)st;
  ln_ctx c = {.B = 3, .D = 9};
  c.x = rnd(27, -2, 2, 40); c.w = rnd(9, 0.5f, 1.5f, 41); c.b = rnd(9, -1, 1, 42);
  c.y = rnd(27, 0, 0, 0); c.m = rnd(3, 0, 0, 0); c.rs = rnd(3, 0, 0, 0); c.r = rnd(27, -1, 1, 43);
  float *dx = rnd(27, 0, 0, 0), *dw = rnd(9, 0, 0, 0), *db = rnd(9, 0, 0, 0);
  ln_loss(&c);
  dt_layernorm_backward(dx, dw, db, c.r, c.x, c.w, c.m, c.rs, c.B, c.D);
  fdcheck("layernorm dinp", ln_loss, &c, c.x, dx, 27, 1e-2f);
  fdcheck("layernorm dweight", ln_loss, &c, c.w, dw, 9, 1e-2f);
  fdcheck("layernorm dbias", ln_loss, &c, c.b, db, 9, 1e-2f);
  free(c.x); free(c.w); free(c.b); free(c.y); free(c.m); free(c.rs); free(c.r);
  free(dx); free(dw); free(db);
}

/* ---- batchnorm (training mode) ---- */
typedef struct { int B, C, S; float *x, *w, *b, *y, *m, *rs, *r; } bn_ctx;
static double bn_loss(void *p) {
  bn_ctx *c = p;
  dt_batchnorm_forward(c->y, c->m, c->rs, NULL, NULL, c->x, c->w, c->b, c->B, c->C, c->S, 1e-5f,
                       0.1f, 1);
  return dot(c->r, c->y, (size_t)c->B * c->C * c->S);
}
static void test_batchnorm(void **st) {
  (void)st;
  bn_ctx c = {.B = 3, .C = 2, .S = 5};
  size_t n = 30;
  c.x = rnd(n, -2, 2, 50); c.w = rnd(2, 0.5f, 1.5f, 51); c.b = rnd(2, -1, 1, 52);
  c.y = rnd(n, 0, 0, 0); c.m = rnd(2, 0, 0, 0); c.rs = rnd(2, 0, 0, 0); c.r = rnd(n, -1, 1, 53);
  float *dx = rnd(n, 0, 0, 0), *dw = rnd(2, 0, 0, 0), *db = rnd(2, 0, 0, 0);
  bn_loss(&c);
  dt_batchnorm_backward(dx, dw, db, c.r, c.x, c.w, c.m, c.rs, c.B, c.C, c.S);
  fdcheck("batchnorm dinp", bn_loss, &c, c.x, dx, n, 1e-2f);
  fdcheck("batchnorm dweight", bn_loss, &c, c.w, dw, 2, 1e-2f);
  fdcheck("batchnorm dbias", bn_loss, &c, c.b, db, 2, 1e-2f);
  free(c.x); free(c.w); free(c.b); free(c.y); free(c.m); free(c.rs); free(c.r);
  free(dx); free(dw); free(db);
}

static void test_batchnorm_eval(void **st) {
  (void)st;
  int B = 4, C = 3, S = 6;
  size_t n = (size_t)B * C * S;
  float *x = rnd(n, -2, 2, 60), *w = rnd(C, 0.5f, 1.5f, 61), *b = rnd(C, -1, 1, 62);
  float rm[3] = {0.3f, -0.2f, 1.0f}, rv[3] = {0.5f, 2.0f, 1.2f};
  float *y = rnd(n, 0, 0, 0), m[3], rs[3];
  dt_batchnorm_forward(y, m, rs, rm, rv, x, w, b, B, C, S, 1e-5f, 0.1f, 0);
  assert_true(rm[0] == 0.3f && rm[1] == -0.2f && rm[2] == 1.0f);
  assert_true(rv[0] == 0.5f && rv[1] == 2.0f && rv[2] == 1.2f);
  for (int bb = 0; bb < B; bb++)
    for (int c = 0; c < C; c++)
      for (int s = 0; s < S; s++) {
        size_t i = ((size_t)bb * C + c) * S + s;
        double ref = (x[i] - rm[c]) / sqrt((double)rv[c] + 1e-5) * w[c] + b[c];
        assert_true(fabs(y[i] - ref) <= 1e-5 * (1 + fabs(ref)));
      }
  /* train mode moves the running stats toward the batch statistics */
  dt_batchnorm_forward(y, m, rs, rm, rv, x, w, b, B, C, S, 1e-5f, 0.1f, 1);
  for (int c = 0; c < C; c++) {
    double s = 0, ss = 0;
    for (int bb = 0; bb < B; bb++)
      for (int k = 0; k < S; k++) s += x[((size_t)bb * C + c) * S + k];
    double mean = s / (B * S);
    for (int bb = 0; bb < B; bb++)
      for (int k = 0; k < S; k++) { double d = x[((size_t)bb * C + c) * S + k] - mean; ss += d * d; }
    double rm_ref = 0.9 * (c == 0 ? 0.3 : c == 1 ? -0.2 : 1.0) + 0.1 * mean;
    double rv_ref = 0.9 * (c == 0 ? 0.5 : c == 1 ? 2.0 : 1.2) + 0.1 * ss / (B * S - 1);
    assert_true(fabs(rm[c] - rm_ref) < 1e-5);
    assert_true(fabs(rv[c] - rv_ref) < 1e-5);
    assert_true(fabs(m[c] - mean) < 1e-5);
    assert_true(fabs(rs[c] - 1.0 / sqrt(ss / (B * S) + 1e-5)) < 1e-4 * rs[c]);
  }
  free(x); free(w); free(b); free(y);
}

/* ---- softmax cross-entropy ---- */
typedef struct { int B, V; float *x; int32_t *t; } xe_ctx;
static double xe_loss(void *p) {
  xe_ctx *c = p;
  return dt_softmax_xent(NULL, NULL, c->x, c->t, c->B, c->V);
}
static void test_xent(void **st) {
  (void)st;
  xe_ctx c = {.B = 4, .V = 7};
  c.x = rnd(28, -3, 3, 70);
  int32_t t[4] = {0, 6, 3, 3};
  c.t = t;
  float *dx = rnd(28, 0, 0, 0);
  dt_softmax_xent(dx, NULL, c.x, c.t, c.B, c.V);
  fdcheck("softmax_xent dlogits", xe_loss, &c, c.x, dx, 28, 1e-2f);
  /* large logits must not overflow */
  c.x[0] = 1000.0f;
  float l = dt_softmax_xent(dx, NULL, c.x, c.t, c.B, c.V);
  assert_true(isfinite(l));
  free(c.x); free(dx);
}

/* ---- dot (two halves' inner product + bias) and mse ---- */
typedef struct { int B, D; float *x, *bias, *y, *r; } dot_ctx;
static double dot_loss(void *p) {
  dot_ctx *c = p;
  dt_dot_forward(c->y, c->x, c->bias[0], c->B, c->D);
  return dot(c->r, c->y, (size_t)c->B);
}
typedef struct { int B; float *x; const int32_t *t; } mse_ctx;
static double mse_loss(void *p) {
  mse_ctx *c = p;
  return dt_mse(NULL, NULL, c->x, c->t, c->B);
}
static void test_dot_mse(void **st) {
  (void)st;
  dot_ctx c = {.B = 5, .D = 6};
  c.x = rnd(60, -1, 1, 80);
  c.bias = rnd(1, -1, 1, 81);
  c.y = rnd(5, 0, 0, 0);
  c.r = rnd(5, -1, 1, 82);
  float *dx = rnd(60, 0, 0, 0), db = 0;
  dt_dot_backward(dx, &db, c.r, c.x, c.B, c.D);
  fdcheck("dot dx", dot_loss, &c, c.x, dx, 60, 1e-2f);
  fdcheck("dot dbias", dot_loss, &c, c.bias, &db, 1, 1e-2f);
  /* a hand-checked value: (1,2).(3,4) + 0.5 = 11.5 */
  float x2[4] = {1, 2, 3, 4}, y2;
  dt_dot_forward(&y2, x2, 0.5f, 1, 2);
  assert_true(y2 == 11.5f);
  mse_ctx m = {.B = 4};
  m.x = rnd(4, 0, 5, 83);
  int32_t t[4] = {1, 5, 3, 2};
  m.t = t;
  float *dm = rnd(4, 0, 0, 0);
  int nc = -1;
  dt_mse(dm, &nc, m.x, t, 4);
  fdcheck("mse dpred", mse_loss, &m, m.x, dm, 4, 1e-2f);
  float p3[3] = {1.2f, 4.0f, 2.4f};
  int32_t t3[3] = {1, 5, 3};
  float l = dt_mse(NULL, &nc, p3, t3, 3); /* (0.04 + 1 + 0.36) / 3 */
  assert_true(fabsf(l - 1.4f / 3) < 1e-6f);
  assert_int_equal(nc, 1); /* only 1.2 is within 0.5 of its star */
  free(c.x); free(c.bias); free(c.y); free(c.r); free(dx); free(m.x); free(dm);
}

/* ---- dropout ---- */
static void test_dropout(void **st) {
  (void)st;
  int B = 8;
  size_t D = 1001, n = (size_t)B * D;
  float p = 0.3f, scale = 1.0f / (1.0f - p);
  float *x = rnd(n, -1, 1, 80), *y = rnd(n, 0, 0, 0), *m = rnd(n, 0, 0, 0);
  float *y2 = rnd(n, 0, 0, 0), *m2 = rnd(n, 0, 0, 0);
  dt_dropout_forward(y, m, x, B, D, p, 42, 7, 1000, 3);
  /* deterministic */
  dt_dropout_forward(y2, m2, x, B, D, p, 42, 7, 1000, 3);
  assert_memory_equal(m, m2, n * sizeof(float));
  assert_memory_equal(y, y2, n * sizeof(float));
  /* a batch split in two (different workers) draws the same masks */
  dt_dropout_forward(y2, m2, x, 3, D, p, 42, 7, 1000, 3);
  dt_dropout_forward(y2 + 3 * D, m2 + 3 * D, x + 3 * D, B - 3, D, p, 42, 7, 1003, 3);
  assert_memory_equal(m, m2, n * sizeof(float));
  /* mask values and output */
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(m[i] == 0.0f || m[i] == scale);
    assert_true(y[i] == x[i] * m[i]);
    kept += m[i] != 0.0f;
  }
  /* keep rate 0.7 within 5 sigma (sigma = sqrt(0.21/n) ~ 0.0051) */
  double rate = (double)kept / n;
  if (fabs(rate - 0.7) > 5 * sqrt(0.21 / n)) fail_msg("keep rate %.4f, want 0.7", rate);
  /* step, seed, layer and sample index each change the mask */
  uint64_t variants[4][4] = {{42, 8, 1000, 3}, {43, 7, 1000, 3}, {42, 7, 1000, 4}, {42, 7, 1001, 3}};
  for (int v = 0; v < 4; v++) {
    dt_dropout_forward(y2, m2, x, B, D, p, variants[v][0], variants[v][1],
                       (int64_t)variants[v][2], (int)variants[v][3]);
    size_t same = 0;
    for (size_t i = 0; i < D; i++) same += m[i] == m2[i];
    if (same > 0.8 * D) fail_msg("dropout variant %d: mask of sample 0 unchanged (%zu/%zu)", v, same, D);
  }
  /* no correlation between consecutive samples / elements blocks */
  size_t agree = 0;
  for (size_t i = 0; i < D; i++) agree += (m[i] != 0) == (m[D + i] != 0);
  assert_true(agree < 0.7 * D); /* independent: expect 0.58 */
  /* backward uses the mask */
  float *dy = rnd(n, -1, 1, 81), *dx = rnd(n, 5, 6, 0);
  dt_dropout_backward(dx, dy, m, n);
  for (size_t i = 0; i < n; i++) assert_true(dx[i] == dy[i] * m[i]);
  dt_dropout_backward(NULL, dy, m, n); /* no-op */
  /* p = 0: identity */
  dt_dropout_forward(y2, m2, x, B, D, 0.0f, 42, 7, 1000, 3);
  assert_memory_equal(y2, x, n * sizeof(float));
  for (size_t i = 0; i < n; i++) assert_true(m2[i] == 1.0f);
  /* p = 1: everything dropped */
  dt_dropout_forward(y2, m2, x, B, D, 1.0f, 42, 7, 1000, 3);
  for (size_t i = 0; i < n; i++) assert_true(y2[i] == 0.0f && m2[i] == 0.0f);
  free(x); free(y); free(m); free(y2); free(m2); free(dy); free(dx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),    cmocka_unit_test(test_conv2d),
      cmocka_unit_test(test_pool),      cmocka_unit_test(test_act),
      cmocka_unit_test(test_layernorm), cmocka_unit_test(test_batchnorm),
      cmocka_unit_test(test_batchnorm_eval), cmocka_unit_test(test_xent),
      cmocka_unit_test(test_dropout),   cmocka_unit_test(test_dot_mse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

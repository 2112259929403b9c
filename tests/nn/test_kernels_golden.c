/*
 * test_kernels_golden.c — every layer kernel of nn/kernels.h against PyTorch
 * 1.13 reference fixtures written by tools/golden.py (tests/nn/golden/<layer>_<n>.bin).
 *
 * Error measure, per tensor: max_i |a_i - b_i| / max(max_i |b_i|, 1e-6),
 * required <= 1e-4. Normalising by the tensor's largest magnitude rather than
 * element by element keeps the bar strict (1e-4 of the scale of the result)
 * without flagging elements that are near zero by cancellation, where float32
 * sums legitimately differ from the float64 reference in relative terms.
 * Integer tensors (maxpool argmax, correct count) must match exactly.
 *
 * Backward buffers are pre-filled with garbage, so a kernel that accumulates
 * instead of overwriting fails. Each backward is also run with dinp = NULL to
 * check the parameter gradients do not depend on it.
 *
 * "meta" layouts: linear B,C,OC,has_bias; conv2d B,C,H,W,OC,KH,KW,stride,
 * pad,has_bias; pools B,C,H,W,k,s; relu/gelu N; layernorm B,D (eps 1e-5);
 * batchnorm B,C,S,train (eps 1e-5, momentum 0.1); xent B,V,ncorrect.
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

#include "nn/kernels.h"

#define TOL 1e-4
#define MAXT 24

typedef struct {
  char name[64];
  int dtype, ndim, dims[8];
  size_t n;
  void *data;
} gtensor;

typedef struct {
  char path[512];
  int count;
  gtensor t[MAXT];
} gfile;

static uint32_t rd32(FILE *f) {
  unsigned char b[4];
  if (fread(b, 1, 4, f) != 4) fail_msg("short read");
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Returns 0 if the file does not exist; fails the test on a malformed file. */
static int gload(gfile *g, const char *stem) {
  snprintf(g->path, sizeof g->path, "%s/tests/nn/golden/%s.bin", DT_SOURCE_DIR, stem);
  FILE *f = fopen(g->path, "rb");
  if (!f) return 0;
  char magic[4];
  assert_int_equal(fread(magic, 1, 4, f), 4);
  assert_memory_equal(magic, "DTGF", 4);
  assert_int_equal(rd32(f), 1);
  g->count = (int)rd32(f);
  assert_true(g->count > 0 && g->count <= MAXT);
  for (int i = 0; i < g->count; i++) {
    gtensor *t = &g->t[i];
    uint32_t nl = rd32(f);
    assert_true(nl < sizeof t->name);
    assert_int_equal(fread(t->name, 1, nl, f), nl);
    t->name[nl] = 0;
    t->dtype = (int)rd32(f);
    t->ndim = (int)rd32(f);
    assert_true(t->ndim >= 0 && t->ndim <= 8);
    t->n = 1;
    for (int d = 0; d < t->ndim; d++) { t->dims[d] = (int)rd32(f); t->n *= (size_t)t->dims[d]; }
    t->data = malloc(t->n * 4 + 4);
    assert_non_null(t->data);
    assert_int_equal(fread(t->data, 4, t->n, f), t->n); /* host is little-endian (x86-64) */
  }
  fclose(f);
  return 1;
}

static void gfree(gfile *g) {
  for (int i = 0; i < g->count; i++) free(g->t[i].data);
  g->count = 0;
}

static gtensor *gfind(gfile *g, const char *name) {
  for (int i = 0; i < g->count; i++)
    if (strcmp(g->t[i].name, name) == 0) return &g->t[i];
  return NULL;
}

static float *F32(gfile *g, const char *name) {
  gtensor *t = gfind(g, name);
  if (!t) fail_msg("%s: no tensor '%s'", g->path, name);
  assert_int_equal(t->dtype, 0);
  return (float *)t->data;
}

static int32_t *I32(gfile *g, const char *name) {
  gtensor *t = gfind(g, name);
  if (!t) fail_msg("%s: no tensor '%s'", g->path, name);
  assert_int_equal(t->dtype, 1);
  return (int32_t *)t->data;
}

static size_t NUM(gfile *g, const char *name) {
  gtensor *t = gfind(g, name);
  if (!t) fail_msg("%s: no tensor '%s'", g->path, name);
  return t->n;
}

/* Fresh buffer filled with garbage so overwrite-vs-accumulate bugs show. */
static float *garbage(size_t n) {
  float *p = malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = 1234.5f;
  return p;
}

static double relerr(const float *a, const float *b, size_t n) {
  double md = 0.0, mb = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= md)) md = d; /* NaN-propagating max */
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return md / (mb > 1e-6 ? mb : 1e-6);
}

static void check(gfile *g, const char *name, const float *got) {
  size_t n = NUM(g, name);
  double e = relerr(got, F32(g, name), n);
  if (!(e <= TOL)) fail_msg("%s: %s rel err %.3g > %g", g->path, name, e, TOL);
}

static void check_equal(gfile *g, const char *what, const float *a, const float *b, size_t n) {
  if (memcmp(a, b, n * sizeof(float)) != 0) fail_msg("%s: %s differs", g->path, what);
}

static void test_linear(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "linear_%d", i);
    if (!gload(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    int B = m[0], C = m[1], OC = m[2], hb = m[3];
    float *bias = hb ? F32(&g, "bias") : NULL;
    float *out = garbage((size_t)B * OC);
    dt_linear_forward(out, F32(&g, "inp"), F32(&g, "weight"), bias, B, C, OC);
    check(&g, "out", out);
    float *dinp = garbage((size_t)B * C), *dw = garbage((size_t)OC * C), *db = garbage(OC);
    dt_linear_backward(dinp, dw, hb ? db : NULL, F32(&g, "dout"), F32(&g, "inp"),
                       F32(&g, "weight"), B, C, OC);
    check(&g, "dinp", dinp);
    check(&g, "dweight", dw);
    if (hb) check(&g, "dbias", db);
    float *dw2 = garbage((size_t)OC * C);
    dt_linear_backward(NULL, dw2, NULL, F32(&g, "dout"), F32(&g, "inp"), F32(&g, "weight"), B, C,
                       OC);
    check_equal(&g, "dweight with dinp=NULL", dw, dw2, (size_t)OC * C);
    free(out); free(dinp); free(dw); free(db); free(dw2);
    gfree(&g);
  }
  assert_true(cases >= 3);
}

static void test_conv2d(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "conv2d_%d", i);
    if (!gload(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    dt_conv2d_geom geo = {.B = m[0], .C = m[1], .H = m[2], .W = m[3], .OC = m[4], .KH = m[5],
                          .KW = m[6], .stride = m[7], .pad = m[8]};
    int hb = m[9];
    assert_int_equal(dt_conv2d_geom_init(&geo), 0);
    size_t nout = (size_t)geo.B * geo.OC * geo.OH * geo.OW;
    assert_int_equal(nout, NUM(&g, "out"));
    size_t nin = (size_t)geo.B * geo.C * geo.H * geo.W, nw = (size_t)geo.OC * geo.C * geo.KH * geo.KW;
    float *ws = garbage(dt_conv2d_ws_floats(&geo));
    float *bias = hb ? F32(&g, "bias") : NULL;
    float *out = garbage(nout);
    dt_conv2d_forward(out, F32(&g, "inp"), F32(&g, "weight"), bias, &geo, ws);
    check(&g, "out", out);
    float *dinp = garbage(nin), *dw = garbage(nw), *db = garbage(geo.OC);
    dt_conv2d_backward(dinp, dw, hb ? db : NULL, F32(&g, "dout"), F32(&g, "inp"),
                       F32(&g, "weight"), &geo, ws);
    check(&g, "dinp", dinp);
    check(&g, "dweight", dw);
    if (hb) check(&g, "dbias", db);
    float *dw2 = garbage(nw);
    dt_conv2d_backward(NULL, dw2, NULL, F32(&g, "dout"), F32(&g, "inp"), F32(&g, "weight"), &geo,
                       ws);
    check_equal(&g, "dweight with dinp=NULL", dw, dw2, nw);
    free(ws); free(out); free(dinp); free(dw); free(db); free(dw2);
    gfree(&g);
  }
  assert_true(cases >= 5);
}

static void test_conv2d_geom(void **st) {
  (void)st;
  dt_conv2d_geom g = {.B = 1, .C = 1, .H = 2, .W = 5, .OC = 1, .KH = 3, .KW = 3, .stride = 1, .pad = 0};
  assert_int_equal(dt_conv2d_geom_init(&g), -1); /* kernel taller than input */
  g.pad = 1;
  assert_int_equal(dt_conv2d_geom_init(&g), 0);
  assert_int_equal(g.OH, 2);
  assert_int_equal(g.OW, 5);
  g.stride = 0;
  assert_int_equal(dt_conv2d_geom_init(&g), -1);
  g.stride = 2; g.B = 0;
  assert_int_equal(dt_conv2d_geom_init(&g), -1);
  g.B = 1; g.pad = -1;
  assert_int_equal(dt_conv2d_geom_init(&g), -1);
}

static void pool_common(int max) {
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "%s_%d", max ? "maxpool2d" : "avgpool2d", i);
    if (!gload(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    int B = m[0], C = m[1], H = m[2], W = m[3], k = m[4], s = m[5];
    size_t nout = NUM(&g, "out"), nin = (size_t)B * C * H * W;
    assert_int_equal(nout, (size_t)B * C * ((H - k) / s + 1) * ((W - k) / s + 1));
    float *out = garbage(nout), *dinp = garbage(nin);
    if (max) {
      int32_t *am = malloc(nout * sizeof(int32_t));
      dt_maxpool2d_forward(out, am, F32(&g, "inp"), B, C, H, W, k, s);
      check(&g, "out", out);
      if (memcmp(am, I32(&g, "argmax"), nout * 4) != 0) fail_msg("%s: argmax differs", g.path);
      dt_maxpool2d_backward(dinp, F32(&g, "dout"), am, B, C, H, W, k, s);
      free(am);
    } else {
      dt_avgpool2d_forward(out, F32(&g, "inp"), B, C, H, W, k, s);
      check(&g, "out", out);
      dt_avgpool2d_backward(dinp, F32(&g, "dout"), B, C, H, W, k, s);
    }
    check(&g, "dinp", dinp);
    free(out); free(dinp);
    gfree(&g);
  }
  assert_true(cases >= 3);
}
static void test_maxpool2d(void **st) { (void)st; pool_common(1); }
static void test_avgpool2d(void **st) { (void)st; pool_common(0); }

static void act_common(int gelu) {
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "%s_%d", gelu ? "gelu" : "relu", i);
    if (!gload(&g, stem)) break;
    cases++;
    size_t n = (size_t)I32(&g, "meta")[0];
    float *out = garbage(n), *dinp = garbage(n);
    if (gelu) {
      dt_gelu_forward(out, F32(&g, "inp"), n);
      check(&g, "out", out);
      dt_gelu_backward(dinp, F32(&g, "dout"), F32(&g, "inp"), n);
    } else {
      dt_relu_forward(out, F32(&g, "inp"), n);
      check(&g, "out", out);
      dt_relu_backward(dinp, F32(&g, "dout"), out, n);
      /* in place */
      float *x = malloc(n * sizeof(float));
      memcpy(x, F32(&g, "inp"), n * sizeof(float));
      dt_relu_forward(x, x, n);
      check_equal(&g, "in-place relu", x, out, n);
      free(x);
    }
    check(&g, "dinp", dinp);
    free(out); free(dinp);
    gfree(&g);
  }
  assert_true(cases >= 2);
}
static void test_relu(void **st) { (void)st; act_common(0); }
static void test_gelu(void **st) { (void)st; act_common(1); }

static void test_layernorm(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "layernorm_%d", i);
    if (!gload(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    int B = m[0], D = m[1];
    size_t n = (size_t)B * D;
    float *out = garbage(n), *mean = garbage(B), *rstd = garbage(B);
    dt_layernorm_forward(out, mean, rstd, F32(&g, "inp"), F32(&g, "weight"), F32(&g, "bias"), B,
                         D, 1e-5f);
    check(&g, "out", out);
    float *dinp = garbage(n), *dw = garbage(D), *db = garbage(D);
    dt_layernorm_backward(dinp, dw, db, F32(&g, "dout"), F32(&g, "inp"), F32(&g, "weight"), mean,
                          rstd, B, D);
    check(&g, "dinp", dinp);
    check(&g, "dweight", dw);
    check(&g, "dbias", db);
    free(out); free(mean); free(rstd); free(dinp); free(dw); free(db);
    gfree(&g);
  }
  assert_true(cases >= 2);
}

static void test_batchnorm(void **st) {
  (void)st;
  int cases = 0, evals = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "batchnorm_%d", i);
    if (!gload(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    int B = m[0], C = m[1], S = m[2], train = m[3];
    size_t n = (size_t)B * C * S;
    float *out = garbage(n), *mean = garbage(C), *rstd = garbage(C);
    float *rm = malloc(C * sizeof(float)), *rv = malloc(C * sizeof(float));
    memcpy(rm, F32(&g, "running_mean0"), C * sizeof(float));
    memcpy(rv, F32(&g, "running_var0"), C * sizeof(float));
    dt_batchnorm_forward(out, mean, rstd, rm, rv, F32(&g, "inp"), F32(&g, "weight"),
                         F32(&g, "bias"), B, C, S, 1e-5f, 0.1f, train);
    check(&g, "out", out);
    check(&g, "running_mean", rm);
    check(&g, "running_var", rv);
    if (train) {
      float *dinp = garbage(n), *dw = garbage(C), *db = garbage(C);
      dt_batchnorm_backward(dinp, dw, db, F32(&g, "dout"), F32(&g, "inp"), F32(&g, "weight"),
                            mean, rstd, B, C, S);
      check(&g, "dinp", dinp);
      check(&g, "dweight", dw);
      check(&g, "dbias", db);
      free(dinp); free(dw); free(db);
    } else {
      /* Eval mode must leave the running statistics untouched. */
      check_equal(&g, "running_mean (eval)", rm, F32(&g, "running_mean0"), C);
      check_equal(&g, "running_var (eval)", rv, F32(&g, "running_var0"), C);
      evals++;
    }
    free(out); free(mean); free(rstd); free(rm); free(rv);
    gfree(&g);
  }
  assert_true(cases >= 3);
  assert_true(evals >= 1);
}

static void test_xent(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "xent_%d", i);
    if (!gload(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    int B = m[0], V = m[1];
    float *d = garbage((size_t)B * V);
    int nc = -1;
    float loss = dt_softmax_xent(d, &nc, F32(&g, "logits"), I32(&g, "targets"), B, V);
    check(&g, "loss", &loss);
    check(&g, "dlogits", d);
    assert_int_equal(nc, m[2]);
    float loss2 = dt_softmax_xent(NULL, NULL, F32(&g, "logits"), I32(&g, "targets"), B, V);
    assert_true(loss2 == loss);
    free(d);
    gfree(&g);
  }
  assert_true(cases >= 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),    cmocka_unit_test(test_conv2d),
      cmocka_unit_test(test_conv2d_geom), cmocka_unit_test(test_maxpool2d),
      cmocka_unit_test(test_avgpool2d), cmocka_unit_test(test_relu),
      cmocka_unit_test(test_gelu),      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_batchnorm), cmocka_unit_test(test_xent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

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
 * Each layer's fixtures are read <layer>_0, _1, ... until one is missing, and
 * the count must equal what tools/golden.py writes, so a missing, renumbered
 * or extra fixture fails. The reader lives in golden_io.h.
 *
 * "meta" layouts: linear B,C,OC,has_bias; conv2d B,C,H,W,OC,KH,KW,stride,
 * pad,has_bias; pools B,C,H,W,k,s; relu/gelu N; layernorm B,D (eps 1e-5);
 * batchnorm B,C,S,train (eps 1e-5, momentum 0.1); xent B,V,ncorrect;
 * embedding N,V,D (repeated indices included: their gradients add up).
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

#include "golden_io.h"

/* Fresh buffer filled with garbage so overwrite-vs-accumulate bugs show. */
static float *garbage(size_t n) {
  float *p = malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = 1234.5f;
  return p;
}

static void check(gfile *g, const char *name, const float *got) {
  size_t n = NUM(g, name);
  double e = relerr(got, F32(g, name), n);
  if (!(e <= GOLDEN_TOL)) fail_msg("%s: %s rel err %.3g > %g", g->path, name, e, GOLDEN_TOL);
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
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 4); /* every fixture tools/golden.py writes */
}

static void test_conv2d(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "conv2d_%d", i);
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 7);
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
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 4);
}
static void test_maxpool2d(void **st) { (void)st; pool_common(1); }
static void test_avgpool2d(void **st) { (void)st; pool_common(0); }

static void act_common(int gelu) {
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "%s_%d", gelu ? "gelu" : "relu", i);
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 2);
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
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 3);
}

static void test_batchnorm(void **st) {
  (void)st;
  int cases = 0, evals = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "batchnorm_%d", i);
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 4);
  assert_true(evals >= 1);
}

static void test_xent(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "xent_%d", i);
    if (!gtry(&g, stem)) break;
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
  assert_int_equal(cases, 3);
}

static void test_embedding(void **st) {
  (void)st;
  int cases = 0;
  for (int i = 0;; i++) {
    gfile g;
    char stem[32];
    snprintf(stem, sizeof stem, "embedding_%d", i);
    if (!gtry(&g, stem)) break;
    cases++;
    int32_t *m = I32(&g, "meta");
    int N = m[0], V = m[1], D = m[2];
    const int32_t *idx = I32(&g, "idx");
    assert_int_equal(dt_embedding_check(idx, N, V), 0);
    float *out = garbage((size_t)N * D), *dw = garbage((size_t)V * D);
    dt_embedding_forward(out, idx, F32(&g, "weight"), N, D);
    check(&g, "out", out);
    dt_embedding_backward(dw, F32(&g, "dout"), idx, N, V, D);
    check(&g, "dweight", dw);
    /* the rows with a nonzero gradient are exactly the distinct indices */
    int32_t *rows = malloc((size_t)N * sizeof *rows);
    int nr = dt_embedding_rows(idx, N, rows);
    for (int r = 0, j = 0; r < V; r++) {
      int used = j < nr && rows[j] == r;
      if (used) j++;
      float mx = 0;
      for (int d = 0; d < D; d++) mx = fmaxf(mx, fabsf(dw[(size_t)r * D + d]));
      if (!used) assert_true(mx == 0);
    }
    for (int j = 1; j < nr; j++) assert_true(rows[j - 1] < rows[j]);
    free(rows);
    free(out);
    free(dw);
    gfree(&g);
  }
  assert_int_equal(cases, 4);
  int32_t bad[3] = {0, 5, 1};
  assert_int_equal(dt_embedding_check(bad, 3, 5), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_linear),    cmocka_unit_test(test_conv2d),
      cmocka_unit_test(test_conv2d_geom), cmocka_unit_test(test_maxpool2d),
      cmocka_unit_test(test_avgpool2d), cmocka_unit_test(test_relu),
      cmocka_unit_test(test_gelu),      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_batchnorm), cmocka_unit_test(test_xent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

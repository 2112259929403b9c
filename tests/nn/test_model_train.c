/*
 * test_model_train.c — model behaviour beyond the PyTorch golden steps:
 * initialisation (a pure function of the seed, PyTorch's bounds, norms at
 * 1/0), determinism (same seed, same steps -> bitwise identical parameters
 * and state, run twice), the gradient of a model using every layer kind
 * against central finite differences of the loss (which checks the wiring:
 * in-place relu, flatten aliasing, ping-pong gradients, batchnorm and
 * dropout state), eval mode, and bad calls; the embedding + dot + mse
 * model (matrix factorisation): its row gradients, the sparse zeroing that
 * must give the same gradients as zeroing the whole table, a bad id.
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
#include "nn/nn.h"

/* Every layer kind, relu in place after a norm and after flatten. */
static const char *ALL =
    "conv(4,3,pad=1) batchnorm gelu avgpool(2) conv(6,3,stride=2,pad=1) relu maxpool(2,stride=1) "
    "dropout(0.3) flatten relu layernorm linear(7) batchnorm relu dropout(0.2) linear(5)";
enum { C = 2, H = 9, W = 9, B = 4 };

static dt_model *make(const char *spec, int max_batch) {
  dt_model *m = NULL;
  if (dt_model_create(&m, spec, C, H, W, max_batch) != DT_OK) fail_msg("%s", dt_errmsg());
  return m;
}

static void data(float *x, int32_t *y, int n, uint64_t seed) {
  dt_rng_uniform(x, (size_t)n * C * H * W, -1.0f, 1.0f, seed, DT_RNG_USER, 0);
  for (int i = 0; i < n; i++) y[i] = (int32_t)((i * 7 + seed) % 5);
}

static void test_init(void **st) {
  (void)st;
  dt_model *a = make(ALL, B), *b = make(ALL, B);
  size_t P = dt_model_nparams(a);
  dt_model_init(a, 11);
  dt_model_init(b, 11);
  assert_memory_equal(dt_model_params(a), dt_model_params(b), P * sizeof(float));
  dt_model_init(b, 12);
  assert_memory_not_equal(dt_model_params(a), dt_model_params(b), P * sizeof(float));
  for (int i = 0; i < dt_model_nlayers(a); i++) {
    const dt_layer_info *l = dt_model_layer(a, i);
    const float *p = dt_model_params(a) + l->param_off;
    if (l->kind == DT_L_LINEAR || l->kind == DT_L_CONV2D) {
      size_t nb = (size_t)l->out_c, fan_in = (l->nparams - nb) / nb;
      float bound = (float)(1.0 / sqrt((double)fan_in));
      float mx = 0.0f;
      for (size_t j = 0; j < l->nparams; j++) {
        assert_true(fabsf(p[j]) <= bound);
        if (fabsf(p[j]) > mx) mx = fabsf(p[j]);
      }
      assert_true(mx > 0.5f * bound); /* actually spread over the range */
    } else if (l->kind == DT_L_LAYERNORM || l->kind == DT_L_BATCHNORM) {
      for (size_t j = 0; j < l->nparams / 2; j++) {
        assert_true(p[j] == 1.0f);
        assert_true(p[l->nparams / 2 + j] == 0.0f);
      }
    }
  }
  /* batchnorm running stats: mean 0, var 1 */
  const float *bufs = dt_model_bufs(a);
  const dt_layer_info *bn = dt_model_layer(a, 1);
  assert_int_equal(bn->nbufs, 8);
  for (int j = 0; j < 4; j++) {
    assert_true(bufs[bn->buf_off + j] == 0.0f);
    assert_true(bufs[bn->buf_off + 4 + j] == 1.0f);
  }
  dt_model_destroy(a);
  dt_model_destroy(b);
}

/* Five SGD-momentum steps from seed `seed`; returns params and bufs. */
/* Forward that must succeed; returns the logits. */
static const float *fwd(dt_model *m, const float *x, int n, const dt_step_ctx *ctx) {
  assert_int_equal(dt_model_forward(m, x, n, ctx), DT_OK);
  return dt_model_logits(m);
}

/* Backward that must succeed; returns the loss. */
static float bwd(dt_model *m, const int32_t *y, int n, int *ncorrect, dt_grad_ready_fn f, void *ud) {
  float loss = NAN;
  assert_int_equal(dt_model_backward(m, y, n, &loss, ncorrect, f, ud), DT_OK);
  return loss;
}

static void train(const char *spec, uint64_t seed, float *params, float *bufs) {
  dt_model *m = make(spec, 8);
  dt_model_init(m, seed);
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.momentum = 0.9f, oc.nesterov = 1, oc.weight_decay = 1e-4f;
  dt_optim *o = NULL;
  assert_int_equal(dt_optim_create(&o, &oc, dt_model_nparams(m)), DT_OK);
  float x[8 * C * H * W];
  int32_t y[8];
  for (int s = 0; s < 5; s++) {
    data(x, y, 8, 100 + s);
    dt_step_ctx ctx = {1, seed, (uint64_t)s, (int64_t)s * 8};
    assert_non_null(fwd(m, x, 8 - (s & 1), &ctx));
    float loss = bwd(m, y, 8 - (s & 1), NULL, NULL, NULL);
    assert_true(isfinite(loss));
    dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 0.05f);
  }
  memcpy(params, dt_model_params(m), dt_model_nparams(m) * sizeof(float));
  memcpy(bufs, dt_model_bufs(m), dt_model_nbufs(m) * sizeof(float));
  dt_optim_destroy(o);
  dt_model_destroy(m);
}

static void test_determinism(void **st) {
  (void)st;
  const char *specs[] = {ALL, "flatten linear(32) relu linear(16) relu linear(5)",
                         "conv(4,3,pad=1) relu maxpool(2) conv(8,3,pad=1) relu maxpool(2) flatten "
                         "linear(16) relu linear(5)"};
  for (int k = 0; k < 3; k++) {
    dt_model *m = make(specs[k], 1);
    size_t P = dt_model_nparams(m), NB = dt_model_nbufs(m) + 1;
    dt_model_destroy(m);
    float *p1 = malloc(P * 4), *p2 = malloc(P * 4), *p3 = malloc(P * 4);
    float *b1 = malloc(NB * 4), *b2 = malloc(NB * 4), *b3 = malloc(NB * 4);
    train(specs[k], 5, p1, b1);
    train(specs[k], 5, p2, b2);
    train(specs[k], 6, p3, b3);
    assert_memory_equal(p1, p2, P * 4);
    assert_memory_equal(b1, b2, (NB - 1) * 4);
    assert_memory_not_equal(p1, p3, P * 4);
    free(p1), free(p2), free(p3), free(b1), free(b2), free(b3);
  }
}

static double loss_at(dt_model *m, const float *x, const int32_t *y, const dt_step_ctx *ctx) {
  assert_non_null(fwd(m, x, B, ctx));
  float loss = NAN;
  assert_int_equal(dt_model_loss(m, y, B, &loss, NULL), DT_OK);
  return loss;
}

/* Directional derivative of the loss along random directions v:
 * (L(p + h v) - L(p - h v)) / 2h against grad . v. */
static void test_gradient_fd(void **st) {
  (void)st;
  dt_model *m = make(ALL, B + 2);
  dt_model_init(m, 3);
  size_t P = dt_model_nparams(m);
  float x[B * C * H * W];
  int32_t y[B];
  data(x, y, B, 9);
  dt_step_ctx ctx = {1, 77, 3, 40};
  assert_non_null(fwd(m, x, B, &ctx));
  int ncorrect = -1;
  float loss = bwd(m, y, B, &ncorrect, NULL, NULL);
  assert_true(ncorrect >= 0 && ncorrect <= B);
  assert_float_equal(loss, loss_at(m, x, y, &ctx), 1e-6);
  float *g = malloc(P * 4), *p0 = malloc(P * 4), *v = malloc(P * 4);
  memcpy(g, dt_model_grads(m), P * 4);
  memcpy(p0, dt_model_params(m), P * 4);
  float *p = dt_model_params(m);
  /* One direction over all parameters, then one per layer span. */
  int nl = dt_model_nlayers(m);
  for (int k = -1; k < nl; k++) {
    size_t off = 0, n = P;
    if (k >= 0) {
      off = dt_model_layer(m, k)->param_off, n = dt_model_layer(m, k)->nparams;
      if (!n) continue;
    }
    memset(v, 0, P * 4);
    dt_rng_uniform(v + off, n, -1.0f, 1.0f, 1234, DT_RNG_USER, (uint64_t)(k + 1));
    double gv = 0.0, vn = 0.0;
    for (size_t i = 0; i < P; i++) gv += (double)g[i] * v[i], vn += (double)v[i] * v[i];
    double h = 1e-2 / sqrt(vn);
    for (size_t i = 0; i < P; i++) p[i] = p0[i] + (float)h * v[i];
    double lp = loss_at(m, x, y, &ctx);
    for (size_t i = 0; i < P; i++) p[i] = p0[i] - (float)h * v[i];
    double lm = loss_at(m, x, y, &ctx);
    memcpy(p, p0, P * 4);
    double fd = (lp - lm) / (2 * h);
    if (!(fabs(fd - gv) <= 2e-2 * fabs(gv) + 2e-3))
      fail_msg("layer %d: finite difference %.6g vs gradient %.6g", k + 1, fd, gv);
  }
  free(g), free(p0), free(v);
  dt_model_destroy(m);
}

static void test_eval_and_bad_calls(void **st) {
  (void)st;
  dt_model *m = make(ALL, B);
  dt_model_init(m, 1);
  float x[B * C * H * W];
  int32_t y[B];
  data(x, y, B, 1);
  /* Eval: dropout is the identity and batchnorm uses running stats, so
   * forward is a pure function of the input, whatever the step. */
  dt_step_ctx e1 = {0, 1, 1, 0}, e2 = {0, 9, 5, 123};
  float out1[B * 5];
  memcpy(out1, fwd(m, x, B, &e1), sizeof out1);
  assert_memory_equal(out1, fwd(m, x, B, &e2), sizeof out1);
  assert_memory_equal(out1, fwd(m, x, B, NULL), sizeof out1);
  /* Train mode differs (dropout masks keyed by step). */
  dt_step_ctx t1 = {1, 1, 1, 0}, t2 = {1, 1, 2, 0};
  memcpy(out1, fwd(m, x, B, &t1), sizeof out1);
  assert_memory_not_equal(out1, fwd(m, x, B, &t2), sizeof out1);
  assert_memory_equal(out1, fwd(m, x, B, &t1), sizeof out1);
  /* Bad batch sizes. */
  assert_int_equal(dt_model_forward(m, x, B + 1, &t1), DT_EINVAL);
  assert_true(strstr(dt_errmsg(), "batch 5") != NULL);
  assert_int_equal(dt_model_forward(m, x, 0, &t1), DT_EINVAL);
  assert_non_null(fwd(m, x, 2, &t1));
  float l = 0.0f;
  assert_int_equal(dt_model_backward(m, y, 3, &l, NULL, NULL, NULL), DT_EINVAL);
  assert_true(strstr(dt_errmsg(), "does not match") != NULL);
  assert_true(l == 0.0f); /* untouched on error */
  assert_int_equal(dt_model_loss(m, y, 3, &l, NULL), DT_EINVAL);
  assert_true(isfinite(bwd(m, y, 2, NULL, NULL, NULL)));
  dt_model_destroy(m);
  /* A model without parameters runs and reports none. */
  m = make("relu maxpool(3)", 2);
  assert_int_equal(dt_model_nparams(m), 0);
  assert_non_null(fwd(m, x, 2, &t1));
  int calls = 0;
  assert_true(isfinite(bwd(m, y, 2, NULL, NULL, &calls)));
  dt_model_destroy(m);
}

static void test_embedding_model(void **st) {
  (void)st;
  dt_model *m = NULL, *s = NULL;
  /* ids per sample: user, item (of one 12-row table) */
  assert_int_equal(dt_model_create(&m, "embedding(12,3,std=0.5) dot", 1, 1, 2, 4), DT_OK);
  assert_int_equal(dt_model_create(&s, "embedding(12,3,std=0.5) dot", 1, 1, 2, 4), DT_OK);
  assert_int_equal(dt_model_nparams(m), 37);
  assert_int_equal(dt_model_out_dim(m), 1);
  dt_model_init(m, 3);
  dt_model_init(s, 3);
  assert_int_equal(dt__model_set_loss(m, DT__LOSS_MSE), DT_OK);
  assert_int_equal(dt__model_set_loss(s, DT__LOSS_MSE), DT_OK);
  dt__model_set_sparse_grads(s, 1);
  float xs[3][8] = {{0, 6, 1, 7, 2, 8, 0, 9}, {3, 10, 4, 11, 3, 6, 5, 6}, {1, 6, 0, 6, 2, 7, 1, 8}};
  int32_t y[4] = {1, 5, 3, 4};
  for (int b = 0; b < 3; b++) {
    dt_step_ctx t = {1, 1, (uint64_t)b, 0};
    assert_int_equal(dt_model_forward(m, xs[b], 4, &t), DT_OK);
    assert_int_equal(dt_model_forward(s, xs[b], 4, &t), DT_OK);
    /* the prediction is the rows' inner product (bias 0 at init) */
    const float *P = dt_model_params(m), *out = dt_model_logits(m);
    int u = (int)xs[b][0], i = (int)xs[b][1];
    float want = P[u * 3] * P[i * 3] + P[u * 3 + 1] * P[i * 3 + 1] + P[u * 3 + 2] * P[i * 3 + 2];
    assert_true(fabsf(out[0] - want) < 1e-6f);
    float lm, ls;
    assert_int_equal(dt_model_backward(m, y, 4, &lm, NULL, NULL, NULL), DT_OK);
    assert_int_equal(dt_model_backward(s, y, 4, &ls, NULL, NULL, NULL), DT_OK);
    assert_true(lm == ls);
    /* sparse zeroing leaves exactly the full zeroing's gradient */
    assert_memory_equal(dt_model_grads(m), dt_model_grads(s), 37 * sizeof(float));
    /* rows no sample read have no gradient */
    int32_t rows[8];
    int n = dt__model_embedding_rows(m, xs[b], 4, rows);
    assert_true(n > 0 && n <= 8);
    for (int r = 0; r < 12; r++) {
      int hit = 0;
      for (int j = 0; j < n; j++) hit |= rows[j] == r;
      for (int d = 0; !hit && d < 3; d++) assert_true(dt_model_grads(m)[r * 3 + d] == 0.0f);
    }
  }
  /* an id outside the table, or not an integer, is refused by name */
  float bad[2] = {3, 12}, frac[2] = {1.5f, 2};
  assert_int_equal(dt_model_forward(m, bad, 1, NULL), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "not a row of the table of 12 rows"));
  assert_int_equal(dt_model_forward(m, frac, 1, NULL), DT_EINVAL);
  dt_model_destroy(m);
  dt_model_destroy(s);
  /* mse needs one output */
  assert_int_equal(dt_model_create(&m, "linear(3)", 1, 1, 2, 4), DT_OK);
  assert_int_equal(dt__model_set_loss(m, DT__LOSS_MSE), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "one output"));
  dt_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embedding_model),
      cmocka_unit_test(test_init),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_gradient_fd),
      cmocka_unit_test(test_eval_and_bad_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

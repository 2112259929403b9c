/*
 * test_model_golden.c — whole training steps of the MLP (784-256-128-10) and
 * the 2-conv CNN against PyTorch 1.13, from fixtures written by
 * tools/golden_step.py (tests/nn/golden/step_*.bin): two steps of forward,
 * softmax cross-entropy, backward and SGD (momentum, Nesterov, weight decay)
 * or AdamW on a batch of 8. Checks logits, loss, gradients and updated
 * parameters, and that the grad-ready callback reports contiguous spans in
 * reverse layer order covering the whole gradient buffer.
 *
 * Error measure, per tensor (as in test_kernels_golden.c): max |a - b| /
 * max |b|, required <= 1e-4. The reference is float64; the model runs in
 * float32.
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

#include "golden_io.h"

/* The fixture's initial parameters: tools/golden_step.py pattern(). */
static void pattern(float *p, size_t n, double bound, uint32_t salt) {
  for (size_t i = 0; i < n; i++) {
    uint32_t h = (uint32_t)(i + 1) * 0x9E3779B1u + salt * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    uint32_t u = h >> 8;
    p[i] = (float)(((double)u * (2.0 / 16777216.0) - 1.0) * bound);
  }
}

static void pattern_init(dt_model *m) {
  float *p = dt_model_params(m);
  uint32_t salt = 0;
  for (int i = 0; i < dt_model_nlayers(m); i++) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if (!li->nparams) continue;
    assert_true(li->kind == DT_L_LINEAR || li->kind == DT_L_CONV2D);
    size_t nb = (size_t)li->out_c, nw = li->nparams - nb;
    double bound = 1.0 / sqrt((double)(nw / nb)); /* fan_in = weights per output */
    pattern(p + li->param_off, nw, bound, salt++);
    pattern(p + li->param_off + nw, nb, bound, salt++);
  }
}

typedef struct {
  size_t off[64], n[64];
  int calls;
} ready_log;

static void on_ready(void *ud, size_t off, size_t n) {
  ready_log *r = ud;
  assert_true(r->calls < 64);
  r->off[r->calls] = off;
  r->n[r->calls] = n;
  r->calls++;
}

static void run_case(const char *stem, int extra_batch) {
  gfile g = {0};
  gload(&g, stem);
  gtensor *st = gfind(&g, "spec", 1);
  char spec[512];
  assert_true(st->n < sizeof spec);
  for (size_t i = 0; i < st->n; i++) spec[i] = (char)((int32_t *)st->data)[i];
  spec[st->n] = 0;
  int32_t *meta = I32(&g, "meta");
  int B = meta[0], steps = meta[6];
  float *hy = F32(&g, "hyper");
  gtensor *idx = gfind(&g, "idx", 1);
  size_t K = idx->n;
  const int32_t *ix = idx->data;

  dt_model *m = NULL;
  int rc = dt_model_create(&m, spec, meta[1], meta[2], meta[3], B + extra_batch);
  if (rc) fail_msg("%s: %s", stem, dt_errmsg());
  size_t P = dt_model_nparams(m);
  assert_int_equal(dt_model_in_dim(m), meta[1] * meta[2] * meta[3]);
  int V = dt_model_out_dim(m);
  pattern_init(m);

  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.kind = meta[4] ? DT_OPT_ADAMW : DT_OPT_SGD;
  oc.lr = hy[0], oc.momentum = hy[1], oc.dampening = hy[2], oc.weight_decay = hy[3];
  oc.beta1 = hy[4], oc.beta2 = hy[5], oc.eps = hy[6], oc.nesterov = meta[5];
  dt_optim *o = NULL;
  assert_int_equal(dt_optim_create(&o, &oc, P), DT_OK);

  float *got = malloc(K * sizeof(float));
  const float *xs = F32(&g, "x");
  const int32_t *ys = I32(&g, "y");
  size_t D = (size_t)dt_model_in_dim(m);
  for (int s = 0; s < steps; s++) {
    dt_step_ctx ctx = {1, 7, (uint64_t)s, (int64_t)s * B};
    assert_int_equal(dt_model_forward(m, xs + (size_t)s * B * D, B, &ctx), DT_OK);
    const float *logits = dt_model_logits(m);
    assert_non_null(logits);
    if (s == 0) check_step(g.path, "logits", s, logits, F32(&g, "logits"), (size_t)B * V);
    /* Poison the gradients: backward must overwrite every element. */
    float *gr = dt_model_grads(m);
    for (size_t i = 0; i < P; i++) gr[i] = NAN;
    ready_log rl = {0};
    int ncorrect = -1;
    float loss = NAN;
    assert_int_equal(dt_model_backward(m, ys + (size_t)s * B, B, &loss, &ncorrect, on_ready, &rl), DT_OK);
    float want_loss = F32(&g, "loss")[s];
    check_step(g.path, "loss", s, &loss, &want_loss, 1);
    assert_true(ncorrect >= 0 && ncorrect <= B);
    /* Grad-ready spans: reverse order, contiguous, covering [0, P). */
    assert_true(rl.calls > 0);
    assert_int_equal(rl.off[0] + rl.n[0], P);
    for (int c = 1; c < rl.calls; c++) assert_int_equal(rl.off[c] + rl.n[c], rl.off[c - 1]);
    assert_int_equal(rl.off[rl.calls - 1], 0);
    for (size_t i = 0; i < P; i++)
      if (isnan(gr[i])) fail_msg("%s: gradient %zu not written", stem, i);
    for (size_t k = 0; k < K; k++) got[k] = gr[ix[k]];
    check_step(g.path, "grads", s, got, F32(&g, "grads") + (size_t)s * K, K);
    dt_optim_step(o, dt_model_params(m), gr, oc.lr);
    float *p = dt_model_params(m);
    for (size_t k = 0; k < K; k++) got[k] = p[ix[k]];
    check_step(g.path, "params", s, got, F32(&g, "params") + (size_t)s * K, K);
  }
  assert_int_equal(*dt_optim_step_count(o), steps);
  free(got);
  dt_optim_destroy(o);
  dt_model_destroy(m);
  gfree(&g);
}

static void test_mlp_sgd(void **st) { (void)st; run_case("step_mlp_sgd", 0); }
static void test_mlp_nesterov(void **st) { (void)st; run_case("step_mlp_nesterov", 0); }
static void test_mlp_adamw(void **st) { (void)st; run_case("step_mlp_adamw", 0); }
static void test_cnn_sgd(void **st) { (void)st; run_case("step_cnn_sgd", 0); }
static void test_cnn_nesterov(void **st) { (void)st; run_case("step_cnn_nesterov", 0); }
static void test_cnn_adamw(void **st) { (void)st; run_case("step_cnn_adamw", 0); }
/* A batch smaller than max_batch must give the same results. */
static void test_mlp_small_batch(void **st) { (void)st; run_case("step_mlp_sgd", 9); }
static void test_cnn_small_batch(void **st) { (void)st; run_case("step_cnn_adamw", 3); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_sgd),        cmocka_unit_test(test_mlp_nesterov),
      cmocka_unit_test(test_mlp_adamw),      cmocka_unit_test(test_cnn_sgd),
      cmocka_unit_test(test_cnn_nesterov),   cmocka_unit_test(test_cnn_adamw),
      cmocka_unit_test(test_mlp_small_batch), cmocka_unit_test(test_cnn_small_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

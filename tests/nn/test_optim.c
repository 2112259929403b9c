/*
 * test_optim.c — SGD and AdamW against torch.optim (PyTorch 1.13) over six
 * steps with a changing learning rate, from tools/golden_step.py fixtures
 * (tests/nn/golden/optim_*.bin): plain SGD with weight decay, momentum with
 * dampening, Nesterov, AdamW with default and non-default betas/eps. Also:
 * state sizes, resuming from copied state (what a checkpoint does) gives
 * bit-identical results, and invalid configurations are rejected.
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

static dt_optim_cfg cfg_of(gfile *g) {
  int32_t *meta = I32(g, "meta");
  float *hy = F32(g, "hyper");
  dt_optim_cfg c = DT_OPTIM_CFG_INIT;
  c.kind = meta[0] ? DT_OPT_ADAMW : DT_OPT_SGD;
  c.nesterov = meta[1];
  c.momentum = hy[0], c.dampening = hy[1], c.weight_decay = hy[2];
  c.beta1 = hy[3], c.beta2 = hy[4], c.eps = hy[5];
  return c;
}

static void run_case(const char *stem, size_t want_state_per_param) {
  gfile g = {0};
  gload(&g, stem);
  int32_t *meta = I32(&g, "meta");
  int steps = meta[2];
  size_t n = (size_t)meta[3];
  dt_optim_cfg c = cfg_of(&g);
  dt_optim *o = NULL;
  assert_int_equal(dt_optim_create(&o, &c, n), DT_OK);
  assert_int_equal(dt_optim_state_floats(o), want_state_per_param * n);
  float *p = malloc(n * sizeof(float));
  memcpy(p, F32(&g, "params0"), n * sizeof(float));
  for (int s = 0; s < steps; s++) {
    dt_optim_step(o, p, F32(&g, "grads") + (size_t)s * n, F32(&g, "lr")[s]);
    check_step(g.path, "params", s, p, F32(&g, "params") + (size_t)s * n, n);
  }
  assert_int_equal(*dt_optim_step_count(o), steps);
  free(p);
  dt_optim_destroy(o);
  gfree(&g);
}

static void test_sgd_plain(void **st) { (void)st; run_case("optim_sgd_plain", 0); }
static void test_sgd_momentum(void **st) { (void)st; run_case("optim_sgd_momentum", 1); }
static void test_sgd_nesterov(void **st) { (void)st; run_case("optim_sgd_nesterov", 1); }
static void test_adamw(void **st) { (void)st; run_case("optim_adamw", 2); }
static void test_adamw_betas(void **st) { (void)st; run_case("optim_adamw_betas", 2); }

/* Three steps, then the state and step count copied into a fresh optimizer
 * (a checkpoint resume), then three more: bit-identical to six in a row. */
static void resume_case(const char *stem) {
  gfile g = {0};
  gload(&g, stem);
  int32_t *meta = I32(&g, "meta");
  size_t n = (size_t)meta[3];
  int steps = meta[2];
  dt_optim_cfg c = cfg_of(&g);
  const float *gr = F32(&g, "grads"), *lr = F32(&g, "lr");
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  memcpy(a, F32(&g, "params0"), n * sizeof(float));
  memcpy(b, a, n * sizeof(float));
  dt_optim *oa = NULL, *ob = NULL, *oc = NULL;
  assert_int_equal(dt_optim_create(&oa, &c, n), DT_OK);
  assert_int_equal(dt_optim_create(&ob, &c, n), DT_OK);
  assert_int_equal(dt_optim_create(&oc, &c, n), DT_OK);
  for (int s = 0; s < steps; s++) dt_optim_step(oa, a, gr + (size_t)s * n, lr[s]);
  int half = steps / 2;
  for (int s = 0; s < half; s++) dt_optim_step(ob, b, gr + (size_t)s * n, lr[s]);
  memcpy(dt_optim_state(oc), dt_optim_state(ob), dt_optim_state_floats(ob) * sizeof(float));
  *dt_optim_step_count(oc) = *dt_optim_step_count(ob);
  for (int s = half; s < steps; s++) dt_optim_step(oc, b, gr + (size_t)s * n, lr[s]);
  assert_memory_equal(a, b, n * sizeof(float));
  dt_optim_destroy(oa);
  dt_optim_destroy(ob);
  dt_optim_destroy(oc);
  free(a);
  free(b);
  gfree(&g);
}

static void test_resume(void **st) {
  (void)st;
  resume_case("optim_sgd_nesterov");
  resume_case("optim_adamw");
}

/* Closed form for plain SGD: p - lr * (g + wd * p), one step. */
static void test_sgd_closed_form(void **st) {
  (void)st;
  dt_optim_cfg c = DT_OPTIM_CFG_INIT;
  c.weight_decay = 0.5f;
  dt_optim *o = NULL;
  assert_int_equal(dt_optim_create(&o, &c, 3), DT_OK);
  float p[3] = {1.0f, -2.0f, 4.0f}, g[3] = {0.5f, 0.25f, -1.0f};
  dt_optim_step(o, p, g, 0.5f);
  assert_float_equal(p[0], 1.0f - 0.5f * (0.5f + 0.5f), 1e-7);
  assert_float_equal(p[1], -2.0f - 0.5f * (0.25f - 1.0f), 1e-7);
  assert_float_equal(p[2], 4.0f - 0.5f * (-1.0f + 2.0f), 1e-7);
  dt_optim_destroy(o);
  dt_optim_destroy(NULL);
}

static void expect_einval(dt_optim_cfg c) {
  dt_optim *o = (dt_optim *)&c; /* must be reset to NULL */
  assert_int_equal(dt_optim_create(&o, &c, 10), DT_EINVAL);
  assert_null(o);
  assert_true(strstr(dt_errmsg(), "optimizer") != NULL);
}

static void test_invalid(void **st) {
  (void)st;
  dt_optim_cfg c = DT_OPTIM_CFG_INIT;
  c.kind = 7;
  expect_einval(c);
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.nesterov = 1; /* without momentum */
  expect_einval(c);
  c.momentum = 0.9f, c.dampening = 0.1f; /* with dampening */
  expect_einval(c);
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.momentum = -0.1f;
  expect_einval(c);
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.weight_decay = NAN;
  expect_einval(c);
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.kind = DT_OPT_ADAMW, c.beta2 = 1.0f;
  expect_einval(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_plain),   cmocka_unit_test(test_sgd_momentum),
      cmocka_unit_test(test_sgd_nesterov), cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_adamw_betas), cmocka_unit_test(test_resume),
      cmocka_unit_test(test_sgd_closed_form), cmocka_unit_test(test_invalid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

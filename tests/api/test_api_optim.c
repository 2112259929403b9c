/*
 * test_api_optim.c — dtrain/optim.h through the public API: configs out of
 * range are refused naming the field, a step with a NULL buffer or a bad
 * learning rate changes nothing, schedules are checked and give the
 * documented values, and model + optimizer + schedule + a dataset from
 * memory together learn a small problem (the loss falls, accuracy rises).
 */
#include <math.h>
#include <stdlib.h>

#include "api_test.h"

static void test_optim_errors(void **st) {
  (void)st;
  dt_optim_cfg c = DT_OPTIM_CFG_INIT;
  dt_optim *o = (dt_optim *)&o;
  EXPECT_ERR(dt_optim_create(NULL, &c, 10), DT_EINVAL, "out");
  EXPECT_ERR(dt_optim_create(&o, NULL, 10), DT_EINVAL, "cfg");
  assert_null(o);
  EXPECT_ERR(dt_optim_create(&o, &c, 0), DT_EINVAL, "n is 0");
  c.kind = 7;
  EXPECT_ERR(dt_optim_create(&o, &c, 10), DT_EINVAL, "kind");
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.lr = -0.1f;
  EXPECT_ERR(dt_optim_create(&o, &c, 10), DT_EINVAL, "lr");
  c.lr = NAN;
  EXPECT_ERR(dt_optim_create(&o, &c, 10), DT_EINVAL, "lr");
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.momentum = -0.5f;
  EXPECT_ERR(dt_optim_create(&o, &c, 10), DT_EINVAL, "momentum");
  c.momentum = 0.0f, c.nesterov = 1;
  EXPECT_ERR(dt_optim_create(&o, &c, 10), DT_EINVAL, "nesterov");
  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.kind = DT_OPT_ADAMW, c.beta2 = 1.0f;
  EXPECT_ERR(dt_optim_create(&o, &c, 10), DT_EINVAL, "betas");
  assert_null(o);
  dt_optim_destroy(NULL);

  c = (dt_optim_cfg)DT_OPTIM_CFG_INIT;
  c.momentum = 0.9f;
  EXPECT_OK(dt_optim_create(&o, &c, 4));
  float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1};
  EXPECT_ERR(dt_optim_step(NULL, p, g, 0.1f), DT_EINVAL, "optimizer is NULL");
  EXPECT_ERR(dt_optim_step(o, NULL, g, 0.1f), DT_EINVAL, "params");
  EXPECT_ERR(dt_optim_step(o, p, NULL, 0.1f), DT_EINVAL, "grads");
  EXPECT_ERR(dt_optim_step(o, p, g, -1.0f), DT_EINVAL, "lr");
  EXPECT_ERR(dt_optim_step(o, p, g, INFINITY), DT_EINVAL, "lr");
  assert_true(p[0] == 1 && p[1] == 2 && p[2] == 3 && p[3] == 4);
  EXPECT_OK(dt_optim_step(o, p, g, 0.5f)); /* first momentum step: buf = g */
  assert_float_equal(p[0], 0.5f, 0.0f);
  EXPECT_OK(dt_optim_step(o, p, g, 0.5f)); /* buf = 0.9 + 1 */
  assert_float_equal(p[0], 0.5f - 0.95f, 1e-6f);
  dt_optim_destroy(o);
}

static void test_sched(void **st) {
  (void)st;
  dt_sched_cfg s = DT_SCHED_CFG_INIT;
  EXPECT_OK(dt_sched_check(&s));
  assert_float_equal(dt_sched_lr(&s, 1000), 0.01f, 0.0f);
  EXPECT_ERR(dt_sched_check(NULL), DT_EINVAL, "cfg is NULL");
  assert_true(dt_sched_lr(NULL, 3) == 0.0f);
  s.kind = 9;
  EXPECT_ERR(dt_sched_check(&s), DT_EINVAL, "kind");
  s = (dt_sched_cfg)DT_SCHED_CFG_INIT;
  s.base_lr = -1;
  EXPECT_ERR(dt_sched_check(&s), DT_EINVAL, "base_lr");
  s = (dt_sched_cfg)DT_SCHED_CFG_INIT;
  s.warmup_steps = -2;
  EXPECT_ERR(dt_sched_check(&s), DT_EINVAL, "warmup_steps");
  s = (dt_sched_cfg)DT_SCHED_CFG_INIT;
  s.kind = DT_SCHED_STEP, s.step_size = 0;
  EXPECT_ERR(dt_sched_check(&s), DT_EINVAL, "step_size");
  s = (dt_sched_cfg)DT_SCHED_CFG_INIT;
  s.kind = DT_SCHED_COSINE, s.warmup_steps = 10, s.total_steps = 10;
  EXPECT_ERR(dt_sched_check(&s), DT_EINVAL, "total_steps");
  s.total_steps = 110, s.base_lr = 1.0f, s.min_lr = 0.0f;
  EXPECT_OK(dt_sched_check(&s));
  assert_float_equal(dt_sched_lr(&s, 0), 0.1f, 1e-7f);   /* warm-up 1/10 */
  assert_float_equal(dt_sched_lr(&s, 9), 1.0f, 1e-7f);   /* end of warm-up */
  assert_float_equal(dt_sched_lr(&s, 60), 0.5f, 1e-6f);  /* half-way down */
  assert_float_equal(dt_sched_lr(&s, 500), 0.0f, 0.0f);  /* past the end */
}

/* Two Gaussian-ish blobs per class in 8 dimensions: learnable in a few
 * dozen steps. */
static void test_learns(void **st) {
  (void)st;
  enum { N = 256, D = 8, K = 3, B = 32 };
  float *x = malloc(sizeof(float) * N * D);
  int32_t *y = malloc(sizeof(int32_t) * N);
  uint32_t r = 12345;
  for (int i = 0; i < N; i++) {
    y[i] = i % K;
    for (int d = 0; d < D; d++) {
      r = r * 1664525u + 1013904223u;
      float noise = (float)(r >> 8) / 16777216.0f - 0.5f;
      x[i * D + d] = (d % K == y[i] ? 1.5f : 0.0f) + noise;
    }
  }
  dt_dataset ds;
  EXPECT_OK(dt_dataset_from_memory(&ds, x, y, N, 1, 1, D, DT_DATA_COPY));
  free(x), free(y); /* a copy: the caller's arrays can go */
  assert_int_equal(ds.nclasses, K);
  dt_model *m = NULL;
  EXPECT_OK(dt_model_create(&m, "linear(16) relu linear(3)", ds.c, ds.h, ds.w, B));
  EXPECT_OK(dt_model_init(m, 3));
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.momentum = 0.9f;
  dt_optim *o = NULL;
  EXPECT_OK(dt_optim_create(&o, &oc, dt_model_nparams(m)));
  dt_sched_cfg sc = DT_SCHED_CFG_INIT;
  sc.kind = DT_SCHED_COSINE, sc.base_lr = 0.1f, sc.total_steps = 5 * (N / B);
  EXPECT_OK(dt_sched_check(&sc));
  float first = 0, last = 0;
  int correct = 0;
  int64_t step = 0;
  for (int ep = 0; ep < 5; ep++) {
    correct = 0;
    for (int b = 0; b < N / B; b++, step++) {
      dt_step_ctx ctx = {1, 1, (uint64_t)step, (int64_t)b * B};
      float loss;
      int nc;
      EXPECT_OK(dt_model_forward(m, ds.x + (size_t)b * B * D, B, &ctx));
      EXPECT_OK(dt_model_backward(m, ds.y + (size_t)b * B, B, &loss, &nc, NULL, NULL));
      EXPECT_OK(dt_optim_step(o, dt_model_params(m), dt_model_grads(m), dt_sched_lr(&sc, step)));
      if (step == 0) first = loss;
      last = loss;
      correct += nc;
    }
  }
  assert_true(last < 0.5f * first);
  assert_true(correct > 0.9 * N);
  dt_optim_destroy(o);
  dt_model_destroy(m);
  dt_dataset_free(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_optim_errors),
      cmocka_unit_test(test_sched),
      cmocka_unit_test(test_learns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_sched.c — learning-rate schedules against closed-form values:
 * constant, step decay, cosine to min_lr, each with and without linear
 * warm-up, and the edge cases (negative step, step_size 0, total <= warmup,
 * past the end).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "nn/nn.h"

#define EQ(a, b) assert_float_equal((a), (b), 1e-7 + 1e-6 * fabs((double)(b)))

static void test_constant(void **st) {
  (void)st;
  dt_sched_cfg s = DT_SCHED_CFG_INIT;
  s.base_lr = 0.1f;
  for (int64_t t = 0; t < 1000; t += 97) EQ(dt_sched_lr(&s, t), 0.1f);
  EQ(dt_sched_lr(&s, -5), 0.1f);
}

static void test_warmup(void **st) {
  (void)st;
  dt_sched_cfg s = DT_SCHED_CFG_INIT;
  s.base_lr = 0.4f;
  s.warmup_steps = 4;
  EQ(dt_sched_lr(&s, 0), 0.1f); /* base/warmup at step 0 */
  EQ(dt_sched_lr(&s, 1), 0.2f);
  EQ(dt_sched_lr(&s, 2), 0.3f);
  EQ(dt_sched_lr(&s, 3), 0.4f);
  EQ(dt_sched_lr(&s, 4), 0.4f);
  EQ(dt_sched_lr(&s, 100000), 0.4f);
  EQ(dt_sched_lr(&s, -3), 0.1f); /* negative steps count as 0 */
}

static void test_step(void **st) {
  (void)st;
  dt_sched_cfg s = DT_SCHED_CFG_INIT;
  s.kind = DT_SCHED_STEP;
  s.base_lr = 1.0f;
  s.step_size = 10;
  s.gamma = 0.5f;
  EQ(dt_sched_lr(&s, 0), 1.0f);
  EQ(dt_sched_lr(&s, 9), 1.0f);
  EQ(dt_sched_lr(&s, 10), 0.5f);
  EQ(dt_sched_lr(&s, 19), 0.5f);
  EQ(dt_sched_lr(&s, 20), 0.25f);
  EQ(dt_sched_lr(&s, 35), 0.125f);
  /* With warm-up the decay counts from the end of warm-up. */
  s.warmup_steps = 5;
  EQ(dt_sched_lr(&s, 0), 0.2f);
  EQ(dt_sched_lr(&s, 4), 1.0f);
  EQ(dt_sched_lr(&s, 14), 1.0f);
  EQ(dt_sched_lr(&s, 15), 0.5f);
  /* step_size <= 0: no decay rather than a division by zero. */
  s.step_size = 0;
  EQ(dt_sched_lr(&s, 1000), 1.0f);
}

static void test_cosine(void **st) {
  (void)st;
  dt_sched_cfg s = DT_SCHED_CFG_INIT;
  s.kind = DT_SCHED_COSINE;
  s.base_lr = 0.1f;
  s.min_lr = 0.001f;
  s.total_steps = 100;
  for (int64_t t = 0; t <= 120; t += 7) {
    double want = t >= 100 ? 0.001 : 0.001 + (0.1 - 0.001) * 0.5 * (1 + cos(M_PI * t / 100.0));
    EQ(dt_sched_lr(&s, t), (float)want);
  }
  EQ(dt_sched_lr(&s, 0), 0.1f);
  EQ(dt_sched_lr(&s, 50), (float)(0.001 + 0.099 * 0.5));
  EQ(dt_sched_lr(&s, 100), 0.001f);
  /* Warm-up 10, then a half cosine over the remaining 90 steps. */
  s.warmup_steps = 10;
  EQ(dt_sched_lr(&s, 0), 0.01f);
  EQ(dt_sched_lr(&s, 9), 0.1f);
  EQ(dt_sched_lr(&s, 10), 0.1f);
  EQ(dt_sched_lr(&s, 55), (float)(0.001 + 0.099 * 0.5));
  EQ(dt_sched_lr(&s, 100), 0.001f);
  EQ(dt_sched_lr(&s, 1000), 0.001f);
  for (int64_t t = 10; t < 100; t++) /* monotone non-increasing after warm-up */
    assert_true(dt_sched_lr(&s, t + 1) <= dt_sched_lr(&s, t));
  /* total <= warmup: min_lr once warm-up is over. */
  s.total_steps = 5;
  EQ(dt_sched_lr(&s, 3), 0.04f);
  EQ(dt_sched_lr(&s, 10), 0.001f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constant),
      cmocka_unit_test(test_warmup),
      cmocka_unit_test(test_step),
      cmocka_unit_test(test_cosine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

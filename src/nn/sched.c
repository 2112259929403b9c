/*
 * sched.c — learning-rate schedules as pure functions of the step (counted
 * from 0), so a resumed or re-sharded run needs no schedule state.
 *
 * Warm-up: for step < warmup_steps, lr = base_lr * (step + 1) / warmup_steps
 * (base_lr / warmup at step 0, reaching base_lr at step warmup - 1). After
 * warm-up, with t = step - warmup_steps:
 *   constant  base_lr
 *   step      base_lr * gamma^floor(t / step_size)   (step_size <= 0: no decay)
 *   cosine    min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2 with
 *             T = total_steps - warmup_steps, and min_lr for t >= T
 * Computed in double, returned as float. It does not do restarts or
 * plateau detection (those need state).
 */
#include <math.h>

#include "core/core.h"
#include "nn/nn.h"

static int bad_rate(float r) { return !(r >= 0.0f) || isinf(r); }

int dt_sched_check(const dt_sched_cfg *s) {
  if (!s) return dt__seterr(DT_EINVAL, "schedule: cfg is NULL");
  if (s->kind != DT_SCHED_CONSTANT && s->kind != DT_SCHED_STEP && s->kind != DT_SCHED_COSINE)
    return dt__seterr(DT_EINVAL, "schedule: unknown kind %d", s->kind);
  if (bad_rate(s->base_lr))
    return dt__seterr(DT_EINVAL, "schedule: base_lr %g must be finite and >= 0", (double)s->base_lr);
  if (bad_rate(s->min_lr))
    return dt__seterr(DT_EINVAL, "schedule: min_lr %g must be finite and >= 0", (double)s->min_lr);
  if (s->warmup_steps < 0)
    return dt__seterr(DT_EINVAL, "schedule: warmup_steps %lld must be >= 0",
                      (long long)s->warmup_steps);
  if (s->kind == DT_SCHED_STEP && s->step_size < 1)
    return dt__seterr(DT_EINVAL, "schedule: step_size %lld must be >= 1",
                      (long long)s->step_size);
  if (s->kind == DT_SCHED_STEP && bad_rate(s->gamma))
    return dt__seterr(DT_EINVAL, "schedule: gamma %g must be finite and >= 0", (double)s->gamma);
  if (s->kind == DT_SCHED_COSINE && s->total_steps <= s->warmup_steps)
    return dt__seterr(DT_EINVAL, "schedule: total_steps %lld must exceed warmup_steps %lld",
                      (long long)s->total_steps, (long long)s->warmup_steps);
  return DT_OK;
}

float dt_sched_lr(const dt_sched_cfg *s, int64_t step) {
  if (!s) return 0.0f;
  if (step < 0) step = 0;
  double base = s->base_lr;
  if (s->warmup_steps > 0 && step < s->warmup_steps)
    return (float)(base * (double)(step + 1) / (double)s->warmup_steps);
  int64_t t = step - (s->warmup_steps > 0 ? s->warmup_steps : 0);
  switch (s->kind) {
  case DT_SCHED_STEP:
    if (s->step_size <= 0) return (float)base;
    return (float)(base * pow((double)s->gamma, (double)(t / s->step_size)));
  case DT_SCHED_COSINE: {
    int64_t T = s->total_steps - (s->warmup_steps > 0 ? s->warmup_steps : 0);
    if (T <= 0 || t >= T) return s->min_lr;
    double min = s->min_lr;
    return (float)(min + (base - min) * 0.5 * (1.0 + cos(M_PI * (double)t / (double)T)));
  }
  default: return (float)base;
  }
}

/*
 * dtrain/optim.h — optimizers over a model's flat parameter and gradient
 * buffers, and learning-rate schedules.
 *
 * Optimizers follow torch.optim (1.13) to rounding: SGD with momentum,
 * dampening, Nesterov and L2 weight decay; AdamW with decoupled weight
 * decay. Their state (momentum buffer, Adam moments) is one flat array the
 * optimizer owns. Schedules are pure functions of the step (counted from
 * 0): a resumed or re-sharded run needs no schedule state.
 *
 * Configs are plain structs: start from the _INIT macro and change fields.
 * Errors follow dtrain/core.h.
 */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizers ------------------------------------------------------------ */

enum dt_optim_kind { DT_OPT_SGD, DT_OPT_ADAMW };

typedef struct dt_optim_cfg {
  int kind;           /* enum dt_optim_kind */
  float lr;           /* the learning rate of dt_optim_step's callers (schedules' base) */
  float momentum;     /* SGD, >= 0 */
  float dampening;    /* SGD, >= 0 */
  int nesterov;       /* SGD: needs momentum > 0 and dampening 0 */
  float weight_decay; /* >= 0; SGD: L2 added to the gradient; AdamW: decoupled */
  float beta1, beta2, eps; /* AdamW: betas in [0, 1), eps >= 0 */
} dt_optim_cfg;
/* Plain SGD, lr 0.01 (AdamW fields at PyTorch's defaults). */
#define DT_OPTIM_CFG_INIT {DT_OPT_SGD, 0.01f, 0.0f, 0.0f, 0, 0.0f, 0.9f, 0.999f, 1e-8f}

typedef struct dt_optim dt_optim;

/* Creates an optimizer for n parameters (n = dt_model_nparams of the model
 * it will update) with its state zeroed. cfg is copied. On success *out is
 * the caller's (free with dt_optim_destroy). DT_EINVAL if out or cfg is
 * NULL, n is 0 or a field is out of range (the message names the field);
 * DT_ENOMEM. */
DT_API int dt_optim_create(dt_optim **out, const dt_optim_cfg *cfg, size_t n);

/* Frees the optimizer and its state. NULL is a no-op. */
DT_API void dt_optim_destroy(dt_optim *o);

/* One update of params (n floats, updated in place) from grads (n floats)
 * with learning rate lr (the schedule's value for this step). DT_EINVAL if
 * o, params or grads is NULL or lr is negative or not finite; nothing is
 * changed then. */
DT_API int dt_optim_step(dt_optim *o, float *params, const float *grads, float lr);

/* ---- learning-rate schedules ----------------------------------------------- */

enum dt_sched_kind { DT_SCHED_CONSTANT, DT_SCHED_STEP, DT_SCHED_COSINE };

/* Warm-up: for step < warmup_steps, lr = base_lr * (step + 1) / warmup_steps.
 * After it, with t = step - warmup_steps:
 *   constant  base_lr
 *   step      base_lr * gamma^floor(t / step_size)
 *   cosine    min_lr + (base_lr - min_lr) * (1 + cos(pi t / T)) / 2 with
 *             T = total_steps - warmup_steps; min_lr once t >= T */
typedef struct dt_sched_cfg {
  int kind;              /* enum dt_sched_kind */
  float base_lr;
  int64_t warmup_steps;  /* 0 = no warm-up */
  int64_t total_steps;   /* cosine: decay to min_lr at total_steps */
  int64_t step_size;     /* step: multiply by gamma every step_size steps */
  float gamma;
  float min_lr;
} dt_sched_cfg;
/* Constant lr 0.01. */
#define DT_SCHED_CFG_INIT {DT_SCHED_CONSTANT, 0.01f, 0, 0, 1, 0.1f, 0.0f}

/* Checks a schedule: DT_EINVAL naming the field if s is NULL, kind is
 * unknown, a rate is negative or not finite, warmup_steps is negative, a
 * step schedule has step_size < 1 or a cosine one total_steps <=
 * warmup_steps. */
DT_API int dt_sched_check(const dt_sched_cfg *s);

/* The learning rate at step (0-based; negative counts as 0). Infallible on
 * a schedule dt_sched_check accepts; a NULL s gives 0. */
DT_API float dt_sched_lr(const dt_sched_cfg *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPTIM_H */

/*
 * fused.c — bsp's close of a dense key with two pushes in one pass: the sum
 * in rank order (x0 + x1) and SGD's update (plain or with momentum) of the
 * parameters and the momentum buffer, element by element, instead of a pass
 * for the sum into a scratch and a pass of the optimizer over it (the
 * separate server's critical path each step: MLP, 2 workers, ~200k floats
 * in the first layer's key). Compiled without FMA contraction, as optim.c,
 * so every element is the same IEEE operations as add2 then dt_optim_step:
 * params_sha256 unchanged (bsp still equals ddp).
 *
 * With o0 and o1 (a separate server whose two workers read this version
 * through their windows) the pass also writes the new parameters into both
 * workers' parameters, so the replies need no copies of their own.
 *
 * It does not handle Nesterov, dampening, AdamW, rows or more than two
 * pushes (the caller takes the general path).
 */
#include <math.h>
#include <string.h>

#include "ps/server_int.h"

int dt__pss_fused_sum2_step(const dt_optim_cfg *c, dt_optim *o, size_t n, float *restrict p,
                            const float *restrict a, const float *restrict b, float lr,
                            float *restrict o0, float *restrict o1) {
  if (c->kind != DT_OPT_SGD || c->nesterov || c->dampening != 0.0f) return 0;
  if (!(lr >= 0.0f) || isinf(lr)) return 0; /* the general path reports it */
  const float wd = c->weight_decay;
  int64_t *t = dt_optim_step_count(o);
  ++*t;
  if (c->momentum == 0.0f) {
    for (size_t i = 0; i < n; i++) {
      float g = a[i] + b[i];
      p[i] -= lr * (g + wd * p[i]);
    }
    if (o0) memcpy(o0, p, n * sizeof(float)), memcpy(o1, p, n * sizeof(float));
    return 1;
  }
  float *restrict st = dt_optim_state(o);
  const float mom = c->momentum, keep = 1.0f;
  if (*t == 1) {
    for (size_t i = 0; i < n; i++) {
      float d = (a[i] + b[i]) + wd * p[i];
      st[i] = d;
      p[i] -= lr * d;
    }
    if (o0) memcpy(o0, p, n * sizeof(float)), memcpy(o1, p, n * sizeof(float));
  } else if (o0) {
    for (size_t i = 0; i < n; i++) {
      float d = (a[i] + b[i]) + wd * p[i];
      float m = mom * st[i] + keep * d;
      st[i] = m;
      float q = p[i] - lr * m;
      p[i] = q;
      o0[i] = q;
      o1[i] = q;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float d = (a[i] + b[i]) + wd * p[i];
      float m = mom * st[i] + keep * d;
      st[i] = m;
      p[i] -= lr * m;
    }
  }
  return 1;
}

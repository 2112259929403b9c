/*
 * optim.c — optimizers over flat buffers with torch.optim semantics (1.13,
 * single-tensor path), so a step here matches a PyTorch step to rounding:
 *
 *   SGD:   g = grad + wd * p;  buf = g on the first step, else
 *          buf = momentum * buf + (1 - dampening) * g;
 *          g = nesterov ? g + momentum * buf : buf;  p -= lr * g
 *   AdamW: p *= 1 - lr * wd;  m += (1 - b1) * (g - m);  v = b2 * v + (1 - b2) g^2;
 *          p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *
 * State is one flat float array (SGD: the momentum buffer, absent without
 * momentum; AdamW: m then v) plus a step count, so checkpoints and ZeRO
 * shards treat it like the parameters. dt__optim_step_rows updates some
 * rows only, lazily (the rows' state moves, the others' does not), for a
 * parameter server's embedding rows. It does not do per-parameter-group
 * settings, amsgrad or maximize.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/nn.h"

struct dt_optim {
  dt_optim_cfg cfg;
  size_t n;
  size_t nstate;
  float *state;
  int64_t step;
  uint32_t grad_maxbits; /* bits of the last step's largest |gradient| */
};

int dt_optim_create(dt_optim **out, const dt_optim_cfg *cfg, size_t n) {
  if (!out) return dt__seterr(DT_EINVAL, "optimizer: out is NULL");
  *out = NULL;
  if (!cfg) return dt__seterr(DT_EINVAL, "optimizer: cfg is NULL");
  if (!n) return dt__seterr(DT_EINVAL, "optimizer: n is 0 (no parameters to update)");
  if (!(cfg->lr >= 0.0f) || isinf(cfg->lr))
    return dt__seterr(DT_EINVAL, "optimizer: lr %g must be finite and >= 0", (double)cfg->lr);
  if (cfg->kind != DT_OPT_SGD && cfg->kind != DT_OPT_ADAMW)
    return dt__seterr(DT_EINVAL, "optimizer: unknown kind %d", cfg->kind);
  if (!(cfg->momentum >= 0.0f) || !(cfg->weight_decay >= 0.0f) || !(cfg->dampening >= 0.0f))
    return dt__seterr(DT_EINVAL, "optimizer: momentum, dampening and weight_decay must be >= 0");
  if (cfg->kind == DT_OPT_SGD && cfg->nesterov && (cfg->momentum <= 0.0f || cfg->dampening != 0.0f))
    return dt__seterr(DT_EINVAL, "optimizer: nesterov needs momentum > 0 and dampening 0");
  if (cfg->kind == DT_OPT_ADAMW &&
      (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f) ||
       !(cfg->eps >= 0.0f)))
    return dt__seterr(DT_EINVAL, "optimizer: AdamW betas must be in [0, 1) and eps >= 0");
  dt_optim *o = calloc(1, sizeof *o);
  if (!o) return dt__seterr(DT_ENOMEM, "optimizer: out of memory");
  o->cfg = *cfg;
  o->n = n;
  if (cfg->kind == DT_OPT_ADAMW) o->nstate = 2 * n;
  else if (cfg->momentum != 0.0f) o->nstate = n;
  if (o->nstate) {
    o->state = dt_calloc(o->nstate * sizeof(float));
    if (!o->state) {
      size_t ns = o->nstate;
      free(o);
      return dt__seterr(DT_ENOMEM, "optimizer: out of memory for %zu state floats", ns);
    }
  }
  *out = o;
  return DT_OK;
}

void dt_optim_destroy(dt_optim *o) {
  if (!o) return;
  dt_free(o->state);
  free(o);
}

size_t dt_optim_state_floats(const dt_optim *o) { return o->nstate; }
float *dt_optim_state(dt_optim *o) { return o->state; }
int64_t *dt_optim_step_count(dt_optim *o) { return &o->step; }
float dt__optim_grad_maxabs(const dt_optim *o) {
  float f;
  memcpy(&f, &o->grad_maxbits, sizeof f);
  return f;
}

/* The bits of |x|: for finite values, inf and NaN they order like the
 * magnitudes (NaN above inf). An integer max over them vectorises, so the
 * update loops below also find the largest |gradient| for the engine's
 * per-step divergence check at no measurable cost, where a separate pass
 * over the gradient cost 3-5% of a small MLP step. */
static inline uint32_t absbits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u & 0x7fffffffu;
}
#define TRACK(x) do { uint32_t a_ = absbits(x); big = a_ > big ? a_ : big; } while (0)

static uint32_t sgd_plain(float *restrict p, const float *restrict g, size_t n, float lr, float wd) {
  uint32_t big = 0;
  for (size_t i = 0; i < n; i++) {
    TRACK(g[i]);
    p[i] -= lr * (g[i] + wd * p[i]);
  }
  return big;
}

static uint32_t sgd_momentum(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                         float lr, float wd, float mom, float damp, int nesterov, int first) {
  float keep = 1.0f - damp;
  uint32_t big = 0;
  if (first) {
    for (size_t i = 0; i < n; i++) {
      TRACK(g[i]);
      float d = g[i] + wd * p[i];
      buf[i] = d;
      p[i] -= lr * (nesterov ? d + mom * d : d);
    }
  } else if (nesterov) {
    for (size_t i = 0; i < n; i++) {
      TRACK(g[i]);
      float d = g[i] + wd * p[i];
      float b = mom * buf[i] + keep * d;
      buf[i] = b;
      p[i] -= lr * (d + mom * b);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      TRACK(g[i]);
      float d = g[i] + wd * p[i];
      float b = mom * buf[i] + keep * d;
      buf[i] = b;
      p[i] -= lr * b;
    }
  }
  return big;
}

static uint32_t adamw(float *restrict p, const float *restrict g, float *restrict m,
                  float *restrict v, size_t n, float decay, float b1, float b2, float step_size,
                  float inv_bc2_sqrt, float eps) {
  float w1 = 1.0f - b1, w2 = 1.0f - b2;
  uint32_t big = 0;
  for (size_t i = 0; i < n; i++) {
    TRACK(g[i]);
    float gi = g[i];
    float pi = p[i] * decay;
    float mi = m[i] + w1 * (gi - m[i]);
    float vi = b2 * v[i] + w2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * (mi / (sqrtf(vi) * inv_bc2_sqrt + eps));
  }
  return big;
}

int dt__optim_step_state(const dt_optim_cfg *c, size_t n, float *params, const float *grads,
                         float lr, float *state, int64_t *step, uint32_t *maxbits) {
  if (!params) return dt__seterr(DT_EINVAL, "optimizer step: params is NULL");
  if (!grads) return dt__seterr(DT_EINVAL, "optimizer step: grads is NULL");
  if (!(lr >= 0.0f) || isinf(lr))
    return dt__seterr(DT_EINVAL, "optimizer step: lr %g must be finite and >= 0", (double)lr);
  ++*step;
  return dt__optim_step_span(c, n, 0, n, params, grads, lr, state, *step, maxbits);
}

int dt__optim_step_span(const dt_optim_cfg *c, size_t n, size_t lo, size_t hi, float *params,
                        const float *grads, float lr, float *state, int64_t t,
                        uint32_t *maxbits) {
  if (!params || !grads || lo > hi || hi > n || t < 1)
    return dt__seterr(DT_EINVAL, "optimizer span step: bad arguments ([%zu, %zu) of %zu, step "
                      "%lld)", lo, hi, n, (long long)t);
  if (!(lr >= 0.0f) || isinf(lr))
    return dt__seterr(DT_EINVAL, "optimizer step: lr %g must be finite and >= 0", (double)lr);
  const size_t k = hi - lo;
  float *p = params + lo;
  const float *g = grads + lo;
  uint32_t big = 0;
  if (k && c->kind == DT_OPT_SGD) {
    if (c->momentum == 0.0f)
      big = sgd_plain(p, g, k, lr, c->weight_decay);
    else
      big = sgd_momentum(p, g, state + lo, k, lr, c->weight_decay, c->momentum, c->dampening,
                         c->nesterov, t == 1);
  } else if (k) {
    /* the scalars of dt__optim_step_state, so the same bits per element */
    double td = (double)t;
    double bc1 = 1.0 - pow((double)c->beta1, td);
    double bc2 = 1.0 - pow((double)c->beta2, td);
    float step_size = (float)((double)lr / bc1);
    float inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
    float decay = (float)(1.0 - (double)lr * (double)c->weight_decay);
    big = adamw(p, g, state + lo, state + n + lo, k, decay, c->beta1, c->beta2, step_size,
                inv_bc2_sqrt, c->eps);
  }
  if (maxbits) *maxbits = big;
  return DT_OK;
}

void dt__optim_set_grad_maxbits(dt_optim *o, uint32_t bits) {
  if (o) o->grad_maxbits = bits;
}

int dt_optim_step(dt_optim *o, float *params, const float *grads, float lr) {
  if (!o) return dt__seterr(DT_EINVAL, "optimizer step: optimizer is NULL");
  return dt__optim_step_state(&o->cfg, o->n, params, grads, lr, o->state, &o->step,
                              &o->grad_maxbits);
}

int dt__optim_step_rows(dt_optim *o, float *params, const float *grads, float lr,
                        const uint32_t *rows, size_t nrows, size_t rowlen) {
  if (!o || !params || (nrows && (!grads || !rows)) || rowlen == 0)
    return dt__seterr(DT_EINVAL, "optimizer row step: NULL argument or rowlen 0");
  if (!(lr >= 0.0f) || isinf(lr))
    return dt__seterr(DT_EINVAL, "optimizer row step: lr %g must be finite and >= 0", (double)lr);
  const dt_optim_cfg *c = &o->cfg;
  o->step++;
  uint32_t big = 0, b;
  double t = (double)o->step;
  float step_size = 0, inv_bc2_sqrt = 0, decay = 0;
  if (c->kind == DT_OPT_ADAMW) {
    step_size = (float)((double)lr / (1.0 - pow((double)c->beta1, t)));
    inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow((double)c->beta2, t)));
    decay = (float)(1.0 - (double)lr * (double)c->weight_decay);
  }
  for (size_t j = 0; j < nrows; j++) {
    size_t at = (size_t)rows[j] * rowlen;
    if (at + rowlen > o->n)
      return dt__seterr(DT_EINVAL, "optimizer row step: row %u outside %zu floats", rows[j], o->n);
    float *p = params + at;
    const float *g = grads + j * rowlen;
    if (c->kind == DT_OPT_ADAMW)
      b = adamw(p, g, o->state + at, o->state + o->n + at, rowlen, decay, c->beta1, c->beta2,
                step_size, inv_bc2_sqrt, c->eps);
    else if (c->momentum == 0.0f)
      b = sgd_plain(p, g, rowlen, lr, c->weight_decay);
    else
      b = sgd_momentum(p, g, o->state + at, rowlen, lr, c->weight_decay, c->momentum,
                       c->dampening, c->nesterov, o->step == 1);
    big = b > big ? b : big;
  }
  o->grad_maxbits = big;
  return DT_OK;
}

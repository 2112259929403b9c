/*
 * wstash.c — deferred weight gradients (nn.h, dt__wstash): a pipeline stage
 * (DTRAIN_PIPE_WGRAD) stashes each linear layer's input rows and output
 * gradient rows of every micro-batch during backward (model.c's
 * stash_rows) and makes the layer's weight gradient once per step from all
 * of them, dW = dy^T * x over the step's rows: one product over many rows
 * instead of one small product per micro-batch. The stash is sized for a
 * step's rows when it is created; nothing is allocated per step.
 */
#include <stdlib.h>

#include "core/core.h"
#include "nn/model_int.h"
#include "tensor/tensor.h"

void dt__wstash_destroy(dt__wstash *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) dt_free(s->x[i]), dt_free(s->dy[i]);
  free(s->x), free(s->dy), free(s);
}

int dt__wstash_create(dt__wstash **out, const dt_model *m, int max_rows) {
  dt__wstash *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!s || !(s->x = calloc((size_t)m->n, sizeof *s->x)) ||
      !(s->dy = calloc((size_t)m->n, sizeof *s->dy))) {
    dt__wstash_destroy(s);
    return dt__seterr(DT_ENOMEM, "model: out of memory for deferred weight gradients");
  }
  s->n = m->n;
  s->max_rows = max_rows;
  for (int i = 0; i < m->n; i++) {
    const layer *l = &m->L[i];
    if (l->s.info.kind != DT_L_LINEAR) continue;
    size_t bx = (size_t)max_rows * l->in_el * sizeof(float), by = (size_t)max_rows * l->out_el * sizeof(float);
    if (!(s->x[i] = dt_alloc(bx)) || !(s->dy[i] = dt_alloc(by))) {
      dt__wstash_destroy(s);
      return dt__seterr(DT_ENOMEM, "model: out of memory for deferred weight gradients (%d rows)",
                        max_rows);
    }
    s->bytes += bx + by;
  }
  *out = s;
  return DT_OK;
}

size_t dt__wstash_bytes(const dt__wstash *s) { return s ? s->bytes : 0; }

void dt__wstash_rows(const dt__wstash *s, int i, const float **x, const float **dy) {
  int ok = s && i >= 0 && i < s->n;
  *x = ok ? s->x[i] : NULL;
  *dy = ok ? s->dy[i] : NULL;
}

/* The one weight-gradient product: dweight(OC,C) = dy^T(OC,rows) * x(rows,C),
 * whoever makes it (a stage's own flush, its two parts, or the last stage
 * for stage 0, dt__wgrad_product), so every path has the same bits. */
static void product(int flags, int OC, int C, int rows, const float *dy, const float *x,
                    int accumulate, float *dw) {
  dt_sgemm_f(flags, 1, 0, OC, C, rows, 1.0f, dy, OC, x, C, accumulate ? 1.0f : 0.0f, dw, C);
}

void dt__wgrad_product(const dt_model *m, int OC, int C, int rows, const float *dy,
                       const float *x, float *dw) {
  product(m->gemm_flags, OC, C, rows, dy, x, 0, dw);
}

void dt__model_wgrad_layer(dt_model *m, const dt__wstash *s, int i, int rows, int accumulate) {
  if (!s || rows <= 0 || i < 0 || i >= s->n || i >= m->n || !s->x[i] || !m->L[i].dw) return;
  layer *l = &m->L[i];
  product(m->gemm_flags, l->s.oc, (int)l->in_el, rows, s->dy[i], s->x[i], accumulate, l->dw);
}

float *dt__model_wgrad_dst(dt_model *m, int i) {
  return i >= 0 && i < m->n && m->L[i].s.info.kind == DT_L_LINEAR ? m->L[i].dw : NULL;
}

void dt__model_wgrad_flush(dt_model *m, const dt__wstash *s, int rows, int accumulate) {
  dt__model_wgrad_flush_ready(m, s, rows, accumulate, NULL, NULL);
}

void dt__model_wgrad_flush_ready(dt_model *m, const dt__wstash *s, int rows, int accumulate,
                                 dt_grad_ready_fn on_ready, void *ud) {
  /* last layer first, as backward reports them */
  for (int i = m->n - 1; i >= 0; i--) {
    layer *l = &m->L[i];
    if (s && rows > 0 && i < s->n && s->x[i] && l->dw)
      product(m->gemm_flags, l->s.oc, (int)l->in_el, rows, s->dy[i], s->x[i], accumulate, l->dw);
    if (on_ready && l->s.info.nparams) on_ready(ud, l->s.info.param_off, l->s.info.nparams);
  }
}

/* The stashed layers' sets for dt__model_wgrad_flush_part, in set[i]
 * (0 or 1; -1: nothing to make): the largest layer not yet placed (the
 * last of equal size first) goes to the lighter set, ties to set 0. A
 * model of more than DT_WGRAD_SPLIT_MAX layers is not split (set 0 makes
 * every product). */
#define DT_WGRAD_SPLIT_MAX 1024
static void wgrad_sets(const dt_model *m, const dt__wstash *s, signed char *set, int n) {
  double load[2] = {0, 0};
  for (int i = 0; i < n; i++) set[i] = (s->x[i] && m->L[i].dw) ? (n > DT_WGRAD_SPLIT_MAX ? 0 : 2) : -1;
  for (;;) {
    int best = -1;
    double bw = -1;
    for (int i = n - 1; i >= 0; i--) {
      if (set[i] != 2) continue;
      double c = (double)m->L[i].s.oc * (double)m->L[i].in_el;
      if (c > bw) bw = c, best = i;
    }
    if (best < 0) return;
    int to = load[1] < load[0] ? 1 : 0;
    load[to] += bw;
    set[best] = (signed char)to;
  }
}

void dt__model_wgrad_flush_part(dt_model *m, const dt__wstash *s, int rows, int accumulate,
                                int part) {
  if (!s || rows <= 0) return;
  const int n = s->n < m->n ? s->n : m->n;
  signed char set[DT_WGRAD_SPLIT_MAX + 1];
  if (n > DT_WGRAD_SPLIT_MAX) {
    if (part) return; /* not split: part 0 makes every product */
  } else {
    wgrad_sets(m, s, set, n);
  }
  for (int i = n - 1; i >= 0; i--) {
    layer *l = &m->L[i];
    if (!s->x[i] || !l->dw || (n <= DT_WGRAD_SPLIT_MAX && set[i] != part)) continue;
    product(m->gemm_flags, l->s.oc, (int)l->in_el, rows, s->dy[i], s->x[i], accumulate, l->dw);
  }
}

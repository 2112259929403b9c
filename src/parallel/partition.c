/*
 * partition.c — pipeline stage boundaries (partition.h): checked cut
 * points, the balanced split by measured layer cost (a small dynamic
 * programme over contiguous splits), the per-layer profile and the
 * description printed at start. It allocates only the profile's one-layer
 * models and scratch, freed before it returns.
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "parallel/partition.h"

int dt_partition_check(int nlayers, int nstages, const int *cuts, int ncuts) {
  int most = nlayers < DT_PIPE_MAX_STAGES ? nlayers : DT_PIPE_MAX_STAGES;
  if (nstages < 1 || nstages > most)
    return dt__seterr(DT_EINVAL, "dist.pipeline_stages = %d: the model has %d layers, so at most "
                      "%d stages", nstages, nlayers, most);
  if (!ncuts) return DT_OK;
  if (ncuts != nstages - 1)
    return dt__seterr(DT_EINVAL, "model.stages: %d cut points for dist.pipeline_stages = %d "
                      "(expects %d)", ncuts, nstages, nstages - 1);
  for (int i = 0; i < ncuts; i++) {
    if (cuts[i] < 1 || cuts[i] > nlayers - 1)
      return dt__seterr(DT_EINVAL, "model.stages: cut point %d is out of range [1, %d] (the "
                        "model has %d layers)", cuts[i], nlayers - 1, nlayers);
    if (i && cuts[i] <= cuts[i - 1])
      return dt__seterr(DT_EINVAL, "model.stages: cut points must increase (%d after %d)",
                        cuts[i], cuts[i - 1]);
  }
  return DT_OK;
}

/* Fills the sizes and offsets of p from its boundaries. */
static void fill_sizes(dt_partition *p, const dt_model *m) {
  for (int s = 0; s < p->nstages; s++) {
    const dt_layer_info *a = dt_model_layer(m, p->first[s]);
    p->param_off[s] = a->param_off;
    p->buf_off[s] = a->buf_off;
    p->params[s] = p->nbufs[s] = 0;
    for (int l = p->first[s]; l < p->first[s + 1]; l++) {
      p->params[s] += dt_model_layer(m, l)->nparams;
      p->nbufs[s] += dt_model_layer(m, l)->nbufs;
    }
  }
}

int dt_partition_from_cuts(dt_partition *p, const dt_model *m, int nstages, const int *cuts,
                           int ncuts) {
  const int n = dt_model_nlayers(m);
  DT_CHECK(dt_partition_check(n, nstages, cuts, ncuts));
  memset(p, 0, sizeof *p);
  p->nstages = nstages;
  p->first[0] = 0;
  for (int s = 1; s < nstages; s++) p->first[s] = ncuts ? cuts[s - 1] : n * s / nstages;
  p->first[nstages] = n;
  fill_sizes(p, m);
  return DT_OK;
}

int dt_partition_balance(dt_partition *p, const dt_model *m, int nstages, const double *cost) {
  const int n = dt_model_nlayers(m);
  DT_CHECK(dt_partition_check(n, nstages, NULL, 0));
  /* best[s][i]: the smallest largest-stage score splitting layers [0, i)
   * into s stages; the score is the cost plus a parameter term far below
   * any measurable time, so equal costs prefer smaller largest stages. */
  const int W = n + 1;
  double *pre = calloc((size_t)W, sizeof *pre);
  double *best = malloc((size_t)(nstages + 1) * W * sizeof *best);
  int *from = malloc((size_t)(nstages + 1) * W * sizeof *from);
  if (!pre || !best || !from) {
    free(pre), free(best), free(from);
    return dt__seterr(DT_ENOMEM, "pipeline partition: out of memory");
  }
  for (int l = 0; l < n; l++)
    pre[l + 1] = pre[l] + cost[l] + 1e-15 * (double)dt_model_layer(m, l)->nparams;
  for (int i = 0; i < (nstages + 1) * W; i++) best[i] = DBL_MAX, from[i] = -1;
  best[0] = 0;
  for (int s = 1; s <= nstages; s++)
    for (int i = s; i <= n; i++)
      for (int j = s - 1; j < i; j++) {
        double prev = best[(s - 1) * W + j];
        if (prev == DBL_MAX) continue;
        double seg = pre[i] - pre[j], v = prev > seg ? prev : seg;
        if (v < best[s * W + i]) best[s * W + i] = v, from[s * W + i] = j;
      }
  memset(p, 0, sizeof *p);
  p->nstages = nstages;
  p->first[nstages] = n;
  for (int s = nstages, i = n; s > 0; s--) {
    i = from[s * W + i];
    p->first[s - 1] = i;
  }
  for (int s = 0; s < nstages; s++)
    for (int l = p->first[s]; l < p->first[s + 1]; l++) p->cost[s] += cost[l];
  free(pre), free(best), free(from);
  fill_sizes(p, m);
  return DT_OK;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int dt_partition_profile(const char *spec, int c, int h, int w, int batch, int reps,
                         double *cost) {
  int n = 0, rc = DT_OK;
  DT_CHECK(dt__model_spec_layers(spec, c, h, w, &n));
  if (reps < 1) reps = 1;
  if (reps > 15) reps = 15;
  for (int l = 0; l < n && rc == DT_OK; l++) {
    dt_model *m = NULL;
    DT_CHECK(dt__model_create_range(&m, spec, c, h, w, batch, l, l + 1,
                                    l > 0 ? DT__STAGE_NEED_DX : 0));
    dt_model_init(m, 0); /* timed on initialised weights */
    size_t in = (size_t)dt_model_in_dim(m) * batch, out = (size_t)dt_model_out_dim(m) * batch;
    float *x = dt_alloc(in * sizeof(float)), *dy = dt_alloc(out * sizeof(float));
    if (!x || !dy) rc = dt__seterr(DT_ENOMEM, "pipeline profile: out of memory");
    double t[16];
    for (size_t i = 0; rc == DT_OK && i < in; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; rc == DT_OK && i < out; i++) dy[i] = 1e-3f;
    dt_step_ctx ctx = {1, 1, 0, 0};
    for (int r = 0; rc == DT_OK && r <= reps; r++) {
      double t0 = dt_now();
      rc = dt_model_forward(m, x, batch, &ctx);
      if (rc == DT_OK) rc = dt__model_backward_dy(m, dy, batch, NULL, NULL, NULL);
      if (r) t[r - 1] = dt_now() - t0;
    }
    if (rc == DT_OK) {
      qsort(t, (size_t)reps, sizeof t[0], cmp_d);
      cost[l] = t[reps / 2];
    }
    dt_free(x);
    dt_free(dy);
    dt_model_destroy(m);
  }
  return rc;
}

void dt_partition_describe(const dt_partition *p, const dt_model *m, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int s = 0; s < p->nstages && k < cap; s++) {
    int a = p->first[s], b = p->first[s + 1] - 1;
    k += (size_t)snprintf(buf + k, cap - k, "%sstage %d: layers %d-%d (%s .. %s), %.3gM params",
                          s ? "\n" : "", s, a + 1, b + 1, dt_model_layer(m, a)->name,
                          dt_model_layer(m, b)->name, (double)p->params[s] / 1e6);
    if (k < cap && p->cost[s] > 0)
      k += (size_t)snprintf(buf + k, cap - k, ", measured %.3g ms per micro-batch",
                            p->cost[s] * 1e3);
  }
}

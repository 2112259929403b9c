/*
 * train_det.c — deterministic mode's step and evaluation (dist.deterministic,
 * docs/ddp.md "Deterministic mode").
 *
 * Every global batch is cut into micro-shards of dist.micro_batch samples
 * (the last may be short) that do not depend on the worker count; worker r
 * of N takes the contiguous micro-shards [S*r/N, S*(r+1)/N) of the S in the
 * batch (sizes differ by at most one; a worker may get none and still takes
 * part in the reduction). Each micro-shard runs forward and backward on its
 * own, so GEMM shapes and float summation order inside it are the same for
 * any N; parallel/ddp.c adds its gradient in fixed point and reduces the
 * int64 sums. One worker takes every micro-shard and needs no
 * communicator: the same arithmetic, the same bits.
 *
 * It does not own anything: the loop (train.c) owns the ddp handle, the
 * order and the buffers.
 */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "parallel/fixsum.h"

/* Fixed point of loss x n, one of at most `terms` terms of a sum (an
 * epoch's train loss, the test loss): bounded so that the int64 sum cannot
 * overflow; a larger or non-finite loss sets *bad and adds 0. */
static int64_t loss_fix(float loss, int n, int64_t terms, int *bad) {
  int64_t q = 0;
  if (dt_fix_add(&q, &loss, 1, (double)n, dt_fix_bound(terms), 1, NULL)) *bad = 1;
  return q;
}

int dt__det_step(dt_engine *e, dt_ddp *ddp, int64_t k, int64_t step, dt__det_step_out *out) {
  const dt_run_cfg *c = &e->cfg;
  const int64_t B = c->batch, dim = e->train.dim, start = k * B;
  const int64_t g = e->train.n - start < B ? e->train.n - start : B;
  const int64_t mb = c->micro_batch < B ? c->micro_batch : B;
  const int64_t S = (g + mb - 1) / mb;
  const int64_t s0 = S * e->rank / e->nranks, s1 = S * (e->rank + 1) / e->nranks;
  memset(out, 0, sizeof *out);
  out->global = (int)g;
  dt_ddp_begin_step_det(ddp, g, S, c->reduce == DT_DIST_SUM);
  for (int64_t s = s0; s < s1; s++) {
    int64_t lo = start + s * mb;
    int n = (int)(start + g - lo < mb ? start + g - lo : mb);
    for (int j = 0; j < n; j++) {
      int64_t si = e->order[lo + j];
      memcpy(e->xbuf + j * dim, e->train.x + si * dim, (size_t)dim * sizeof(float));
      e->ybuf[j] = e->train.y[si];
    }
    /* dropout masks are keyed by the global position lo + i */
    dt_step_ctx ctx = {1, c->seed, (uint64_t)step, lo};
    dt_model_forward(e->model, e->xbuf, n, &ctx);
    dt_ddp_det_shard(ddp, n, s == s1 - 1);
    int nc = 0;
    float loss = dt_model_backward(e->model, e->ybuf, n, &nc, dt_ddp_grad_ready, ddp);
    out->n += n;
    out->correct += nc;
    /* an epoch has at most steps_per_epoch x ceil(B / mb) micro-shards */
    out->loss_fix += loss_fix(loss, n, e->steps_per_epoch * ((B + mb - 1) / mb), &out->loss_bad);
  }
  if (s0 == s1) dt_ddp_all_ready(ddp);
  return dt_ddp_finish_step(ddp);
}

int dt__det_evaluate(dt_engine *e, double *loss, double *accuracy) {
  const int64_t B = e->cfg.batch, n = e->test.n, C = (n + B - 1) / B;
  const int64_t c0 = C * e->rank / e->nranks, c1 = C * (e->rank + 1) / e->nranks;
  dt_step_ctx ctx = {0, e->cfg.seed, 0, 0};
  int bad = 0;
  /* Batch-norm buffers need no averaging here: deterministic steps leave
   * them bit-identical on every rank. */
  int64_t v[2] = {0, 0}; /* loss x samples in fixed point, correct */
  for (int64_t ch = c0; ch < c1; ch++) {
    int64_t i = ch * B;
    int m = (int)(n - i < B ? n - i : B);
    ctx.sample0 = i;
    dt_model_forward(e->model, e->test.x + i * e->test.dim, m, &ctx);
    int nc = 0;
    float l = dt_model_loss(e->model, e->test.y + i, m, &nc);
    v[0] += loss_fix(l, m, C, &bad);
    v[1] += nc;
  }
  if (e->comm && e->nranks > 1) {
    int rc = dt_comm_allreduce(e->comm, v, v, 2, DT_I64, DT_OP_SUM);
    if (rc < 0) {
      const char *m = dt_comm_errmsg(e->comm);
      return dt__seterr(rc, "rank %d: evaluation: %s", e->rank, m && *m ? m : dt_errmsg());
    }
  }
  /* a non-finite test loss is reported as such, not as a wrapped integer */
  *loss = bad ? NAN : ldexp((double)v[0], -DT_FIX_BITS) / (double)n;
  *accuracy = (double)v[1] / (double)n;
  return DT_OK;
}

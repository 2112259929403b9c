/*
 * pipe_offload.c — DTRAIN_PIPE_OFFLOAD (pipe_int.h): with 2 stages the
 * last stage makes stage 0's first linear layer's weight gradient from
 * the rows stage 0 sends it after each backward, and sends the product
 * back; the same product call as stage 0's own, so the same bits
 * (docs/pipeline.md). The stage's schedule stays in pipe.c, which calls
 * in here where p->off is set.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "core/core.h"
#include "obs/obs.h"
#include "parallel/pipe_int.h"

int dt__pipe_offload_at = -1;

/* DTRAIN_PIPE_OFFLOAD: with 2 stages the deep MLP's best cut at layer
 * granularity gives stage 0 0.53 of the GEMM work, and the last stage
 * idles at the step's end while stage 0 makes its last backward, its
 * deferred weight gradients and its optimizer step. Moving stage 0's first
 * linear layer's weight gradient (784 x 2048 there: 1.6M of stage 0's
 * 28.4M multiply-adds per sample, which makes both stages 26.8M) onto the
 * last stage balances them below layer granularity: ~11 KB of rows per
 * sample go over, the product (6.4 MB) comes back, made by the same call
 * (dt__wgrad_product), so the same bits. Both stages decide alike from the
 * same configuration (a mismatch would leave one waiting). Only where:
 *  - 2 stages: the move balances the 2-stage cut (it was measured there);
 *    with more the last stage is not stage 0's pair, and the partition
 *    would have to know of it;
 *  - stage 0 stashes its weight gradients for one product per step
 *    (deferred weight gradients on, m > 1, not deterministic mode, which
 *    makes its own per-micro-shard fixed-point sums, not recomputation,
 *    whose stash holds groups flushed during the step);
 *  - not with DTRAIN_PIPE_TAIL (the other answer to the same imbalance:
 *    the helper thread splits the very flush this shortens);
 *  - stage 0 has a linear layer. */
int dt__pipe_offload_setup(dt_pipe *p) {
  const dt_pipe_cfg *c = &p->c;
  if (!dt_param(DT_PARAM_PIPE_OFFLOAD) || c->nstages != 2 || c->det || c->micro < 2 ||
      !c->wgrad || c->recompute || c->tail || !c->whole)
    return DT_OK;
  /* stage 0's layers: [0, l1) on stage 0, [0, l0) seen from stage 1 */
  const int end = c->stage == 0 ? c->l1 : c->l0;
  int f = -1;
  for (int i = 0; i < end && f < 0; i++) {
    const dt_layer_info *l = dt_model_layer(c->whole, i);
    if (l->kind == DT_L_LINEAR && l->nparams) f = i;
  }
  if (f < 0) return DT_OK;
  const dt_layer_info *l = dt_model_layer(c->whole, f);
  p->olayer = f; /* stage 0's models start at layer 0: the same index */
  p->oC = l->in_c * l->in_h * l->in_w;
  p->oOC = l->out_c;
  const size_t rows = (size_t)c->micro * c->max_batch;
  if (!(p->oreq = calloc(2 * (size_t)c->micro + 1, sizeof *p->oreq)) ||
      !(p->opend = calloc(2 * (size_t)c->micro + 1, sizeof *p->opend)))
    goto nomem;
  if (c->stage == 0) {
    if (!p->wst || !dt__model_wgrad_dst(p->inst[0], f)) return DT_OK; /* cannot happen: see above */
    p->off = 1;
    return DT_OK;
  }
  if (!(p->ox = dt_alloc(rows * p->oC * sizeof(float))) ||
      !(p->ody = dt_alloc(rows * p->oOC * sizeof(float))) ||
      !(p->odw = dt_alloc((size_t)p->oC * p->oOC * sizeof(float))))
    goto nomem;
  /* the product goes after the layers (last first) that make about half of
   * the stage's own flush: the last micro-batch's rows arrive a backward
   * of stage 0 after this stage's flush starts, and stage 0 needs the
   * product only after its own other products */
  double tot = 0, acc = 0;
  const int n = dt_model_nlayers(p->inst[0]);
  for (int i = 0; i < n; i++) {
    const float *x, *dy;
    dt__wstash_rows(p->wst, i, &x, &dy);
    const dt_layer_info *li = dt_model_layer(p->inst[0], i);
    if (x) tot += (double)li->out_c * li->in_c * li->in_h * li->in_w;
  }
  p->ocut = 0;
  for (int i = n - 1; i >= 0; i--) {
    const float *x, *dy;
    dt__wstash_rows(p->wst, i, &x, &dy);
    const dt_layer_info *li = dt_model_layer(p->inst[0], i);
    if (x) acc += (double)li->out_c * li->in_c * li->in_h * li->in_w;
    if (acc >= tot / 2) {
      p->ocut = i;
      break;
    }
  }
  if (dt__pipe_offload_at >= 0) p->ocut = dt__pipe_offload_at;
  p->off = 2;
  return DT_OK;
nomem:
  return dt__seterr(DT_ENOMEM, "pipeline stage %d: out of memory for the offloaded weight gradient",
                    c->stage);
}

/* Offload, stage 0: micro-batch j's stashed rows [row0, row0 + n) of the
 * offloaded layer to the last stage (its inputs, then its output
 * gradients), while the next backward or forward runs. */
int dt__pipe_offload_send(dt_pipe *p, int j, int row0, int n) {
  const float *x, *dy;
  dt__wstash_rows(p->wst, p->olayer, &x, &dy);
  const int peer = p->c.nstages - 1;
  int rc = dt_comm_isend(p->c.comm, peer, TAG_OX + j, x + (size_t)row0 * p->oC,
                         (size_t)n * p->oC * sizeof(float), &p->oreq[2 * j]);
  if (rc < 0) return dt__stage_comm_err(p, rc, "sending the first layer's inputs of", j, peer);
  p->opend[2 * j] = 1;
  rc = dt_comm_isend(p->c.comm, peer, TAG_ODY + j, dy + (size_t)row0 * p->oOC,
                     (size_t)n * p->oOC * sizeof(float), &p->oreq[2 * j + 1]);
  if (rc < 0)
    return dt__stage_comm_err(p, rc, "sending the first layer's output gradients of", j, peer);
  p->opend[2 * j + 1] = 1;
  return DT_OK;
}

/* Offload, the last stage: receives for the step's rows, micro-batch j's
 * at the rows stage 0 stashed them in (backwards go in micro-batch order). */
int dt__pipe_offload_post(dt_pipe *p, const dt_pipe_mb *mb, int m) {
  size_t r = 0;
  for (int j = 0; j < m; j++) {
    const size_t n = (size_t)mb[j].n;
    int rc = dt_comm_irecv(p->c.comm, 0, TAG_OX + j, p->ox + r * p->oC, n * p->oC * sizeof(float),
                           &p->oreq[2 * j]);
    if (rc >= 0) {
      p->opend[2 * j] = 1;
      rc = dt_comm_irecv(p->c.comm, 0, TAG_ODY + j, p->ody + r * p->oOC,
                         n * p->oOC * sizeof(float), &p->oreq[2 * j + 1]);
    }
    if (rc < 0) {
      p->oleak = 1;
      return dt__stage_comm_err(p, rc, "posting receives of stage 0's first-layer rows of", j, 0);
    }
    p->opend[2 * j + 1] = 1;
    r += n;
  }
  return DT_OK;
}

/* Offload: the pending row messages moved on (tested), without waiting.
 * A message that did not fit in the transport's ring when it was sent
 * goes on only when its sender drives the transport, and a received one
 * leaves the ring only when its receiver does: both stages are in their
 * weight-gradient products at the step's end (the last micro-batches'
 * rows, about 1 MiB, waited there for stage 0's next call otherwise,
 * 50 ms later), so both call this between their layers' products. */
static void offload_progress(dt_pipe *p) {
  for (int i = 0; p->off && i < 2 * p->c.micro; i++) {
    if (!p->opend[i]) continue;
    bool done = false;
    if (dt_comm_test(p->c.comm, &p->oreq[i], &done) < 0) return; /* the wait reports it */
    if (done) p->opend[i] = 0;
  }
}

/* Offload, the last stage: waits for the step's rows, makes the product
 * and sends it to stage 0. */
static int offload_product(dt_pipe *p, int m, int rows) {
  int64_t t0 = dt_now_ns();
  int rc = DT_OK;
  for (int i = 0; i < 2 * m && rc >= 0; i++)
    if (p->opend[i]) rc = dt_comm_waitall(p->c.comm, &p->oreq[i], 1);
  double w = dt_obs_lap(p->obs, p->m_recv, "recv", 0, t0, -1);
  p->wait_s += w;
  p->recv_s += w;
  for (int i = 0; i < 2 * m; i++) p->opend[i] = 0;
  if (rc < 0) return dt__stage_comm_err(p, rc, "receiving stage 0's first-layer rows of", m - 1, 0);
  double t1 = dt_now();
  dt__wgrad_product(p->inst[0], p->oOC, p->oC, rows, p->ody, p->ox, p->odw);
  double t = dt_now() - t1;
  p->compute_s += t;
  p->wgrad_s += t;
  const int q = 2 * p->c.micro;
  rc = dt_comm_isend(p->c.comm, 0, TAG_ODW, p->odw, (size_t)p->oC * p->oOC * sizeof(float),
                     &p->oreq[q]);
  if (rc < 0)
    return dt__stage_comm_err(p, rc, "sending stage 0's first-layer weight gradient after", m - 1,
                              0);
  p->opend[q] = 1;
  return DT_OK;
}

/* The step's weight gradients not yet made (all of them, in one product
 * per layer over the step's rows), last layer first, each reported to
 * p->ready (if set) right after: dt__model_wgrad_flush_ready's order and
 * products, with the offload's part: stage 0 receives its first linear
 * layer's product from the last stage instead of making it, the last
 * stage makes that product after its layers from ocut up. With reports
 * (hybrid replicas) a report may start a reduction on ddp's thread over
 * the same transport, which one thread at a time may drive: the offload's
 * messages come first then (the last stage makes the product before its
 * own; stage 0 reports its layers once the product is in). */
int dt__pipe_offload_flush(dt_pipe *p, int m) {
  dt_model *md = p->inst[0];
  const int rows = p->wrows, n = dt_model_nlayers(md);
  const int cut = p->ready ? n : p->ocut, defer = p->ready && p->off == 1;
  int made = p->off != 2;
  for (int i = n - 1; i >= 0; i--) {
    offload_progress(p);
    if (!made && i < cut) {
      DT_CHECK(offload_product(p, m, rows));
      made = 1;
    }
    const dt_layer_info *l = dt_model_layer(md, i);
    if (p->off == 1 && i == p->olayer) {
      DT_CHECK(dt__stage_recv_msg(p, p->c.nstages - 1, TAG_ODW, dt__model_wgrad_dst(md, i),
                                  (size_t)p->oC * p->oOC * sizeof(float), m - 1,
                                  "receiving the first layer's weight gradient after"));
    } else {
      double t0 = dt_now();
      dt__model_wgrad_layer(md, p->wst, i, rows, p->wflushed > 0);
      double t = dt_now() - t0;
      p->compute_s += t;
      p->wgrad_s += t;
    }
    if (p->ready && !defer && l->nparams) p->ready(p->ready_ud, l->param_off, l->nparams);
  }
  if (!made) DT_CHECK(offload_product(p, m, rows));
  for (int i = n - 1; defer && i >= 0; i--) {
    const dt_layer_info *l = dt_model_layer(md, i);
    if (l->nparams) p->ready(p->ready_ud, l->param_off, l->nparams);
  }
  p->wflushed++;
  p->wrows = 0;
  return DT_OK;
}

int dt__pipe_offload_drain(dt_pipe *p, int rc) {
  if (p->off == 1) {
    /* the offloaded rows (delivered: the product came back after them) */
    for (int i = 0; i < 2 * p->c.micro; i++) {
      int r = dt__stage_wait_send(p, &p->oreq[i], &p->opend[i], p->c.nstages - 1, i / 2);
      if (rc == DT_OK) rc = r;
    }
  } else if (p->off == 2) {
    int r = dt__stage_wait_send(p, &p->oreq[2 * p->c.micro], &p->opend[2 * p->c.micro], 0, -1);
    if (rc == DT_OK) rc = r;
    /* receives of rows still pending after an error: their buffers stay
     * (never freed) rather than be written after free */
    for (int i = 0; i < 2 * p->c.micro; i++)
      if (p->opend[i]) p->oleak = 1;
  }
  return rc;
}

void dt__pipe_offload_free(dt_pipe *p) {
  if (p->oleak) return; /* receives still pending after an error may yet write here */
  dt_free(p->ox), dt_free(p->ody), dt_free(p->odw);
  free(p->oreq), free(p->opend);
}

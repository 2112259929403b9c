/*
 * strategy_ddp_det.c — the "ddp_det" strategy: deterministic data
 * parallelism (dist.deterministic, docs/ddp.md "Deterministic mode").
 *
 * Every global batch is cut into micro-shards of dist.micro_batch samples
 * (the last may be short) that do not depend on the worker count; worker r
 * of N takes the contiguous micro-shards [S*r/N, S*(r+1)/N) of the S in the
 * batch (the "shards" source; a worker may get none and still takes part
 * in the reduction). Each micro-shard runs forward and backward on its own,
 * so GEMM shapes and float summation order inside it are the same for any
 * N; parallel/ddp.c adds its gradient in fixed point (backward_begin tells
 * it which micro-shard comes) and reduces the int64 sums. Loss tallies are
 * fixed point too, and evaluation runs in whole chunks of train.batch per
 * rank, so loss and accuracy have the same bits for any worker count. One
 * worker takes every micro-shard and needs no communicator: the same
 * arithmetic, the same bits.
 *
 * dist.balance = steal (workers on one host): instead of the static deal,
 * every worker takes micro-shards from one shared queue per step (a ticket
 * counter in the shared window, parallel/ddp.h) until it is empty, so a
 * slow or stalled worker simply takes fewer; any assignment gives the same
 * fixed-point sums. Once the queue is empty, an idle worker re-runs a
 * micro-shard another worker has held for too long (a backup task,
 * parallel/steal.h); whichever copy finishes first counts, the other is
 * undone, so the sums are the same bits. dist.balance = dynamic cuts the
 * deal by measured speed.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/strategy.h"
#include "tensor/tensor.h"
#include "comm/compress/compress.h"
#include "nn/nn.h"
#include "parallel/ddp.h"
#include "parallel/steal.h"

typedef struct det_impl {
  dt_ddp *ddp;
  dt_balance *bal;
  dt_step_plan plan;
  int steal;           /* dist.balance = steal with a shared queue */
  int taken, samples;  /* this step's micro-shards and samples that count here */
  int backup;          /* the current micro-shard is a backup copy */
  int last_n;          /* its samples */
  dt_steal_stats st0;  /* the queue's counts when the balance record began */
  dt__wpack *wpk;      /* forward weights packed once per step (DTRAIN_DET_WPACK) */
  int wpack_tried;
  int wpack_stale;     /* stealing: packed at the step's first take, not at its start */
  uint64_t sent0, recv0;
} det_impl;

/* The source's taker under stealing: a rank under a CPU quota first paces
 * itself (dt__balance_pace), so that it takes micro-shards only as fast as
 * its quota lets it compute them and is not stopped by the kernel for the
 * rest of a quota period holding one (the others would wait for it at the
 * reduction); meanwhile the others take the queue. */
static int64_t det_take(void *ud) {
  dt_strategy *s = ud;
  det_impl *d = s->impl;
  dt__balance_pace(d->bal, d->ddp);
  dt_steal *q = dt_ddp_steal(d->ddp);
  dt_steal_stats a, b;
  dt_steal_get_stats(q, &a);
  int64_t j = dt_steal_take(q, !dt__balance_throttled(d->bal), &d->backup);
  dt_steal_get_stats(q, &b);
  if (j >= 0 && d->wpack_stale) { /* its forward comes next */
    dt__wpack_refresh(d->wpk, s->model);
    d->wpack_stale = 0;
  }
  /* waiting for shards other ranks hold is waiting for later ranks */
  dt__balance_waited(d->bal, b.wait_seconds - a.wait_seconds);
  return j;
}

static int det_source(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out) {
  if (cfg->micro_batch < 1)
    return dt__seterr(DT_EINVAL, "dist.micro_batch = %d: expects at least 1", cfg->micro_batch);
  /* docs/compress.md "Deterministic mode": a codec acts on each worker's
   * partial sum, which depends on how the batch is split over workers */
  if (cfg->compress != 0)
    return dt__seterr(DT_EINVAL, "dist.compress = %s with dist.deterministic = true: no codec keeps "
                      "the bitwise any-worker-count guarantee (each worker compresses its own "
                      "partial sum, and that depends on the worker count); use dist.compress = "
                      "none, or dist.deterministic = false (compressed runs are still "
                      "reproducible for a fixed worker count)", dt__enum_name(dt__codec_names, cfg->compress));
  return dt__source_shards(out, train, cfg->batch, cfg->seed, cfg->shuffle, cfg->micro_batch);
}

static int det_setup(dt_strategy *s) {
  /* Every product through our own kernels: OpenBLAS's choice depends on
   * the CPU (OPENBLAS_CORETYPE), which would change the hash. */
  dt_model_set_gemm_flags(s->model, DT_GEMM_FIXED);
  if (s->joining) { /* membership_change builds the rest with the job's state */
    if (!(s->impl = calloc(1, sizeof(det_impl)))) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
    return DT_OK;
  }
  DT_CHECK(dt__ddp_startup(s));
  det_impl *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  int rc = dt_ddp_create_det(&d->ddp, s->model, s->comm, s->cfg->bucket_bytes);
  if (rc == DT_OK) rc = dt__ddp_det_rows(d->ddp, s->cfg->micro_batch);
  if (rc == DT_OK) rc = dt__ddp_balance_create(s, &d->bal);
  if (rc < 0) {
    dt_ddp_destroy(d->ddp);
    free(d);
    return rc;
  }
  if (s->comm) dt_comm_bytes(s->comm, &d->sent0, &d->recv0);
  if (s->cfg->balance == DT_BALANCE_STEAL && s->nranks > 1) {
    if (dt_ddp_steal(d->ddp)) {
      rc = dt__source_set_taker(s->source, det_take, s);
      if (rc < 0) {
        dt__ddp_balance_destroy(s, d->bal);
        dt_ddp_destroy(d->ddp);
        free(d);
        return rc;
      }
      d->steal = 1;
    } else if (s->rank == 0) {
      DT_LOG_WARN("dist.balance = steal: the shared micro-shard queue needs every worker on one "
                  "host talking shared memory; micro-shards are dealt out statically instead");
    }
  }
  s->impl = d;
  s->grad_ud = d->ddp;
  return DT_OK;
}

/* Every micro-shard's forward multiplies by the same weights: pack them
 * once (per step, and before an evaluation), not once per micro-shard.
 * The packed panels are the ones the products would pack (our AVX-512 or
 * AVX2 kernels, src/tensor/gemm_avx*.c), so the bits do not change; layers
 * our kernels do not pack ahead (or a CPU without them) multiply as before. */
static int det_wpack(dt_strategy *s, int now) {
  det_impl *d = s->impl;
  if (!d->wpack_tried) {
    d->wpack_tried = 1;
    if (dt_param(DT_PARAM_DET_WPACK)) {
      DT_CHECK(dt__wpack_create(&d->wpk, s->model));
      dt__model_set_wpack(s->model, d->wpk);
    }
  }
  d->wpack_stale = !now;
  if (now) dt__wpack_refresh(d->wpk, s->model);
  return DT_OK;
}

static int det_step_begin(dt_strategy *s, const dt_step_plan *plan) {
  det_impl *d = s->impl;
  /* stealing: packed by det_take before the step's first forward here, so
   * a rank that takes nothing in a step (one under a CPU quota, often)
   * does not pack for nothing; the panels are the same */
  DT_CHECK(det_wpack(s, !d->steal));
  d->plan = *plan;
  dt__balance_step_begin(d->bal);
  dt__balance_step_pace(d->bal);
  d->taken = d->samples = 0;
  if (d->steal) dt_steal_begin(dt_ddp_steal(d->ddp), plan->pieces_global);
  dt_ddp_begin_step_det(d->ddp, plan->n_global, plan->pieces_global,
                        s->cfg->reduce == DT_DIST_SUM);
  return DT_OK;
}

/* Stealing, after a micro-shard's backward (or instead of it): commits it;
 * when another copy counted first, ddp undoes this one's sums and the
 * step's counts forget it. */
static int det_piece_done(dt_strategy *s) {
  det_impl *d = s->impl;
  if (!d->steal || dt_steal_commit(dt_ddp_steal(d->ddp))) return 1;
  dt_ddp_det_drop(d->ddp);
  d->taken--;
  d->samples -= d->last_n;
  return 0;
}

/* After the micro-shard's forward, before its backward: ddp keeps the
 * running statistics it produced and restores the step's starting ones. */
static int det_backward_begin(dt_strategy *s, const dt_batch *b, int index, int count) {
  det_impl *d = s->impl;
  d->taken++;
  d->samples += b->n;
  d->last_n = b->n;
  dt__balance_piece(d->bal, b->n);
  /* stealing: nobody knows which micro-shard is this worker's last, so
   * every bucket is reduced after the step's pieces (-1) */
  dt_ddp_det_shard(d->ddp, b->n, d->steal ? -1 : index == count - 1);
  /* another copy already counted: this one's backward would be wasted */
  if (d->steal && dt_steal_lost(dt_ddp_steal(d->ddp))) return !det_piece_done(s);
  return 0;
}

static int det_step_finish(dt_strategy *s, float lr) {
  det_impl *d = s->impl;
  if (!d->taken) dt_ddp_all_ready(d->ddp);
  d->plan.n_local = d->samples;
  DT_CHECK(dt__ddp_exchange(s, d->ddp, d->bal, &d->plan));
  DT_CHECK(dt_optim_step(s->optim, dt_model_params(s->model), dt_model_grads(s->model), lr));
  s->step++;
  return dt__ddp_replan(s, d->ddp, d->bal);
}

/* The test set in fixed chunks of train.batch, whole chunks per rank.
 * Batch-norm buffers need no averaging: deterministic steps leave them
 * bit-identical on every rank. */
static int det_eval_begin(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi) {
  DT_CHECK(det_wpack(s, 1));
  const int64_t C = (n + chunk - 1) / chunk;
  *lo = C * s->rank / s->nranks * chunk;
  *hi = C * (s->rank + 1) / s->nranks * chunk;
  if (*hi > n) *hi = n;
  if (*lo > n) *lo = n;
  return DT_OK;
}

static int det_eval_reduce(dt_strategy *s, dt_tally *t) {
  if (!s->comm || s->nranks < 2) return DT_OK;
  int64_t v[2] = {t->loss_q, t->correct};
  int rc = dt_comm_allreduce(s->comm, v, v, 2, DT_I64, DT_OP_SUM);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "evaluation");
  t->loss_q = v[0];
  t->correct = v[1];
  return DT_OK;
}

/* The epoch's train numbers over all workers, the loss summed in fixed point
 * (int64), so it has the same bits for any worker count. */
static int det_epoch_end(dt_strategy *s, int epoch, dt_tally *t) {
  det_impl *d = s->impl;
  if (d->steal) {
    dt_steal_stats now;
    dt_steal_get_stats(dt_ddp_steal(d->ddp), &now);
    dt__balance_backups(d->bal, (double)(now.backups - d->st0.backups),
                        (double)(now.backups_won - d->st0.backups_won),
                        (double)(now.dropped - d->st0.dropped));
    d->st0 = now;
  }
  DT_CHECK(dt__balance_epoch_end(d->bal, s->comm, epoch));
  if (!s->comm) return DT_OK;
  int64_t v[3] = {t->loss_q, t->correct, t->samples};
  int rc = dt_comm_allreduce(s->comm, v, v, 3, DT_I64, DT_OP_SUM);
  if (rc == DT_OK) rc = dt_comm_allreduce(s->comm, &t->seconds, &t->seconds, 1, DT_F64, DT_OP_MAX);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "epoch statistics");
  t->loss_q = v[0];
  t->correct = v[1];
  t->samples = v[2];
  return DT_OK;
}

static int det_run_end(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all) {
  det_impl *d = s->impl;
  return dt__ddp_finish(s, d->ddp, d->sent0, d->recv0, me, all);
}

static int det_membership(dt_strategy *s, const dt_membership *m) {
  det_impl *d = s->impl;
  DT_CHECK(dt__ddp_membership(s, m, d ? &d->ddp : NULL, 1));
  dt_comm_bytes(s->comm, &d->sent0, &d->recv0);
  /* stealing: the queue lives in the new generation's window (its tickets
   * start afresh on every member alike); det_take reads d->ddp */
  memset(&d->st0, 0, sizeof d->st0);
  if (d->steal) {
    d->steal = dt_ddp_steal(d->ddp) && s->nranks > 1;
    DT_CHECK(dt__source_set_taker(s->source, d->steal ? det_take : NULL, d->steal ? s : NULL));
  }
  /* the speed measurements are per rank of the old world: start afresh */
  dt__ddp_balance_destroy(s, d->bal);
  d->bal = NULL;
  return dt__ddp_balance_create(s, &d->bal);
}

static void det_teardown(dt_strategy *s) {
  det_impl *d = s->impl;
  if (d) {
    dt_ddp_destroy(d->ddp);
    dt__ddp_balance_destroy(s, d->bal);
    if (d->wpk) dt__model_set_wpack(s->model, NULL);
    dt__wpack_destroy(d->wpk);
  }
  free(d);
  s->impl = s->grad_ud = NULL;
}

const struct dt_strategy_ops dt__strategy_ddp_det = {
    .name = "ddp_det",
    .fixed_point = 1,
    .open_source = det_source,
    .setup = det_setup,
    .step_begin = det_step_begin,
    .backward_begin = det_backward_begin,
    .piece_done = det_piece_done,
    .grad_ready = dt_ddp_grad_ready,
    .step_finish = det_step_finish,
    .eval_begin = det_eval_begin,
    .eval_reduce = det_eval_reduce,
    .epoch_end = det_epoch_end,
    .state_export = dt__strategy_export_optim,
    .state_import = dt__strategy_import_optim,
    .membership_change = det_membership,
    .run_end = det_run_end,
    .teardown = det_teardown,
};

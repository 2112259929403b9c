/*
 * strategy_pipeline.c — the "pipeline" strategy (docs/pipeline.md): the
 * model's layers cut into P stages on P ranks (parallel/partition.h), each
 * global batch's share of a pipeline replica cut into m micro-batches that
 * flow through the stages on a schedule (gpipe or 1f1b, parallel/pipe.h),
 * gradients accumulated over the micro-batches, one optimizer step per
 * stage on its own span of the parameters. With W = R x P workers there are
 * R replicas (ranks r*P .. r*P+P-1, so one replica's stages share a host
 * when ranks are laid out by host): each stage's gradients are summed over
 * its R replicas on a communicator split by stage. P = 1 is micro-batch
 * accumulation in one process (with train.recompute: keeping only the
 * micro-batches' inputs).
 *
 * The whole model's buffers stay on every rank as the address space the
 * stages' spans live in (a stage trains its span in place), but with
 * P > 1 a stage writes, and so holds in memory, only its own span: it
 * initialises only that (the engine leaves the rest unwritten), evaluation
 * goes through the stages and the end's check and params_sha256 are made
 * from the stages' spans (pipeline_parts.c); checkpoints bring the other
 * stages' spans to a spill file of rank 0, not its memory (pipeline_ckpt.c).
 * Its batch source is a "replica" view of the shards source: rank r trains
 * on replica r / P's slice of every global batch, one piece per step that
 * run_pieces cuts into micro-batches.
 *
 * Deterministic mode ("pipeline_det", dist.deterministic): the source
 * deals fixed micro-shards as ddp_det's does, micro-batches are runs of
 * whole micro-shards, and each stage sums its micro-shards' gradients in
 * fixed point through parallel/ddp.c's deterministic path (over the stage
 * communicator), so params_sha256 is ddp_det's for any P, m, schedule and
 * replica count.
 *
 * With dist.zero = 1 each stage's optimizer state is sharded over its
 * replicas (pipeline_zero.c). It does not do elastic membership.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/strategy.h"
#include "parallel/partition.h"
#include "parallel/pipe.h"
#include "engine/pipeline_int.h"
#include "tensor/tensor.h"

/* ---- the replica source ------------------------------------------------------ */

typedef struct replica_src {
  dt_batch_source base;
  dt_batch_source *inner; /* shards over R replicas */
  int P;
} replica_src;

static int rs_bind(dt_batch_source *s, int rank, int nranks) {
  replica_src *r = (replica_src *)s;
  if (nranks % r->P)
    return dt__seterr(DT_EINVAL, "dist.pipeline_stages = %d: %d workers are not a multiple of it",
                      r->P, nranks);
  return r->inner->ops->bind(r->inner, rank / r->P, nranks / r->P);
}
static int64_t rs_steps(const dt_batch_source *s) {
  const replica_src *r = (const replica_src *)s;
  return r->inner->ops->steps_per_epoch(r->inner);
}
static int rs_epoch(dt_batch_source *s, int epoch) {
  replica_src *r = (replica_src *)s;
  return r->inner->ops->epoch_begin(r->inner, epoch);
}
static int rs_plan(dt_batch_source *s, int64_t k, dt_step_plan *plan) {
  replica_src *r = (replica_src *)s;
  return r->inner->ops->plan(r->inner, k, plan);
}
static int rs_piece(dt_batch_source *s, int i, dt_batch *b) {
  replica_src *r = (replica_src *)s;
  return r->inner->ops->piece(r->inner, i, b);
}
static void rs_destroy(dt_batch_source *s) {
  replica_src *r = (replica_src *)s;
  dt__source_destroy(r->inner);
  free(r);
}
static const struct dt_batch_source_ops replica_ops = {
    "replica", rs_bind, rs_steps, rs_epoch, rs_plan, rs_piece, rs_destroy};

/* ---- settings ------------------------------------------------------------------ */

static int check_settings(const dt_run_cfg *c, const dt_dataset *train) {
  const int P = c->pipeline_stages;
  if (c->deterministic && c->micro_batch < 1)
    return dt__seterr(DT_EINVAL, "dist.micro_batch = %d: expects at least 1", c->micro_batch);
  if (c->zero && c->deterministic)
    return dt__seterr(DT_EINVAL, "dist.zero = 1: not with dist.deterministic yet");
  if (c->micro_batches < 1)
    return dt__seterr(DT_EINVAL, "dist.micro_batches = %d: expects at least 1", c->micro_batches);
  if (c->workers % P)
    return dt__seterr(DT_EINVAL, "dist.pipeline_stages = %d: %d workers are not a multiple of "
                      "it (--workers must be replicas x stages)", P, c->workers);
  int n = 0;
  DT_CHECK(dt__model_spec_layers(c->layers, train->c, train->h, train->w, &n));
  return dt_partition_check(n, P, c->stages + 1, c->stages[0]);
}

static int pipe_source(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out) {
  DT_CHECK(check_settings(cfg, train));
  replica_src *r = calloc(1, sizeof *r);
  if (!r) return dt__seterr(DT_ENOMEM, "pipeline: out of memory");
  int rc = dt__source_shards(&r->inner, train, cfg->batch, cfg->seed, cfg->shuffle,
                             cfg->deterministic ? cfg->micro_batch : 0);
  if (rc < 0) {
    free(r);
    return rc;
  }
  r->base.ops = &replica_ops;
  r->P = cfg->pipeline_stages;
  *out = &r->base;
  return DT_OK;
}

/* ---- the strategy --------------------------------------------------------------- */


/* A communication error that names a rank which exited or was killed
 * (the transports say "rank K (pid P) exited", "rank K exited") gets that
 * rank's place in the pipeline added, so every rank's last line names the
 * lost stage and rank, whichever collective or neighbour it was waiting in. */
int dt__pipe_name_lost(dt_strategy *s, int rc) {
  char m[1024];
  snprintf(m, sizeof m, "%s", dt_errmsg());
  const char *hit = strstr(m, " exited");
  if (!hit) hit = strstr(m, "killed");
  if (!hit || s->cfg->pipeline_stages < 2) return rc;
  int lost = -1;
  for (const char *r = m; (r = strstr(r, "rank ")) && r < hit; r += 5) sscanf(r + 5, "%d", &lost);
  if (lost < 0 || lost >= s->nranks) return rc;
  const int P = s->cfg->pipeline_stages;
  return dt__seterr(rc, "%s (rank %d is pipeline stage %d of replica %d)", m, lost, lost % P,
                    lost / P);
}

int dt__pipe_comm_err(dt_strategy *s, int rc, const char *what) {
  return dt__pipe_name_lost(s, dt__ddp_comm_err(s, rc, what));
}

/* Every rank's partition: cut points, or balanced by costs rank 0 measured. */
static int partition(dt_strategy *s, pipe_impl *d) {
  const dt_run_cfg *c = s->cfg;
  dt_model *m = s->model;
  const int n = dt_model_nlayers(m);
  if (c->stages[0] || d->P == 1)
    return dt_partition_from_cuts(&d->part, m, d->P, c->stages + 1, c->stages[0]);
  double *cost = calloc((size_t)n, sizeof *cost);
  if (!cost) return dt__seterr(DT_ENOMEM, "pipeline: out of memory");
  int rc = DT_OK;
  int mb = (c->batch / d->R + c->micro_batches - 1) / c->micro_batches;
  if (mb < 1) mb = 1;
  int li = dt_model_layer(m, 0)->in_c, hi = dt_model_layer(m, 0)->in_h,
      wi = dt_model_layer(m, 0)->in_w;
  if (s->rank == 0) rc = dt_partition_profile(c->layers, li, hi, wi, mb, 5, cost);
  /* every rank learns rank 0's verdict, then its costs */
  int ok = rc == DT_OK;
  int rc2 = dt_comm_broadcast(s->comm, &ok, 1, DT_I32, 0);
  if (rc2 == DT_OK && ok) rc2 = dt_comm_broadcast(s->comm, cost, (size_t)n, DT_F64, 0);
  if (rc2 < 0) rc = dt__pipe_comm_err(s, rc2, "pipeline partition");
  else if (!ok && rc == DT_OK) rc = dt__seterr(DT_EIO, "rank %d: pipeline partition: rank 0 "
                                               "could not profile the layers", s->rank);
  if (rc == DT_OK) rc = dt_partition_balance(&d->part, m, d->P, cost);
  free(cost);
  return rc;
}

static void pipe_teardown(dt_strategy *s) {
  pipe_impl *d = s->impl;
  if (!d) return;
  dt_ddp_destroy(d->ddp);
  dt_ddp_destroy(d->rddp);
  dt_pipe_destroy(d->pipe);
  dt_free(d->xstep);
  dt_free(d->ystep);
  dt__pipe_optim_destroy(d);
  dt__pipe_ckpt_free(d);
  dt_comm_destroy(d->scomm);
  dt_comm_destroy(d->pcomm);
  free(d->mb), free(d->loss), free(d->correct);
  free(d);
  s->impl = NULL;
}

static int pipe_setup(dt_strategy *s) {
  const dt_run_cfg *c = s->cfg;
  const int P = c->pipeline_stages;
  if (P > 1 && !s->comm)
    return dt__seterr(DT_EINVAL, "dist.pipeline_stages = %d: the engine needs a communicator "
                      "(dt_engine_set_comm) of a multiple of %d workers", P, P);
  if (s->nranks % P)
    return dt__seterr(DT_EINVAL, "dist.pipeline_stages = %d: %d workers are not a multiple of it",
                      P, s->nranks);
  const int det = c->deterministic;
  /* deterministic: every product through our own kernels (ddp_det's rule) */
  if (det) dt_model_set_gemm_flags(s->model, DT_GEMM_FIXED);
  DT_CHECK(dt__ddp_check_cfg(s)); /* dt__pipe_start makes the parameters equal */
  pipe_impl *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "pipeline: out of memory");
  s->impl = d;
  d->det = det;
  d->P = P;
  d->R = s->nranks / P;
  d->stage = s->rank % P;
  d->replica = s->rank / P;
  int rc = DT_OK;
  if (s->comm) {
    dt_comm_bytes(s->comm, &d->sent0, &d->recv0);
    if ((rc = dt_comm_split(s->comm, d->replica, d->stage, &d->pcomm)) < 0 ||
        (rc = dt_comm_split(s->comm, d->stage, d->replica, &d->scomm)) < 0) {
      rc = dt__pipe_comm_err(s, rc, "pipeline communicators");
      goto fail;
    }
    if (P == 1) dt_comm_destroy(d->pcomm), d->pcomm = NULL;
    if (d->R == 1) dt_comm_destroy(d->scomm), d->scomm = NULL;
  }
  DT_CHECK_GOTO(partition(s, d), rc, fail);
  const int st = d->stage, m = c->micro_batches;
  int per_replica = (c->batch + d->R - 1) / d->R;
  dt_pipe_cfg pc = {
      .spec = c->layers,
      .l0 = d->part.first[st],
      .l1 = d->part.first[st + 1],
      .param_off = d->part.param_off[st],
      .buf_off = d->part.buf_off[st],
      .nbufs = d->part.nbufs[st],
      .stage = st,
      .nstages = P,
      .schedule = c->schedule,
      .micro = m,
      .max_batch = (per_replica + m - 1) / m,
      .recompute = c->recompute,
      .rc_rows = (int)dt_param_or(DT_PARAM_PIPE_RECOMPUTE_ROWS, 64),
      .wgrad = c->pipe_wgrad >= 0 ? c->pipe_wgrad : (int)dt_param_or(DT_PARAM_PIPE_WGRAD, 1),
      .wpack = (int)dt_param_or(DT_PARAM_PIPE_WPACK, 1),
      .warm_extra = (int)dt_param_or(DT_PARAM_PIPE_WARMUP, 1),
      .tail = (int)dt_param_or(DT_PARAM_PIPE_TAIL, 0),
      .det = det,
      .whole = s->model,
      .comm = d->pcomm,
  };
  const dt_layer_info *l0 = dt_model_layer(s->model, 0);
  pc.c = l0->in_c, pc.h = l0->in_h, pc.w = l0->in_w;
  if (det) {
    /* micro-batches are runs of whole micro-shards: as large as the share */
    pc.max_batch = per_replica;
  }
  DT_CHECK_GOTO(dt_pipe_create(&d->pipe, &pc), rc, fail);
  d->pc = pc;
  /* this stage's span initialised (or every rank's whole model checked
   * equal with P = 1) before anything reads it */
  DT_CHECK_GOTO(dt__pipe_start(s, d), rc, fail);
  /* the stages keep stage-sized gradients: no rank holds the whole model's */
  dt__model_drop_grads(s->model);
  {
    /* printed at start by rank 0: the partition and every stage's
     * activation memory (replica 0's ranks are stages 0..P-1) */
    int K = 0, S = 0;
    double ab = (double)dt_pipe_act_bytes(d->pipe, &K, &S), *all = NULL;
    d->act_bytes = (size_t)ab;
    if (s->comm && !(all = calloc((size_t)s->nranks, sizeof *all))) {
      rc = dt__seterr(DT_ENOMEM, "pipeline: out of memory");
      goto fail;
    }
    if (s->comm && (rc = dt_comm_allgather(s->comm, &ab, all, 1, DT_F64)) < 0) {
      free(all);
      rc = dt__pipe_comm_err(s, rc, "pipeline start");
      goto fail;
    }
    if (s->rank == 0 && (P > 1 || c->recompute)) {
      char desc[4096], mem[1024];
      size_t k = 0;
      dt_partition_describe(&d->part, s->model, desc, sizeof desc);
      for (int t = 0; t < P && k < sizeof mem; t++)
        k += (size_t)snprintf(mem + k, sizeof mem - k, "%s%.1f", t ? ", " : "",
                              (all ? all[t] : ab) / 1048576.0);
      DT_LOG_INFO("pipeline: %d stage%s x %d replica%s, schedule %s, %d micro-batches%s\n%s\n"
                  "activation memory per stage (MiB; stage 0 holds %d micro-batch%s): %s",
                  P, P == 1 ? "" : "s", d->R, d->R == 1 ? "" : "s",
                  dt__schedule_names[c->schedule], c->micro_batches,
                  c->recompute ? ", recompute" : "", desc, K, K == 1 ? "" : "es", mem);
    }
    free(all);
  }
  if (det) {
    /* one bucket: the fixed-point sums are reduced after the drain on this
     * thread, never beside the pipeline's own messages */
    DT_CHECK_GOTO(dt_ddp_create_det(&d->ddp, dt_pipe_model(d->pipe), d->scomm, 1 << 30), rc,
                  fail);
    dt_pipe_set_det(d->pipe, d->ddp);
    const size_t dim = (size_t)dt_model_in_dim(s->model);
    d->xstep = dt_alloc((size_t)per_replica * dim * sizeof(float));
    d->ystep = dt_alloc((size_t)per_replica * sizeof(int32_t));
    if (!d->xstep || !d->ystep) {
      rc = dt__seterr(DT_ENOMEM, "pipeline: out of memory");
      goto fail;
    }
  }
  if (!det && d->scomm && d->part.params[st] && dt_param_or(DT_PARAM_PIPE_DDP, 1)) {
    /* the stage's gradient over its replicas in ddp's buckets, each
     * reduced as soon as the stage's last products have made it: the
     * reduction overlaps the drain (pipe.h dt_pipe_set_ready); the
     * gradients are already weighted by each replica's share, so scale 1.
     * Through the transport, not a shared window (ddp.h says why). */
    DT_CHECK_GOTO(dt__ddp_create_nowin(&d->rddp, dt_pipe_model(d->pipe), d->scomm,
                                       c->bucket_bytes), rc, fail);
    dt_pipe_grads_moved(d->pipe);
    dt_pipe_set_ready(d->pipe, dt_ddp_grad_ready, d->rddp);
  }
  DT_CHECK_GOTO(dt__pipe_optim_create(s, d), rc, fail);
  d->mb = calloc((size_t)m, sizeof *d->mb);
  d->loss = calloc((size_t)m, sizeof *d->loss);
  d->correct = calloc((size_t)m, sizeof *d->correct);
  if (!d->mb || !d->loss || !d->correct) {
    rc = dt__seterr(DT_ENOMEM, "pipeline: out of memory");
    goto fail;
  }
  return DT_OK;
fail:
  if (rc < 0 && !strstr(dt_errmsg(), "rank ")) dt__preerr(rc, "rank %d (stage %d)", s->rank, d->stage);
  pipe_teardown(s);
  return rc;
}

static int pipe_step_begin(dt_strategy *s, const dt_step_plan *plan) {
  pipe_impl *d = s->impl;
  d->plan = *plan;
  if (d->det)
    dt_ddp_begin_step_det(d->ddp, plan->n_global, plan->pieces_global,
                          s->cfg->reduce == DT_DIST_SUM);
  if (d->rddp) dt_ddp_begin_step(d->rddp, 1, 1);
  return DT_OK;
}

/* Deterministic mode: this replica's micro-shards side by side, grouped
 * into at most m micro-batches of whole micro-shards. */
static int det_micro(dt_strategy *s, pipe_impl *d, dt_batch_source *src, const dt_step_plan *plan,
                     int *m) {
  const size_t dim = (size_t)dt_model_in_dim(s->model);
  const int np = plan->pieces, M = s->cfg->micro_batches;
  int at = 0, shard = 0;
  int64_t first = 0;
  int *start = malloc(((size_t)np + 1) * sizeof *start);
  if (!start) return dt__seterr(DT_ENOMEM, "pipeline: out of memory");
  for (int i = 0; i < np; i++) {
    dt_batch b;
    int rc = src->ops->piece(src, i, &b);
    if (rc < 0) {
      free(start);
      return rc;
    }
    if (i == 0) first = b.sample0, shard = b.n;
    start[i] = at;
    memcpy(d->xstep + (size_t)at * dim, b.x, (size_t)b.n * dim * sizeof(float));
    memcpy(d->ystep + at, b.y, (size_t)b.n * sizeof(int32_t));
    at += b.n;
  }
  start[np] = at;
  *m = 0;
  for (int j = 0; j < M; j++) {
    int a = (int)((int64_t)np * j / M), e = (int)((int64_t)np * (j + 1) / M);
    if (a == e) continue;
    d->mb[*m] = (dt_pipe_mb){d->xstep + (size_t)start[a] * dim, d->ystep + start[a],
                             start[e] - start[a], first + start[a], shard};
    (*m)++;
  }
  free(start);
  return DT_OK;
}

static int pipe_run(dt_strategy *s, dt_batch_source *src, const dt_step_plan *plan, dt_tally *t) {
  pipe_impl *d = s->impl;
  int m = 0;
  dt_batch b = {0};
  if (d->det) {
    if (plan->pieces > 0) DT_CHECK(det_micro(s, d, src, plan, &m));
  } else if (plan->pieces > 0) {
    DT_CHECK(src->ops->piece(src, 0, &b));
    const int M = s->cfg->micro_batches, n = b.n;
    const size_t dim = (size_t)dt_model_in_dim(s->model);
    for (int j = 0; j < M; j++) {
      int lo = (int)((int64_t)n * j / M), hi = (int)((int64_t)n * (j + 1) / M);
      if (hi == lo) continue; /* fewer samples than micro-batches */
      d->mb[m] = (dt_pipe_mb){b.x + (size_t)lo * dim, b.y + lo, hi - lo, b.sample0 + lo, 0};
      m++;
    }
  }
  int rc = dt_pipe_step(d->pipe, d->mb, m, plan->n_global, s->cfg->seed, (uint64_t)s->step,
                        d->loss, d->correct);
  if (rc < 0) return dt__pipe_name_lost(s, rc);
  for (int j = 0; j < m; j++) dt__tally_add(t, d->loss[j], d->mb[j].n, d->correct[j], plan->terms);
  return DT_OK;
}

static int pipe_step_finish(dt_strategy *s, float lr) {
  pipe_impl *d = s->impl;
  const int st = d->stage;
  const size_t off = d->part.param_off[st], n = d->part.params[st];
  float *g = dt_model_grads(dt_pipe_model(d->pipe));
  if (d->det) {
    int rc = dt_ddp_finish_step(d->ddp);
    if (rc < 0) return dt__preerr(rc, "rank %d (stage %d)", s->rank, st);
  } else if (d->rddp) {
    double t0 = dt_now();
    int rc = dt_ddp_finish_step(d->rddp);
    d->reduce_s += dt_now() - t0;
    if (rc < 0) return dt__pipe_name_lost(s, dt__preerr(rc, "rank %d (stage %d)", s->rank, st));
  } else if (d->scomm && n) {
    /* the stage's gradient over its replicas (each already weighted by its
     * share of the global batch) */
    double t0 = dt_now();
    int rc = dt_comm_allreduce(d->scomm, g, g, n, DT_F32, DT_OP_SUM);
    d->reduce_s += dt_now() - t0;
    if (rc < 0) return dt__pipe_comm_err(s, rc, "stage gradient allreduce");
  }
  double t0 = dt_now();
  if (n) DT_CHECK(dt__pipe_optim_step(s, d, dt_model_params(s->model) + off, g, lr));
  d->opt_s += dt_now() - t0;
  d->nsteps++;
  s->step++;
  return DT_OK;
}

/* Rank 0, at the end of a run with P > 1: where each stage's steps went
 * (ms per step, replica 0's stages; one allgather of every rank's
 * phases). Compute is forward + backward + packing + weight gradients;
 * waiting is receiving + send completions + replica reduction + the
 * checkpoint agreement (ranks > 0 wait there for stage 0's step). */
#define NPH 9
static int print_phases(dt_strategy *s, pipe_impl *d) {
  dt_pipe_phase ph;
  dt_pipe_phases(d->pipe, &ph);
  double me[NPH] = {ph.fwd, ph.bwd, ph.pack, ph.wgrad, d->opt_s, ph.recv, ph.send,
                    d->reduce_s, d->agree_s};
  double *all = calloc((size_t)s->nranks * NPH, sizeof *all);
  if (!all) return dt__seterr(DT_ENOMEM, "pipeline: out of memory");
  int rc = dt_comm_allgather(s->comm, me, all, NPH, DT_F64);
  if (rc < 0) {
    free(all);
    return dt__pipe_comm_err(s, rc, "the stages' time lines");
  }
  if (s->rank == 0 && d->nsteps > 0) {
    char buf[2048];
    size_t at = 0;
    const double k = 1000.0 / (double)d->nsteps;
    for (int t = 0; t < d->P && at < sizeof buf; t++) {
      const double *x = all + (size_t)t * NPH;
      at += (size_t)snprintf(buf + at, sizeof buf - at,
                             "%sstage %d: forward %.2f, backward %.2f, packing %.2f, weight "
                             "gradients %.2f, optimizer %.2f; receiving %.2f, sends %.2f, replica "
                             "reduction %.2f, checkpoint agreement %.2f",
                             t ? "\n" : "", t, k * x[0], k * x[1], k * x[2], k * x[3], k * x[4],
                             k * x[5], k * x[6], k * x[7], k * x[8]);
    }
    DT_LOG_INFO("pipeline time per step (ms, %lld steps):\n%s", (long long)d->nsteps, buf);
  }
  free(all);
  return DT_OK;
}

static int pipe_eval_begin(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi) {
  (void)chunk;
  *lo = 0;
  *hi = n;
  if (!s->comm || s->nranks < 2) return DT_OK;
  /* here with P = 1 (every rank holds the whole model) or before setup;
   * stages evaluate through dt__pipe_evaluate */
  dt_model *m = s->model;
  pipe_impl *d = s->impl;
  if (d && d->det) {
    /* ddp_det's ranges (whole chunks); running statistics are already
     * the same bits on every replica */
    const int64_t C = (n + chunk - 1) / chunk;
    *lo = C * s->rank / s->nranks * chunk;
    *hi = C * (s->rank + 1) / s->nranks * chunk;
    if (*hi > n) *hi = n;
    if (*lo > n) *lo = n;
    return DT_OK;
  }
  if (dt_model_nbufs(m)) {
    int rc = dt_comm_allreduce(s->comm, dt_model_bufs(m), dt_model_bufs(m), dt_model_nbufs(m),
                               DT_F32, DT_OP_AVG);
    if (rc < 0) return dt__pipe_comm_err(s, rc, "evaluation buffers");
  }
  *lo = n * s->rank / s->nranks;
  *hi = n * (s->rank + 1) / s->nranks;
  return DT_OK;
}

static int pipe_eval_reduce(dt_strategy *s, dt_tally *t) {
  if (!s->comm || s->nranks < 2) return DT_OK;
  if (t->fixed) {
    int64_t v[2] = {t->loss_q, t->correct};
    int rc = dt_comm_allreduce(s->comm, v, v, 2, DT_I64, DT_OP_SUM);
    if (rc < 0) return dt__pipe_comm_err(s, rc, "evaluation");
    t->loss_q = v[0];
    t->correct = v[1];
    return DT_OK;
  }
  double v[2] = {t->loss, (double)t->correct};
  int rc = dt_comm_allreduce(s->comm, v, v, 2, DT_F64, DT_OP_SUM);
  if (rc < 0) return dt__pipe_comm_err(s, rc, "evaluation");
  t->loss = v[0];
  t->correct = (int64_t)(v[1] + 0.5);
  return DT_OK;
}

static int pipe_epoch_end(dt_strategy *s, int epoch, dt_tally *t) {
  (void)epoch;
  pipe_impl *d = s->impl;
  if (!s->comm) return DT_OK;
  /* every stage of a replica saw the same losses: count stage 0's */
  int mine = d->stage == 0;
  if (t->fixed) {
    int64_t q[3] = {mine ? t->loss_q : 0, mine ? t->correct : 0, mine ? t->samples : 0};
    int rc = dt_comm_allreduce(s->comm, q, q, 3, DT_I64, DT_OP_SUM);
    if (rc == DT_OK)
      rc = dt_comm_allreduce(s->comm, &t->seconds, &t->seconds, 1, DT_F64, DT_OP_MAX);
    if (rc < 0) return dt__pipe_comm_err(s, rc, "epoch statistics");
    t->loss_q = q[0];
    t->correct = q[1];
    t->samples = q[2];
    return DT_OK;
  }
  double v[3] = {mine ? t->loss : 0, mine ? (double)t->correct : 0, mine ? (double)t->samples : 0};
  int rc = dt_comm_allreduce(s->comm, v, v, 3, DT_F64, DT_OP_SUM);
  if (rc == DT_OK) rc = dt_comm_allreduce(s->comm, &t->seconds, &t->seconds, 1, DT_F64, DT_OP_MAX);
  if (rc < 0) return dt__pipe_comm_err(s, rc, "epoch statistics");
  t->loss = v[0];
  t->correct = (int64_t)(v[1] + 0.5);
  t->samples = (int64_t)(v[2] + 0.5);
  return DT_OK;
}

static int pipe_run_end(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all) {
  pipe_impl *d = s->impl;
  if (d->P > 1) {
    DT_CHECK(dt__pipe_end_check(s, d));
    DT_CHECK(print_phases(s, d));
  } else if (s->comm) {
    int rc = dt_ddp_check_params(s->model, s->comm);
    if (rc < 0) return dt__preerr(rc, "rank %d", s->rank);
  }
  double comp = 0, wait = 0;
  dt_pipe_times(d->pipe, &comp, &wait);
  uint64_t sent = 0, recv = 0;
  if (s->comm) dt_comm_bytes(s->comm, &sent, &recv);
  me->compute_seconds = comp;
  me->comm_seconds = wait + d->reduce_s + d->agree_s;
  me->comm_hidden = 0;
  me->bytes_sent = (double)(sent - d->sent0);
  me->bytes_received = (double)(recv - d->recv0);
  all[0] = *me;
  if (!s->comm) return DT_OK;
  int rc = dt_comm_allgather(s->comm, me, all, DT_WORKER_STATS_FIELDS, DT_F64);
  return rc < 0 ? dt__pipe_comm_err(s, rc, "summary statistics") : DT_OK;
}

/* ---- checkpoints ----------------------------------------------------------------- */

/* Each stage's optimizer state is its own: a checkpoint holds it as the
 * file stage-T.safetensors (owner "stage-T" in the manifest) beside the
 * whole model's parameters in model.safetensors (so `dtrain export` and
 * PyTorch read the usual file). At a step boundary every stage of replica
 * 0 sends its span of the parameters and running statistics, its optimizer
 * state and step count to rank 0 (replicas hold the same state after their
 * allreduce), which spills them to a file and writes (pipeline_ckpt.c:
 * gather and export). Resuming, every rank reads the part of
 * the stages' files its own span covers, whatever the stage count and cut
 * points that wrote them (dt__import_optim_span): the state is per
 * parameter, so re-partitioning is exact. */

static int pipe_import(dt_strategy *s, const dt_state_reader *r) {
  pipe_impl *d = s->impl;
  int64_t step = 0, ostep = 0;
  size_t len = 0;
  DT_CHECK(r->get(r->ud, "optim_step", &ostep, sizeof ostep, &len));
  if (len != sizeof ostep) return dt__seterr(DT_ECORRUPT, "strategy state 'optim_step': bad size");
  DT_CHECK(r->get(r->ud, "step", &step, sizeof step, &len));
  if (len != sizeof step) return dt__seterr(DT_ECORRUPT, "strategy state 'step': bad size");
  if (step < 0 || ostep < 0)
    return dt__seterr(DT_ECORRUPT, "strategy state: negative step count (%lld, %lld)",
                      (long long)step, (long long)ostep);
  DT_CHECK(dt__pipe_optim_import(s, d, r));
  *dt_optim_step_count(d->optim) = ostep;
  if (d->otail) *dt_optim_step_count(d->otail) = ostep;
  s->step = step;
  return DT_OK;
}

/* The two tables differ in name and tallies only. */
#define PIPE_OPS(NAME, FIXED)                                                                    \
  {                                                                                              \
    .name = NAME, .fixed_point = FIXED,                                                          \
    .state_sharded = 1, /* each stage its own parameters and optimizer: gathered to rank 0 */ \
    .own_optim = 1, .init_own = 1, .open_source = pipe_source, .setup = pipe_setup,              \
    .step_begin = pipe_step_begin, .run_pieces = pipe_run, .backward_begin = NULL,               \
    .grad_ready = NULL, .step_finish = pipe_step_finish, .eval_begin = pipe_eval_begin,          \
    .evaluate = dt__pipe_evaluate,                                                               \
    .eval_reduce = pipe_eval_reduce, .epoch_end = pipe_epoch_end, .state_gather = dt__pipe_gather,   \
    .state_export = dt__pipe_export, .state_import = pipe_import,                                    \
    .membership_change = dt__strategy_no_membership,                                             \
    .run_end = pipe_run_end, .teardown = pipe_teardown,                                          \
  }

const struct dt_strategy_ops dt__strategy_pipeline = PIPE_OPS("pipeline", 0);

/* Deterministic mode: the same strategy, tallies in fixed point. */
const struct dt_strategy_ops dt__strategy_pipeline_det = PIPE_OPS("pipeline_det", 1);

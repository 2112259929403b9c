/*
 * strategy_ddp.c — the "ddp" strategy: data parallelism over allreduce
 * (docs/ddp.md). Every worker trains on a balanced contiguous slice of each
 * global batch (the "shards" source); its gradients, scaled by its share of
 * the batch, are summed in buckets that parallel/ddp.c reduces on a
 * communication thread while backward still runs (grad_ready), so after
 * step_finish every rank holds the global-batch mean (or, with
 * dist.reduce = sum, the sum of every worker's mean) and applies the same
 * optimizer step. Start-up compares every rank's configuration and copies
 * rank 0's parameters; the end compares every rank's parameter hash.
 * Evaluation is sharded by contiguous ranges and summed. Each step is timed
 * (balance.h): compute up to step_finish, the wait in the exchange; with
 * dist.balance = dynamic the slices follow the ranks' measured speed, and
 * since every bucket is scaled by n_local / n_global the reduced gradient
 * is the global-batch mean whatever the cut.
 *
 * The start-up, end-of-run and message helpers (dt__ddp_*) are shared with
 * strategy_ddp_det.c. It needs a communicator; one worker is "local".
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/strategy.h"
#include "comm/compress/compress.h"
#include "parallel/ddp.h"
#include "parallel/shupd.h"

typedef struct ddp_impl {
  dt_ddp *ddp;
  dt_balance *bal;
  dt_shupd *up;          /* the shared update (docs/ddp.md): NULL, every rank updates all */
  dt_step_plan plan;
  uint64_t sent0, recv0; /* communicator bytes at start */
} ddp_impl;

/* ---- shared with ddp_det ------------------------------------------------------ */

int dt__ddp_comm_err(dt_strategy *s, int rc, const char *what) {
  const char *m = s->comm ? dt_comm_errmsg(s->comm) : NULL;
  return dt__seterr(rc, "rank %d: %s: %s", s->rank, what, m && *m ? m : dt_errmsg());
}

int dt__ddp_check_cfg(dt_strategy *s) {
  if (!s->comm) return DT_OK;
  dt_ddp_fingerprint fp;
  dt__config_fingerprint(s->cfg, s->train_n, s->test_n, dt_model_nparams(s->model),
                         s->config_sha, &fp);
  int rc = dt_ddp_check_config(s->comm, &fp);
  return rc < 0 ? dt__preerr(rc, "rank %d", s->rank) : DT_OK;
}

int dt__ddp_startup(dt_strategy *s) {
  if (!s->comm) return DT_OK;
  DT_CHECK(dt__ddp_check_cfg(s));
  int rc = dt_ddp_broadcast_params(s->model, s->comm);
  if (rc < 0) return dt__preerr(rc, "rank %d", s->rank);
  return DT_OK;
}

int dt__ddp_balance_create(dt_strategy *s, dt_balance **out) {
  DT_CHECK(dt__balance_create(out, s->cfg, s->rank, s->nranks));
  int n = 0;
  s->perf_epoch = dt__balance_epoch_perf(*out, &n);
  s->perf_run = dt__balance_run_perf(*out, &n);
  s->nperf = n;
  return DT_OK;
}

/* The wait that counts against the others (docs/ddp.md "Stragglers"):
 * through a shared window, the time this rank waited for ranks that came
 * later by their own stamps, at most its local wait (with a communication
 * thread the window's waits may overlap backward); otherwise the local
 * wait. A rank descheduled while it waits (its CPU quota ran out) thus
 * does not book its own stall as waiting for the others. */
int dt__ddp_exchange(dt_strategy *s, dt_ddp *ddp, dt_balance *bal, const dt_step_plan *plan) {
  (void)s;
  dt__balance_computed(bal, plan->n_local, plan->n_global);
  double b0 = dt_ddp_blocked_seconds(ddp);
  double t0 = dt_now();
  DT_CHECK(dt_ddp_finish_step(ddp));
  double local = dt_now() - t0, waited = local;
  if (b0 >= 0) {
    double blocked = dt_ddp_blocked_seconds(ddp) - b0;
    waited = blocked < local ? blocked : local;
  }
  dt__balance_waited(bal, waited > 0 ? waited : 0);
  return DT_OK;
}

int dt__ddp_replan(dt_strategy *s, dt_ddp *ddp, dt_balance *bal) {
  dt__balance_step_end(bal);
  const double *w = NULL;
  int changed = 0;
  DT_CHECK(dt__balance_replan(bal, s->comm, s->step, &w, &changed));
  if (!changed) return DT_OK;
  /* the slow rank also sums less of each bucket in the shared window: the
   * reduction is per-step work every rank repeats whatever its share; a
   * rank under a CPU quota none (dt__balance_slice_weights): otherwise the
   * fast rank waits, every step, for it to wake up and sum its slice at
   * its reduced speed — or for the rest of a quota period when the kernel
   * stops it there */
  DT_CHECK(dt_ddp_set_shares(ddp, dt__balance_slice_weights(bal, w)));
  return dt__source_set_weights(s->source, w);
}

void dt__ddp_balance_destroy(dt_strategy *s, dt_balance *bal) {
  dt__balance_destroy(bal);
  s->perf_epoch = s->perf_run = NULL;
  s->nperf = 0;
}

int dt__ddp_finish(dt_strategy *s, dt_ddp *ddp, uint64_t sent0, uint64_t recv0,
                   dt_worker_stats *me, dt_worker_stats *all) {
  /* Every worker must end with the same parameters. */
  if (s->comm) {
    int rc = dt_ddp_check_params(s->model, s->comm);
    if (rc < 0) return dt__preerr(rc, "rank %d", s->rank);
  }
  dt_ddp_stats st;
  dt_ddp_get_stats(ddp, &st);
  uint64_t sent = 0, recv = 0;
  if (s->comm) dt_comm_bytes(s->comm, &sent, &recv);
  me->compute_seconds = me->train_seconds - st.exposed_seconds;
  me->comm_seconds = st.comm_seconds;
  double h = st.comm_seconds > 0 ? 1.0 - st.exposed_seconds / st.comm_seconds : 0;
  me->comm_hidden = h < 0 ? 0 : h > 1 ? 1 : h;
  me->bytes_sent = (double)(sent - sent0 + st.window_written);
  me->bytes_received = (double)(recv - recv0 + st.window_read);
  all[0] = *me;
  if (!s->comm) return DT_OK;
  int rc = dt_comm_allgather(s->comm, me, all, DT_WORKER_STATS_FIELDS, DT_F64);
  return rc < 0 ? dt__ddp_comm_err(s, rc, "summary statistics") : DT_OK;
}

/* The source's state to every member of the new communicator: parameters,
 * buffers, optimizer state and step count; with det a fresh deterministic
 * synchroniser too (ddp makes its own: it may compress). */
int dt__ddp_membership(dt_strategy *s, const dt_membership *m, dt_ddp **ddp, int det) {
  if (!m->comm || m->source < 0 || m->source >= m->nranks || m->rank < 0 ||
      m->rank >= m->nranks)
    return dt__seterr(DT_EINVAL, "strategy '%s': membership change needs a communicator and "
                      "ranks in range (rank %d, source %d of %d)", s->ops->name, m->rank,
                      m->source, m->nranks);
  if (!ddp)
    return dt__seterr(DT_EINVAL, "strategy '%s': membership change before setup", s->ops->name);
  dt_ddp_destroy(*ddp);
  *ddp = NULL;
  s->grad_ud = NULL;
  s->comm = m->comm;
  s->rank = m->rank;
  s->nranks = m->nranks;
  dt_comm *c = m->comm;
  dt_model *md = s->model;
  /* buffers (running statistics) differ between members: always the source's */
  int rc = m->have_state ? DT_OK
                         : dt_comm_broadcast(c, dt_model_params(md), dt_model_nparams(md), DT_F32,
                                             m->source);
  if (rc == DT_OK && dt_model_nbufs(md))
    rc = dt_comm_broadcast(c, dt_model_bufs(md), dt_model_nbufs(md), DT_F32, m->source);
  size_t nf = m->have_state ? 0 : dt_optim_state_floats(s->optim);
  if (rc == DT_OK && nf)
    rc = dt_comm_broadcast(c, dt_optim_state(s->optim), nf, DT_F32, m->source);
  int64_t steps[2] = {*dt_optim_step_count(s->optim), s->step};
  if (rc == DT_OK) rc = dt_comm_broadcast(c, steps, 2, DT_I64, m->source);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "membership change: state from the source");
  *dt_optim_step_count(s->optim) = steps[0];
  s->step = steps[1];
  if (det) {
    rc = dt_ddp_create_det(ddp, md, c, s->cfg->bucket_bytes);
    if (rc == DT_OK) rc = dt__ddp_det_rows(*ddp, s->cfg->micro_batch);
    if (rc < 0) return dt__preerr(rc, "rank %d: membership change", s->rank);
    s->grad_ud = *ddp;
  }
  return DT_OK;
}

/* The compression settings of this run (docs/compress.md): none unless
 * dist.compress names a codec and it pays here (not when every rank shares
 * one host, unless dist.compress_force). Every rank decides alike: the
 * inputs are the config and the host topology. */
static int compress_cfg(dt_strategy *s, dt_compress_cfg *cz) {
  const dt_run_cfg *c = s->cfg;
  *cz = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  if (c->compress == DT_CODEC_NONE) return DT_OK;
  if (!dt__compress_pays(s->comm, c->compress_force)) {
    if (s->rank == 0)
      DT_LOG_INFO("dist.compress = %s left off: every worker is on one host, where gradients "
                  "move at memory speed (dist.compress_force = true compresses anyway)",
                  dt__codec_names[c->compress]);
    return DT_OK;
  }
  cz->codec = c->compress;
  cz->error_feedback = c->error_feedback;
  cz->ratio = c->compress_ratio;
  cz->qsgd_levels = c->qsgd_levels;
  cz->rank = c->powersgd_rank;
  /* powersgd below rank 6 starts at rank 6 for two epochs (-1, the
   * default): rank 2 from step 0 ends 0.92-1.35 points below dense; after
   * two epochs at rank 6 within 0.31, after one dense epoch (the default
   * before) within 0.41, and it reaches 0.88 an epoch sooner (bench/
   * RESULTS.md, ninth session, 3 seeds). 0 turns it off. */
  cz->warm_rank = c->powersgd_warm_rank;
  if (cz->warm_rank < 0) cz->warm_rank = c->powersgd_rank < 6 ? 6 : 0;
  cz->warm_steps = c->powersgd_warm_steps < 0 ? 2 * s->steps_per_epoch : c->powersgd_warm_steps;
  cz->warmup_epochs = c->compress_warmup_epochs;
  cz->start_step = c->compress_start_step;
  /* -1: dense steps first for the codecs that otherwise end more than
   * half a point below dense (bench/RESULTS.md 2026-11-27, 3 seeds):
   * powersgd below rank 6 without a warm rank one epoch (rank 2 from
   * step 0: -1.35 points; rank 6 and 8 from step 0 are within 0.22: none
   * for them; with the warm rank none); sign and
   * topk with the optimizer's momentum after the codec two; sign with
   * dist.compress_momentum three quarters of an epoch (its dense steps
   * keep the worker momentum); topk with it none (DGC's momentum
   * correction is enough) */
  /* sign: the optimizer's momentum moved before the codec (signum) with
   * DTRAIN_CZ_SIGN_MOM=1 (off by default: 0.65 / 0.81 points below dense
   * on the CNN, seeds 42 / 1; docs/compress.md "sign's momentum") */
  int signum = c->compress == DT_CODEC_SIGN && c->compress_momentum == 0 &&
               c->optim.kind == DT_OPT_SGD && c->optim.momentum > 0 &&
               c->optim.dampening == 0 && !c->optim.nesterov && dt_param(DT_PARAM_CZ_SIGN_MOM);
  if (c->compress_start_step < 0) {
    int64_t quarters = 0;
    if (c->compress == DT_CODEC_POWERSGD) quarters = c->powersgd_rank < 6 && !cz->warm_rank ? 4 : 0;
    else if ((c->compress == DT_CODEC_SIGN || c->compress == DT_CODEC_TOPK) &&
             c->compress_momentum == 0 && !signum)
      quarters = 8;
    else if (c->compress == DT_CODEC_SIGN)
      quarters = 3;
    cz->start_step = quarters * s->steps_per_epoch / 4;
  }
  cz->clip = c->compress_clip;
  cz->momentum = c->compress_momentum;
  if (signum) {
    cz->momentum = cz->opt_momentum = c->optim.momentum;
    if (s->rank == 0)
      DT_LOG_INFO("dist.compress = sign: the optimizer's momentum %g runs before the codec on "
                  "each worker (signum; DTRAIN_CZ_SIGN_MOM=0 puts it after)",
                  (double)c->optim.momentum);
  }
  cz->seed = c->seed;
  return DT_OK;
}

/* The shared update (parallel/shupd.h, docs/ddp.md): with dist.balance =
 * dynamic on one host (a shared gradient window), the optimizer state once
 * per host and each rank stepping its speed-weighted slice inside the
 * reduction: by default (DTRAIN_SHUPD auto) with AdamW, where the update
 * is compute and doing it once made dynamic faster under a quota (1.07x;
 * 1.5x while its loop was scalar), not with SGD, where it measured no
 * faster. Not with elastic membership (dist.min_workers): a step aborted
 * between two ranks' updates would leave the shared state half stepped,
 * and the redone step would step that half twice. Every rank decides
 * alike (config, knob, and the window verdict, which is collective). */
static int shared_update(dt_strategy *s, ddp_impl *d) {
  const dt_run_cfg *c = s->cfg;
  int64_t mode = dt_param(DT_PARAM_SHUPD);
  /* auto: where the update is compute (AdamW) it pays to do it once; SGD's
   * is a memory pass that costs about what moving the slices does */
  if (mode < 0) mode = c->optim.kind == DT_OPT_ADAMW ? 2 : 0;
  if (c->balance != DT_BALANCE_DYNAMIC || c->min_workers > 0 || !mode) return DT_OK;
  if (dt_ddp_set_apply(d->ddp, dt_shupd_apply, NULL) == DT_ENOTSUP) {
    dt__clearerr(); /* no window here (tcp, several hosts, DTRAIN_WINDOW=0) */
    return DT_OK;
  }
  int rc = dt_shupd_create(&d->up, s->model, s->optim, &c->optim, s->comm, mode == 2,
                           (size_t)dt_model_nlayers(s->model) + 1);
  if (rc == DT_ENOTSUP) {
    dt__clearerr();
    return dt_ddp_set_apply(d->ddp, NULL, NULL);
  }
  if (rc < 0) return dt__preerr(rc, "rank %d: shared update", s->rank);
  dt_shupd_set_grads(d->up, dt_model_grads(s->model));
  return dt_ddp_set_apply(d->ddp, dt_shupd_apply, d->up);
}

/* ---- the strategy -------------------------------------------------------------- */

static int ddp_source(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out) {
  if (cfg->compress && cfg->compress_momentum > 0 &&
      (cfg->optim.kind != DT_OPT_SGD || cfg->optim.momentum > 0))
    return dt__seterr(DT_EINVAL, "dist.compress_momentum = %g: DGC momentum correction replaces "
                      "the optimizer's momentum; set optim.name = sgd and optim.momentum = 0",
                      (double)cfg->compress_momentum);
  return dt__source_shards(out, train, cfg->batch, cfg->seed, cfg->shuffle, 0);
}

static int ddp_setup(dt_strategy *s) {
  if (s->joining) { /* membership_change builds the rest with the job's state */
    if (!(s->impl = calloc(1, sizeof(ddp_impl)))) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
    return DT_OK;
  }
  if (!s->comm)
    return dt__seterr(DT_EINVAL, "dist.workers = %d: the engine needs a communicator "
                      "(dt_engine_set_comm) to train with several workers", s->cfg->workers);
  DT_CHECK(dt__ddp_startup(s));
  dt_compress_cfg cz;
  DT_CHECK(compress_cfg(s, &cz));
  ddp_impl *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  int rc = cz.codec != DT_CODEC_NONE
               ? dt_ddp_create_compressed(&d->ddp, s->model, s->comm, s->cfg->bucket_bytes, &cz)
               : dt_ddp_create(&d->ddp, s->model, s->comm, s->cfg->bucket_bytes);
  if (rc == DT_OK) rc = dt__ddp_balance_create(s, &d->bal);
  if (rc == DT_OK && cz.codec == DT_CODEC_NONE) rc = shared_update(s, d);
  if (rc < 0) {
    dt_shupd_destroy(d->up, s->model, s->optim);
    dt_ddp_destroy(d->ddp);
    free(d);
    return rc;
  }
  dt_comm_bytes(s->comm, &d->sent0, &d->recv0);
  s->impl = d;
  s->grad_ud = d->ddp;
  return DT_OK;
}

static int ddp_step_begin(dt_strategy *s, const dt_step_plan *plan) {
  ddp_impl *d = s->impl;
  d->plan = *plan;
  /* the shared update runs inside the reduction, maybe before step_finish
   * (the communication thread): the step's rate now, as the loop's */
  if (d->up) dt_shupd_begin(d->up, s->optim, dt_sched_lr(s->sched, s->step));
  dt__balance_step_begin(d->bal);
  dt__balance_step_pace(d->bal);
  dt_ddp_set_step(d->ddp, s->step,
                  s->steps_per_epoch > 0 ? (int)(s->step / s->steps_per_epoch) : 0);
  dt_compress *z = dt_ddp_compressor(d->ddp);
  if (s->ckpt_notes && z) {
    dt_compress_note_enable(z);
    dt_compress_note_set(z, s->ckpt_note_out);
  }
  /* avg: scale by n / global, so the sum is the global-batch mean; sum:
   * every worker's own mean, summed */
  if (s->cfg->reduce == DT_DIST_SUM) dt_ddp_begin_step(d->ddp, plan->n_local > 0, 1);
  else dt_ddp_begin_step(d->ddp, plan->n_local, plan->n_global);
  return DT_OK;
}

static int ddp_step_finish(dt_strategy *s, float lr) {
  ddp_impl *d = s->impl;
  if (!d->plan.pieces) {
    /* no samples this step: add zeros */
    memset(dt_model_grads(s->model), 0, dt_model_nparams(s->model) * sizeof(float));
    dt_ddp_all_ready(d->ddp);
  }
  DT_CHECK(dt__ddp_exchange(s, d->ddp, d->bal, &d->plan));
  dt_compress *z = dt_ddp_compressor(d->ddp);
  s->ckpt_note_in = s->ckpt_notes && z ? dt_compress_note_get(z) : 0;
  if (d->up) dt_shupd_end(d->up, s->optim); /* every slice is stepped already */
  else DT_CHECK(dt_optim_step(s->optim, dt_model_params(s->model), dt_model_grads(s->model), lr));
  s->step++;
  return dt__ddp_replan(s, d->ddp, d->bal);
}

int dt__ddp_eval_begin(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi) {
  (void)chunk;
  *lo = 0;
  *hi = n;
  if (!s->comm || s->nranks < 2) return DT_OK;
  /* every rank evaluates with the same (averaged) non-trainable state */
  dt_model *m = s->model;
  if (dt_model_nbufs(m)) {
    int rc = dt_comm_allreduce(s->comm, dt_model_bufs(m), dt_model_bufs(m), dt_model_nbufs(m),
                               DT_F32, DT_OP_AVG);
    if (rc < 0) return dt__ddp_comm_err(s, rc, "evaluation buffers");
  }
  *lo = n * s->rank / s->nranks;
  *hi = n * (s->rank + 1) / s->nranks;
  return DT_OK;
}

int dt__ddp_eval_reduce(dt_strategy *s, dt_tally *t) {
  if (!s->comm || s->nranks < 2) return DT_OK;
  double v[2] = {t->loss, (double)t->correct};
  int rc = dt_comm_allreduce(s->comm, v, v, 2, DT_F64, DT_OP_SUM);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "evaluation");
  t->loss = v[0];
  t->correct = (int64_t)(v[1] + 0.5);
  return DT_OK;
}

int dt__ddp_epoch_reduce(dt_strategy *s, dt_tally *t) {
  if (!s->comm || s->nranks < 2) return DT_OK;
  double v[3] = {t->loss, (double)t->correct, (double)t->samples};
  int rc = dt_comm_allreduce(s->comm, v, v, 3, DT_F64, DT_OP_SUM);
  if (rc == DT_OK) rc = dt_comm_allreduce(s->comm, &t->seconds, &t->seconds, 1, DT_F64, DT_OP_MAX);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "epoch statistics");
  t->loss = v[0];
  t->correct = (int64_t)(v[1] + 0.5);
  t->samples = (int64_t)(v[2] + 0.5);
  return DT_OK;
}

static int ddp_epoch_end(dt_strategy *s, int epoch, dt_tally *t) {
  DT_CHECK(dt__balance_epoch_end(((ddp_impl *)s->impl)->bal, s->comm, epoch));
  return dt__ddp_epoch_reduce(s, t);
}

static int ddp_run_end(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all) {
  ddp_impl *d = s->impl;
  return dt__ddp_finish(s, d->ddp, d->sent0, d->recv0, me, all);
}

static int ddp_membership(dt_strategy *s, const dt_membership *m) {
  ddp_impl *d = s->impl;
  if (d && d->up) { /* not made with elastic membership; should one exist, undo it */
    dt_ddp_set_apply(d->ddp, NULL, NULL);
    dt_shupd_destroy(d->up, s->model, s->optim);
    d->up = NULL;
  }
  DT_CHECK(dt__ddp_membership(s, m, d ? &d->ddp : NULL, 0));
  /* a fresh synchroniser over the new communicator (buckets, a new window
   * on one host; compression restarts with empty error-feedback residuals) */
  dt_compress_cfg cz;
  DT_CHECK(compress_cfg(s, &cz));
  DT_CHECK(cz.codec != DT_CODEC_NONE
               ? dt_ddp_create_compressed(&d->ddp, s->model, s->comm, s->cfg->bucket_bytes, &cz)
               : dt_ddp_create(&d->ddp, s->model, s->comm, s->cfg->bucket_bytes));
  s->grad_ud = d->ddp;
  dt_comm_bytes(s->comm, &d->sent0, &d->recv0);
  /* the speed measurements are per rank of the old world: start afresh */
  dt__ddp_balance_destroy(s, d->bal);
  d->bal = NULL;
  return dt__ddp_balance_create(s, &d->bal);
}

/* The compressor's residuals, worker momentum and PowerSGD Q of this rank
 * (docs/compress.md "Checkpoints"); nothing without compression. */
static int ddp_rank_save(dt_strategy *s, void *buf, size_t *len) {
  ddp_impl *d = s->impl;
  dt_compress *z = d ? dt_ddp_compressor(d->ddp) : NULL;
  if (!buf) {
    *len = dt_compress_state_bytes(z);
    return DT_OK;
  }
  return dt_compress_state_save(z, buf, *len);
}

static int ddp_rank_load(dt_strategy *s, const void *buf, size_t len) {
  ddp_impl *d = s->impl;
  dt_compress *z = d ? dt_ddp_compressor(d->ddp) : NULL;
  if (!z) return dt__seterr(DT_EMISMATCH, "this run does not compress (dist.compress = none or "
                            "left off on one host)");
  return dt_compress_state_load(z, buf, len);
}

/* Checkpoints with the shared update: the state is read out of the one
 * copy (rank 0 exports before its next step's reduction, which no rank can
 * update in before rank 0 joins it), and after an import rank 0 writes it
 * back before its first step (the same argument). The parameters are the
 * shared copy itself. */
static int ddp_export(dt_strategy *s, const dt_state_writer *w) {
  ddp_impl *d = s->impl;
  if (d && d->up) dt_shupd_state_out(d->up, s->optim);
  return dt__strategy_export_optim(s, w);
}

static int ddp_import(dt_strategy *s, const dt_state_reader *r) {
  ddp_impl *d = s->impl;
  DT_CHECK(dt__strategy_import_optim(s, r));
  if (d && d->up && s->rank == 0) dt_shupd_state_in(d->up, s->optim);
  return DT_OK;
}

static void ddp_teardown(dt_strategy *s) {
  ddp_impl *d = s->impl;
  if (d) {
    dt_shupd_destroy(d->up, s->model, s->optim); /* the model's own copy back */
    dt_ddp_destroy(d->ddp);
    dt__ddp_balance_destroy(s, d->bal);
  }
  free(d);
  s->impl = s->grad_ud = NULL;
}

const struct dt_strategy_ops dt__strategy_ddp = {
    .name = "ddp",
    .fixed_point = 0,
    .open_source = ddp_source,
    .setup = ddp_setup,
    .step_begin = ddp_step_begin,
    .backward_begin = NULL,
    .grad_ready = dt_ddp_grad_ready,
    .step_finish = ddp_step_finish,
    .eval_begin = dt__ddp_eval_begin,
    .eval_reduce = dt__ddp_eval_reduce,
    .epoch_end = ddp_epoch_end,
    .state_export = ddp_export,
    .state_import = ddp_import,
    .rank_state_save = ddp_rank_save,
    .rank_state_load = ddp_rank_load,
    .membership_change = ddp_membership,
    .run_end = ddp_run_end,
    .teardown = ddp_teardown,
};

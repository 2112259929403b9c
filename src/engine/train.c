/*
 * train.c — the training loop, one for every strategy. Read it top to
 * bottom: the run starts (records opened on rank 0, the strategy's
 * start-up checks), then epochs of steps — the batch source plans this
 * worker's pieces of the global batch, each piece goes forward and backward
 * (the strategy sees every gradient span as it is ready), the strategy
 * finishes the step (reduce, then optimizer), the loss and gradient are
 * checked — then each epoch's numbers are combined over workers,
 * evaluated when due and recorded, and the run ends with the summary.
 *
 * What differs between one worker, data parallelism and deterministic data
 * parallelism lives behind the strategy table (strategy.h) and the batch
 * source (batch_source.h); this file never asks which one it has. Files are
 * written by records.c, only on rank 0.
 *
 * Timing: train_seconds counts only the steps (waiting for a batch, forward,
 * backward, reduction, update); evaluation, loading from disk and writing
 * files are excluded. It does not print; callers get hooks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"

/* ---- guards ----------------------------------------------------------------------- */

/* A loss as text: "NaN" / "inf" rather than the C library's "-nan". */
/* This process's CPU time so far (every thread), for the summary's
 * per-worker cpu_seconds: read twice a run, never per step. */
static double cpu_seconds(void) {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u) < 0) return 0;
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/* This process's peak resident memory in bytes (Linux: ru_maxrss in KiB). */
static double peak_rss(void) {
  struct rusage u;
  return getrusage(RUSAGE_SELF, &u) < 0 ? 0 : (double)u.ru_maxrss * 1024.0;
}

static const char *num(double v, char *buf, size_t cap) {
  if (isnan(v)) return "NaN";
  if (isinf(v)) return v > 0 ? "inf" : "-inf";
  snprintf(buf, cap, "%.4g", v);
  return buf;
}

/* Only on the failure path: which layer holds the first non-finite
 * gradient value or, when every value is finite and only the sum of squares
 * overflowed, the largest one. */
static void bad_layer(const dt_model *m, const float *g, char *buf, size_t cap) {
  int worst = -1;
  size_t worst_i = 0;
  float big = 0;
  char b[32];
  for (int l = 0; l < dt_model_nlayers(m); l++) {
    const dt_layer_info *li = dt_model_layer(m, l);
    for (size_t i = 0; i < li->nparams; i++) {
      float v = g[li->param_off + i];
      if (!isfinite(v)) {
        snprintf(buf, cap, "first in layer %d '%s', parameter %zu: %s", l + 1, li->name, i,
                 num(v, b, sizeof b));
        return;
      }
      if (fabsf(v) > big) big = fabsf(v), worst = l, worst_i = i;
    }
  }
  if (worst < 0) {
    snprintf(buf, cap, "the sum of squares overflows");
    return;
  }
  snprintf(buf, cap, "the sum of squares overflows; largest |gradient| %s in layer %d '%s', "
           "parameter %zu", num(big, b, sizeof b), worst + 1, dt_model_layer(m, worst)->name,
           worst_i);
}

/* A step's checks: the loss this worker saw and the reduced gradient
 * (the same on every rank, so every rank stops at the same step). */
static int check_step(dt_engine *e, int epoch, double loss) {
  const int64_t step = e->strat.step;
  char b[32], where[160], who[32] = "";
  if (e->comm) snprintf(who, sizeof who, "rank %d: ", e->rank);
  if (!isfinite(loss))
    return dt__seterr(DT_ERANGE, "%straining diverged at epoch %d step %lld (loss %s); try a "
                      "smaller optim.lr", who, epoch, (long long)step, num(loss, b, sizeof b));
  /* The optimizer saw every (reduced) gradient value while updating and
   * kept the largest: n * max^2 bounds the squared norm, so this fails when
   * a value is not finite or the norm may overflow float. */
  const double big = (double)dt__optim_grad_maxabs(e->optim);
  if (big * sqrt((double)dt_model_nparams(e->model)) <= 0x1p64) return DT_OK;
  const float *g = dt_model_grads(e->model);
  bad_layer(e->model, g, where, sizeof where);
  return dt__seterr(DT_ERANGE, "%straining diverged at epoch %d step %lld: the gradient norm is "
                    "not finite (%s); try a smaller optim.lr", who, epoch, (long long)step, where);
}

/* An epoch's loss that grew by orders of magnitude is divergence too
 * (docs/config.md, [train]): above DT_LOSS_ABS, or above DT_LOSS_GROWTH
 * times the first epoch's. The epoch loss is combined over workers, so every
 * rank reaches the same verdict. */
#define DT_LOSS_ABS 1e6
#define DT_LOSS_GROWTH 1e3
static int check_epoch(int epoch, double loss, double first) {
  char b[32], f[32];
  if (!(loss <= DT_LOSS_ABS))
    return dt__seterr(DT_ERANGE, "training diverged: epoch %d train loss %s exceeds %g; try a "
                      "smaller optim.lr", epoch, num(loss, b, sizeof b), DT_LOSS_ABS);
  if (epoch > 1 && first > 0 && loss > DT_LOSS_GROWTH * first)
    return dt__seterr(DT_ERANGE, "training diverged: epoch %d train loss %s is more than %g "
                      "times epoch 1's (%s); try a smaller optim.lr", epoch,
                      num(loss, b, sizeof b), DT_LOSS_GROWTH, num(first, f, sizeof f));
  return DT_OK;
}

/* ---- evaluation ------------------------------------------------------------------- */

/* Mean loss and accuracy on the test set, every worker's part summed
 * through the strategy (a collective with a communicator). */
static int evaluate(dt_engine *e, double *loss, double *accuracy) {
  dt_strategy *S = &e->strat;
  const int B = e->cfg.batch;
  const int64_t n = e->test.n;
  int64_t lo = 0, hi = 0;
  dt_tally t = {.fixed = S->ops->fixed_point};
  int own = S->ops->evaluate ? S->ops->evaluate(S, &e->test, B, &t) : 1;
  if (own < 0) return own;
  if (own == 1 && S->params_lazy) {
    /* before the strategy initialised its part (dt_engine_evaluate first) */
    if (S->params_load)
      DT_CHECK(S->params_load(S->params_load_ud, e->model, 0, dt_model_nlayers(e->model)));
    else
      DT_CHECK(dt_model_init(e->model, e->cfg.seed));
    S->params_lazy = 0;
  }
  if (own == 1) DT_CHECK(S->ops->eval_begin(S, n, B, &lo, &hi));
  dt_step_ctx ctx = {0, e->cfg.seed, 0, 0};
  for (int64_t i = lo; own == 1 && i < hi; i += B) {
    int m = (int)(hi - i < B ? hi - i : B);
    ctx.sample0 = i;
    DT_CHECK(dt_model_forward(e->model, e->test.x + i * e->test.dim, m, &ctx));
    int nc = 0;
    float l = 0.0f;
    DT_CHECK(dt_model_loss(e->model, e->test.y + i, m, &l, &nc));
    dt__tally_add(&t, l, m, nc, (n + B - 1) / B);
  }
  if (own == 1) DT_CHECK(S->ops->eval_reduce(S, &t));
  /* a non-finite test loss is reported as such, not as a wrapped integer */
  *loss = t.fixed && t.bad ? NAN : dt__tally_sum(&t) / (double)n;
  *accuracy = (double)t.correct / (double)n;
  return DT_OK;
}

void dt__engine_lend(dt_engine *e) {
  dt_strategy *S = &e->strat;
  S->model = e->model;
  S->optim = e->optim;
  S->comm = e->comm;
  S->rank = e->rank;
  S->nranks = e->nranks;
  S->cfg = &e->cfg;
  S->steps_per_epoch = e->steps_per_epoch;
  S->train_n = e->train.n;
  S->test_n = e->test.n;
  S->source = e->source;
  S->sched = &e->sched;
  S->job_comm = e->job_comm;
}

int dt_engine_evaluate(dt_engine *e, double *loss, double *accuracy) {
  if (!e || !loss || !accuracy)
    return dt__seterr(DT_EINVAL, "dt_engine_evaluate: %s is NULL",
                      !e ? "engine" : !loss ? "loss" : "accuracy");
  dt__engine_lend(e);
  return evaluate(e, loss, accuracy);
}

/* ---- the loop --------------------------------------------------------------------- */

/* The end of epoch r->epoch (train fields filled in): the evaluation when it
 * is due, the events.jsonl record and the hook. */
static int end_epoch(dt_engine *e, dt_epoch_report *r, double t_start, dt_records *rec,
                     const dt_engine_hooks *hooks, double *test_loss, double *test_acc) {
  const dt_run_cfg *c = &e->cfg;
  if (r->epoch % c->eval_every == 0 || r->epoch == c->epochs) {
    int64_t n0 = dt_obs_tracing(e->obs.o) ? dt_now_ns() : 0;
    DT_CHECK(evaluate(e, test_loss, test_acc));
    if (n0) dt_obs_span(e->obs.o, "evaluate", 0, n0, dt_now_ns(), r->epoch);
    r->evaluated = 1;
    r->test_loss = *test_loss;
    r->test_accuracy = *test_acc;
  }
  r->time = dt_now() - t_start;
  dt__eobs_epoch(e, r);
  DT_CHECK(dt__records_event(rec, r));
  if (hooks->on_epoch && (!e->elastic || e->rank == 0)) hooks->on_epoch(hooks->ud, r);
  return DT_OK;
}

/* The end of an epoch: the train tally combined over workers (in place),
 * the divergence check, evaluation when due, the record. */
static int end_of_epoch(dt_engine *e, int epoch, dt_tally *ep, double *first_loss, float lr,
                        double t_start, dt_records *rec, const dt_engine_hooks *hooks,
                        double *test_loss, double *test_acc) {
  dt_strategy *S = &e->strat;
  DT_CHECK(S->ops->epoch_end(S, epoch, ep));
  dt_epoch_report r;
  memset(&r, 0, sizeof r);
  r.epoch = epoch;
  r.step = S->step;
  r.train_loss = dt__tally_mean(ep);
  r.train_accuracy = ep->samples ? (double)ep->correct / (double)ep->samples : 0;
  r.samples_per_second = ep->seconds > 0 ? (double)ep->samples / ep->seconds : 0;
  r.lr = lr;
  if (epoch == 1) *first_loss = r.train_loss;
  DT_CHECK(check_epoch(epoch, r.train_loss, *first_loss));
  if (e->elastic) dt__elastic_fault(e, DT_FAULT_EVAL);
  return end_epoch(e, &r, t_start, rec, hooks, test_loss, test_acc);
}

/* Elastic training: re-form (elastic_run.c); a worker that became rank 0
 * takes over the run's records. */
static int recover(dt_engine *e, int in_step, int *epoch, int64_t *k, const char *out_dir,
                   dt_records *rec) {
  DT_CHECK(dt__elastic_recover(e, in_step, epoch, k));
  if (e->rank == 0 && out_dir && !rec->open) return dt__records_append(rec, out_dir);
  return DT_OK;
}

/* Adds this worker's name to a failure during the steps. */
static int step_err(dt_engine *e, int rc, int epoch) {
  if (e->comm)
    return dt__preerr(rc, "rank %d: epoch %d step %lld", e->rank, epoch,
                      (long long)e->strat.step + 1);
  return dt__preerr(rc, "epoch %d step %lld", epoch, (long long)e->strat.step + 1);
}

/* Start-of-run notes that are not errors (rank 0 only, once). */
static void warn_settings(const dt_engine *e) {
  const int64_t total = e->sched.total_steps, warm = e->sched.warmup_steps;
  if (warm > total)
    DT_LOG_WARN("schedule.warmup_steps = %lld is longer than the whole run (%lld steps): the "
                "learning rate peaks at %.3g, %.0f%% of its base %.3g", (long long)warm,
                (long long)total, (double)dt_sched_lr(&e->sched, total - 1),
                100.0 * (double)total / (double)warm, (double)e->sched.base_lr);
}

/* Rank 0 owns out_dir for the run: the claim made by dt_engine_set_out_dir,
 * or one made now, then the records. */
static int open_records(dt_engine *e, const char *out_dir, const char *config_text,
                        dt_records *rec) {
  if (e->out_fd < 0 || strcmp(e->out_dir, out_dir)) {
    int fd;
    DT_CHECK(dt__outdir_claim(out_dir, &fd));
    if (e->out_fd >= 0) close(e->out_fd);
    e->out_fd = fd;
    snprintf(e->out_dir, sizeof e->out_dir, "%s", out_dir);
  }
  DT_CHECK(dt__records_open(rec, out_dir, config_text));
  rec->strat = &e->strat;
  return DT_OK;
}

int dt_engine_run(dt_engine *e, const char *out_dir, const char *config_text,
                  const dt_engine_hooks *hooks, dt_run_summary *sum) {
  if (!e) return dt__seterr(DT_EINVAL, "dt_engine_run: engine is NULL");
  if (e->ran)
    return dt__seterr(DT_EINVAL, "dt_engine_run: engine already ran (create a new engine for "
                      "another run)");
  e->ran = 1;
  const dt_run_cfg *c = &e->cfg;
  dt_engine_hooks none = {NULL, NULL, NULL};
  if (!hooks) hooks = &none;
  dt_strategy *S = &e->strat;
  dt_batch_source *src = e->source;
  dt_records rec = {0};
  dt_run_summary s;
  memset(&s, 0, sizeof s);
  s.rank = e->rank;
  const char *ctext = config_text ? config_text : "";
  uint8_t csha[32];
  dt_sha256(ctext, strlen(ctext), csha);
  dt_hex(csha, 32, s.config_sha256);
  dt__engine_lend(e);
  S->config_sha = csha;
  dt_worker_stats *all = NULL;
  int rc = DT_OK;

  int epoch = 0;
  /* this rank's metrics and flight recorder (observe.c), before any collective */
  DT_CHECK_GOTO(dt__eobs_open(e, out_dir), rc, done);

  /* Start: rank 0 owns the records; every rank runs the strategy's checks. */
  if (e->rank == 0 && out_dir) DT_CHECK_GOTO(open_records(e, out_dir, config_text, &rec), rc, done);
  if (e->rank == 0) warn_settings(e);
  DT_CHECK_GOTO(S->ops->setup(S), rc, done);
  DT_CHECK_GOTO(src->ops->bind(src, e->rank, e->nranks), rc, done);
  DT_CHECK_GOTO(dt__eobs_trace_start(e), rc, done);
  dt_obs *ob = e->obs.o;
  /* checkpoints: the writer, and where a resumed run starts (ckpt_run.c) */
  dt_ckpt_pos start;
  DT_CHECK_GOTO(dt__ckpt_start(e, out_dir, &start), rc, done);

  double t_start = dt_now(), cpu_start = cpu_seconds(), train_seconds = 0, test_loss = start.test_loss,
         test_acc = start.test_acc, first_loss = start.first_loss;
  int64_t samples_total = 0, global_total = 0;
  float lr = 0;
  dt_progress p = {0};
  p.epochs = c->epochs;
  p.steps_per_epoch = e->steps_per_epoch;
  /* Elastic training (elastic_run.c): a failed collective re-forms the
   * group and the loop goes on at the agreed position (resume:). */
  if (e->elastic) DT_CHECK_GOTO(dt__elastic_begin(e, &start), rc, done);
  int64_t k0 = 0;
  dt_tally ep;
  for (epoch = start.epoch; epoch <= c->epochs; epoch++) {
    k0 = epoch == start.epoch ? start.k : 0;
    ep = (dt_tally){.fixed = S->ops->fixed_point};
    if (k0) ep = start.ep;
  resume:
    DT_CHECK_GOTO(src->ops->epoch_begin(src, epoch), rc, done);
    for (int64_t k = k0; k < e->steps_per_epoch; k++) {
      double t0 = dt_now();
      /* spans only when tracing: four clock reads per piece */
      const int tr = dt_obs_tracing(ob);
      const int64_t s0 = tr ? dt_now_ns() : 0;
      int64_t n0 = s0, n1;
      dt_tally st = {.fixed = S->ops->fixed_point};
      dt_step_plan plan;
      int64_t *vlo = &e->vis_lo, *vhi = &e->vis_hi; /* this worker's positions in the step */
      *vlo = *vhi = -1;
      lr = dt_sched_lr(&e->sched, S->step);
      if (e->elastic) dt__elastic_step_begin(e);
      DT_CHECK_GOTO(src->ops->plan(src, k, &plan), rc, step_failed);
      if (e->elastic) { /* the global batch, for the visit record of a recovery */
        e->plan_ep = epoch;
        e->plan_lo = plan.start;
        e->plan_hi = plan.start + plan.n_global;
      }
      dt__ckpt_before_step(e);
      DT_CHECK_GOTO(S->ops->step_begin(S, &plan), rc, step_failed);
      if (S->ops->run_pieces) DT_CHECK_GOTO(S->ops->run_pieces(S, src, &plan, &st), rc, step_failed);
      for (int i = 0; !S->ops->run_pieces && i < plan.pieces; i++) {
        dt_batch b;
        DT_CHECK_GOTO(src->ops->piece(src, i, &b), rc, step_failed);
        if (b.n == 0) break; /* the source ended the step's pieces (a work queue ran dry) */
        if (tr) n1 = dt_now_ns(), dt_obs_span(ob, "data", 0, n0, n1, -1), n0 = n1;
        if (e->elastic) dt__elastic_fault(e, DT_FAULT_FORWARD);
        /* dropout masks are keyed by (seed, step, global position) */
        dt_step_ctx ctx = {1, c->seed, (uint64_t)S->step, b.sample0};
        if (S->ops->forward_begin)
          DT_CHECK_GOTO(S->ops->forward_begin(S, &b, i, plan.pieces), rc, step_failed);
        DT_CHECK_GOTO(dt_model_forward(e->model, b.x, b.n, &ctx), rc, step_failed);
        if (tr) n1 = dt_now_ns(), dt_obs_span(ob, "forward", 0, n0, n1, b.n), n0 = n1;
        /* a piece whose backup copy finished first elsewhere (stealing) is
         * not this worker's: no backward, no loss */
        if (S->ops->backward_begin && S->ops->backward_begin(S, &b, i, plan.pieces)) continue;
        if (e->elastic) dt__elastic_fault(e, DT_FAULT_BACKWARD);
        int nc = 0;
        float loss = 0.0f;
        DT_CHECK_GOTO(dt_model_backward(e->model, b.y, b.n, &loss, &nc, S->ops->grad_ready,
                                        S->grad_ud), rc, step_failed);
        if (tr) n1 = dt_now_ns(), dt_obs_span(ob, "backward", 0, n0, n1, b.n), n0 = n1;
        if (S->ops->piece_done && !S->ops->piece_done(S)) continue;
        dt__tally_add(&st, loss, b.n, nc, plan.terms);
        if (*vlo < 0) *vlo = b.sample0;
        *vhi = b.sample0 + b.n;
      }
      if (e->elastic) dt__elastic_fault(e, DT_FAULT_ALLREDUCE);
      rc = S->ops->step_finish(S, lr);
      if (rc < 0) {
      step_failed:
        if (!dt__elastic_recoverable(e, rc)) {
          step_err(e, rc, epoch);
          goto done;
        }
        DT_CHECK_GOTO(recover(e, 1, &epoch, &k0, out_dir, &rec), rc, done);
        if (epoch > c->epochs) goto finished;
        ep = (dt_tally){.fixed = S->ops->fixed_point}; /* redone steps are counted anew */
        goto resume;
      }
      if (e->elastic) dt__elastic_fault(e, DT_FAULT_REDUCED);
      if (tr) {
        n1 = dt_now_ns();
        dt_obs_span(ob, "reduce+update", 0, n0, n1, -1);
        dt_obs_span(ob, "step", 0, s0, n1, S->step);
      }
      if (e->elastic) dt__elastic_visit(e, epoch, *vlo, *vhi), dt__elastic_step_done(e);
      DT_CHECK_GOTO(check_step(e, epoch, plan.pieces ? dt__tally_mean(&st) : 0), rc, done);
      ep.loss += st.loss;
      ep.loss_q += st.loss_q;
      ep.samples += st.samples;
      ep.correct += st.correct;
      ep.global += plan.n_global;
      /* a checkpoint due now: its snapshot (and any wait for the writer)
       * holds up training, so it counts in the step's time */
      dt_ckpt_pos cp = {epoch, k + 1, ep, first_loss, test_loss, test_acc};
      DT_CHECK_GOTO(dt__ckpt_after_step(e, &cp), rc, done);
      const double step_s = dt_now() - t0;
      ep.seconds += step_s;
      dt__eobs_step(e, step_s, st.samples, dt__tally_mean(&ep), lr,
                    ep.seconds > 0 ? (double)ep.global / ep.seconds : 0);
      if (hooks->on_step && (!e->elastic || e->rank == 0)) {
        p.epoch = epoch;
        p.step_in_epoch = k + 1;
        p.step = S->step;
        p.loss = dt__tally_mean(&ep);
        /* global samples/s, as seen from this worker's clock */
        p.samples_per_second = ep.seconds > 0 ? (double)ep.global / ep.seconds : 0;
        p.lr = lr;
        hooks->on_step(hooks->ud, &p);
      }
    }
    /* the epoch over all workers; its time is the slowest worker's */
    dt_tally mine = ep;
    rc = end_of_epoch(e, epoch, &ep, &first_loss, lr, t_start, &rec, hooks, &test_loss,
                      &test_acc);
    if (rc < 0) {
      if (!dt__elastic_recoverable(e, rc) || rc == DT_ERANGE) goto done;
      ep = mine;
      int was = epoch;
      DT_CHECK_GOTO(recover(e, 0, &epoch, &k0, out_dir, &rec), rc, done);
      if (epoch > c->epochs) goto finished;
      if (epoch != was) ep = (dt_tally){.fixed = S->ops->fixed_point};
      goto resume;
    }
    if (e->elastic) dt__elastic_epoch_done(e);
    train_seconds += mine.seconds;
    samples_total += mine.samples;
    global_total += mine.global;
    dt_ckpt_pos cp = {epoch + 1, 0, {.fixed = S->ops->fixed_point}, first_loss, test_loss,
                      test_acc};
    DT_CHECK_GOTO(dt__ckpt_epoch_end(e, &cp), rc, done);
  }

finished:
  /* End: the strategy's checks and numbers, then the summary. */
  free(all);
  all = calloc((size_t)e->nranks, sizeof *all);
  if (!all) {
    rc = dt__seterr(DT_ENOMEM, "summary: out of memory");
    goto done;
  }
  s.self.samples = (double)samples_total;
  s.self.train_seconds = train_seconds;
  s.self.samples_per_second = train_seconds > 0 ? (double)samples_total / train_seconds : 0;
  s.self.cpu_seconds = cpu_seconds() - cpu_start;
  s.self.peak_rss_bytes = peak_rss();
  rc = S->ops->run_end(S, &s.self, all);
  if (rc < 0) {
    if (!dt__elastic_recoverable(e, rc)) goto done;
    DT_CHECK_GOTO(recover(e, 0, &epoch, &k0, out_dir, &rec), rc, done);
    if (epoch <= c->epochs) {
      ep = (dt_tally){.fixed = S->ops->fixed_point};
      goto resume;
    }
    goto finished;
  }
  double tmax = 0;
  for (int r = 0; r < e->nranks; r++)
    if (all[r].train_seconds > tmax) tmax = all[r].train_seconds;
  s.test_accuracy = test_acc;
  s.test_loss = test_loss;
  s.epochs = c->epochs;
  s.steps = S->step;
  s.train_samples = global_total;
  s.train_seconds = tmax;
  s.samples_per_second = tmax > 0 ? (double)global_total / tmax : 0;
  s.gflops = tmax > 0 ? dt_model_flops_per_sample(e->model, 1) * (double)global_total / tmax / 1e9
                      : 0;
  s.workers = e->nranks;
  s.rank = e->rank; /* elastic: rank 0 may have changed */
  s.params = dt_model_nparams(e->model);
  uint8_t psha[32];
  if (S->params_hashed) memcpy(psha, S->params_sha, 32);
  else dt__params_sha256(e->model, psha);
  dt_hex(psha, 32, s.params_sha256);
  dt__ckpt_finish(e); /* the last checkpoint on disk before the summary reports it */
  rc = dt__records_summary(&rec, e, &s, e->comm ? all : NULL, e->comm ? e->nranks : 0);
  if (rc == DT_OK && sum) *sum = s;
  goto done;
done:
  free(all);
  dt__ckpt_finish(e);
  if (e->elastic) dt__elastic_end(e);
  S->ops->teardown(S);
  dt__eobs_end(e, out_dir, rc, rc < 0 ? dt_errmsg() : NULL);
  if (rc < 0 && rec.open) {
    /* the failure, not a stale success: summary.json was removed at start */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dt_errmsg());
    if (dt__records_failure(&rec, e, rc, msg, epoch, S->step) < 0) {
      char why[256];
      snprintf(why, sizeof why, "%s", dt_errmsg());
      dt__seterr(rc, "%s (and the failure record could not be written: %s)", msg, why);
    } else {
      dt__seterr(rc, "%s", msg);
    }
  }
  dt__records_close(&rec);
  return rc;
}

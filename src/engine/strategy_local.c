/*
 * strategy_local.c — the "local" strategy: one worker, no communicator.
 * Batches come from the prefetching loader; a step's gradient is the batch
 * mean and goes straight into the optimizer. Nothing to check at start,
 * nothing to reduce. It does not accept a communicator of more than one rank
 * (the engine refuses that in dt_engine_set_comm).
 */
#include "core/core.h"
#include "engine/strategy.h"

static int local_source(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out) {
  return dt__source_loader(out, train, cfg->batch, cfg->seed, cfg->shuffle);
}

static int local_setup(dt_strategy *s) {
  if (s->nranks > 1)
    return dt__seterr(DT_EINVAL, "strategy 'local' trains one worker, not %d", s->nranks);
  return DT_OK;
}

static int local_step_begin(dt_strategy *s, const dt_step_plan *plan) {
  (void)s;
  (void)plan;
  return DT_OK;
}

static int local_step_finish(dt_strategy *s, float lr) {
  DT_CHECK(dt_optim_step(s->optim, dt_model_params(s->model), dt_model_grads(s->model), lr));
  s->step++;
  return DT_OK;
}

static int local_eval_begin(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi) {
  (void)s;
  (void)chunk;
  *lo = 0;
  *hi = n;
  return DT_OK;
}

static int local_eval_reduce(dt_strategy *s, dt_tally *t) {
  (void)s;
  (void)t;
  return DT_OK;
}

static int local_epoch_end(dt_strategy *s, int epoch, dt_tally *train) {
  (void)s;
  (void)epoch;
  (void)train;
  return DT_OK;
}

static int local_run_end(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all) {
  (void)s;
  me->compute_seconds = me->train_seconds;
  all[0] = *me;
  return DT_OK;
}

static void local_teardown(dt_strategy *s) { s->impl = NULL; }

const struct dt_strategy_ops dt__strategy_local = {
    .name = "local",
    .fixed_point = 0,
    .open_source = local_source,
    .setup = local_setup,
    .step_begin = local_step_begin,
    .backward_begin = NULL,
    .grad_ready = NULL,
    .step_finish = local_step_finish,
    .eval_begin = local_eval_begin,
    .eval_reduce = local_eval_reduce,
    .epoch_end = local_epoch_end,
    .state_export = dt__strategy_export_optim,
    .state_import = dt__strategy_import_optim,
    .membership_change = dt__strategy_no_membership,
    .run_end = local_run_end,
    .teardown = local_teardown,
};

/*
 * strategy.c — the table of strategies (strategy.h) and what they share:
 * loss/accuracy tallies (floating point, or fixed point for the
 * deterministic strategies), the optimizer-state export and import used by
 * checkpoints, and the "not yet" answer to membership changes. The
 * strategies themselves live one per file (strategy_<name>.c).
 */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "engine/strategy.h"
#include "parallel/fixsum.h"

static const struct dt_strategy_ops *const table[] = {
    &dt__strategy_local,
    &dt__strategy_ddp,
    &dt__strategy_ddp_det,
    &dt__strategy_pipeline,
    &dt__strategy_pipeline_det,
    &dt__strategy_ps,
    &dt__strategy_zero,
};

const struct dt_strategy_ops *dt__strategy_find(const char *name) {
  for (size_t i = 0; name && i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(table[i]->name, name)) return table[i];
  return NULL;
}

const char *dt__strategy_for(const dt_run_cfg *cfg) {
  if (cfg->ps.servers > 0 || cfg->ps.colocate) return "ps";
  if (cfg->pipeline_stages > 1 || cfg->micro_batches > 1 || cfg->recompute)
    return cfg->deterministic ? "pipeline_det" : "pipeline";
  if (cfg->zero && cfg->workers > 1) return "zero";
  if (cfg->deterministic) return "ddp_det";
  return cfg->workers > 1 ? "ddp" : "local";
}

/* ---- tallies ---------------------------------------------------------------- */

void dt__tally_add(dt_tally *t, float loss, int n, int correct, int64_t terms) {
  t->samples += n;
  t->correct += correct;
  if (!t->fixed) {
    t->loss += (double)loss * n;
    return;
  }
  /* loss x n in fixed point, one of at most `terms` terms: bounded so that
   * the int64 sum cannot overflow; a larger or non-finite loss adds 0 */
  int64_t q = 0;
  if (dt_fix_add(&q, &loss, 1, (double)n, dt_fix_bound(terms), 1, NULL)) t->bad = 1;
  t->loss_q += q;
}

double dt__tally_sum(const dt_tally *t) {
  return t->fixed ? ldexp((double)t->loss_q, -DT_FIX_BITS) : t->loss;
}

double dt__tally_mean(const dt_tally *t) {
  if (t->fixed && t->bad) return NAN;
  if (!t->samples) return 0;
  return dt__tally_sum(t) / (double)t->samples;
}

/* ---- state for checkpoints -------------------------------------------------- */

int dt__strategy_export_optim(dt_strategy *s, const dt_state_writer *w) {
  size_t n = dt_optim_state_floats(s->optim);
  DT_CHECK(w->put(w->ud, "optim", dt_optim_state(s->optim), n * sizeof(float)));
  DT_CHECK(w->put(w->ud, "optim_step", dt_optim_step_count(s->optim), sizeof(int64_t)));
  return w->put(w->ud, "step", &s->step, sizeof s->step);
}

static int get_exact(const dt_state_reader *r, const char *name, void *buf, size_t want) {
  size_t len = 0;
  DT_CHECK(r->get(r->ud, name, buf, want, &len));
  if (len != want)
    return dt__seterr(DT_ECORRUPT, "strategy state '%s': %zu bytes, expected %zu", name, len,
                      want);
  return DT_OK;
}

int dt__strategy_import_optim(dt_strategy *s, const dt_state_reader *r) {
  size_t n = dt_optim_state_floats(s->optim);
  int64_t step = 0, ostep = 0;
  /* read everything before changing anything: a bad blob leaves the state */
  DT_CHECK(get_exact(r, "optim_step", &ostep, sizeof ostep));
  DT_CHECK(get_exact(r, "step", &step, sizeof step));
  if (step < 0 || ostep < 0)
    return dt__seterr(DT_ECORRUPT, "strategy state: negative step count (%lld, %lld)",
                      (long long)step, (long long)ostep);
  DT_CHECK(get_exact(r, "optim", dt_optim_state(s->optim), n * sizeof(float)));
  *dt_optim_step_count(s->optim) = ostep;
  s->step = step;
  return DT_OK;
}

int dt__strategy_no_membership(dt_strategy *s, const dt_membership *m) {
  (void)m;
  return dt__seterr(DT_ENOTSUP, "strategy '%s': membership changes (elastic training) are not "
                    "supported yet", s->ops->name);
}

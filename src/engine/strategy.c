/*
 * strategy.c — the table of strategies (strategy.h) and what they share:
 * loss/accuracy tallies (floating point, or fixed point for the
 * deterministic strategies), the optimizer-state export and import used by
 * checkpoints, and the "not yet" answer to membership changes. The
 * strategies themselves live one per file (strategy_<name>.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
  const size_t np = dt_model_nparams(s->model);
  if (n) DT_CHECK(dt__import_optim_span(r, np, n / np, 0, np, dt_optim_state(s->optim)));
  *dt_optim_step_count(s->optim) = ostep;
  s->step = step;
  return DT_OK;
}

#define MAX_STAGES 4096

int dt__import_optim_span(const dt_state_reader *r, size_t total, size_t slots, size_t off,
                          size_t n, float *dst) {
  if (!slots || !n) return DT_OK;
  int32_t P = 0;
  size_t len = 0;
  int rc = r->get(r->ud, "pipe.stages", &P, sizeof P, &len);
  if (rc == DT_ENOENT) {
    /* the whole model's state in one blob (local, ddp, ddp_det) */
    if (r->get_part) {
      /* only [off, off + n) of each slot is read (a ZeRO-1 rank's block) */
      for (size_t k = 0; k < slots; k++) {
        size_t tot = 0;
        DT_CHECK(r->get_part(r->ud, NULL, "optim", (uint64_t)(k * total + off) * sizeof(float),
                             dst + k * n, n * sizeof(float), &tot));
        if (tot != slots * total * sizeof(float))
          return dt__seterr(DT_ECORRUPT, "strategy state 'optim': %zu bytes, expected %zu",
                            tot, slots * total * sizeof(float));
      }
      return DT_OK;
    }
    if (n == total && !off) return get_exact(r, "optim", dst, slots * n * sizeof(float));
    float *all = dt_alloc(slots * total * sizeof(float));
    if (!all) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory for the optimizer state");
    rc = get_exact(r, "optim", all, slots * total * sizeof(float));
    for (size_t k = 0; rc == DT_OK && k < slots; k++)
      memcpy(dst + k * n, all + k * total + off, n * sizeof(float));
    dt_free(all);
    return rc;
  }
  DT_CHECK(rc);
  if (len != sizeof P || P < 1 || P > MAX_STAGES)
    return dt__seterr(DT_ECORRUPT, "strategy state 'pipe.stages': not a stage count");
  if (!r->get_file)
    return dt__seterr(DT_ENOTSUP, "a pipeline checkpoint's optimizer state is in its stages' "
                      "files, which this reader cannot open");
  int64_t *span = malloc(2 * (size_t)P * sizeof *span);
  if (!span) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
  rc = get_exact(r, "pipe.spans", span, 2 * (size_t)P * sizeof *span);
  /* the stages' spans tile the whole model in order */
  int64_t at = 0;
  for (int t = 0; rc == DT_OK && t < P; t++) {
    if (span[2 * t] != at || span[2 * t + 1] < 0 || (size_t)(span[2 * t] + span[2 * t + 1]) > total)
      rc = dt__seterr(DT_ECORRUPT, "strategy state 'pipe.spans': stage %d's span [%lld, +%lld) "
                      "does not follow the previous one in a model of %zu parameters", t,
                      (long long)span[2 * t], (long long)span[2 * t + 1], total);
    at = span[2 * t] + span[2 * t + 1];
    if (rc == DT_OK && t == P - 1 && (size_t)at != total)
      rc = dt__seterr(DT_ECORRUPT, "strategy state 'pipe.spans': the stages hold %lld of the "
                      "model's %zu parameters", (long long)at, total);
  }
  float *buf = NULL;
  for (int t = 0; rc == DT_OK && t < P; t++) {
    const size_t o = (size_t)span[2 * t], m = (size_t)span[2 * t + 1];
    const size_t lo = o > off ? o : off, hi = o + m < off + n ? o + m : off + n;
    if (lo >= hi) continue; /* stage t holds none of [off, off + n) */
    char file[64];
    snprintf(file, sizeof file, "stage-%d.safetensors", t);
    if (r->get_part) {
      /* only the overlap, slot by slot, where it lies in the stage's file */
      for (size_t k = 0; rc == DT_OK && k < slots; k++) {
        size_t tot = 0;
        rc = r->get_part(r->ud, file, "optim", (uint64_t)(k * m + (lo - o)) * sizeof(float),
                         dst + k * n + (lo - off), (hi - lo) * sizeof(float), &tot);
        if (rc == DT_OK && tot != slots * m * sizeof(float))
          rc = dt__seterr(DT_ECORRUPT, "%s: 'optim' holds %zu bytes, stage %d's %zu parameters "
                          "need %zu (another optimizer?)", file, tot, t, m, slots * m * sizeof(float));
      }
      continue;
    }
    dt_free(buf);
    buf = dt_alloc(slots * m * sizeof(float));
    if (!buf) {
      rc = dt__seterr(DT_ENOMEM, "checkpoint: out of memory for %s", file);
      break;
    }
    rc = r->get_file(r->ud, file, "optim", buf, slots * m * sizeof(float), &len);
    if (rc == DT_OK && len != slots * m * sizeof(float))
      rc = dt__seterr(DT_ECORRUPT, "%s: 'optim' holds %zu bytes, stage %d's %zu parameters "
                      "need %zu (another optimizer?)", file, len, t, m, slots * m * sizeof(float));
    for (size_t k = 0; rc == DT_OK && k < slots; k++)
      memcpy(dst + k * n + (lo - off), buf + k * m + (lo - o), (hi - lo) * sizeof(float));
  }
  dt_free(buf);
  free(span);
  return rc;
}

int dt__strategy_no_membership(dt_strategy *s, const dt_membership *m) {
  (void)m;
  return dt__seterr(DT_ENOTSUP, "strategy '%s': membership changes (elastic training) are not "
                    "supported yet", s->ops->name);
}

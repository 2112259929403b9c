/*
 * elastic_run.c — what the training loop (train.c) does when membership
 * changes (docs/elastic.md): it maps the loop's progress to one position
 * (2 x steps taken, +1 once that epoch's end — statistics, evaluation,
 * record — is done), asks the elastic layer for the next generation,
 * lends the strategy the new communicator (membership_change copies the
 * most advanced member's parameters, buffers and optimizer state to
 * everyone), re-binds the batch source so the rest of the epoch's global
 * batches are split over the new members, and tells the loop where to go
 * on. Also the two test-only knobs of elastic training: a self-inflicted
 * SIGKILL at a named point (DTRAIN_TEST_KILL) and the per-sample visit
 * record (DTRAIN_TEST_VISITS).
 *
 * It does not decide membership (src/elastic does) or move state itself
 * (the strategy does); nothing here runs unless the engine was given a
 * dt_elastic.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "elastic/elastic.h"
#include "engine/engine_int.h"

int dt__engine_set_elastic(dt_engine *e, dt_elastic *el, int id) {
  if (!e || !el) return dt__seterr(DT_EINVAL, "dt__engine_set_elastic: %s is NULL",
                                   !e ? "engine" : "elastic");
  e->elastic = el;
  e->el_id = id;
  return DT_OK;
}

static const char *const phases[] = {"", "forward", "backward", "allreduce", "eval", NULL};

void dt__elastic_begin(dt_engine *e) {
  e->kill_phase = 0;
  e->visits = NULL;
  e->ended_at = -1;
  const char *k = dt_param_s(DT_PARAM_TEST_KILL);
  /* ID:STEP:PHASE[,ID:STEP:PHASE...]: the entry naming this member */
  for (; k && *k; k = strchr(k, ',') ? strchr(k, ',') + 1 : NULL) {
    int id = -1;
    long long step = -1;
    char ph[16] = "";
    if (sscanf(k, "%d:%lld:%15[a-z]", &id, &step, ph) == 3 && id == e->el_id)
      for (int i = 1; phases[i]; i++)
        if (!strcmp(ph, phases[i])) e->kill_phase = i, e->kill_step = step;
  }
  const char *v = dt_param_s(DT_PARAM_TEST_VISITS);
  if (v && *v) {
    char path[DT_CFG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/visits.%d", v, (int)getpid());
    e->visits = fopen(path, "a");
    if (!e->visits) DT_LOG_WARN("DTRAIN_TEST_VISITS: cannot open %s", path);
  }
  size_t nb = dt_model_nbufs(e->model);
  if (nb && !e->bufs_snap) e->bufs_snap = malloc(nb * sizeof(float));
}

void dt__elastic_end(dt_engine *e) {
  if (e->visits) fclose(e->visits);
  e->visits = NULL;
  free(e->bufs_snap);
  e->bufs_snap = NULL;
}

void dt__elastic_fault(const dt_engine *e, int phase) {
  if (phase == e->kill_phase && e->strat.step == e->kill_step) {
    fflush(NULL);
    raise(SIGKILL);
  }
}

void dt__elastic_step_begin(dt_engine *e) {
  if (e->bufs_snap)
    memcpy(e->bufs_snap, dt_model_bufs(e->model), dt_model_nbufs(e->model) * sizeof(float));
}

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dt__elastic_visit(dt_engine *e, int epoch, int64_t lo, int64_t hi) {
  if (e->el_failed_at > 0) {
    /* the first completed step of a new generation: what recovery cost */
    DT_LOG_INFO("elastic: member %d: first step of generation %d done at wall clock %.6f, "
                "%.3f s after this member saw the failure", e->el_id,
                dt_elastic_generation(e->elastic), wall(), dt_now() - e->el_failed_at);
    e->el_failed_at = 0;
  }
  if (!e->visits || hi <= lo) return;
  fprintf(e->visits, "%d %lld %lld\n", epoch, (long long)lo, (long long)hi);
  fflush(e->visits);
}

int dt__elastic_recoverable(const dt_engine *e, int rc) {
  return e->elastic && (rc == DT_EPEERLOST || rc == DT_ETIMEDOUT || rc == DT_EABORTED ||
                        rc == DT_EMISMATCH);
}

int64_t dt__elastic_pos(const dt_engine *e) {
  const int64_t s = e->strat.step;
  return 2 * s + (e->ended_at == s);
}

int dt__elastic_recover(dt_engine *e, int in_step, int *epoch, int64_t *k) {
  dt_strategy *S = &e->strat;
  char why[512];
  snprintf(why, sizeof why, "%s", dt_errmsg());
  /* an interrupted step may have moved the running statistics: put them back */
  if (in_step && e->bufs_snap)
    memcpy(dt_model_bufs(e->model), e->bufs_snap, dt_model_nbufs(e->model) * sizeof(float));
  double t0 = dt_now();
  if (!(e->el_failed_at > 0)) e->el_failed_at = t0;
  DT_LOG_INFO("elastic: member %d (rank %d) at step %lld: %s", e->el_id, e->rank,
              (long long)S->step, why);
  dt_elastic_gen g;
  int rc = dt_elastic_reform(e->elastic, dt__elastic_pos(e), &g);
  if (rc < 0) return dt__preerr(rc, "member %d after \"%s\"", e->el_id, why);
  e->comm = g.comm;
  e->rank = g.rank;
  e->nranks = g.size;
  dt__engine_lend(e);
  dt__eobs_membership(e, g.gen);
  dt_membership m = {g.comm, g.rank, g.size, g.source};
  rc = S->ops->membership_change(S, &m);
  if (rc == DT_OK) rc = e->source->ops->bind(e->source, g.rank, g.size);
  if (rc < 0) return dt__preerr(rc, "member %d: generation %d", e->el_id, g.gen);
  dt_elastic_release_old(e->elastic);
  e->ended_at = g.pos & 1 ? S->step : -1;
  /* where the agreed position is in the loop */
  const int64_t spe = e->steps_per_epoch, step = S->step;
  if ((g.pos & 1) || step == 0 || step % spe) {
    *epoch = (int)(step / spe) + 1;
    *k = step % spe;
  } else {
    *epoch = (int)(step / spe);
    *k = spe; /* that epoch's end is still to do */
  }
  e->recoveries++;
  DT_LOG_INFO("elastic: generation %d: %d workers, going on at epoch %d step %lld (%.3f s)",
              g.gen, g.size, *epoch, (long long)*k, dt_now() - t0);
  return DT_OK;
}

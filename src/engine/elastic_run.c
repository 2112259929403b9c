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
#include <dirent.h>
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

void dt__engine_el_fingerprint(dt_engine *e, const char *config_text, const void **fp,
                               size_t *len) {
  uint8_t sha[32];
  const char *t = config_text ? config_text : "";
  dt_sha256(t, strlen(t), sha);
  dt__engine_lend(e);
  dt__config_fingerprint(&e->cfg, e->train.n, e->test.n, dt_model_nparams(e->model), sha,
                         &e->el_fp);
  size_t n = sizeof e->el_fp + strlen(t);
  free(e->el_blob);
  e->el_blob = malloc(n + 1);
  if (!e->el_blob) n = sizeof e->el_fp; /* the fingerprint alone */
  else memcpy(e->el_blob, &e->el_fp, sizeof e->el_fp), memcpy(e->el_blob + sizeof e->el_fp, t, n - sizeof e->el_fp + 1);
  *fp = e->el_blob ? (const void *)e->el_blob : (const void *)&e->el_fp;
  *len = n;
}

/* Keys a joiner may hold differently: how the job was started. */
static int launch_key(const char *sec, const char *key) {
  return !strcmp(sec, "dist") && (!strcmp(key, "workers") || !strcmp(key, "standby") ||
                                  !strcmp(key, "replace") || !strcmp(key, "standby_refresh_steps"));
}

/* The first line of config text b that differs from a's, as "section.key"
 * with both values; 0 if none (launch keys skipped). */
static int text_diff(const char *a, size_t na, const char *b, size_t nb, char *out, size_t cap) {
  char sec[64] = "";
  const char *pa = a, *pb = b, *ea = a + na, *eb = b + nb;
  while (pa < ea || pb < eb) {
    const char *la = pa, *lb = pb;
    while (pa < ea && *pa != '\n') pa++;
    while (pb < eb && *pb != '\n') pb++;
    size_t ka = (size_t)(pa - la), kb = (size_t)(pb - lb);
    if (pa < ea) pa++;
    if (pb < eb) pb++;
    if (ka && la[0] == '[') snprintf(sec, sizeof sec, "%.*s", (int)(ka > 2 ? ka - 2 : 0), la + 1);
    if (ka == kb && !memcmp(la, lb, ka)) continue;
    const char *eq = memchr(la, '=', ka);
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)(eq && eq > la ? eq - la - 1 : (ptrdiff_t)ka), la);
    if (launch_key(sec, key)) continue;
    const char *ev = memchr(lb, '=', kb);
    snprintf(out, cap, "%s.%s = %.*s in the job, %.*s here", sec, key,
             (int)(eq ? ka - (size_t)(eq - la) - 2 : ka), eq ? eq + 2 : la,
             (int)(ev ? kb - (size_t)(ev - lb) - 2 : kb), ev ? ev + 2 : lb);
    return 1;
  }
  return 0;
}

int dt__engine_el_check_fp(void *ud, const void *job_fp, size_t len) {
  dt_engine *e = ud;
  if (len < sizeof e->el_fp)
    return dt__seterr(DT_EMISMATCH, "the job's config fingerprint has %zu bytes, this joiner's "
                      "%zu (another dtrain version)", len, sizeof e->el_fp);
  dt_ddp_fingerprint job, mine = e->el_fp;
  memcpy(&job, job_fp, sizeof job);
  /* how the job was started may differ; the text is compared below */
  mine.workers = job.workers;
  memcpy(mine.config_sha, job.config_sha, 32);
  char buf[256];
  const char *why = dt_ddp_fingerprint_diff(&job, &mine, "here", "in the job", buf,
                                            sizeof buf);
  if (!why && e->el_blob &&
      text_diff((const char *)job_fp + sizeof job, len - sizeof job, e->el_blob + sizeof job,
                strlen(e->el_blob + sizeof job) , buf, sizeof buf))
    why = buf;
  if (why)
    return dt__seterr(DT_EMISMATCH, "its config differs from the job's (%s); a joiner must run "
                      "the job's configuration", why);
  return DT_OK;
}

int dt__engine_set_joined(dt_engine *e, dt_elastic *el, const dt_elastic_gen *g) {
  if (!e || !el || !g || !g->comm)
    return dt__seterr(DT_EINVAL, "dt__engine_set_joined: %s is NULL",
                      !e ? "engine" : !el ? "elastic" : "generation");
  if (e->ran) return dt__seterr(DT_EINVAL, "dt__engine_set_joined: engine already ran");
  e->elastic = el;
  e->el_id = dt_elastic_id(el);
  e->comm = g->comm;
  e->rank = g->rank;
  e->nranks = g->size;
  e->el_join = 1;
  e->el_gen = g->gen;
  e->el_source = g->source;
  e->el_pos = g->pos;
  e->el_join_t = dt_now();
  e->el_partial = 1; /* no state of its own until the first copy arrives */
  e->strat.joining = 1;
  dt__engine_lend(e);
  return DT_OK;
}

static const char *const phases[] = {"",     "forward",  "backward", "allreduce", "eval",
                                     "ckpt", "lastsend", "reduced",  NULL};

/* Where position pos (dt__elastic_pos) is in the loop: epoch and step. */
static void where(const dt_engine *e, int64_t pos, int *epoch, int64_t *k) {
  const int64_t spe = e->steps_per_epoch, step = e->strat.step;
  if ((pos & 1) || step == 0 || step % spe) {
    *epoch = (int)(step / spe) + 1;
    *k = step % spe;
  } else {
    *epoch = (int)(step / spe);
    *k = spe; /* that epoch's end is still to do */
  }
}

/* A joiner's start: the source's state over the generation it was admitted
 * to (the members are in membership_change too), the batches re-split. */
static int adopt(dt_engine *e, const dt_elastic_gen *g);

static int join_start(dt_engine *e, dt_ckpt_pos *start) {
  dt_strategy *S = &e->strat;
  dt_elastic_gen g = {e->el_gen, e->comm, e->rank, e->nranks, e->el_source, e->el_pos};
  dt_tally z = {.fixed = S->ops->fixed_point};
  memset(start, 0, sizeof *start);
  start->ep = z;
  int rc = adopt(e, &g);
  if (rc < 0 && dt__elastic_recoverable(e, rc)) {
    /* a change while the state came: re-form with the members (this
     * joiner holds no state: it is never the source) */
    rc = dt__elastic_recover(e, 0, &start->epoch, &start->k);
    if (rc < 0) return rc;
  } else if (rc < 0) {
    return dt__preerr(rc, "joiner %d: generation %d", e->el_id, e->el_gen);
  } else {
    where(e, e->el_pos, &start->epoch, &start->k);
  }
  e->el_failed_at = e->el_join_t; /* the first step's log line says how long joining took */
  DT_LOG_INFO("elastic: joiner %d is rank %d of %d in generation %d; going on at epoch %d "
              "step %lld", e->el_id, e->rank, e->nranks, e->el_gen, start->epoch,
              (long long)start->k);
  return DT_OK;
}

int dt__elastic_begin(dt_engine *e, dt_ckpt_pos *start) {
  e->kill_phase = 0;
  e->visits = NULL;
  e->ended_at = -1;
  e->done_step = -1;
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
  return e->el_join ? join_start(e, start) : DT_OK;
}

void dt__elastic_end(dt_engine *e) {
  if (e->visits) fclose(e->visits);
  e->visits = NULL;
  free(e->bufs_snap);
  e->bufs_snap = NULL;
}

void dt__elastic_fault(const dt_engine *e, int phase) {
  /* "reduced" is checked once the step is counted */
  const int64_t at = e->kill_step + (phase == DT_FAULT_REDUCED);
  if (phase == e->kill_phase && e->strat.step == at) {
    fflush(NULL);
    raise(SIGKILL);
  }
}

/* DTRAIN_TEST_KILL ID:STEP:lastsend — the communicator calls this before
 * every collective send: the sends of step STEP-1 are counted, and in step
 * STEP the worker dies before the one with the same number, its last. The
 * peer waiting for that message cannot complete the step; the others can
 * (ring, halving-doubling: one of the two survivors of three), which is
 * how one survivor ends up a step ahead of another. */
static void lastsend_hook(void *ud) {
  dt_engine *e = ud;
  if (++e->t_sends != e->t_kill_at) return;
  DT_LOG_INFO("elastic: member %d: DTRAIN_TEST_KILL: SIGKILL before send %lld of step %lld, its "
              "last", e->el_id, (long long)e->t_sends, (long long)e->strat.step);
  fflush(NULL);
  raise(SIGKILL);
}

static void lastsend_arm(dt_engine *e) {
  const int64_t s = e->strat.step;
  if (s == e->kill_step - 1 || s == e->kill_step) {
    dt__comm_set_send_hook(e->comm, lastsend_hook, e);
    e->t_sends = 0;
    e->t_kill_at = s == e->kill_step ? e->t_per_step : 0;
  }
  if (s == e->kill_step && e->t_kill_at <= 0) {
    /* nothing counted: step STEP-1 sent nothing (a shared-memory window
     * reduces without messages), or STEP is the run's first step */
    DT_LOG_WARN("DTRAIN_TEST_KILL %d:%lld:lastsend: no collective send counted in step %lld; "
                "killed at the allreduce point instead", e->el_id, (long long)e->kill_step,
                (long long)s - 1);
    e->kill_phase = DT_FAULT_ALLREDUCE;
  }
}

void dt__elastic_step_begin(dt_engine *e) {
  if (e->bufs_snap)
    memcpy(e->bufs_snap, dt_model_bufs(e->model), dt_model_nbufs(e->model) * sizeof(float));
  if (e->kill_phase == DT_FAULT_LASTSEND) lastsend_arm(e);
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
  if (e->el_partial) return -1;
  const int64_t s = e->strat.step;
  return 2 * s + (e->ended_at == s);
}

void dt__elastic_step_done(dt_engine *e) {
  e->state_gen = dt_elastic_generation(e->elastic);
  e->done_step = e->strat.step;
  e->done_ep = e->plan_ep;
  e->done_lo = e->plan_lo;
  e->done_hi = e->plan_hi;
  if (e->kill_phase == DT_FAULT_LASTSEND && e->strat.step == e->kill_step)
    e->t_per_step = e->t_sends;
  const int k = e->cfg.standby_refresh_steps;
  if (e->sb && k > 0 && e->strat.step % k == 0) dt__standby_write(e, 1);
}

void dt__elastic_epoch_done(dt_engine *e) {
  e->ended_at = e->strat.step;
  e->state_gen = dt_elastic_generation(e->elastic);
}

/* Who already holds the source's state (docs/elastic.md "Standby copy").
 * Members whose state has the source's tag — the same position, changed
 * last in the same generation — hold its parameters and optimizer state
 * bit for bit (every member applies the same reduced gradient). A rank
 * that shares a node's standby copy with a member holding the source's
 * state gets it from there: that member brings the copy up to date in
 * place if it is behind, the rank reads it. *have = 1 when, after that,
 * every rank holds the source's state (only buffers and step counts are
 * broadcast then); 0: the whole state goes by broadcast. One allgather of
 * 4 numbers, and two one-number allreduces when the copy is written. */
static int admit(dt_engine *e, const dt_elastic_gen *g, int *have) {
  *have = 0;
  const int n = g->size, me = g->rank;
  int64_t mine[4] = {-1, -1, (int64_t)dt__standby_region(e), 0}, *all = NULL;
  int loaded = 0;
  if (e->el_partial || e->strat.joining) {
    /* a woken spare (or a member whose copy was interrupted): the node's
     * standby copy, if it is whole, with its tag */
    if (e->sb) loaded = dt__standby_load(e, &mine[0], &mine[1]);
    e->el_partial = 1; /* whatever it holds, until every rank agrees below */
  } else {
    mine[0] = dt__elastic_pos(e);
    mine[1] = e->state_gen;
  }
  if (!(all = malloc((size_t)n * 4 * sizeof *all)))
    return dt__seterr(DT_ENOMEM, "elastic: admission: out of memory");
  int rc = dt_comm_allgather(g->comm, mine, all, 4, DT_I64);
  if (rc < 0) goto out;
  const int64_t *src = all + 4 * g->source;
#define HOLDS(i) (all[4 * (i)] == src[0] && all[4 * (i) + 1] == src[1])
  int need = 0, unserved = 0, write = 0, via_copy = 0;
  for (int i = 0; i < n; i++) {
    if (HOLDS(i)) continue;
    need++;
    int w = -1; /* the lowest rank holding the state that shares i's copy */
    for (int j = 0; j < n && w < 0 && all[4 * i + 2]; j++)
      if (HOLDS(j) && all[4 * j + 2] == all[4 * i + 2]) w = j;
    if (w < 0) unserved++;
    else if (w == me) write = 1;
    if (i == me) via_copy = 1;
  }
  if (src[0] < 0 || unserved) goto out; /* by broadcast */
  if (need) {
    int64_t ok = 1;
    if (write) ok = dt__standby_write(e, 0) >= 0;
    rc = dt_comm_allreduce(g->comm, &ok, &ok, 1, DT_I64, DT_OP_MIN);
    if (rc < 0 || !ok) goto out;
    if (via_copy) {
      int64_t p = -1, gg = -1;
      ok = dt__standby_load(e, &p, &gg) && p == src[0] && gg == src[1];
      e->el_partial = !ok;
      loaded = ok;
    }
    rc = dt_comm_allreduce(g->comm, &ok, &ok, 1, DT_I64, DT_OP_MIN);
    if (rc < 0 || !ok) goto out;
  }
  *have = 1;
  if (loaded) e->el_partial = 0;
  if (loaded) {
    char d[192];
    dt__standby_describe(e, d, sizeof d);
    DT_LOG_INFO("elastic: member %d: state of step %lld taken from the standby copy (%s), "
                "no broadcast of parameters or optimizer state", e->el_id,
                (long long)e->strat.step, d);
  }
out:
#undef HOLDS
  if (rc == DT_OK && !*have && e->sb && (e->el_partial || e->strat.joining))
    DT_LOG_INFO("elastic: member %d: the standby copy cannot serve this admission; the state "
                "comes by broadcast", e->el_id);
  if (rc == DT_OK && n > 0) e->state_gen = all[4 * g->source + 1];
  free(all);
  return rc;
}

/* Trains over generation g from now: its communicator, the source's state
 * (membership_change, skipping what admit found every rank holds), the
 * batches re-split. */
static int adopt(dt_engine *e, const dt_elastic_gen *g) {
  dt_strategy *S = &e->strat;
  e->comm = g->comm;
  e->rank = g->rank;
  e->nranks = g->size;
  dt__engine_lend(e);
  dt__eobs_membership(e, g->gen);
  int have = 0;
  double ta = dt_now();
  int rc = admit(e, g, &have);
  double tb = dt_now();
  dt_membership m = {g->comm, g->rank, g->size, g->source, have};
  if (rc == DT_OK) rc = S->ops->membership_change(S, &m);
  DT_LOG_INFO("elastic: member %d: generation %d: state %s in %.3f s, membership change (state "
              "broadcast, gradient synchroniser) %.3f s", e->el_id, g->gen,
              have ? "held or from the standby copy" : "to come by broadcast", tb - ta,
              dt_now() - tb);
  S->joining = 0;
  if (rc < 0) {
    if (g->rank != g->source) e->el_partial = 1;
    return rc;
  }
  e->el_partial = 0;
  DT_CHECK(e->source->ops->bind(e->source, g->rank, g->size));
  dt_elastic_release_old(e->elastic);
  e->ended_at = g->pos & 1 ? S->step : -1;
  return DT_OK;
}

/* The visit record (DTRAIN_TEST_VISITS) of the step the agreed state
 * completed last, written by the source after every re-forming. Each
 * worker records its share of a step when its reduction completes; a
 * member lost inside that reduction may have sent its part (so the state
 * holds it) and never recorded it, and whether it did cannot be told
 * from here (it may also have completed the step and died in the next).
 * So the source reads every worker's record in the directory (the lost
 * members' files too) and records the positions of that step's global
 * batch nobody holds: each position once. The members' own records of
 * the step were written before they entered this generation's admission,
 * which the source has passed. Tests only. */
static void visits_complete(dt_engine *e) {
  const dt_strategy *S = &e->strat;
  const char *dir = dt_param_s(DT_PARAM_TEST_VISITS);
  const int64_t lo = e->done_lo, hi = e->done_hi;
  if (!dir || !*dir || e->done_step != S->step || S->step <= 0 || hi <= lo) return;
  uint8_t *seen = calloc((size_t)(hi - lo), 1);
  DIR *d = seen ? opendir(dir) : NULL;
  if (!d) {
    DT_LOG_WARN("DTRAIN_TEST_VISITS: cannot read %s: the record of step %lld may miss lost "
                "members' positions", dir, (long long)S->step);
    free(seen);
    return;
  }
  fflush(e->visits);
  for (struct dirent *de; (de = readdir(d));) {
    if (strncmp(de->d_name, "visits.", 7)) continue;
    char path[DT_CFG_PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    FILE *f = fopen(path, "r");
    int ep;
    long long a, b;
    while (f && fscanf(f, "%d %lld %lld", &ep, &a, &b) == 3)
      for (int64_t i = a > lo ? a : lo; ep == e->done_ep && i < b && i < hi; i++) seen[i - lo] = 1;
    if (f) fclose(f);
  }
  closedir(d);
  int64_t added = 0;
  for (int64_t i = lo; i < hi;) {
    if (seen[i - lo]) {
      i++;
      continue;
    }
    int64_t j = i;
    while (j < hi && !seen[j - lo]) j++;
    fprintf(e->visits, "%lld %lld %lld\n", (long long)e->done_ep, (long long)i, (long long)j);
    added += j - i;
    i = j;
  }
  fflush(e->visits);
  free(seen);
  if (added)
    DT_LOG_INFO("elastic: member %d: visit record: %lld positions of step %lld (epoch %lld, "
                "[%lld, %lld)) recorded that no worker had recorded (shares of members that did not "
                "complete the step themselves)",
                e->el_id, (long long)added, (long long)S->step - 1, (long long)e->done_ep,
                (long long)lo, (long long)hi);
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
  const int64_t was = S->step;
  /* a spare woken to replace the lost worker reads the node's standby
   * copy at its admission: bring it up to date now, while the spare starts
   * and the members agree (one member writes; the others find it done or
   * under way) */
  if (e->sb && !e->el_partial) dt__standby_write(e, 0);
  dt_elastic_gen g;
  int rc;
  for (int tries = 0;; tries++) {
    rc = dt_elastic_reform(e->elastic, dt__elastic_pos(e), &g);
    if (rc < 0 && dt_elastic_saves(e->elastic) && !e->el_partial) {
      /* giving up below min_workers: the job's state into a checkpoint */
      char msg[512], dir[DT_CKPT_PATH_MAX + 32];
      snprintf(msg, sizeof msg, "%s", dt_errmsg());
      if (dt__ckpt_final(e, e->out_dir[0] ? e->out_dir : NULL, dir, sizeof dir) == DT_OK)
        return dt__seterr(rc, "member %d: %s; checkpoint of step %lld written: %s (go on with "
                          "--resume)", e->el_id, msg, (long long)S->step, dir);
      return dt__seterr(rc, "member %d: %s; no checkpoint written: %s", e->el_id, msg,
                        dt_errmsg());
    }
    if (rc < 0) return dt__preerr(rc, "member %d after \"%s\"", e->el_id, why);
    rc = adopt(e, &g);
    /* another change while the state moved (a joiner, a second loss):
     * re-form again; a member that was receiving holds a partial copy */
    if (rc < 0 && dt__elastic_recoverable(e, rc) && tries < 16) {
      snprintf(why, sizeof why, "%s", dt_errmsg());
      DT_LOG_INFO("elastic: member %d: generation %d: %s; re-forming again", e->el_id, g.gen, why);
      continue;
    }
    if (rc < 0) return dt__preerr(rc, "member %d: generation %d", e->el_id, g.gen);
    break;
  }
  /* the interrupted step, if the agreed state completed it after all (the
   * source's reduction got every message): the state's last step is the
   * one this worker planned */
  if (in_step && S->step == was + 1) {
    e->done_step = S->step;
    e->done_ep = e->plan_ep;
    e->done_lo = e->plan_lo;
    e->done_hi = e->plan_hi;
  }
  if (e->visits && g.rank == g.source) visits_complete(e);
  where(e, g.pos, epoch, k); /* where the agreed position is in the loop */
  e->recoveries++;
  DT_LOG_INFO("elastic: generation %d: %d workers, going on at epoch %d step %lld (%.3f s)",
              g.gen, g.size, *epoch, (long long)*k, dt_now() - t0);
  return DT_OK;
}

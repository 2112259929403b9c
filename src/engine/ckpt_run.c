/*
 * ckpt_run.c — checkpoints during a run (docs/checkpoint.md): when to take
 * one (ckpt.every_steps, ckpt.every_seconds, the end of every epoch, the
 * caller's stop flag — SIGTERM/SIGINT in the CLI — before the run ends),
 * who writes (rank 0 only: every rank holds the same replicated state after
 * a step), and how: the training thread copies the flat buffers into a
 * snapshot (ckpt_state.c) and the ckpt layer's background thread writes it
 * while training goes on (ckpt.async = false writes on the training
 * thread). A write that fails (a full disk) is a warning naming the path;
 * older checkpoints stay, training goes on, and summary.json reports it.
 *
 * Also resuming: dt_engine_resume finds the newest valid checkpoint, checks
 * its config fingerprint against the engine, loads the weights at once and
 * keeps the strategy state and the loop position for dt_engine_run, which
 * applies them after the strategy's setup.
 *
 * The stop flag is read only by rank 0: other ranks go on until rank 0
 * leaves after its checkpoint, then see a lost peer. So the checkpoint is
 * always taken at a step boundary that every rank has passed.
 *
 * State that differs per rank (the strategy's rank_state_save: gradient
 * compression's error-feedback residuals and worker momentum) cannot be
 * taken by rank 0 alone. At the checkpoints every rank can tell are due
 * from the step count — ckpt.every_steps and the ends of epochs — every
 * rank sends its blob to rank 0 first, and the checkpoint holds one file
 * per worker (worker-R.safetensors, owner "worker-R", as a parameter
 * server's shards). A checkpoint only rank 0 can decide (ckpt.every_seconds,
 * a signal) is announced instead: at the start of a step rank 0 sets a note
 * that rides with that step's compressed gradients (strategy.h
 * ckpt_notes), and at its end every rank knows and sends its state. A
 * signal is thus answered one step later than without per-rank state.
 *
 * Strategies whose state is split over ranks (pipeline stages: state_sharded
 * with a state_gather op) checkpoint collectively: at every step boundary
 * and epoch end rank 0 decides (its clock, its stop flag, its writer) and
 * the strategy broadcasts the decision (4 bytes: a later stage waits in it
 * no longer than it would wait for stage 0's next activations anyway); when
 * it says so every rank hands its part to rank 0 and rank 0 writes one
 * checkpoint, a file per owner. On a signal every rank stops after rank 0
 * wrote. ZeRO-1 (strategy zero) checkpoints the same way: its blocks of
 * optimizer state come to rank 0, which writes them as ddp's one blob.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"

static int wants_ckpt(const dt_run_cfg *c) {
  return c->ckpt_every_steps > 0 || c->ckpt_every_seconds > 0 || c->ckpt_epoch_end ||
         c->ckpt_on_signal;
}

/* A sharded strategy that cannot bring its state to one writer. */
static int no_writer(const dt_engine *e) {
  return e->strat.ops->state_sharded && !e->strat.ops->state_gather;
}

/* Every rank takes part in every checkpoint decision (see the top). */
static int collective(const dt_engine *e) {
  return e->strat.ops->state_sharded && e->strat.ops->state_gather && e->nranks > 1 &&
         wants_ckpt(&e->cfg);
}

enum { CK_TAKE = DT__CK_TAKE, CK_PENDING = DT__CK_PENDING, CK_STOP = DT__CK_STOP };

/* Rank 0's decision *f to every rank, and every owner's state to rank 0
 * when it is CK_TAKE. */
static int agree(dt_engine *e, int32_t *f) {
  if (!collective(e)) return DT_OK;
  return e->strat.ops->state_gather(&e->strat, f);
}

int dt__ckpt_root(const dt_engine *e, const char *out_dir, char *root, size_t cap) {
  root[0] = '\0';
  if (!wants_ckpt(&e->cfg) || no_writer(e)) return 0;
  if (e->cfg.ckpt_dir[0]) snprintf(root, cap, "%s", e->cfg.ckpt_dir);
  else if (out_dir && out_dir[0]) snprintf(root, cap, "%s/ckpt", out_dir);
  return root[0] != '\0';
}

int dt__ckpt_check_root(dt_engine *e, const char *out_dir) {
  char root[DT_CFG_PATH_MAX + 16];
  if (!dt__ckpt_root(e, out_dir, root, sizeof root)) return DT_OK;
  int rc = dt__ckpt_root_check(root);
  if (rc < 0) return dt__seterr(rc, "ckpt.dir: %s", dt_errmsg());
  return DT_OK;
}

/* ---- per-rank state ---------------------------------------------------------------- */

#define RANK_STATE_TAG 0x7c5a01 /* a user tag of the workers' communicator */

/* Every rank decides alike whether the per-rank state is gathered: the
 * strategy has some (the same size on every rank: the same configuration)
 * and rank 0 writes checkpoints (broadcast: only rank 0 knows). */
static int rank_state_start(dt_engine *e) {
  dt_ckpt_run *k = &e->ck;
  dt_strategy *S = &e->strat;
  k->gather = 0;
  k->rs_step = -1;
  if (!S->ops->rank_state_save || !S->comm || S->nranks < 2 || e->elastic) return DT_OK;
  size_t len = 0;
  DT_CHECK(S->ops->rank_state_save(S, NULL, &len));
  if (!len) return DT_OK;
  int32_t on = k->on;
  int rc = dt_comm_broadcast(S->comm, &on, 1, DT_I32, 0);
  if (rc < 0) return dt__ddp_comm_err(S, rc, "checkpoints: per-worker state");
  if (!on) return DT_OK;
  if (S->nranks + 3 > DT_CKPT_FILES_MAX) {
    if (S->rank == 0)
      DT_LOG_WARN("checkpoints hold no per-worker state (compression residuals) beyond %d "
                  "workers; a resume starts it at zero", DT_CKPT_FILES_MAX - 3);
    return DT_OK;
  }
  k->rs_buf = malloc(len * (S->rank == 0 ? (size_t)S->nranks : 1));
  if (!k->rs_buf) return dt__seterr(DT_ENOMEM, "checkpoints: out of memory for per-worker state");
  k->rs_len = len;
  k->gather = 1;
  S->ckpt_notes = 1;
  return DT_OK;
}

/* Every rank's blob to rank 0 (its own first in rank order). Collective:
 * called by every rank at the same step boundary. */
static int rank_state_gather(dt_engine *e) {
  dt_ckpt_run *k = &e->ck;
  dt_strategy *S = &e->strat;
  size_t len = k->rs_len;
  DT_CHECK(S->ops->rank_state_save(S, k->rs_buf, &len));
  int rc = DT_OK;
  if (S->rank == 0)
    for (int r = 1; r < S->nranks && rc == DT_OK; r++)
      rc = dt_comm_recv(S->comm, r, RANK_STATE_TAG, k->rs_buf + (size_t)r * len, len);
  else
    rc = dt_comm_send(S->comm, 0, RANK_STATE_TAG, k->rs_buf, len);
  if (rc < 0) {
    char what[64];
    snprintf(what, sizeof what, "checkpoint of step %lld: per-worker state", (long long)S->step);
    return dt__ddp_comm_err(S, rc, what);
  }
  k->rs_step = S->step;
  return DT_OK;
}

/* Checkpoints due by the step count alone, which every rank can tell:
 * ckpt.every_steps (at an epoch's last step it follows the epoch's end)
 * and the ends of epochs. */
static int agreed_after_step(const dt_engine *e, const dt_ckpt_pos *p) {
  const int64_t n = e->cfg.ckpt_every_steps;
  return n > 0 && e->strat.step % n == 0 && p->k < e->steps_per_epoch;
}

static int agreed_epoch_end(const dt_engine *e) {
  const int64_t n = e->cfg.ckpt_every_steps;
  return e->cfg.ckpt_epoch_end || (n > 0 && e->strat.step % n == 0);
}

void dt__ckpt_before_step(dt_engine *e) {
  dt_ckpt_run *k = &e->ck;
  if (!k->gather) return;
  k->announced = 0;
  if (e->rank == 0 && k->on) {
    const dt_run_cfg *c = &e->cfg;
    int sig = k->stop && *k->stop && c->ckpt_on_signal;
    int timer = c->ckpt_every_seconds > 0 && dt_now() - k->last_t >= c->ckpt_every_seconds;
    k->announced = sig || timer;
  }
  e->strat.ckpt_note_out = k->announced;
}

/* ---- taking a checkpoint --------------------------------------------------------- */

static void note_failure(dt_ckpt_run *k, int64_t step, const char *msg) {
  k->sync_failed++;
  k->sync_failed_step = step;
  snprintf(k->sync_err, sizeof k->sync_err, "%s", msg);
}

/* Snapshot now; written by the thread (or here when sync). Never fails the
 * run: a failure is a warning and a count. */
static void take(dt_engine *e, const dt_ckpt_pos *p, int sync) {
  dt_ckpt_run *k = &e->ck;
  double t0 = dt_now(), waited = 0;
  const int64_t t0_ns = dt_now_ns(); /* observe.c: metrics and a span */
  const int64_t step = e->strat.step;
  k->last_t = t0;
  k->last_step = step;
  if (k->w) {
    dt_ckpt_snap *s = dt__writer_acquire(k->w, &waited);
    int rc = dt__ckpt_snapshot(e, s, p);
    k->wait_seconds += waited;
    k->snap_seconds += dt_now() - t0 - waited;
    if (rc < 0) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", dt_errmsg());
      DT_LOG_WARN("checkpoint of step %lld not taken (training goes on): %s", (long long)step, msg);
      note_failure(k, step, msg);
      dt__eobs_ckpt(e, t0_ns, 0);
      return;
    }
    dt__writer_submit(k->w);
    /* DTRAIN_TEST_KILL ID:STEP:ckpt — dies while the writer thread writes */
    if (e->elastic) dt__elastic_fault(e, DT_FAULT_CKPT);
    if (sync) dt__writer_drain(k->w);
    dt__eobs_ckpt(e, t0_ns, 1);
    return;
  }
  int rc = dt__ckpt_snapshot(e, &k->snap, p);
  k->snap_seconds += dt_now() - t0;
  if (e->elastic) dt__elastic_fault(e, DT_FAULT_CKPT); /* DTRAIN_TEST_KILL ID:STEP:ckpt */
  char dir[DT_CKPT_PATH_MAX + 32];
  if (rc == DT_OK) rc = dt__ckpt_write(k->root, &k->snap, e->cfg.ckpt_keep, dir, sizeof dir);
  if (rc < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dt_errmsg());
    DT_LOG_WARN("checkpoint of step %lld not written (training goes on, older checkpoints "
                "kept): %s", (long long)step, msg);
    note_failure(k, step, msg);
    dt__eobs_ckpt(e, t0_ns, 0);
    return;
  }
  k->sync_written++;
  dt__eobs_ckpt(e, t0_ns, 1);
  snprintf(k->last_dir, sizeof k->last_dir, "%s", dir);
}

/* Rank 0 writes. Every rank knows the root, so a rank that becomes rank 0
 * after a membership change (elastic training) takes the writing over at
 * its next step boundary. */
static int become_writer(dt_engine *e) {
  dt_ckpt_run *k = &e->ck;
  int rc = dt__ckpt_root_check(k->root);
  if (rc < 0) return dt__seterr(rc, "ckpt.dir: %s", dt_errmsg());
  if (e->cfg.ckpt_async) DT_CHECK(dt__writer_create(&k->w, k->root, e->cfg.ckpt_keep));
  k->on = 1;
  e->strat.ckpt_root = k->root;
  return DT_OK;
}

int dt__ckpt_start(dt_engine *e, const char *out_dir, dt_ckpt_pos *pos) {
  dt_ckpt_run *k = &e->ck;
  dt__ckpt_root(e, out_dir, k->root, sizeof k->root);
  k->on = 0;
  if (e->rank == 0 && no_writer(e) && wants_ckpt(&e->cfg) &&
      (e->cfg.ckpt_every_steps > 0 || e->cfg.ckpt_every_seconds > 0))
    DT_LOG_WARN("strategy '%s' keeps its state sharded over ranks: checkpoints are not taken "
                "(per-owner checkpoint files are not built yet)", e->strat.ops->name);
  k->last_t = dt_now();
  k->last_step = -1;
  k->sync_failed_step = -1;
  if (e->rank == 0 && k->root[0]) DT_CHECK(become_writer(e));
  DT_CHECK(rank_state_start(e));
  memset(pos, 0, sizeof *pos);
  pos->epoch = 1;
  if (!k->res) return DT_OK;
  DT_CHECK(dt__ckpt_apply(e, k->res));
  *pos = k->res->pos;
  /* the epoch's tally so far counts only when the same single worker had it */
  if (!(k->res->workers == 1 && e->nranks == 1) || pos->ep.fixed != e->strat.ops->fixed_point) {
    dt_tally z = {.fixed = e->strat.ops->fixed_point};
    pos->ep = z;
  }
  k->last_step = e->strat.step;
  return DT_OK;
}

int dt__ckpt_after_step(dt_engine *e, const dt_ckpt_pos *p) {
  dt_ckpt_run *k = &e->ck;
  k->at = *p;
  if (k->gather && (agreed_after_step(e, p) || e->strat.ckpt_note_in))
    DT_CHECK(rank_state_gather(e));
  const int coll = collective(e);
  if (e->rank != 0 && !coll) return DT_OK;
  if (e->rank == 0 && !k->on && k->root[0] && !k->finished && become_writer(e) < 0) {
    DT_LOG_WARN("rank 0 (new after a membership change) cannot write checkpoints: %s",
                dt_errmsg());
    k->root[0] = '\0';
  }
  const dt_run_cfg *c = &e->cfg;
  const int64_t step = e->strat.step;
  int32_t f = 0;
  if (e->rank == 0) {
    if (k->stop && *k->stop) {
      /* per-rank state: the checkpoint comes after the step that announced
       * it (never with coll: only ddp has per-rank state) */
      if (k->gather && k->on && c->ckpt_on_signal && !k->announced) return DT_OK;
      f = CK_STOP | (k->on && c->ckpt_on_signal ? CK_TAKE : 0);
    } else if (k->on && step != k->last_step &&
               ((c->ckpt_every_steps > 0 && step % c->ckpt_every_steps == 0) ||
                (c->ckpt_every_seconds > 0 &&
                 (k->gather ? k->announced : dt_now() - k->last_t >= c->ckpt_every_seconds)))) {
      /* the epoch's last step: the epoch-end checkpoint follows its records */
      f = p->k >= e->steps_per_epoch ? CK_PENDING : CK_TAKE;
    }
  }
  DT_CHECK(agree(e, &f));
  if (e->rank != 0) {
    if (!(f & CK_STOP)) return DT_OK;
    /* leave only once rank 0 wrote (it says so with one more broadcast) */
    int32_t done = 0;
    DT_CHECK(agree(e, &done));
    return dt__seterr(DT_EABORTED, "stopped after step %lld (epoch %d): rank 0 was stopped by a "
                      "signal%s", (long long)step, p->epoch,
                      f & CK_TAKE ? " and wrote a checkpoint" : "");
  }
  if (f & CK_STOP) {
    char where[DT_CKPT_PATH_MAX + 64] = "no checkpoint (checkpoints are off)";
    if (f & CK_TAKE) {
      take(e, p, 1);
      dt_ckpt_stats st;
      if (k->w) dt__writer_stats(k->w, &st);
      int ok = k->w ? st.last_step == step : k->last_step == step && k->sync_failed_step != step;
      if (ok) snprintf(where, sizeof where, "checkpoint written: %s",
                       k->w ? st.last_dir : k->last_dir);
      else snprintf(where, sizeof where, "the checkpoint failed: %s",
                    k->w ? st.last_error : k->sync_err);
    }
    int32_t done = 0;
    if (coll && agree(e, &done) < 0)
      DT_LOG_WARN("telling the other ranks the checkpoint is written: %s", dt_errmsg());
    return dt__seterr(DT_EABORTED, "stopped by a signal after step %lld (epoch %d); %s",
                      (long long)step, p->epoch, where);
  }
  if (f & CK_PENDING) k->pending = 1;
  if (f & CK_TAKE) take(e, p, 0);
  return DT_OK;
}

int dt__ckpt_epoch_end(dt_engine *e, const dt_ckpt_pos *p) {
  dt_ckpt_run *k = &e->ck;
  k->at = *p;
  if (k->gather && agreed_epoch_end(e)) DT_CHECK(rank_state_gather(e));
  int32_t f = e->rank == 0 && k->on && (e->cfg.ckpt_epoch_end || k->pending) &&
                      e->strat.step != k->last_step ? CK_TAKE : 0;
  k->pending = 0;
  if (agree(e, &f) < 0) {
    /* a lost peer: the next collective ends the run */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dt_errmsg());
    DT_LOG_WARN("checkpoint of step %lld not taken: %s", (long long)e->strat.step, msg);
    if (e->rank == 0) note_failure(k, e->strat.step, msg);
    return DT_OK;
  }
  if (e->rank == 0 && (f & CK_TAKE)) take(e, p, 0);
  return DT_OK;
}

int dt__ckpt_final(dt_engine *e, const char *out_dir, char *dir, size_t cap) {
  dt_ckpt_run *k = &e->ck;
  if (k->finished) return dt__seterr(DT_EINVAL, "checkpoint after the run's end");
  if (collective(e))
    return dt__seterr(DT_ENOTSUP, "strategy '%s': a checkpoint of a sharded state is taken by "
                      "every rank together, at a step boundary", e->strat.ops->name);
  if (!k->root[0]) {
    if (e->cfg.ckpt_dir[0]) snprintf(k->root, sizeof k->root, "%s", e->cfg.ckpt_dir);
    else if (out_dir && out_dir[0]) snprintf(k->root, sizeof k->root, "%s/ckpt", out_dir);
    else return dt__seterr(DT_ENOENT, "no checkpoint directory (ckpt.dir, or the run's --out)");
  }
  if (!k->on) DT_CHECK(become_writer(e));
  /* the position after this worker's last completed step (the first
   * step of a run counts from the start) */
  dt_ckpt_pos p = k->at;
  if (p.epoch < 1) {
    memset(&p, 0, sizeof p);
    p.epoch = 1;
  }
  p.ep = (dt_tally){.fixed = e->strat.ops->fixed_point};
  k->last_step = -1;
  take(e, &p, 1);
  dt_ckpt_stats st;
  int ok;
  if (k->w) {
    dt__writer_stats(k->w, &st);
    ok = st.last_step == e->strat.step && st.failed_step != e->strat.step;
    snprintf(dir, cap, "%s", ok ? st.last_dir : st.last_error);
  } else {
    ok = k->sync_failed_step != e->strat.step;
    snprintf(dir, cap, "%s", ok ? k->last_dir : k->sync_err);
  }
  return ok ? DT_OK : dt__seterr(DT_EIO, "%s", dir);
}

void dt__ckpt_finish(dt_engine *e) {
  dt_ckpt_run *k = &e->ck;
  if (k->finished) return;
  k->finished = 1;
  dt_ckpt_stats *st = &k->stats;
  memset(st, 0, sizeof *st);
  st->last_step = st->failed_step = -1;
  if (k->w) {
    dt__writer_drain(k->w);
    dt__writer_stats(k->w, st);
    dt__writer_destroy(k->w);
    k->w = NULL;
  } else {
    st->written = k->sync_written;
    snprintf(st->last_dir, sizeof st->last_dir, "%s", k->last_dir);
  }
  free(k->rs_buf);
  k->rs_buf = NULL;
  k->gather = 0;
  st->failed += k->sync_failed;
  if (k->sync_failed) {
    st->failed_step = k->sync_failed_step;
    snprintf(st->last_error, sizeof st->last_error, "%s", k->sync_err);
  }
  dt__snap_free(&k->snap);
}

/* ---- resuming --------------------------------------------------------------------- */

void dt__ckpt_resume_free(dt_ckpt_resume *r) {
  if (!r) return;
  dt__st_free(&r->model_st);
  dt__st_free(&r->state_st);
  free(r->model_buf);
  free(r->state_buf);
  free(r);
}

int dt_engine_resume(dt_engine *e, const char *path) {
  if (!e) return dt__seterr(DT_EINVAL, "dt_engine_resume: engine is NULL");
  if (!path || !*path) return dt__seterr(DT_EINVAL, "dt_engine_resume: path is empty");
  if (e->ran) return dt__seterr(DT_EINVAL, "dt_engine_resume: engine already ran");
  if (no_writer(e))
    return dt__seterr(DT_ENOTSUP, "strategy '%s' keeps its state sharded over ranks; its "
                      "checkpoints (one file per owner) are not built yet", e->strat.ops->name);
  dt_ckpt_resume *r = calloc(1, sizeof *r);
  if (!r) return dt__seterr(DT_ENOMEM, "resume: out of memory");
  /* Verified in chunks, then only headers and trainer.json are read here:
   * the weights and the optimizer state stay in the files until the rank
   * that needs a tensor reads it (every rank its own), so this process
   * (the launcher, before the fork) never holds the model's bytes. */
  int rc = dt__ckpt_find(path, &r->info);
  uint8_t *tj = NULL;
  size_t tl = 0;
  int fd = -1;
  if (rc == DT_OK) rc = dt__ckpt_load(&r->info, "trainer.json", &tj, &tl);
  if (rc == DT_OK) rc = dt__ckpt_read_trainer(e, r, tj, tl);
  free(tj);
  if (rc == DT_OK) rc = dt__ckpt_open_st(&r->info, "model.safetensors", &r->model_st, &fd);
  if (fd >= 0) close(fd), fd = -1;
  if (rc == DT_OK) rc = dt__ckpt_open_st(&r->info, "state.safetensors", &r->state_st, &fd);
  if (fd >= 0) close(fd), fd = -1;
  char what[DT_CKPT_PATH_MAX + 32];
  snprintf(what, sizeof what, "checkpoint '%s'", r->info.dir);
  if (rc == DT_OK) rc = dt__ckpt_check_model(e, &r->model_st, what);
  if (rc == DT_OK && !e->strat.params_lazy)
    rc = dt__ckpt_read_layers(r, e->model, 0, dt_model_nlayers(e->model));
  if (rc < 0) {
    dt__ckpt_resume_free(r);
    return rc;
  }
  /* a stage reads its own span when it would initialise it (setup) */
  if (e->strat.params_lazy) {
    e->strat.params_load = dt__ckpt_read_layers;
    e->strat.params_load_ud = r;
  }
  dt__st_free(&r->model_st);
  dt__ckpt_resume_free(e->ck.res);
  e->ck.res = r;
  return DT_OK;
}

int dt_engine_set_stop_flag(dt_engine *e, const volatile sig_atomic_t *flag) {
  if (!e) return dt__seterr(DT_EINVAL, "dt_engine_set_stop_flag: engine is NULL");
  e->ck.stop = flag;
  return DT_OK;
}

const char *dt_engine_resumed_from(const dt_engine *e, int64_t *step) {
  if (!e || !e->ck.res) return NULL;
  if (step) *step = e->ck.res->step;
  return e->ck.res->info.dir;
}

/* ---- model.init ------------------------------------------------------------------- */

int dt__ckpt_model_init(dt_engine *e, const char *path) {
  uint8_t *b = NULL;
  size_t n = 0;
  int rc = dt__read_all(path, (size_t)1 << 40, &b, &n);
  if (rc < 0) return dt__preerr(rc, "model.init");
  char what[DT_CFG_PATH_MAX + 32];
  snprintf(what, sizeof what, "model.init '%s'", path);
  dt_st st;
  rc = dt__st_parse(&st, b, n, what);
  if (rc == DT_OK) {
    rc = dt__ckpt_load_model(e, &st, what, 1);
    dt__st_free(&st);
  }
  free(b);
  return rc;
}

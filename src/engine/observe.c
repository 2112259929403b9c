/*
 * observe.c — what the training loop tells src/obs: it opens this rank's
 * page (DIR/obs/rank-R, read by the launcher's /metrics and hang
 * diagnosis), lends it to the communicator (flight recorder) and the
 * strategy, registers the loop's metrics, updates them once per step and
 * per epoch, starts the trace after a barrier (so every rank's time zero is
 * the same moment) and writes it at the end, and on a failure records it
 * and dumps this rank's flight recorder next to the page. Every call is a
 * no-op when the run has no page. It never decides anything about the run.
 */
#include <stdio.h>
#include <string.h>

#include "engine/engine_int.h"
#include "obs/obs_diag.h"

/* The job label: the output directory's last component. */
static void job_name(const char *out_dir, char *buf, size_t cap) {
  snprintf(buf, cap, "dtrain");
  if (!out_dir || !*out_dir) return;
  size_t n = strlen(out_dir);
  while (n > 1 && out_dir[n - 1] == '/') n--;
  size_t s = n;
  while (s > 0 && out_dir[s - 1] != '/') s--;
  if (n > s) snprintf(buf, cap, "%.*s", (int)(n - s), out_dir + s);
}

int dt__eobs_open(dt_engine *e, const char *out_dir) {
  dt_eobs *x = &e->obs;
  memset(x, 0, sizeof *x);
  if (e->comm) dt_log_set_rank(e->rank);
  dt_log_set_json(e->cfg.obs_log_format == 1);
  char job[64];
  job_name(out_dir, job, sizeof job);
  if (out_dir) snprintf(x->dir, sizeof x->dir, "%s/obs", out_dir);
  /* an elastic joiner's page is named by its member id: a rank of a later
   * generation may be a running member's page */
  int prank = e->el_join ? e->el_id : e->rank, psize = e->el_join ? e->el_id + 1 : e->nranks;
  int rc = dt_obs_open(&x->o, out_dir ? x->dir : NULL, prank, psize, job, NULL);
  if (rc < 0 && out_dir) {
    /* observability must not stop a run: fall back to memory, say why */
    DT_LOG_WARN("rank %d: %s; metrics and flight recorder kept in memory only", e->rank,
                dt_errmsg());
    x->dir[0] = '\0';
    rc = dt_obs_open(&x->o, NULL, prank, psize, job, NULL);
  }
  if (rc < 0) return rc;
  dt_obs *o = x->o;
  x->samples = dt_obs_counter(o, "dtrain_samples_total", "Training samples this rank processed");
  x->steps = dt_obs_counter(o, "dtrain_steps_total", "Optimizer steps taken");
  x->step_s = dt_obs_histogram(o, "dtrain_step_seconds",
                               "Time of one training step (data, forward, backward, reduction, "
                               "update)", NULL, 0);
  x->sps = dt_obs_gauge(o, "dtrain_samples_per_second",
                        "Global samples per second in the current epoch, as this rank sees it");
  x->loss = dt_obs_gauge(o, "dtrain_train_loss", "Mean training loss of the current epoch so far");
  x->lr = dt_obs_gauge(o, "dtrain_learning_rate", "Learning rate of the last step");
  x->epoch = dt_obs_gauge(o, "dtrain_epoch", "Current epoch (1-based)");
  x->test_acc = dt_obs_gauge(o, "dtrain_test_accuracy", "Test accuracy of the last evaluation");
  x->test_loss = dt_obs_gauge(o, "dtrain_test_loss", "Test loss of the last evaluation");
  if (e->comm) {
    x->sent = dt_obs_counter(o, "dtrain_sent_bytes_total", "Bytes this rank's transports sent");
    x->recv = dt_obs_counter(o, "dtrain_received_bytes_total",
                             "Bytes this rank's transports received");
    dt_comm_set_obs(e->comm, o);
  }
  e->strat.obs = o;
  return DT_OK;
}

int dt__eobs_trace_start(dt_engine *e) {
  dt_eobs *x = &e->obs;
  if (!x->o || !e->cfg.obs_trace) return DT_OK;
  /* the same zero on every rank: the moment a barrier lets them all go */
  if (e->comm) DT_CHECK(dt_comm_barrier(e->comm));
  return dt_obs_trace_start(x->o, e->cfg.obs_trace_steps, dt_now_ns());
}

void dt__eobs_step(dt_engine *e, double seconds, int64_t samples, double loss, double lr,
                   double sps) {
  dt_eobs *x = &e->obs;
  if (!x->o) return;
  dt_obs_observe(x->step_s, seconds);
  dt_obs_add(x->samples, (double)samples);
  dt_obs_add(x->steps, 1);
  dt_obs_set(x->loss, loss);
  dt_obs_set(x->lr, lr);
  dt_obs_set(x->sps, sps);
  if (e->comm) {
    uint64_t s, r;
    dt_comm_bytes(e->comm, &s, &r);
    dt_obs_set(x->sent, (double)s);
    dt_obs_set(x->recv, (double)r);
  }
}

void dt__eobs_ckpt(dt_engine *e, int64_t t0_ns, int ok) {
  dt_obs *o = e->obs.o;
  if (!o) return;
  int64_t t1 = dt_now_ns();
  if (ok) {
    dt_obs_add(dt_obs_counter(o, "dtrain_checkpoint_writes_total",
                              "Checkpoints taken (handed to the writer, or written)"), 1);
    dt_obs_observe(dt_obs_histogram(o, "dtrain_checkpoint_seconds",
                                    "Training-thread time per checkpoint (snapshot, waiting for "
                                    "the writer, or the whole write without one)", NULL, 0),
                   (double)(t1 - t0_ns) / 1e9);
  } else {
    dt_obs_add(dt_obs_counter(o, "dtrain_checkpoint_failures_total", "Checkpoints that failed"), 1);
  }
  dt_obs_span(o, "checkpoint", 0, t0_ns, t1, e->strat.step);
}

void dt__eobs_membership(dt_engine *e, int generation) {
  dt_obs *o = e->obs.o;
  if (!o) return;
  if (e->comm) dt_comm_set_obs(e->comm, o); /* the new communicator records too */
  /* renumbered: the labels and the page's file name follow the new rank */
  if (dt_obs_rerank(o, e->obs.dir[0] ? e->obs.dir : NULL, e->rank, e->nranks) < 0)
    DT_LOG_WARN("rank %d: %s", e->rank, dt_errmsg());
  dt_obs_set(dt_obs_gauge(o, "dtrain_membership_generation",
                          "Elastic membership generation this rank trains in"), generation);
}

void dt__eobs_epoch(dt_engine *e, const dt_epoch_report *r) {
  dt_eobs *x = &e->obs;
  if (!x->o) return;
  dt_obs_set(x->epoch, r->epoch);
  /* the straggler view the strategy measured (balance.h), not measured twice */
  const dt_strategy *S = &e->strat;
  if (S->perf_epoch && e->rank < S->nperf) {
    const dt_rank_perf *p = &S->perf_epoch[e->rank];
    dt_obs_set(dt_obs_gauge(x->o, "dtrain_straggler",
                            "1 when this rank was flagged a straggler in the last epoch"),
               p->straggler ? 1 : 0);
    dt_obs_set(dt_obs_gauge(x->o, "dtrain_compute_seconds_per_sample",
                            "This rank's compute time per sample in the last epoch"),
               p->sec_per_sample);
    dt_obs_set(dt_obs_gauge(x->o, "dtrain_slower_than_median_ratio",
                            "This rank's compute time per sample over the median's, minus 1"),
               p->slower);
  }
  if (r->evaluated) {
    dt_obs_set(x->test_acc, r->test_accuracy);
    dt_obs_set(x->test_loss, r->test_loss);
  }
}

void dt__eobs_end(dt_engine *e, const char *out_dir, int rc, const char *msg) {
  dt_eobs *x = &e->obs;
  if (!x->o) return;
  /* msg may be this thread's message buffer, which the calls below reuse */
  char why[512] = "";
  if (rc < 0) snprintf(why, sizeof why, "%s", msg ? msg : "");
  if (rc < 0) {
    dt_obs_fail(x->o, rc, why);
    /* this rank's own dump of its recorder (the launcher merges every rank's) */
    if (x->dir[0] && (rc == DT_ETIMEDOUT || rc == DT_EPEERLOST || rc == DT_EMISMATCH ||
                      rc == DT_EABORTED)) {
      char path[DT_CFG_PATH_MAX + 64];
      struct dt_obs_page pg;
      snprintf(path, sizeof path, "%s/rank-%d", x->dir, e->rank);
      if (dt__obs_read(path, &pg) == DT_OK) {
        snprintf(path, sizeof path, "%s/flight-rank-%d.txt", x->dir, e->rank);
        FILE *f = fopen(path, "w");
        if (f) {
          dt_obs_fr_dump(&pg, f, dt_now_ns(), DT_OBS_FR_LEN);
          fclose(f);
        }
      }
    }
  }
  if (dt_obs_tracing(x->o) && x->dir[0]) {
    char path[DT_CFG_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/trace-rank-%d.json", x->dir, e->rank);
    if (dt_obs_trace_write(x->o, path) < 0) DT_LOG_WARN("rank %d: %s", e->rank, dt_errmsg());
  }
  (void)out_dir;
  if (e->comm) dt_comm_set_obs(e->comm, NULL);
  e->strat.obs = NULL;
  dt_obs_close(x->o);
  x->o = NULL;
  if (rc < 0) dt__seterr(rc, "%s", why); /* the run's message, as it was */
}

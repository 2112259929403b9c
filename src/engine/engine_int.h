/*
 * engine_int.h — the engine's own view of itself, shared by engine.c
 * (create, destroy, data), train.c (the loop), records.c (summary, events,
 * hashes) and the strategies. Not for other layers: they use engine.h.
 */
#ifndef DT_ENGINE_INT_H
#define DT_ENGINE_INT_H

#include <stdio.h>

#include "data/data.h"
#include "engine/batch_source.h"
#include "engine/engine.h"
#include "engine/strategy.h"
#include "parallel/ddp.h"
#include "obs/obs.h"

/* This rank's observability during a run (observe.c). */
typedef struct dt_eobs {
  dt_obs *o;                /* NULL: none (before or after a run) */
  char dir[DT_CFG_PATH_MAX + 8]; /* DIR/obs, or "" (in memory) */
  dt_obs_metric *samples, *steps, *step_s, *sps, *loss, *lr, *epoch, *test_acc, *test_loss;
  dt_obs_metric *sent, *recv;
} dt_eobs;

struct dt_engine {
  dt_run_cfg cfg;
  dt_dataset train, test;
  dt_model *model;
  dt_optim *optim;
  dt_sched_cfg sched;
  int64_t steps_per_epoch;
  float mean, std;          /* normalisation applied (0, 1 if none) */
  dt_batch_source *source;  /* this worker's pieces of every global batch */
  dt_strategy strat;        /* ops picked at create; model, optim, comm lent */
  dt_comm *comm;            /* NULL: one worker */
  int rank, nranks;
  int ran;                  /* dt_engine_run was called (once per engine) */
  int from_memory;          /* data sets given by the caller, not paths */
  int out_fd;               /* DIR/.lock held (flock) for out_dir, or -1 */
  char out_dir[DT_CFG_PATH_MAX];
  dt_eobs obs;              /* metrics, flight recorder, trace of the current run */
};

/* Fills e->strat with what the engine lends its strategy (strategy.h):
 * model, optimizer, communicator, rank, sizes. */
void dt__engine_lend(dt_engine *e);

/* ---- observability (observe.c) ---------------------------------------------------- */

/* Opens this rank's page (DIR/obs/rank-R, or memory without out_dir),
 * registers the loop's metrics and lends the page to the communicator and
 * the strategy. */
int dt__eobs_open(dt_engine *e, const char *out_dir);
/* obs.trace: a barrier (with a communicator), then spans are kept. */
int dt__eobs_trace_start(dt_engine *e);
void dt__eobs_step(dt_engine *e, double seconds, int64_t samples, double loss, double lr,
                   double sps);
void dt__eobs_epoch(dt_engine *e, const dt_epoch_report *r);
/* End of the run: a failure recorded (and this rank's recorder dumped for a
 * communication failure), the trace written, the page closed. */
void dt__eobs_end(dt_engine *e, const char *out_dir, int rc, const char *msg);

/* ---- files (files.c) ------------------------------------------------------------ */

/* Paths in messages are cut to this many bytes (the middle elided). */
#define DT_SHORT_PATH 160
/* path, or its first and last (DT_SHORT_PATH - 4) / 2 bytes around "...". */
const char *dt__short_path(const char *path, char buf[DT_SHORT_PATH]);
/* A run's claim on its output directory: mkdir -p, an exclusive flock on
 * DIR/.lock with this pid written in it (DT_EAGAIN naming the holder's pid
 * when another process holds it), and the previous run's summary.json and
 * failure record removed. *fd keeps the lock until closed. */
int dt__outdir_claim(const char *dir, int *fd);

/* A failed run's record (summary.json is written only on success). */
#define DT_FAILURE_RECORD "failure.json"

/* ---- records (records.c) -------------------------------------------------------- */

/* The files of one run in its output directory. Only rank 0 has them open. */
typedef struct dt_records {
  int open;
  char dir[DT_CFG_PATH_MAX];
  char events_path[DT_CFG_PATH_MAX + 32];
  FILE *events;
  const dt_strategy *strat;   /* per-rank speed for the records (perf_*), may be NULL */
} dt_records;

/* Creates dir (mkdir -p), writes dir/config.ini (config_text, if not NULL)
 * and starts dir/events.jsonl empty. */
int dt__records_open(dt_records *r, const char *dir, const char *config_text);
/* Appends one epoch's line to events.jsonl (flushed). */
int dt__records_event(dt_records *r, const dt_epoch_report *rep);
/* Writes dir/summary.json atomically; per/nper: every worker's numbers in
 * rank order (NULL/0: one worker without a communicator). */
int dt__records_summary(dt_records *r, const dt_engine *e, const dt_run_summary *s,
                        const dt_worker_stats *per, int nper);
/* Writes dir/failure.json atomically: status "failed", the error code and
 * message, where the run stopped. */
int dt__records_failure(dt_records *r, const dt_engine *e, int rc, const char *msg, int epoch,
                        int64_t step);
/* Closes events.jsonl (fsynced, best effort). Safe on a closed record. */
void dt__records_close(dt_records *r);

/* SHA-256 of the parameters as little-endian float32. */
void dt__params_sha256(const dt_model *m, uint8_t out[32]);
/* What must agree between data-parallel workers (dt_ddp_check_config). */
void dt__config_fingerprint(const dt_run_cfg *c, int64_t train_n, int64_t test_n, size_t nparams,
                            const uint8_t config_sha[32], dt_ddp_fingerprint *fp);

#endif /* DT_ENGINE_INT_H */

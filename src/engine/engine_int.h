/*
 * engine_int.h — the engine's own view of itself, shared by engine.c
 * (create, destroy, data), train.c (the loop), records.c (summary, events,
 * hashes) and the strategies. Not for other layers: they use engine.h.
 */
#ifndef DT_ENGINE_INT_H
#define DT_ENGINE_INT_H

#include <signal.h>
#include <stdio.h>

#include "ckpt/ckpt.h"
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

/* ---- checkpoints (ckpt_state.c, ckpt_run.c) ---------------------------------------- */

/* Where the loop stands: the next step is step k (0-based) of epoch
 * `epoch`; ep is that epoch's tally so far. */
typedef struct dt_ckpt_pos {
  int epoch;
  int64_t k;
  dt_tally ep;
  double first_loss, test_loss, test_acc;
} dt_ckpt_pos;

/* A checkpoint loaded by dt_engine_resume, applied by dt_engine_run. */
typedef struct dt_ckpt_resume {
  dt_ckpt_info info;
  uint8_t *model_buf, *state_buf;
  dt_st model_st, state_st;
  dt_ckpt_pos pos;
  int64_t step;
  int workers;  /* of the run that wrote it */
} dt_ckpt_resume;

typedef struct dt_ckpt_run {
  int on;                            /* this rank writes checkpoints in this run */
  char root[DT_CFG_PATH_MAX + 16];
  dt_ckpt_writer *w;                 /* ckpt.async */
  dt_ckpt_snap snap;                 /* synchronous writes */
  double last_t;
  int64_t last_step;                 /* step of the last snapshot */
  dt_ckpt_pos at;                    /* the loop's position after the last step or epoch end */
  int pending;                       /* due at the epoch's last step: taken at its end */
  int finished;                      /* dt__ckpt_finish ran */
  int sync_written, sync_failed;
  int64_t sync_failed_step;
  char sync_err[512], last_dir[DT_CKPT_PATH_MAX + 32];
  double snap_seconds, wait_seconds; /* training-thread time: copies, waits for the writer */
  dt_ckpt_stats stats;               /* the run's totals (dt__ckpt_finish) */
  dt_ckpt_resume *res;
  const volatile sig_atomic_t *stop;
  /* State that differs per rank (the strategy's rank_state_save: the
   * compressor's residuals): gathered to rank 0 at the checkpoints every
   * rank can tell are due (ckpt.every_steps, epoch ends). */
  int gather;                        /* every rank takes part */
  size_t rs_len;                     /* one rank's blob */
  uint8_t *rs_buf;                   /* rank 0: every rank's blob; others: its own */
  int64_t rs_step;                   /* the step rs_buf holds (-1: none) */
  int announced;                     /* rank 0: this step carries a checkpoint note */
} dt_ckpt_run;

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
  dt_comm *job_comm;        /* workers and parameter servers (dt__engine_set_job_comm) */
  int rank, nranks;
  int ran;                  /* dt_engine_run was called (once per engine) */
  int from_memory;          /* data sets given by the caller, not paths */
  int out_fd;               /* DIR/.lock held (flock) for out_dir, or -1 */
  char out_dir[DT_CFG_PATH_MAX];
  dt_eobs obs;              /* metrics, flight recorder, trace of the current run */
  dt_ckpt_run ck;           /* checkpoints and resuming (ckpt_run.c) */
  /* elastic training (elastic_run.c); all unused when elastic is NULL */
  struct dt_elastic *elastic;
  int el_id;                /* this worker's member id */
  int kill_phase;           /* DTRAIN_TEST_KILL: point (0: none) and step */
  int64_t kill_step;
  FILE *visits;             /* DTRAIN_TEST_VISITS record, or NULL */
  float *bufs_snap;         /* the model's buffers at the step's start */
  int64_t ended_at;         /* S->step when the last epoch end was done, or -1 */
  int recoveries;           /* membership changes survived */
  double el_failed_at;      /* dt_now() of the failure being recovered from, or 0 */
  int el_join;              /* a joiner: the generation it was admitted to (el_gen) */
  int el_partial;           /* a state copy into this worker was interrupted */
  int64_t vis_lo, vis_hi;   /* positions of the epoch this worker trains in the current step */
  int64_t plan_ep, plan_lo, plan_hi; /* the current step's global batch: epoch, positions */
  int64_t done_step, done_ep, done_lo, done_hi; /* the global batch of the step that took the
                                                 * state to step count done_step */
  int64_t t_sends, t_per_step, t_kill_at; /* DTRAIN_TEST_KILL phase lastsend: sends counted */
  int el_gen, el_source;
  int64_t el_pos;
  double el_join_t;         /* dt_now() when it was admitted */
  dt_ddp_fingerprint el_fp; /* dt__engine_el_fingerprint: fp, then the config text */
  char *el_blob;
  int64_t state_gen;        /* generation in which the state last changed (its tag with the position) */
  void *sb;                 /* the node's standby copy (standby.c), shared with the spares, or NULL */
  size_t sb_len;
};

/* The checkpoint root of a run writing to out_dir (ckpt.dir, else
 * out_dir/ckpt); 0 when the run takes no checkpoints. */
int dt__ckpt_root(const dt_engine *e, const char *out_dir, char *root, size_t cap);
/* Refuses (DT_EIO naming ckpt.dir) a root that cannot hold checkpoints. */
int dt__ckpt_check_root(dt_engine *e, const char *out_dir);
/* Start of a run, after the strategy's setup: the writer (rank 0) and a
 * resumed checkpoint's state; *pos is where the loop starts. */
int dt__ckpt_start(dt_engine *e, const char *out_dir, dt_ckpt_pos *pos);
/* Before every step: with per-rank state, rank 0 announces a checkpoint
 * it alone decides (a timer, a signal) with the step's gradients. */
void dt__ckpt_before_step(dt_engine *e);
/* After every step (pos: the next step). Rank 0 takes a checkpoint when
 * due; when the stop flag is up it writes one and returns DT_EABORTED. */
int dt__ckpt_after_step(dt_engine *e, const dt_ckpt_pos *pos);
/* After an epoch's records (pos: epoch + 1, step 0). Fails only when the
 * gathering of per-rank state (a collective) fails. */
int dt__ckpt_epoch_end(dt_engine *e, const dt_ckpt_pos *pos);
/* Elastic training giving up below min_workers: this worker writes a
 * checkpoint of its state at its last step boundary now (synchronously,
 * under ckpt.dir or out_dir/ckpt even when no ckpt.* trigger is set) and
 * names the directory in dir. */
int dt__ckpt_final(dt_engine *e, const char *out_dir, char *dir, size_t cap);
/* End of a run, whatever its outcome: waits for the writer, totals. */
void dt__ckpt_finish(dt_engine *e);
void dt__ckpt_resume_free(dt_ckpt_resume *r);
/* ckpt_state.c */
int dt__ckpt_snapshot(dt_engine *e, dt_ckpt_snap *s, const dt_ckpt_pos *p);
/* The file of rank r's per-rank state in a checkpoint ("worker-R.safetensors"). */
void dt__ckpt_rank_file(int r, char *file, size_t cap);
int dt__ckpt_export_model(dt_engine *e, dt_st *st);
int dt__ckpt_load_model(dt_engine *e, const dt_st *st, const char *what, int strict);
/* Checks st (a header: dt__st_parse_head) against e's model as
 * dt__ckpt_load_model does, copying nothing. */
int dt__ckpt_check_model(dt_engine *e, const dt_st *st, const char *what);
/* Reads the tensors of layers [first, last) of the resumed checkpoint's
 * model.safetensors straight into m's buffers (no copy of the file):
 * every rank its own (dt_strategy.params_load). */
int dt__ckpt_read_layers(void *resume, dt_model *m, int first, int last);
int dt__ckpt_read_trainer(dt_engine *e, dt_ckpt_resume *r, const uint8_t *text, size_t len);
int dt__ckpt_apply(dt_engine *e, dt_ckpt_resume *r);
/* A reader of the strategy's blobs (and other files) of checkpoint r. */
void dt__ckpt_reader(dt_ckpt_resume *r, dt_state_reader *out);
/* model.init: the weights of a safetensors file into the model. */
int dt__ckpt_model_init(dt_engine *e, const char *path);

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
/* A checkpoint taken since t0_ns (ok) or failed: counters, time, a span. */
void dt__eobs_ckpt(dt_engine *e, int64_t t0_ns, int ok);
/* Elastic: a new generation; its communicator records into the same page. */
void dt__eobs_membership(dt_engine *e, int generation);
/* End of the run: a failure recorded (and this rank's recorder dumped for a
 * communication failure), the trace written, the page closed. */
void dt__eobs_end(dt_engine *e, const char *out_dir, int rc, const char *msg);
/* ---- elastic training (elastic_run.c) ----------------------------------------- */

/* Fault points of DTRAIN_TEST_KILL. */
enum {
  DT_FAULT_FORWARD = 1,
  DT_FAULT_BACKWARD,
  DT_FAULT_ALLREDUCE,
  DT_FAULT_EVAL,
  DT_FAULT_CKPT,
  DT_FAULT_LASTSEND, /* before the last collective send of the step (a communicator hook) */
  DT_FAULT_REDUCED,  /* after the step's reduction completed, before the step is recorded */
};
/* Start of the loop; a joiner takes the job's state here and *start
 * becomes where it goes on. */
int dt__elastic_begin(dt_engine *e, dt_ckpt_pos *start);
void dt__elastic_end(dt_engine *e);
void dt__elastic_fault(const dt_engine *e, int phase);
void dt__elastic_step_begin(dt_engine *e);
void dt__elastic_visit(dt_engine *e, int epoch, int64_t lo, int64_t hi);
/* Whether rc (a failed collective) may be survived by re-forming. */
int dt__elastic_recoverable(const dt_engine *e, int rc);
/* The loop's position: 2 x steps taken, + 1 once that epoch's end is done. */
int64_t dt__elastic_pos(const dt_engine *e);
/* Re-forms over the next generation and says where the loop goes on:
 * *epoch and step *k (k = steps_per_epoch: the epoch's end; epoch beyond
 * the last: the run's end). in_step: the failure interrupted a step. */
int dt__elastic_recover(dt_engine *e, int in_step, int *epoch, int64_t *k);

/* After a completed step: the state's tag moves, and every
 * dist.standby_refresh_steps steps the standby copy is refreshed. */
void dt__elastic_step_done(dt_engine *e);
/* After an epoch's end (statistics, evaluation, record). */
void dt__elastic_epoch_done(dt_engine *e);

/* ---- the standby copy (standby.c) ------------------------------------------------ */

/* A shared anonymous mapping the size of parameters, buffers and optimizer
 * state, made before the node's workers and spares are forked (e->sb). */
int dt__standby_map(dt_engine *e);
void dt__standby_unmap(dt_engine *e);
/* The copy's random id (0: none). */
uint64_t dt__standby_region(const dt_engine *e);
/* Writes this worker's state and tag into the copy: 1 written, 0 it held
 * them already, -1 not possible now (another live writer holds the lock,
 * this worker holds no complete state). periodic: counted as a refresh,
 * else as a catch-up. */
int dt__standby_write(dt_engine *e, int periodic);
/* Copies the copy into this worker's model and optimizer: 1 and its tag
 * (*pos, *gen) if it was consistent, else 0 (the model then holds a torn
 * mix: e->el_partial stays set). */
int dt__standby_load(dt_engine *e, int64_t *pos, int64_t *gen);
/* Tests: sets the writer lock to lock_pid and, with make_odd, leaves the
 * copy as a writer killed mid-write does (sequence counter odd). */
void dt__standby_poke(dt_engine *e, int lock_pid, int make_odd);
/* Its refresh counters, for a log line. */
void dt__standby_describe(const dt_engine *e, char *buf, size_t cap);

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
/* Takes over the records of a run another rank 0 started (elastic
 * training, after rank 0 was lost): events.jsonl opened for appending. */
int dt__records_append(dt_records *r, const char *dir);
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

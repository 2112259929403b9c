/*
 * engine.h — training runs: from a typed run configuration the engine loads
 * the data set (normalised with train-set statistics), builds the model,
 * optimizer and learning-rate schedule, and runs one training loop
 * (train.c) over a batch source and a strategy (strategy.h): "local" for one
 * worker, "ddp" with a communicator of dist.workers ranks (docs/ddp.md:
 * balanced slices of every global batch, gradients averaged through
 * parallel/ddp.h, sharded evaluation), "ddp_det" with dist.deterministic
 * (fixed micro-shards summed in fixed point: the same bits for any worker
 * count, transport and algorithm). Rank 0 appends one JSON record per epoch
 * to DIR/events.jsonl and writes DIR/summary.json atomically at the end
 * (records.c).
 *
 * It does not parse configs or arguments (that is the cli layer), does not
 * print (progress goes to caller hooks) and does not start processes.
 */
#ifndef DT_ENGINE_H
#define DT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "data/data.h"
#include "nn/nn.h"

#define DT_CFG_PATH_MAX 1024
#define DT_CFG_SPEC_MAX 2048

enum dt_data_format { DT_FMT_IDX, DT_FMT_CSV, DT_FMT_NPY };
/* dist.transport: how workers talk (auto: shm inside a host, tcp between). */
enum dt_dist_transport { DT_DIST_AUTO, DT_DIST_SHM, DT_DIST_TCP, DT_DIST_MPI };
/* dist.reduce: the synchronised gradient is the global-batch mean (avg) or
 * the sum of every worker's own mean (sum, N times larger with N equal
 * slices — what frameworks that sum instead of average do). */
enum dt_dist_reduce { DT_DIST_AVG, DT_DIST_SUM };

/* The default data: Debian's dataset-fashion-mnist package. */
#define DT_FASHION_DIR "/usr/share/datasets/fashion-mnist"
/* The built-in default model (examples/fashion_cnn.ini). */
#define DT_DEFAULT_LAYERS                                                              \
  "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten "           \
  "linear(128) relu linear(10)"

/* Everything a run needs, with the defaults of docs/config.md filled in by
 * dt_run_cfg_defaults(). Plain data: copy it freely. */
typedef struct dt_run_cfg {
  /* [model] */
  char layers[DT_CFG_SPEC_MAX];
  /* [data] */
  int format;                          /* enum dt_data_format */
  char train_images[DT_CFG_PATH_MAX];  /* idx/npy: features; csv: the CSV file */
  char train_labels[DT_CFG_PATH_MAX];  /* idx/npy only */
  char test_images[DT_CFG_PATH_MAX];
  char test_labels[DT_CFG_PATH_MAX];
  int normalize;                       /* (x - mean) / std with train-set stats */
  int shuffle;                         /* reshuffle every epoch from (seed, epoch) */
  int64_t limit_train, limit_test;     /* use only the first N samples; 0 = all */
  int label_col;                       /* csv: label column, -1 = last */
  int shape[3];                        /* csv: (c,h,w) of a sample; 0,0,0 = (1,1,dim) */
  /* [optim] (lr is the schedule's base rate) */
  dt_optim_cfg optim;
  /* [train] */
  int epochs;
  int batch;
  uint64_t seed;
  int eval_every;                      /* evaluate every N epochs (and after the last) */
  /* [schedule] (base_lr and total_steps are filled in by the engine) */
  dt_sched_cfg sched;
  /* [dist] */
  int workers;
  int transport;                       /* enum dt_dist_transport */
  int64_t bucket_bytes;                /* gradient bucket cap */
  int reduce;                          /* enum dt_dist_reduce */
  int scale_lr;                        /* linear scaling rule: lr x batch / base_batch */
  int base_batch;                      /* the batch optim.lr was tuned for */
  int deterministic;                   /* bitwise-identical params for any worker count */
  int micro_batch;                     /* deterministic mode: samples per micro-shard */
} dt_run_cfg;

void dt_run_cfg_defaults(dt_run_cfg *cfg);

/* Progress of the current epoch, handed to the step hook after every step. */
typedef struct dt_progress {
  int epoch, epochs;                  /* 1-based epoch */
  int64_t step_in_epoch, steps_per_epoch;
  int64_t step;                       /* global steps done */
  double loss;                        /* mean train loss of this epoch so far */
  double samples_per_second;          /* this epoch so far, pure training time */
  double lr;
} dt_progress;

/* One epoch's record (also the line written to events.jsonl). */
typedef struct dt_epoch_report {
  int epoch;
  int64_t step;
  double train_loss, train_accuracy;
  int evaluated;                      /* test_* are valid only if set */
  double test_loss, test_accuracy;
  double samples_per_second;          /* this epoch, pure training time */
  double lr;                          /* at the last step of the epoch */
  double time;                        /* seconds since the run started */
} dt_epoch_report;

typedef struct dt_engine_hooks {
  void (*on_step)(void *ud, const dt_progress *p);      /* may be NULL */
  void (*on_epoch)(void *ud, const dt_epoch_report *r); /* may be NULL */
  void *ud;
} dt_engine_hooks;

/* One worker's share of a run (summary.json "per_worker"). */
typedef struct dt_worker_stats {
  double samples;                     /* samples this worker trained on */
  double samples_per_second;          /* samples / its own train_seconds */
  double train_seconds;
  double compute_seconds;             /* train_seconds minus waiting for communication */
  double comm_seconds;                /* communication thread busy in allreduce */
  double comm_hidden;                 /* fraction of comm_seconds overlapped with compute */
  double bytes_sent, bytes_received;
} dt_worker_stats;
#define DT_WORKER_STATS_FIELDS 8

/* What summary.json holds. */
typedef struct dt_run_summary {
  double test_accuracy, test_loss;
  int epochs;
  int64_t steps;
  int64_t train_samples;              /* samples trained on, all epochs */
  double train_seconds;               /* pure training time (no eval, no loading) */
  double samples_per_second;
  double gflops;                      /* achieved GFLOP/s of training steps */
  int workers;
  size_t params;
  char params_sha256[65];
  char config_sha256[65];
  int rank;                           /* this worker's rank (0 without a communicator) */
  dt_worker_stats self;               /* this worker's numbers */
} dt_run_summary;

typedef struct dt_engine dt_engine;

/* Validates cfg, loads and normalises the data and builds and initialises
 * the model. Every failure here is bad input (missing or corrupt file,
 * impossible model, unsupported setting): DT_E* with one dt_errmsg() line
 * naming the file or layer. Nothing is written to disk. */
int dt_engine_create(dt_engine **out, const dt_run_cfg *cfg);
int dt_engine_create_with_data(dt_engine **out, const dt_run_cfg *cfg, const dt_dataset *train,
                               const dt_dataset *test);
void dt_engine_destroy(dt_engine *e); /* NULL is a no-op */
int dt_engine_set_out_dir(dt_engine *e, const char *dir);
const char *dt_engine_strategy(const dt_engine *e);

/* Makes the engine one worker of a data-parallel job: c (borrowed, must
 * outlive every later call) must have dist.workers ranks. dt_engine_run and
 * dt_engine_evaluate then become collectives: every rank must call them. */
int dt_engine_set_comm(dt_engine *e, dt_comm *c);

/* Read-only views, valid for the engine's life. */
const dt_model *dt_engine_model(const dt_engine *e);
int64_t dt_engine_train_samples(const dt_engine *e);
int64_t dt_engine_test_samples(const dt_engine *e);

/* Trains. Creates out_dir (mkdir -p), writes out_dir/config.ini (config_text,
 * if not NULL; its SHA-256 is the summary's config hash), appends one record
 * per epoch to out_dir/events.jsonl and, only on success, writes
 * out_dir/summary.json via a temporary file, fsync and rename. *sum (may be
 * NULL) gets the summary. */
int dt_engine_run(dt_engine *e, const char *out_dir, const char *config_text,
                  const dt_engine_hooks *hooks, dt_run_summary *sum);

/* Evaluates the current model on the test set: mean loss and accuracy.
 * With a communicator each rank evaluates a contiguous shard and the sums
 * are allreduced, so every rank returns the same numbers. */
int dt_engine_evaluate(dt_engine *e, double *loss, double *accuracy);


/* mkdir -p; DT_EIO naming the path on failure. */
int dt_mkdirs(const char *path);

/* Writes data to path atomically: path.tmp, fsync, rename, fsync the
 * directory. */
int dt_write_file_atomic(const char *path, const void *data, size_t len);

#endif /* DT_ENGINE_H */

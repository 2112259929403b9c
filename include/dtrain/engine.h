/*
 * dtrain/engine.h — training runs: a run configuration (or data sets in
 * the caller's memory) in, a trained model, per-step and per-epoch
 * callbacks, and a summary out.
 *
 * An engine holds one run: the data (normalised with train-set statistics
 * when cfg.normalize is set), the model built from cfg.layers and
 * initialised from cfg.seed, the optimizer and the learning-rate schedule.
 * dt_engine_run trains it once with one loop whose distribution strategy
 * follows the configuration: "local" (one worker), "ddp" (cfg.workers > 1,
 * with a communicator: every global batch of cfg.batch samples split over
 * the workers, gradients averaged) or "ddp_det" (cfg.deterministic: fixed
 * micro-shards summed in fixed point, the same bits for any worker count).
 *
 * Output, optional: with an output directory DIR, rank 0 owns it for the
 * run (DIR/.lock, an flock held with its pid written in it; a second run on
 * DIR is refused naming that pid), writes DIR/config.ini (the config text
 * given), appends one JSON line per epoch to DIR/events.jsonl (started
 * empty), and at the end writes DIR/summary.json (status "succeeded")
 * atomically — or, when the run fails, DIR/failure.json (status "failed",
 * the message). A previous run's summary.json and failure.json are removed
 * when the run starts, so a directory never shows a stale success. Without
 * one (NULL), nothing is written.
 *
 * Errors follow dtrain/core.h: every function that can fail returns DT_OK
 * or a negative DT_E* code with a dt_errmsg() line naming the argument,
 * config key (as section.key), file, step or rank. Bad input never crashes
 * and never exits. Threads: an engine is used by one thread at a time;
 * several engines may train in one process (each with its own communicator).
 */
#ifndef DTRAIN_ENGINE_H
#define DTRAIN_ENGINE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the run configuration ------------------------------------------------------ */

#define DT_CFG_PATH_MAX 1024
#define DT_CFG_SPEC_MAX 2048
#define DT_CFG_MAX_STAGES 64

/* data.format */
enum dt_data_format { DT_FMT_IDX, DT_FMT_CSV, DT_FMT_NPY };
/* dist.transport: how workers talk (auto: shm inside a host, tcp between). */
enum dt_dist_transport { DT_DIST_AUTO, DT_DIST_SHM, DT_DIST_TCP, DT_DIST_MPI };
/* dist.reduce: the synchronised gradient is the global-batch mean (avg) or
 * the sum of every worker's own mean (sum, N times larger with N equal
 * slices — what frameworks that sum instead of average do). */
enum dt_dist_reduce { DT_DIST_AVG, DT_DIST_SUM };
/* dist.balance: how the global batch is cut between workers */
enum dt_dist_balance { DT_BALANCE_STATIC, DT_BALANCE_DYNAMIC, DT_BALANCE_STEAL };

/* The default data: Debian's dataset-fashion-mnist package. */
#define DT_FASHION_DIR "/usr/share/datasets/fashion-mnist"
/* The built-in default model (examples/fashion_cnn.ini). */
#define DT_DEFAULT_LAYERS                                                              \
  "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten "           \
  "linear(128) relu linear(10)"

/* Everything a run needs, one field per config key of docs/config.md (the
 * comments name the section). Plain data: start from dt_run_cfg_defaults
 * and change fields; copy it freely. Strings are NUL-terminated. */
typedef struct dt_run_cfg {
  /* [model] */
  char layers[DT_CFG_SPEC_MAX];        /* the layer spec (dtrain/model.h) */
  int loss;                            /* model.loss: 0 xent, 1 mse (one output vs the label) */
  /* [data] (ignored by dt_engine_create_with_data except normalize, shuffle, limits) */
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
  int epochs;                          /* >= 1 */
  int batch;                           /* global batch, >= 1 */
  uint64_t seed;                       /* initialisation, order, dropout */
  int eval_every;                      /* evaluate every N epochs (and after the last) */
  /* [schedule] (base_lr and total_steps are filled in by the engine) */
  dt_sched_cfg sched;
  /* [dist] */
  int workers;                         /* ranks of the job (1: no communicator) */
  int transport;                       /* enum dt_dist_transport (for launchers) */
  int64_t bucket_bytes;                /* gradient bucket cap; <= 0: 128 KiB */
  int reduce;                          /* enum dt_dist_reduce */
  int scale_lr;                        /* linear scaling rule: lr x batch / base_batch */
  int base_batch;                      /* the batch optim.lr was tuned for */
  int deterministic;                   /* bitwise-identical params for any worker count */
  int micro_batch;                     /* deterministic mode: samples per micro-shard */
  int balance;                         /* enum dt_dist_balance (stragglers) */
  float straggler_threshold;           /* flag a rank this fraction slower than the median */
  int balance_every;                   /* dynamic: re-plan the shares every N steps */
  /* pipeline parallelism (docs/pipeline.md) */
  int pipeline_stages;                 /* dist.pipeline_stages: P (1: no pipeline) */
  int schedule;                        /* dist.schedule: 0 gpipe, 1 1f1b */
  int micro_batches;                   /* dist.micro_batches: m per global batch */
  int stages[DT_CFG_MAX_STAGES];       /* model.stages: [0] = cut points, then each */
  int recompute;                       /* train.recompute: activation recomputation */
  int pipe_wgrad;                      /* -1: DTRAIN_PIPE_WGRAD; 0/1 (tests): weight
                                          gradients per micro-batch / deferred */
  /* [dist] gradient compression (docs/compress.md) */
  int compress;                        /* codec: 0 none, fp16, bf16, int8, qsgd, sign, topk, powersgd */
  int error_feedback;                  /* keep what a codec did not send for the next step */
  float compress_ratio;                /* topk: fraction of values sent */
  int qsgd_levels;                     /* qsgd: levels per sign (1..127) */
  int powersgd_rank;                   /* powersgd: rank of the approximation */
  int powersgd_warm_rank;              /* powersgd: rank of the first warm_steps steps (0: none;
                                        * -1: 6 below rank 6, none from it) */
  int64_t powersgd_warm_steps;         /* powersgd: steps at the warm rank; -1: two epochs */
  int compress_warmup_epochs;          /* topk: denser over the first epochs (DGC warm-up) */
  int64_t compress_start_step;         /* dense allreduce before this step; -1: the codec's
                                        * own (one epoch for powersgd below rank 6 without a
                                        * warm rank, two for sign and topk without
                                        * compress_momentum, 0 for the others) */
  float compress_clip;                 /* local L2 clip of each bucket's gradient (0: off) */
  float compress_momentum;             /* topk: DGC momentum correction (0: off) */
  int compress_force;                  /* compress even when every rank shares one host */
  int tcp_connections;                 /* dist.tcp_connections: per peer (0: DTRAIN_TCP_NCONN) */
  /* [obs] (docs/observability.md) */
  char obs_metrics[64];                /* "HOST:PORT" the launcher serves /metrics on; "" off */
  int obs_trace;                       /* write DIR/trace.json (Chrome trace events) */
  int obs_trace_steps;                 /* the trace keeps the spans of the last N steps */
  int obs_log_format;                  /* 0 text, 1 json (one object per log line) */
  /* [model] init: start from these weights (a safetensors file, e.g. one
   * PyTorch wrote: tools/torch_safetensors.py); "" = initialise from seed */
  char model_init[DT_CFG_PATH_MAX];
  /* [ckpt] checkpoints (docs/checkpoint.md); written by rank 0 only, and
   * only when the run has an output directory or ckpt_dir is set */
  char ckpt_dir[DT_CFG_PATH_MAX];      /* "" = <out>/ckpt */
  int64_t ckpt_every_steps;            /* every N optimizer steps; 0 = off */
  float ckpt_every_seconds;            /* at the first step boundary N s after the last; 0 = off */
  int ckpt_epoch_end;                  /* at the end of every epoch (default on) */
  int ckpt_on_signal;                  /* when the caller's stop flag is raised (SIGTERM/SIGINT) */
  int ckpt_keep;                       /* keep the newest N; 0 = all */
  int ckpt_async;                      /* written by a background thread (default on) */
  /* [ps] parameter server (docs/ps.md); used when servers > 0 or colocate */
  struct dt_run_ps_cfg {
    int servers;                       /* separate server processes (ranks after the workers) */
    int colocate;                      /* a server inside every worker instead */
    int consistency;                   /* 0 bsp, 1 ssp, 2 asp */
    int staleness;                     /* ssp: the bound s */
    int backup_workers;                /* bsp: a clock closes with workers - b pushes */
    float significance;                /* push only updates above this fraction of |param| */
    int replicas;                      /* servers holding each key range (0 or 1: no replicas) */
  } ps;
  int zero;                            /* dist.zero: 1 = optimizer state sharded (ZeRO-1) */
  /* [dist] elastic training (docs/elastic.md) */
  int min_workers;                     /* 0: not elastic (a lost worker ends the job) */
  int max_workers;                     /* 0: dist.workers */
  float rejoin_timeout;                /* below min_workers: wait this long, seconds */
  float heartbeat_timeout;             /* a silent member is dead after this, seconds */
  int replace;                         /* dist.replace: spare workers replace lost ones */
  int standby;                         /* dist.standby: spare workers forked at start */
  int standby_refresh_steps;           /* spares' copy of the state refreshed every N steps (0: none) */
} dt_run_cfg;

/* Fills *cfg with the defaults of docs/config.md: the 2-conv CNN on
 * Fashion-MNIST (DT_FASHION_DIR), SGD with momentum 0.9 at lr 0.05, weight
 * decay 5e-4, a cosine schedule, 15 epochs of batch 64, seed 42, one
 * worker. A NULL cfg is a no-op. */
DT_API void dt_run_cfg_defaults(dt_run_cfg *cfg);

/* ---- what a run reports --------------------------------------------------------- */

/* Progress of the current epoch, handed to the step callback after every step. */
typedef struct dt_progress {
  int epoch, epochs;                  /* 1-based epoch */
  int64_t step_in_epoch, steps_per_epoch;
  int64_t step;                       /* global steps done */
  double loss;                        /* mean train loss of this epoch so far (this worker) */
  double samples_per_second;          /* this epoch so far, pure training time */
  double lr;
} dt_progress;

/* One epoch's record (also the line written to events.jsonl). */
typedef struct dt_epoch_report {
  int epoch;
  int64_t step;
  double train_loss, train_accuracy;  /* over every worker */
  int evaluated;                      /* test_* are valid only if set */
  double test_loss, test_accuracy;
  double samples_per_second;          /* this epoch, pure training time */
  double lr;                          /* at the last step of the epoch */
  double time;                        /* seconds since the run started */
} dt_epoch_report;

/* Callbacks, called on the thread that called dt_engine_run, between steps
 * (they may print; they must not call back into the engine). Either may be
 * NULL. ud is passed back unchanged. */
typedef struct dt_engine_hooks {
  void (*on_step)(void *ud, const dt_progress *p);
  void (*on_epoch)(void *ud, const dt_epoch_report *r);
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
  double cpu_seconds;                 /* CPU time (user + system, every thread) of this worker's
                                       * process from the first step to the end (evaluations
                                       * included): what a loaded machine disturbs least */
  double peak_rss_bytes;              /* the process's peak resident memory (VmHWM, getrusage
                                       * ru_maxrss) at the end of the run, pages inherited
                                       * from the process that forked it included */
} dt_worker_stats;
#define DT_WORKER_STATS_FIELDS 10

/* What summary.json holds (the main fields). */
typedef struct dt_run_summary {
  double test_accuracy, test_loss;
  int epochs;
  int64_t steps;
  int64_t train_samples;              /* samples trained on, all epochs, all workers */
  double train_seconds;               /* pure training time of the slowest worker */
  double samples_per_second;
  double gflops;                      /* achieved GFLOP/s of training steps */
  int workers;
  size_t params;
  char params_sha256[65];             /* SHA-256 of the parameters (little-endian f32), hex */
  char config_sha256[65];             /* SHA-256 of the config text given to dt_engine_run */
  int rank;                           /* this worker's rank (0 without a communicator) */
  dt_worker_stats self;               /* this worker's numbers */
} dt_run_summary;

/* ---- engines -------------------------------------------------------------------- */

typedef struct dt_engine dt_engine;

/* Creates an engine from cfg (copied): loads the data files it names,
 * normalises them, builds and initialises the model. Every failure is bad
 * input and nothing is written to disk: DT_EINVAL if out or cfg is NULL or
 * a setting is out of range (the message names it as section.key: e.g.
 * "train.batch = 0: expects at least 1"), the model spec is wrong
 * ("model.layers: layer 3 ...") or does not fit the data (feature shape, or
 * fewer outputs than classes); DT_ENOENT / DT_EIO / DT_ECORRUPT naming a
 * data file; DT_ENOMEM. On success *out is the caller's (dt_engine_destroy);
 * on failure *out is NULL (if out is not NULL). With cfg.workers = 1 the
 * engine starts a loader thread; with more workers it starts none, so a
 * process may create the engine once and fork its workers. */
DT_API int dt_engine_create(dt_engine **out, const dt_run_cfg *cfg);

/* Like dt_engine_create, but the data sets are the caller's (from files
 * the caller read, or dt_dataset_from_memory); cfg's data paths, format,
 * label_col and shape are ignored. The engine copies both sets (the caller
 * keeps and frees its own, and they need not outlive the call). Checks:
 * DT_EINVAL naming "train" or "test" if one is NULL, empty (n < 1, x or y
 * NULL), has a shape c x h x w that is not dim, or a negative label; if
 * train and test samples differ in shape; if the model does not take the
 * samples' shape or has fewer outputs than the labels have classes (the
 * largest label + 1, whatever nclasses says). */
DT_API int dt_engine_create_with_data(dt_engine **out, const dt_run_cfg *cfg,
                                      const dt_dataset *train, const dt_dataset *test);

/* Frees the engine, its data, model and optimizer, and releases its output
 * directory's lock. It does not destroy the communicator. NULL is a no-op. */
DT_API void dt_engine_destroy(dt_engine *e);

/* Makes the engine one worker of a data-parallel job: c (borrowed: it must
 * outlive every later call on the engine) must have cfg.workers ranks.
 * dt_engine_run and dt_engine_evaluate then become collectives: every rank
 * must call them. DT_EINVAL if e or c is NULL, the sizes differ, or the
 * engine already ran. */
DT_API int dt_engine_set_comm(dt_engine *e, dt_comm *c);

/* Claims dir as the output directory of the coming run now (rather than in
 * dt_engine_run): creates it (mkdir -p), takes DIR/.lock and removes a
 * previous run's summary.json and failure.json. A launcher calls it before
 * forking its workers, so the lock is held by the job and a second job on
 * dir is refused before any worker starts. The lock is released by
 * dt_engine_destroy (and when every process holding it has exited).
 * DT_EINVAL if e or dir is NULL, dir is empty or too long, or the engine
 * already ran; DT_EIO naming the path if it cannot be made; DT_EAGAIN if
 * another run holds it ("... in use by another run (pid N holds its
 * .lock)"). */
DT_API int dt_engine_set_out_dir(dt_engine *e, const char *dir);

/* Trains: cfg.epochs epochs of ceil(train samples / cfg.batch) steps, an
 * evaluation every cfg.eval_every epochs and after the last, the callbacks
 * (hooks may be NULL; with a communicator give them on rank 0 only if only
 * rank 0 should report). out_dir: the output directory (see the top of this
 * file; NULL = write nothing; only rank 0 writes; the directory claimed by
 * dt_engine_set_out_dir if it is the same string). config_text (may be
 * NULL) is written to DIR/config.ini and its SHA-256 is the summary's
 * config_sha256; with a communicator every rank must pass the same text.
 * *sum (may be NULL) gets the summary on success.
 *
 * An engine runs once: a second call is DT_EINVAL "engine already ran".
 * Errors: DT_EINVAL (NULL engine; cfg.workers > 1 without a communicator),
 * DT_EIO / DT_EAGAIN for the output directory (as dt_engine_set_out_dir),
 * DT_ERANGE when training diverges (a loss or gradient norm that is not
 * finite — naming the step, and the first layer with a non-finite gradient —
 * or an epoch's train loss above 1e6 or 1e3 times epoch 1's), and with a
 * communicator DT_EMISMATCH (ranks with different configurations or
 * parameters), DT_EPEERLOST / DT_ETIMEDOUT naming the rank. */
DT_API int dt_engine_run(dt_engine *e, const char *out_dir, const char *config_text,
                         const dt_engine_hooks *hooks, dt_run_summary *sum);

/* Continues from a checkpoint in the coming dt_engine_run (docs/checkpoint.md).
 * path is a checkpoint directory (step-NNNNNNNN), a checkpoint root (holding
 * step-* and `latest`) or a run directory (holding ckpt/). The newest valid
 * checkpoint is chosen; damaged, truncated or half-written ones are skipped
 * with a warning naming them (an explicit checkpoint that is damaged falls
 * back to an older one). Its config fingerprint must match the engine's:
 * another model, data set, batch, seed, optimizer or schedule is refused
 * with DT_EMISMATCH naming the key; train.epochs and the worker count may
 * change. The weights are loaded at once; the optimizer state and the
 * position (epoch, step, data cursor) are applied after the strategy's
 * setup. DT_ENOENT when there is no valid checkpoint, DT_ENOTSUP for a
 * newer checkpoint format. Call before dt_engine_run (before forking
 * workers, so each inherits it). */
DT_API int dt_engine_resume(dt_engine *e, const char *path);

/* The checkpoint directory dt_engine_resume chose (and its step in *step),
 * or NULL. Owned by the engine. */
DT_API const char *dt_engine_resumed_from(const dt_engine *e, int64_t *step);

/* A flag the run reads at every step boundary (set by a SIGTERM/SIGINT
 * handler, say). When it is nonzero, rank 0 writes a checkpoint
 * (ckpt.on_signal) and dt_engine_run returns DT_EABORTED naming it; the
 * other ranks ignore the flag and end when rank 0 has left (a lost peer),
 * so the checkpoint is always of a step every rank finished. NULL: none.
 * The flag is borrowed for the engine's life. */
DT_API int dt_engine_set_stop_flag(dt_engine *e, const volatile sig_atomic_t *flag);

/* Evaluates the current model on the test set: mean loss and accuracy.
 * With a communicator each rank evaluates its part and the sums are
 * combined, so every rank returns the same numbers (a collective). Before
 * dt_engine_run it evaluates the initial model. DT_EINVAL if an argument is
 * NULL. */
DT_API int dt_engine_evaluate(dt_engine *e, double *loss, double *accuracy);

/* Read-only views, valid for the engine's life; NULL / 0 for a NULL engine.
 * The model's parameters change during dt_engine_run. */
DT_API const dt_model *dt_engine_model(const dt_engine *e);
DT_API int64_t dt_engine_train_samples(const dt_engine *e);
DT_API int64_t dt_engine_test_samples(const dt_engine *e);
/* The strategy's name: "local", "ddp" or "ddp_det" (static storage). */
DT_API const char *dt_engine_strategy(const dt_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_ENGINE_H */

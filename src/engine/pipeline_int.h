/*
 * pipeline_int.h — the pipeline strategy's own state, shared by
 * strategy_pipeline.c (setup, steps, checkpoints) and pipeline_parts.c
 * (what a stage does about the parts of the model it does not hold: the
 * start, evaluation through the stages, the end's checks and hash). Not
 * for other files.
 */
#ifndef DT_ENGINE_PIPELINE_INT_H
#define DT_ENGINE_PIPELINE_INT_H

#include "engine/strategy.h"
#include "parallel/partition.h"
#include "parallel/pipe.h"

typedef struct pipe_impl {
  dt_partition part;
  int P, R, stage, replica;
  dt_comm *pcomm;    /* this replica's stages (rank = stage); NULL with P = 1 */
  dt_comm *scomm;    /* this stage over the replicas (rank = replica); NULL with R = 1 */
  dt_pipe *pipe;
  dt_pipe_cfg pc;     /* the stage's configuration (evaluation models are made from it) */
  int det;           /* deterministic mode */
  dt_ddp *ddp;       /* det: the stage's fixed-point sums over its replicas */
  dt_ddp *rddp;      /* R > 1, not det: the stage's gradient buckets over its replicas */
  float *xstep;      /* det: this step's micro-shards, side by side */
  int32_t *ystep;
  dt_optim *optim;   /* over this stage's span */
  dt_pipe_mb *mb;
  float *loss;
  int *correct;
  dt_step_plan plan;
  uint64_t sent0, recv0;
  double reduce_s;
  double agree_s;    /* waiting in the per-step checkpoint agreement (pipe_gather) */
  double opt_s;      /* the optimizer steps on the stage's span */
  int64_t nsteps;    /* steps of this run */
  size_t act_bytes;  /* this stage's activation memory (dt_pipe_act_bytes) */
  /* checkpoints, rank 0 (pipeline_ckpt.c): the other stages' state goes
   * to a spill file (two alternate), never to memory */
  int ck_fd[2], ck_cur;
  dt_ckpt_range *ck_range;  /* 2 P: the spilled spans of parameters and buffers */
  uint64_t *ck_ooff;        /* P: byte of stage t's optimizer state in the spill */
  float *ck_buf;            /* one chunk */
  dt_ckpt_spill ck_spill;
  char ck_err[256];         /* the spill's write failed: this checkpoint is not taken */
  /* dist.zero with replicas (pipeline_zero.c): the stage's optimizer
   * state sharded over its R replicas: replica r steps block r of the
   * stage's span (zblk parameters; optim holds its state), every replica
   * the tail [ztail0, n) (otail), then an allgather over scomm */
  int zero;
  size_t zblk, ztail0, zntail;
  dt_optim *otail;
  float *zfull;      /* replica 0 at a checkpoint: the stage's whole state (slots x n) */
  int64_t *ck_ostep; /* P */
} pipe_impl;

/* A communication error with the lost rank's place in the pipeline added
 * (strategy_pipeline.c). */
int dt__pipe_name_lost(dt_strategy *s, int rc);
int dt__pipe_comm_err(dt_strategy *s, int rc, const char *what);

/* pipeline_zero.c. The stage's optimizers (d->optim over its span, or
 * with dist.zero over its block and tail); the step of the stage's span
 * (params, g: its reduced gradient); optimizer floats per parameter; the
 * step count; at a checkpoint (collective over the stage's replicas) the
 * stage's whole state, slot-major, on replica 0 (*state; others get NULL);
 * a resumed checkpoint's state for the stage's part. */
int dt__pipe_optim_create(dt_strategy *s, pipe_impl *d);
int dt__pipe_optim_step(dt_strategy *s, pipe_impl *d, float *params, const float *g, float lr);
size_t dt__pipe_optim_slots(const pipe_impl *d);
int64_t *dt__pipe_optim_count(pipe_impl *d);
int dt__pipe_optim_whole(dt_strategy *s, pipe_impl *d, const float **state);
int dt__pipe_optim_import(dt_strategy *s, pipe_impl *d, const dt_state_reader *r);
void dt__pipe_optim_destroy(pipe_impl *d);

/* pipeline_ckpt.c: ops.state_gather and ops.state_export (checkpoints
 * without the other stages' state in rank 0's memory); freed at teardown. */
int dt__pipe_gather(dt_strategy *s, int32_t *flags);
int dt__pipe_export(dt_strategy *s, const dt_state_writer *w);
void dt__pipe_ckpt_free(pipe_impl *d);

/* pipeline_parts.c. Start (after the partition): the configuration checked
 * on every rank; with P > 1 this stage's span initialised when the engine
 * left it (s->params_lazy) and replica 0's span broadcast to the stage's
 * other replicas; with P = 1 the whole model broadcast as ddp does. */
int dt__pipe_start(dt_strategy *s, pipe_impl *d);
/* ops.evaluate: with P > 1 the test set forward through the stages. */
int dt__pipe_evaluate(dt_strategy *s, const dt_dataset *test, int chunk, dt_tally *t);
/* End of a run with P > 1: every replica's span of each stage checked
 * equal, the whole model's SHA-256 made from the stages' spans in order
 * (s->params_hashed). */
int dt__pipe_end_check(dt_strategy *s, pipe_impl *d);

#endif /* DT_ENGINE_PIPELINE_INT_H */

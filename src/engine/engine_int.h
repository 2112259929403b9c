/*
 * engine_int.h — the engine's own view of itself, shared by train.c (the
 * loops) and train_det.c (deterministic mode's micro-shard step and
 * evaluation). Not for other layers: they use engine.h.
 */
#ifndef DT_ENGINE_INT_H
#define DT_ENGINE_INT_H

#include "data/data.h"
#include "engine/engine.h"
#include "parallel/ddp.h"

struct dt_engine {
  dt_run_cfg cfg;
  dt_dataset train, test;
  dt_model *model;
  dt_optim *optim;
  dt_loader *loader;
  dt_sched_cfg sched;
  int64_t steps_per_epoch;
  float mean, std; /* normalisation applied (0, 1 if none) */
  /* data parallel (workers > 1, or deterministic mode with any workers) */
  dt_comm *comm;     /* NULL: one worker */
  int rank, nranks;
  int64_t *order;    /* the epoch's global order */
  float *xbuf;       /* this worker's slice (or micro-shard) of a global batch */
  int32_t *ybuf;
};

/* What one worker did in one deterministic step. */
typedef struct dt__det_step_out {
  int n;            /* samples this worker trained on */
  int global;       /* samples in the global batch */
  int64_t loss_fix; /* sum over its micro-shards of loss x samples, fixed point */
  int correct;
  int loss_bad;     /* some micro-shard's loss was not finite */
} dt__det_step_out;

/* Deterministic mode, global batch k of the current epoch order at global
 * step `step`: this worker's micro-shards through forward and backward into
 * ddp's fixed-point sums, then the reduction (dt_ddp_finish_step). On
 * return the gradient buffer holds the global gradient, identical on every
 * rank and for any worker count. */
int dt__det_step(dt_engine *e, dt_ddp *ddp, int64_t k, int64_t step, dt__det_step_out *out);

/* Deterministic evaluation: the test set in fixed chunks of train.batch,
 * whole chunks per rank, loss in fixed point and integer counts, so loss and
 * accuracy have the same bits for any worker count. */
int dt__det_evaluate(dt_engine *e, double *loss, double *accuracy);

#endif /* DT_ENGINE_INT_H */

/*
 * pipe.h — one pipeline stage: its layers of the model (as stage models
 * over the whole model's parameter, gradient and state buffers, one per
 * micro-batch in flight) and one step of a schedule over m micro-batches,
 * with activations sent to the next stage and their gradients back over a
 * communicator (isend, so transfers overlap the next computation; blocking
 * receives). Schedules:
 *  - gpipe: every micro-batch forward, then every one backward (m in flight);
 *  - 1f1b: P-1-s+e warm-up forwards on stage s < P-1 (e = cfg.warm_extra),
 *    none on the last, then one forward one backward, then the drain (at
 *    most P-s+e micro-batches in flight on stage s, 1 on the last).
 * Any m >= 1 works with any number of stages. The stage's gradients are the
 * sum over micro-batches of n_j / n_global times each micro-batch's mean
 * gradient (accumulated in place: dt__model_set_accum), so one optimizer
 * step afterwards is the step of the whole batch. Each micro-batch's loss
 * and correct count travel back with its gradients, so every stage knows
 * them. With recompute only one set of activations exists: each stage keeps
 * its micro-batches' inputs and repeats the forward before the backward
 * (dropout masks are counter-based, batch-norm running statistics are
 * restored after the repeat), except for a trailing linear layer (and a
 * relu after it) on stages before the last, whose backward needs only the
 * output still in the stage's send slot; gpipe's last stage runs each
 * forward only with its backward, as soon as the activations are in.
 *
 * It does not choose the partition (partition.h), reduce gradients over
 * replicas or step the optimizer (the pipeline strategy does).
 */
#ifndef DT_PARALLEL_PIPE_H
#define DT_PARALLEL_PIPE_H

#include <stdint.h>

#include "comm/comm.h"
#include "nn/nn.h"

enum dt_pipe_schedule { DT_PIPE_GPIPE = 0, DT_PIPE_1F1B = 1 };

typedef struct dt_pipe_cfg {
  const char *spec;       /* the whole model's spec, input (c,h,w) */
  int c, h, w;
  int l0, l1;             /* this stage's layers [l0, l1) */
  size_t param_off, buf_off, nbufs; /* its spans in the whole model's buffers */
  int stage, nstages;     /* stage = this rank in comm */
  int schedule;           /* enum dt_pipe_schedule */
  int micro;              /* most micro-batches per step (m) */
  int max_batch;          /* most samples per micro-batch */
  int recompute;
  int rc_rows;            /* recompute: rows of deferred weight gradients kept (pipe.c) */
  int wgrad;              /* deferred weight gradients (pipe.c) unless 0 */
  int wpack;              /* forward weights packed once per step (nn.h dt__wpack) unless 0 */
  int warm_extra;         /* 1f1b: extra warm-up forwards on stages before the last */
  int tail;               /* the step's last weight-gradient flush on two threads (pipe.c) unless 0 */
  int det;                /* deterministic mode: see dt_pipe_set_det */
  dt_model *whole;        /* lends its parameters and state; must outlive the pipe */
  dt_comm *comm;          /* rank = stage; NULL with one stage */
} dt_pipe_cfg;

/* One micro-batch: x on the first stage, y on the last (others may be NULL). */
typedef struct dt_pipe_mb {
  const float *x;
  const int32_t *y;
  int n;
  int64_t sample0;        /* epoch position of its first sample (dropout keys) */
  int shard;              /* deterministic mode: samples per micro-shard */
} dt_pipe_mb;

typedef struct dt_pipe dt_pipe;

int dt_pipe_create(dt_pipe **out, const dt_pipe_cfg *cfg);
void dt_pipe_destroy(dt_pipe *p);

/* One step over mb[0..m) (m <= cfg.micro, every n >= 1; every stage passes
 * the same sizes): the stage's gradients become the n_global-weighted sum
 * described above; loss[j] and correct[j] are filled on every stage. Errors
 * name this stage and rank, the peer stage and rank, and the micro-batch. */
int dt_pipe_step(dt_pipe *p, const dt_pipe_mb *mb, int m, int n_global, uint64_t seed,
                 uint64_t step, float *loss, int *correct);

/* Hybrid data x pipeline: fn(ud, off, n) is called once per step for
 * every span of the stage model's gradient (offsets in dt_pipe_model's
 * parameters) as soon as it is final, from dt_pipe_step after every send of
 * the step was delivered: with deferred weight gradients each linear
 * layer's right after its product, last layer first, so a reduction of
 * the spans over the replicas (parallel/ddp.h dt_ddp_grad_ready) overlaps
 * the products still to come. fn NULL: no reports. Not in deterministic
 * mode (dt_pipe_set_det). */
void dt_pipe_set_ready(dt_pipe *p, dt_grad_ready_fn fn, void *ud);
/* After the caller moved the stage model's gradients (dt_model_set_grads on
 * dt_pipe_model, e.g. into ddp's shared window): the stage's other models
 * write there too. */
void dt_pipe_grads_moved(dt_pipe *p);

/* Deterministic mode (cfg.det): every micro-batch is a run of fixed
 * micro-shards (mb.shard samples each, the last may be shorter); each
 * micro-shard goes forward and backward on its own, as in ddp_det (an extra
 * forward per micro-shard: the backward repeats it), and its gradient and
 * running statistics go to ddp's fixed-point sums (dt_ddp_det_shard,
 * dt_ddp_grad_ready), so the stage's reduced gradient has the bits of
 * ddp_det's for any P, m, schedule and replica count. ddp must be made with
 * dt_ddp_create_det over dt_pipe_model(p) and outlive the pipe's steps; the
 * caller begins and finishes its steps. */
struct dt_ddp;
void dt_pipe_set_det(dt_pipe *p, struct dt_ddp *ddp);

/* The stage model that owns the stage's gradients (stage-sized, its own;
 * for reductions over replicas and the optimizer step). */
dt_model *dt_pipe_model(dt_pipe *p);

/* Bytes this stage holds for activations: its stage models' activation
 * memory plus the input and send slots. */
size_t dt_pipe_act_bytes(const dt_pipe *p, int *models, int *slots);

/* Seconds this stage spent computing and waiting for its neighbours over
 * every step so far (the bubble is the waiting share). */
void dt_pipe_times(const dt_pipe *p, double *compute_s, double *wait_s);
/* The same seconds by phase: compute = fwd + bwd + pack + wgrad (bwd:
 * backwards, recomputation and the rest), wait = recv + send. */
typedef struct dt_pipe_phase {
  double fwd, bwd, pack, wgrad, recv, send;
} dt_pipe_phase;
void dt_pipe_phases(const dt_pipe *p, dt_pipe_phase *ph);

/* ---- evaluation through the stages (pipe_eval.c) ---- */

/* A stage's forward-only evaluation: its layers of cfg (the same cfg as
 * its dt_pipe's) at up to rows samples per chunk, over cfg->whole's span
 * of the parameters and running statistics; loss: the whole model's loss
 * (dt__model_set_loss; 0 = the default). Made for one evaluation and
 * destroyed after (its activations are one chunk's). */
typedef struct dt_pipe_eval dt_pipe_eval;
int dt_pipe_eval_create(dt_pipe_eval **out, const dt_pipe_cfg *cfg, int rows, int loss);
void dt_pipe_eval_destroy(dt_pipe_eval *e);
/* Called on the last stage for every chunk: its mean loss, samples and
 * correct count, in sample order. */
typedef void (*dt_pipe_eval_fn)(void *ud, float loss, int n, int correct);
/* Samples [lo, hi) forward in chunks of rows, from lo (x read on stage 0,
 * y on the last stage; every stage of the replica passes the same lo and
 * hi); fn on the last stage. Errors name this stage, the peer and the
 * chunk. */
int dt_pipe_eval_run(dt_pipe_eval *e, const float *x, const int32_t *y, int64_t lo, int64_t hi,
                     dt_pipe_eval_fn fn, void *ud);

/* Tests: the helper thread (dt_pipe_cfg.tail) sleeps this long before
 * each job, so a caller that did not wait for it would see it unfinished. */
extern int dt__pipe_tail_delay_us;
/* Tests: >= 0 puts the last stage's offloaded product (DTRAIN_PIPE_OFFLOAD)
 * before its own layers from this index down (0: after all of them). */
extern int dt__pipe_offload_at;

#endif /* DT_PARALLEL_PIPE_H */

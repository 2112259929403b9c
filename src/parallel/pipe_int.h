/*
 * pipe_int.h — inside one pipeline stage (pipe.c), shared with the
 * offload of stage 0's first weight gradient to the last stage
 * (pipe_offload.c): the stage's state, its message tags and the waits
 * that time and name their failures.
 */
#ifndef DT_PARALLEL_PIPE_INT_H
#define DT_PARALLEL_PIPE_INT_H

#include <pthread.h>

#include "core/core.h"
#include "obs/obs.h"
#include "parallel/ddp.h"
#include "parallel/pipe.h"

#define TAG_ACT 0x100000
#define TAG_GRAD 0x200000
#define TAG_OX 0x300000  /* offload: stage 0's first linear layer's input rows of micro-batch j */
#define TAG_ODY 0x400000 /* ... and its output gradient rows */
#define TAG_ODW 0x500000 /* ... and back, the step's weight gradient of that layer */
#define MAX_SLOTS 65536

struct dt_pipe {
  dt_pipe_cfg c;
  dt_obs *obs;               /* the waits below as spans and histograms (docs/observability.md) */
  dt_obs_metric *m_send, *m_recv;
  int K, S;                  /* stage models, slots */
  dt_model **inst;           /* K models of this stage */
  int *inst_mb;              /* micro-batch whose activations model k holds (-1: none) */
  size_t in_dim, out_dim;
  float **in;                /* S input slots (stages after the first) */
  float **aout, **gout;      /* S send slots: activations, gradients (+2) */
  float *gin;                /* received gradients (+2) */
  float *bufsave;            /* recompute: the stage's running statistics */
  dt_comm_req *areq, *greq;  /* S pending sends each */
  int *apend, *gpend;
  const float **xin;         /* per micro-batch of the step: its input */
  dt_ddp *ddp;               /* deterministic mode: the fixed-point sums */
  int nshards_left;          /* deterministic mode: micro-shards still to go back */
  dt__wstash *wst;           /* deferred weight gradients (NULL: per micro-batch) */
  dt__wpack *wpk;            /* forward weights packed once per step (NULL: per product) */
  int wcap, wrows, wflushed; /* stash rows, rows stashed since the last flush, flushes this step */
  int G;                     /* gpipe recompute: micro-batches recomputed and backward at once */
  float *xg;                 /* G > 1, stages after the first: a group's inputs, contiguous */
  double compute_s, wait_s;
  /* parts of compute_s and wait_s (dt_pipe_phases): forwards, weight
   * packing, deferred weight gradients; receives, send completions */
  double fwd_s, pack_s, wgrad_s, recv_s, send_s;
  dt_grad_ready_fn ready;    /* the stage's gradient spans, once final each step */
  void *ready_ud;
  /* a helper thread on stages before the last (DTRAIN_PIPE_TAIL), for
   * work the stage's thread need not wait for at once, run while the next
   * stage has nothing to do: part 1 of the step's last weight-gradient
   * flush (dt__model_wgrad_flush_part) while the stage's thread makes part
   * 0; the step's weight packing, layer by layer, forward forms first,
   * while the step's first forwards run (each waits for its layer's form,
   * the first backward for the whole job) */
  int tail_on, tail_quit;
  pthread_t tail;
  pthread_mutex_t tail_mu;
  pthread_cond_t tail_cv;
  uint64_t tail_gen, tail_done; /* jobs posted, jobs finished */
  int tail_kind, tail_rows, tail_acc;
  uint64_t pack_gen;            /* the packing job the first backward waits for (0: none) */
  /* DTRAIN_PIPE_OFFLOAD (2 stages): stage 0's first linear layer's weight
   * gradient made by the last stage, which idles while stage 0 finishes
   * its step (dt_pipe_create says where it applies). Stage 0 (off = 1)
   * sends each micro-batch's stashed rows of that layer after its
   * backward and receives the step's product into its gradient in place
   * of making it; the last stage (off = 2) receives the rows into ox /
   * ody (irecvs posted at the step's start) and makes the product in the
   * middle of its own flush, after its layers from ocut up. */
  int off, olayer, oC, oOC, ocut;
  float *ox, *ody, *odw;
  dt_comm_req *oreq;            /* 2 per micro-batch (rows), then 1 (the product) */
  int *opend;
  int oleak;                    /* receives left pending by an error: buffers not freed */
  int lazy;                     /* gpipe recompute, the last stage: forwards only in backward */
};

/* pipe.c: a communication failure naming both ends; a pending send's
 * completion and a blocking receive, each timed as waiting (send / recv) */
int dt__stage_comm_err(dt_pipe *p, int rc, const char *what, int j, int peer);
int dt__stage_wait_send(dt_pipe *p, dt_comm_req *req, int *pend, int peer, int j);
int dt__stage_recv_msg(dt_pipe *p, int peer, int tag, void *buf, size_t bytes, int j,
                       const char *what);

/* pipe_offload.c (DTRAIN_PIPE_OFFLOAD; p->off says the role: 0 none, 1
 * stage 0, 2 the last stage): _setup decides and allocates at create;
 * _post, on the last stage at the step's start, the receives of the
 * step's rows; _send, on stage 0 after micro-batch j's backward, its
 * rows; _flush, both, the step's weight gradients with the offloaded
 * product; _drain, both, its sends finished at the step's end (rc: the
 * step's result so far, returned unless it was DT_OK); _free at destroy. */
int dt__pipe_offload_setup(dt_pipe *p);
int dt__pipe_offload_post(dt_pipe *p, const dt_pipe_mb *mb, int m);
int dt__pipe_offload_send(dt_pipe *p, int j, int row0, int n);
int dt__pipe_offload_flush(dt_pipe *p, int m);
int dt__pipe_offload_drain(dt_pipe *p, int rc);
void dt__pipe_offload_free(dt_pipe *p);

#endif /* DT_PARALLEL_PIPE_INT_H */

/*
 * ddp_int.h — the data-parallel gradient exchange's state, shared by its two
 * files: ddp.c (buckets, the communication thread, float allreduce through a
 * window, the transport or a codec) and ddp_det.c (deterministic mode: the
 * fixed-point accumulator, gradient slots, the fused weight-gradient
 * conversion, work stealing's hooks). Not an API: include only from those.
 */
#ifndef DT_PARALLEL_DDP_INT_H
#define DT_PARALLEL_DDP_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/compress/compress.h"
#include "comm/window.h"
#include "core/core.h"
#include "nn/nn.h"
#include "parallel/ddp.h"
#include "parallel/steal.h"

typedef struct bucket {
  size_t off, n;  /* span in the gradient buffer (floats) */
  int layers;     /* layers with parameters inside */
  int pending;    /* of those, not yet reported this step */
  int queued;
} bucket;

struct dt_ddp {
  dt_model *model;
  dt_comm *comm;
  dt_comm_window *win;     /* the gradients live here when ranks share a host */
  float *grads;
  bucket *b;
  int nb;
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;       /* work queued, step begun, stop */
  pthread_cond_t done_cv;  /* a bucket finished */
  int *queue;              /* bucket indices in the order they became ready */
  int qlen, qnext, ndone;
  int stop;
  int overlap;             /* 0: no thread, buckets reduced in finish_step */
  float scale;
  int err;
  char errmsg[512];
  dt_ddp_stats st;
  dt_compress *cz;         /* compressed buckets (NULL: plain allreduce) */
  dt_window_apply_fn apply; /* dt_ddp_set_apply: each rank updates its slice (NULL: allreduce) */
  void *apply_ud;
  /* deterministic mode */
  int det;
  size_t nparams, nbufs, head; /* nbufs + 1 (the overflow count), rounded up to 8 */
  int64_t *acc;                /* head, then nparams gradient sums */
  int acc_in_win;              /* acc is the shared window's memory (one host) */
  /* DTRAIN_DET_FWIN: the model's gradients (slot 0) live in the window too,
   * at byte fwin_off, and each rank writes its slice of the reduced sums
   * there as floats for every rank (dt_comm_window_allreduce_i64_f32) */
  size_t fwin_off;             /* 0: not in the window */
  /* work stealing (parallel/steal.h): the queue in rank 0's window, after
   * its accumulator */
  dt_steal *steal;
  size_t reported0, nbad0;     /* at the current micro-shard's start */
  /* Gradient slots: each micro-shard's backward writes its float gradients
   * to the next slot (slot[0] is the model's own buffer), and the filled
   * slots are turned into fixed point together (dt_fix_add_slots: the
   * int64 sums read and written once for all of them, not once per
   * micro-shard) during the backward of the worker's last micro-shard or
   * of the one that fills the last slot (layer by layer, so buckets still
   * overlap backward); under stealing (the last micro-shard is not known)
   * between micro-shards and before the reduction, so a micro-shard whose
   * backup copy counted first is simply forgotten. */
  int nslots, nfill;           /* DTRAIN_DET_SLOTS (1 if the model cannot) / filled */
  float **slot;
  double *slot_w;              /* each slot's weight */
  int flushing;                /* this backward converts every filled slot */
  /* Linear layers' weight gradients made straight in fixed point
   * (DTRAIN_DET_FUSE, dt_fix_add_wgrad): the backward only stashes each
   * micro-shard's inputs and output gradients (rows [j * srows, ...) of
   * the stash for slot j), and the conversion multiplies them out per
   * micro-shard, so no slot holds those gradients as floats. */
  dt__wstash *wst;
  int srows;                   /* stash rows per slot (the model's batch) */
  int *slot_n;                 /* each slot's samples */
  int nwl;
  struct wlayer { size_t off; int oc, c, layer; } *wl; /* weight spans, in order */
  int fstore;                  /* that conversion stores (the step's first) */
  int gstored;                 /* the step's gradient sums were stored once */
  double wbufs;                /* weight of its buffer terms */
  float *bufs, *bufs0;         /* the model's buffers; their value at step start */
  float *bufs_last;            /* stealing: the current micro-shard's buffer terms */
  double gw;                   /* 1: gradients weigh 1 per micro-shard (reduce sum) */
  double w;                    /* weight of the current micro-shard's gradients */
  double divisor, n_global, bound;
  int shard, first, last;      /* micro-shards begun this step; the current one is
                                  the worker's first (store, not add) / last */
  size_t reported;             /* gradient values converted this step */
  size_t nbad, bad_index;      /* this rank's out-of-range values this step */
  float bad_value;
  int64_t overflow_total;      /* over all ranks, from the head's allreduce */
  /* observability (src/obs; NULL slots when the communicator has no recorder) */
  dt_obs *obs;
  dt_obs_metric *m_ar, *m_wait;
};

/* ddp.c, for ddp_det.c: a new step's bucket bookkeeping (d->mu held). */
void dt__ddp_reset_locked(dt_ddp *d);

/* ddp_det.c, for ddp.c. All on the compute thread unless said. */

/* create(): deterministic mode's accumulator, slots and weight stash
 * (rewritten: the model's backward rewrites every gradient, so it may
 * write them into slots). DT_ENOMEM, with everything it took freed by
 * dt__ddp_det_free. */
int dt__ddp_det_init(dt_ddp *d, int rewritten);
/* create(): the accumulator (and the work-stealing queue, and with
 * DTRAIN_DET_FWIN the float gradients) in a shared window when ranks share
 * a host. DT_OK also when the transport has no window. */
int dt__ddp_det_window(dt_ddp *d, dt_comm *c, int rewritten);
/* destroy(): what dt__ddp_det_init and dt__ddp_det_window took. */
void dt__ddp_det_free(dt_ddp *d);
/* Backward reported [off, off + n): into the accumulator when this
 * micro-shard converts its slots. */
void dt__ddp_det_grad_ready(dt_ddp *d, size_t off, size_t n);
/* Before the reduction: every micro-shard converted, the model's gradients
 * back in its own buffer. No-op outside deterministic mode. */
void dt__ddp_slots_settle(dt_ddp *d);
/* Bucket i's exact sum over the ranks and its conversion back to floats
 * (the head with the last bucket). Communication thread or inline. */
int dt__ddp_det_reduce(dt_ddp *d, int i);
/* After the reduction: the same verdict on every rank (DT_OK outside
 * deterministic mode). */
int dt__ddp_det_verdict(dt_ddp *d);

#endif

/*
 * ddp.c — bucketed, overlapped gradient allreduce for data parallelism.
 *
 * Buckets are contiguous spans of the flat gradient buffer, built walking
 * the layers backwards (the order backward produces them) and closed once
 * they hold dist.bucket_bytes. Each bucket counts the layers it still
 * waits for; the grad-ready callback of dt_model_backward decrements it and,
 * at zero, queues the bucket for the communication thread, which scales it
 * by n_local / n_global and sums it over all workers in place. After
 * backward, dt_ddp_finish_step queues whatever is left (robust to a layer
 * that never reported) and waits.
 *
 * Deterministic mode (dt_ddp_create_det, docs/ddp.md "Deterministic
 * mode"): the engine runs forward/backward once per fixed micro-shard; the
 * grad-ready callback turns each layer's gradient into fixed point
 * (parallel/fixsum.h) and adds it to an int64 accumulator on the compute
 * thread, and during the worker's last micro-shard it also counts buckets,
 * so the int64 allreduce of a bucket still overlaps the rest of backward.
 * After its allreduce a bucket is turned back into floats (the same
 * expression on every rank). The accumulator starts with a head — the
 * buffer sums (batch-norm running statistics, one term per micro-shard)
 * and a count of values that left the fixed-point range — which travels
 * with the bucket holding the first layer (the last one queued), so an
 * overflow on any rank is seen by every rank in the same step at no extra
 * collective. With no communicator (one worker) nothing is sent: the same
 * sums, the same conversion, the same bits.
 *
 * Ranks that share a host over shm keep the gradient buffer in a shared
 * window (comm/window.h): a bucket's "allreduce" is then one pass in which
 * each rank sums its slice over every rank's window, scale included, and
 * writes it back everywhere — no staging copies, no separate scaling pass.
 * In deterministic mode the window holds the int64 accumulator instead
 * (exact sums, the same bits as through the transport).
 *
 * With compression (dt_ddp_create_compressed) a bucket's reduction is
 * dt_compress_reduce of comm/compress instead: the scale, the codec, its
 * error feedback and collective in one call; no shared window.
 *
 * The communication thread is the only user of the communicator during a
 * step; it records the first error (with its message, since dt_errmsg is
 * per thread) and skips the remaining buckets of that step, so the compute
 * thread never waits on work that will not happen. Every allreduce has the
 * communicator's deadline, so no wait here is unbounded.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/compress/compress.h"
#include "comm/window.h"
#include "core/core.h"
#include "nn/nn.h"
#include "parallel/ddp.h"
#include "parallel/fixsum.h"
#include "parallel/steal.h"
#include "tensor/tensor.h"

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

/* Deterministic mode: fixed point of a span of the current gradients (or,
 * for the head, of the buffers) into the accumulator. Compute thread only. */
static void det_add(dt_ddp *d, int64_t *acc, const float *x, size_t n, double w, size_t base) {
  size_t first = 0;
  size_t bad = dt_fix_add(acc, x, n, w, d->bound, d->first, &first);
  if (bad) {
    if (!d->nbad) {
      d->bad_index = base + first;
      d->bad_value = x[first];
    }
    d->nbad += bad;
  }
}

/* The filled slots' span [off, off + n) into the accumulator. */
static void slots_add_plain(dt_ddp *d, size_t off, size_t n, int store) {
  const float *xs[64];
  for (int j = 0; j < d->nfill; j++) xs[j] = d->slot[j] + off;
  size_t first = 0;
  float val = 0;
  size_t bad = dt_fix_add_slots(d->acc + d->head + off, xs, d->slot_w, d->nfill, n, d->bound,
                                store, &first, &val);
  if (bad) {
    if (!d->nbad) {
      d->bad_index = off + first;
      d->bad_value = val;
    }
    d->nbad += bad;
  }
}

/* Linear layer l's weight gradients of every filled slot into the
 * accumulator, from the stash. A micro-shard longer than the fused kernel
 * takes has its gradient multiplied out into its slot first (the product
 * backward would have made) and goes the plain way. */
static void wgrad_add(dt_ddp *d, const struct wlayer *w, int store) {
  const float *x, *dy;
  dt__wstash_rows(d->wst, w->layer, &x, &dy);
  dt_fix_wseg sg[64];
  int fused = 1;
  for (int j = 0; j < d->nfill; j++) {
    size_t r0 = (size_t)j * d->srows;
    sg[j] = (dt_fix_wseg){dy + r0 * w->oc, x + r0 * w->c, d->slot_n[j], d->slot_w[j]};
    if (d->slot_n[j] < 1 || d->slot_n[j] > DT_FIX_WGRAD_MAXN) fused = 0;
  }
  size_t n = (size_t)w->oc * w->c;
  if (!fused) {
    for (int j = 0; j < d->nfill; j++)
      dt_sgemm_f(DT_GEMM_FIXED, 1, 0, w->oc, w->c, sg[j].n, 1.0f, sg[j].dy, w->oc, sg[j].x, w->c,
                 0.0f, d->slot[j] + w->off, w->c);
    slots_add_plain(d, w->off, n, store);
    return;
  }
  size_t first = 0;
  float val = 0;
  size_t bad = dt_fix_add_wgrad(d->acc + d->head + w->off, sg, d->nfill, w->oc, w->c, d->bound,
                                store, &first, &val);
  if (bad) {
    if (!d->nbad) {
      d->bad_index = w->off + first;
      d->bad_value = val;
    }
    d->nbad += bad;
  }
}

/* The span [off, off + n): stashed weight spans through wgrad_add, the
 * rest from the slots. Backward reports whole layers (and a flush the
 * whole model), so a weight span is inside or outside the span. */
static void slots_add(dt_ddp *d, size_t off, size_t n, int store) {
  size_t end = off + n;
  for (int l = 0; l < d->nwl && off < end; l++) {
    const struct wlayer *w = &d->wl[l];
    size_t wend = w->off + (size_t)w->oc * w->c;
    if (wend <= off || w->off >= end) continue;
    if (w->off < off || wend > end) { /* not a whole span: multiply out, then plain */
      for (int j = 0; j < d->nfill; j++) {
        const float *x, *dy;
        dt__wstash_rows(d->wst, w->layer, &x, &dy);
        size_t r0 = (size_t)j * d->srows;
        dt_sgemm_f(DT_GEMM_FIXED, 1, 0, w->oc, w->c, d->slot_n[j], 1.0f, dy + r0 * w->oc, w->oc,
                   x + r0 * w->c, w->c, 0.0f, d->slot[j] + w->off, w->c);
      }
      continue;
    }
    if (w->off > off) slots_add_plain(d, off, w->off - off, store);
    wgrad_add(d, w, store);
    off = wend;
  }
  if (off < end) slots_add_plain(d, off, end - off, store);
}

/* Every filled slot, whole, into the accumulator; the slots are free
 * again. Compute thread only. */
static void slots_flush(dt_ddp *d) {
  if (d->flushing) { /* the last backward converted them span by span */
    d->flushing = 0;
    d->nfill = 0;
    d->gstored = 1;
    return;
  }
  if (!d->nfill) return;
  slots_add(d, 0, d->nparams, !d->gstored);
  d->gstored = 1;
  d->nfill = 0;
}

/* Before the reduction: every micro-shard converted, and the model's
 * gradients back in its own buffer (the optimizer reads them there). */
static void slots_settle(dt_ddp *d) {
  if (!d->det) return;
  slots_flush(d);
  if (d->nslots > 1) dt__model_point_grads(d->model, d->slot[0]);
}

static int reduce_bucket_now(dt_ddp *d, int i, float scale);

/* One bucket's reduction as the flight recorder, the allreduce histogram
 * and the trace see it (tid 1: the communication thread). */
static int reduce_bucket(dt_ddp *d, int i, float scale, int tid) {
  if (!d->obs) return reduce_bucket_now(d, i, scale);
  dt_obs_fr_note_n(d->obs, "bucket", i);
  int64_t t0 = dt_now_ns();
  int rc = reduce_bucket_now(d, i, scale);
  int64_t t1 = dt_now_ns();
  dt_obs_observe(d->m_ar, (double)(t1 - t0) / 1e9);
  dt_obs_span(d->obs, "allreduce", tid, t0, t1, i);
  return rc;
}

/* Allreduce of bucket i (in place) and, in deterministic mode, conversion
 * back to floats. Returns the allreduce's status. */
static int reduce_bucket_now(dt_ddp *d, int i, float scale) {
  float *g = d->grads + d->b[i].off;
  size_t n = d->b[i].n;
  if (d->cz) return dt_compress_reduce(d->cz, d->comm, d->grads, d->b[i].off, n, scale);
  if (!d->det && d->win && d->apply)
    return dt_comm_window_reduce_apply_f32(d->win, d->b[i].off * sizeof(float), n, scale,
                                           d->apply, d->apply_ud);
  if (!d->det && d->win)
    return dt_comm_window_allreduce_f32(d->win, d->b[i].off * sizeof(float), n, scale);
  if (!d->det) {
    if (scale != 1.0f)
      for (size_t j = 0; j < n; j++) g[j] *= scale;
    return dt_comm_allreduce(d->comm, g, g, n, DT_F32, DT_OP_SUM);
  }
  int with_head = i == d->nb - 1;
  int64_t *a = d->acc + d->head + d->b[i].off;
  int64_t *lo = with_head ? d->acc : a;
  size_t len = (size_t)(a + n - lo);
  if (d->win && len && d->fwin_off) {
    /* the floats arrive in g (the window) from every rank's slice */
    int rc = dt_comm_window_allreduce_i64_f32(d->win, (size_t)(lo - d->acc) * sizeof *lo, len,
                                              (size_t)(a - lo),
                                              d->fwin_off + d->b[i].off * sizeof(float),
                                              dt_fix_scale(d->divisor));
    if (rc < 0) return rc;
  } else if (d->win && len) {
    int rc = dt_comm_window_allreduce_i64(d->win, (size_t)(lo - d->acc) * sizeof *lo, len);
    if (rc < 0) return rc;
  } else if (d->comm && len) {
    int rc = dt_comm_allreduce(d->comm, lo, lo, len, DT_I64, DT_OP_SUM);
    if (rc < 0) return rc;
  }
  if (!(d->win && d->fwin_off)) dt_fix_to_float(g, a, n, d->divisor);
  if (with_head) {
    d->overflow_total = d->acc[d->nbufs];
    if (d->nbufs) dt_fix_to_float(d->bufs, d->acc, d->nbufs, d->n_global);
  }
  return DT_OK;
}

/* The message of reduce_bucket's failure, on the thread that saw it. */
static const char *reduce_errmsg(dt_ddp *d) {
  const char *m = d->win || d->cz || !d->comm ? NULL : dt_comm_errmsg(d->comm);
  return m && *m ? m : dt_errmsg();
}

static void enqueue_locked(dt_ddp *d, int i) {
  if (d->b[i].queued) return;
  d->b[i].queued = 1;
  /* the head rides with the last bucket: every value is converted by now */
  if (d->det && i == d->nb - 1) d->acc[d->nbufs] = (int64_t)d->nbad;
  d->queue[d->qlen++] = i;
  pthread_cond_signal(&d->cv);
}

static void *comm_main(void *arg) {
  dt_ddp *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->stop && d->qnext >= d->qlen) pthread_cond_wait(&d->cv, &d->mu);
    if (d->qnext >= d->qlen && d->stop) break;
    int i = d->queue[d->qnext++];
    int skip = d->err != 0;
    float scale = d->scale;
    pthread_mutex_unlock(&d->mu);
    int rc = DT_OK;
    double t0 = dt_now();
    if (!skip) rc = reduce_bucket(d, i, scale, 1);
    double dt = dt_now() - t0;
    pthread_mutex_lock(&d->mu);
    d->st.comm_seconds += dt;
    if (rc < 0 && !d->err) {
      d->err = rc;
      snprintf(d->errmsg, sizeof d->errmsg, "%s", reduce_errmsg(d));
    }
    d->ndone++;
    pthread_cond_broadcast(&d->done_cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* Whether a communication thread should reduce buckets while backward
 * runs. DTRAIN_DDP_OVERLAP=1/0 decides; by default (-1) yes, except when
 * the buckets go through a shared window and this host has fewer cores than
 * 2 threads per worker: the window's reduction is CPU work, not waiting, so
 * a thread can only take it from the compute thread, and the hand-offs cost
 * more than they hide (MLP, 2 workers on 2 cores: 149-155k samples/s with
 * the thread, 175-189k without; the CNN within noise either way). */
static int overlap_pays(dt_ddp *d, dt_comm *c) {
  int64_t v = dt_param(DT_PARAM_DDP_OVERLAP);
  if (v >= 0) return v != 0;
  if (!d->win) return 1;
  struct dt_comm_topo t;
  dt_comm_topology(c, &t);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return 2L * t.local_size <= cores;
}

/* The weight matrices powersgd may factor: linear and conv layers' weights
 * (out_c rows, the rest of the layer's parameters but its out_c biases). */
static int compressor(dt_ddp *d, dt_model *m, dt_comm *c, const dt_compress_cfg *cz) {
  int nl = dt_model_nlayers(m), nm = 0;
  dt_cz_matrix *mats = calloc((size_t)nl + 1, sizeof *mats);
  if (!mats) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  for (int i = 0; i < nl; i++) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if ((li->kind != DT_L_LINEAR && li->kind != DT_L_CONV2D) || li->out_c < 1 || !li->nparams)
      continue;
    size_t oc = (size_t)li->out_c;
    if (li->nparams % oc || li->nparams / oc < 2) continue;
    mats[nm++] = (dt_cz_matrix){li->param_off, li->out_c, (int)(li->nparams / oc - 1)};
  }
  int rc = dt_compress_create(&d->cz, cz, dt_model_nparams(m), mats, nm, dt_comm_rank(c),
                              dt_comm_size(c));
  free(mats);
  /* the framed codecs' frames of all buckets in one allgather per step
   * (DTRAIN_CZ_FUSE): each bucket is still encoded as backward makes it */
  int spans = 0;
  for (int i = 0; i < d->nb; i++) spans += d->b[i].n > 0;
  if (rc == DT_OK && dt_param(DT_PARAM_CZ_FUSE)) rc = dt_compress_fuse(d->cz, spans);
  return rc;
}

static int create(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes, int det,
                  const dt_compress_cfg *cz, int nowin) {
  *out = NULL;
  dt_ddp *d = calloc(1, sizeof *d);
  if (!d) return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  d->model = m;
  d->comm = c;
  d->obs = dt_comm_obs(c);
  d->m_ar = dt_obs_histogram(d->obs, "dtrain_allreduce_seconds",
                             "Time to reduce one gradient bucket over all workers", NULL, 0);
  d->m_wait = dt_obs_counter(d->obs, "dtrain_peer_wait_seconds_total",
                             "Time the training thread waited for gradient reduction after backward");
  d->grads = dt_model_grads(m);
  int nl = dt_model_nlayers(m);
  d->b = calloc((size_t)nl + 1, sizeof *d->b);
  d->queue = calloc((size_t)nl + 1, sizeof *d->queue);
  d->det = det;
  int nsl = 0; /* slots allocated */
  const int rewritten = dt__model_grads_rewritten(m); /* before the stash is set */
  if (det) {
    d->nparams = dt_model_nparams(m);
    d->nbufs = dt_model_nbufs(m);
    /* the head padded to whole 64-byte lines (zeros that are summed too):
     * the sums then start on a line, so the fused weight-gradient kernel's
     * 16-value tiles and the reduction's blocks stay on whole lines instead
     * of each load and store crossing two (a head of 1 put every row of
     * the MLP's sums 8 bytes off) */
    d->head = (d->nbufs + 1 + 7) & ~(size_t)7;
    d->bufs = dt_model_bufs(m);
    d->acc = calloc(d->head + d->nparams, sizeof *d->acc);
    d->bufs0 = malloc((d->nbufs ? d->nbufs : 1) * sizeof *d->bufs0);
    d->bufs_last = malloc((d->nbufs ? d->nbufs : 1) * sizeof *d->bufs_last);
    /* slots beyond the model's own buffer: at most 256 MiB of them */
    int64_t ns = rewritten ? dt_param(DT_PARAM_DET_SLOTS) : 1;
    size_t pb = (d->nparams ? d->nparams : 1) * sizeof(float);
    while (ns > 1 && (size_t)(ns - 1) * pb > ((size_t)256 << 20)) ns--;
    d->nslots = nsl = (int)ns;
    d->slot = calloc((size_t)ns, sizeof *d->slot);
    d->slot_w = calloc((size_t)ns, sizeof *d->slot_w);
    if (d->slot) {
      d->slot[0] = d->grads;
      for (int j = 1; j < ns; j++)
        if (!(d->slot[j] = dt_alloc(pb))) d->nslots = 0;
    }
  }
  if (det && d->nslots && dt_param(DT_PARAM_DET_FUSE) && dt_fix_wgrad_ok()) {
    int nw = 0;
    for (int i = 0; i < nl; i++) nw += dt_model_layer(m, i)->kind == DT_L_LINEAR;
    /* rows per slot: the model's batch until dt__ddp_det_rows says the
     * micro-shard size; a stash past 256 MiB is not worth it */
    d->srows = dt_model_max_batch(m);
    size_t row_floats = 0;
    for (int i = 0; i < nl; i++) {
      const dt_layer_info *li = dt_model_layer(m, i);
      if (li->kind == DT_L_LINEAR)
        row_floats += (size_t)li->in_c * li->in_h * li->in_w + (size_t)li->out_c;
    }
    d->slot_n = calloc((size_t)d->nslots, sizeof *d->slot_n);
    d->wl = calloc((size_t)nw + 1, sizeof *d->wl);
    if (!d->slot_n || !d->wl ||
        (size_t)d->nslots * d->srows * row_floats * sizeof(float) > ((size_t)256 << 20) ||
        dt__wstash_create(&d->wst, m, d->nslots * d->srows) < 0) {
      dt__clearerr(); /* no stash: backward writes the weight gradients as before */
      free(d->slot_n), free(d->wl);
      d->slot_n = NULL, d->wl = NULL, d->wst = NULL;
    }
    for (int i = 0; d->wst && i < nl; i++) {
      const dt_layer_info *li = dt_model_layer(m, i);
      if (li->kind != DT_L_LINEAR) continue;
      int C = li->in_c * li->in_h * li->in_w;
      d->wl[d->nwl++] = (struct wlayer){li->param_off, li->out_c, C, i};
    }
    if (d->wst) dt__model_set_wstash(m, d->wst, 0);
  }
  if (!d->b || !d->queue ||
      (det && (!d->acc || !d->bufs0 || !d->bufs_last || !d->slot || !d->slot_w || !d->nslots))) {
    if (d->wst) dt__model_set_wstash(m, NULL, 0);
    dt__wstash_destroy(d->wst);
    free(d->slot_n);
    free(d->wl);
    free(d->b);
    free(d->queue);
    free(d->acc);
    free(d->bufs0);
    free(d->bufs_last);
    for (int j = 1; d->slot && j < nsl; j++) dt_free(d->slot[j]);
    free(d->slot);
    free(d->slot_w);
    free(d);
    return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  }
  int64_t cap = bucket_bytes > 0 ? bucket_bytes : 128 << 10;
  if (cap < 4) cap = 4;
  /* Walk layers backwards; a bucket is [lo, hi) growing downwards. */
  bucket *cur = NULL;
  for (int i = nl - 1; i >= 0; i--) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if (!li->nparams) continue;
    if (cur && (int64_t)(cur->n * sizeof(float)) >= cap) cur = NULL;
    if (!cur) {
      cur = &d->b[d->nb++];
      cur->off = li->param_off + li->nparams;
      cur->n = 0;
    }
    /* layers are laid out in order, so this layer ends where the bucket begins */
    cur->off = li->param_off;
    cur->n += li->nparams;
    cur->layers++;
  }
  if (det && d->nb == 0) d->nb = 1; /* no parameters: one empty bucket carries the head */
  d->st.nbuckets = d->nb;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  pthread_cond_init(&d->done_cv, NULL);
  /* Ranks on one host talking shm: the gradients move into a shared window
   * and each bucket is reduced in one pass over it, with the averaging
   * scale fused in (comm/window.h); in deterministic mode the int64
   * accumulator (head and sums) lives there instead and buckets are summed
   * exactly in one pass. Otherwise (other hosts, a forced tcp or mpi
   * transport, DTRAIN_WINDOW=0) the transport's allreduce. */
  size_t np = dt_model_nparams(m);
  if (det && c && dt_comm_size(c) > 1 && !(cz && cz->codec != DT_CODEC_NONE)) {
    /* the accumulator, then the work-stealing queue, then (DTRAIN_DET_FWIN,
     * a model whose backward rewrites every gradient) the float gradients */
    size_t acc_bytes = ((d->head + d->nparams) * sizeof *d->acc + 63) & ~(size_t)63;
    const int nr = dt_comm_size(c);
    size_t fwin = 0;
    if (dt_param(DT_PARAM_DET_FWIN) && rewritten && d->nparams)
      fwin = (acc_bytes + dt_steal_bytes(nr) + 63) & ~(size_t)63;
    int rc = dt_comm_window_create(c, fwin ? fwin + d->nparams * sizeof(float)
                                           : acc_bytes + dt_steal_bytes(nr), &d->win);
    if (rc == DT_OK) {
      free(d->acc);
      d->acc = dt_comm_window_base(d->win);
      d->acc_in_win = 1;
      if (fwin) {
        /* slot 0 (the model's gradients, which the optimizer reads) moves
         * into the window: peers write their slices of the sums there */
        dt_model_set_grads(m, (float *)((char *)d->acc + fwin));
        d->grads = dt_model_grads(m);
        d->slot[0] = d->grads;
        d->fwin_off = fwin;
      }
      rc = dt_steal_create(&d->steal, (char *)dt_comm_window_peer(d->win, 0) + acc_bytes,
                             dt_comm_rank(c), nr);
      if (rc < 0) {
        dt_ddp_destroy(d);
        return rc;
      }
    } else if (rc != DT_ENOTSUP) {
      dt_ddp_destroy(d);
      return dt__preerr(rc, "ddp: fixed-point window");
    }
  }
  if (cz && cz->codec != DT_CODEC_NONE) {
    int rc = compressor(d, m, c, cz);
    if (rc < 0) {
      dt_ddp_destroy(d);
      return rc;
    }
  } else if (!det && !nowin && c && dt_comm_size(c) > 1 && np) {
    int rc = dt_comm_window_create(c, np * sizeof(float), &d->win);
    if (rc == DT_OK) {
      dt_model_set_grads(m, dt_comm_window_base(d->win));
      d->grads = dt_model_grads(m);
    } else if (rc != DT_ENOTSUP) {
      dt_ddp_destroy(d);
      return dt__preerr(rc, "ddp: gradient window");
    }
  }
  d->ndone = d->qlen = d->qnext = 0;
  /* one bucket is ready only when backward ends: nothing to overlap, so
   * skip the thread hand-off */
  d->overlap = d->nb > 1 && c && overlap_pays(d, c);
  if (!d->overlap) {
    *out = d;
    return DT_OK;
  }
  if (pthread_create(&d->thread, NULL, comm_main, d)) {
    dt_ddp_destroy(d);
    return dt__seterr(DT_ENOMEM, "ddp: cannot start the communication thread");
  }
  d->started = 1;
  *out = d;
  return DT_OK;
}

int dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes) {
  if (!c) {
    *out = NULL;
    return dt__seterr(DT_EINVAL, "ddp: a communicator is needed outside deterministic mode");
  }
  return create(out, m, c, bucket_bytes, 0, NULL, 0);
}

int dt__ddp_create_nowin(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes) {
  if (!c) {
    *out = NULL;
    return dt__seterr(DT_EINVAL, "ddp: a communicator is needed outside deterministic mode");
  }
  return create(out, m, c, bucket_bytes, 0, NULL, 1);
}

int dt_ddp_create_compressed(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes,
                             const dt_compress_cfg *cz) {
  if (!c) {
    *out = NULL;
    return dt__seterr(DT_EINVAL, "ddp: a communicator is needed for compressed gradients");
  }
  return create(out, m, c, bucket_bytes, 0, cz, 0);
}

void dt_ddp_set_step(dt_ddp *d, int64_t step, int epoch) {
  if (d->cz) dt_compress_begin_step(d->cz, step, epoch);
}

void dt_ddp_compress_bytes(const dt_ddp *d, uint64_t *sent, uint64_t *dense) {
  dt_compress_stats st = {0, 0, 0};
  if (d->cz) dt_compress_get_stats(d->cz, &st);
  *sent = st.bytes_sent;
  *dense = st.dense_bytes;
}

struct dt_compress *dt_ddp_compressor(dt_ddp *d) { return d ? d->cz : NULL; }

int dt_ddp_create_det(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes) {
  return create(out, m, c, bucket_bytes, 1, NULL, 0);
}

void dt_ddp_destroy(dt_ddp *d) {
  if (!d) return;
  if (d->started) {
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
  }
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  pthread_cond_destroy(&d->done_cv);
  if (d->win) {
    if (d->fwin_off) { /* the model's own gradient buffer again, before the unmap */
      dt__model_point_grads(d->model, d->slot[0]);
      dt_model_set_grads(d->model, NULL);
      d->slot[0] = dt_model_grads(d->model);
    }
    if (!d->acc_in_win) dt_model_set_grads(d->model, NULL);
    dt_comm_window_destroy(d->win);
  }
  dt_compress_destroy(d->cz);
  free(d->b);
  free(d->queue);
  if (!d->acc_in_win) free(d->acc);
  free(d->bufs0);
  free(d->bufs_last);
  if (d->wst) dt__model_set_wstash(d->model, NULL, 0);
  dt__wstash_destroy(d->wst);
  free(d->slot_n);
  free(d->wl);
  if (d->slot) {
    if (d->nslots > 1) dt__model_point_grads(d->model, d->slot[0]);
    for (int j = 1; j < d->nslots; j++) dt_free(d->slot[j]);
  }
  free(d->slot);
  free(d->slot_w);
  dt_steal_destroy(d->steal);
  free(d);
}

static void reset_locked(dt_ddp *d) {
  d->qlen = d->qnext = d->ndone = 0;
  d->err = 0;
  d->errmsg[0] = '\0';
  for (int i = 0; i < d->nb; i++) {
    d->b[i].pending = d->b[i].layers;
    d->b[i].queued = 0;
  }
}

void dt_ddp_begin_step(dt_ddp *d, int n_local, int n_global) {
  pthread_mutex_lock(&d->mu);
  d->scale = n_global > 0 ? (float)n_local / (float)n_global : 0.0f;
  reset_locked(d);
  pthread_mutex_unlock(&d->mu);
}

void dt_ddp_begin_step_det(dt_ddp *d, int64_t n_global, int64_t shards_global, int sum) {
  pthread_mutex_lock(&d->mu);
  reset_locked(d);
  d->gw = sum ? 1.0 : 0.0;
  d->divisor = sum ? 1.0 : (double)n_global;
  d->n_global = (double)n_global;
  d->bound = dt_fix_bound(shards_global);
  d->shard = d->first = d->last = 0;
  d->nbad = d->bad_index = d->reported = 0;
  d->bad_value = 0;
  d->overflow_total = 0;
  d->nfill = d->flushing = d->fstore = d->gstored = 0;
  if (d->nslots > 1) dt__model_point_grads(d->model, d->slot[0]);
  if (d->nbufs) memcpy(d->bufs0, d->bufs, d->nbufs * sizeof *d->bufs);
  pthread_mutex_unlock(&d->mu);
}

void dt_ddp_det_shard(dt_ddp *d, int n, int last) {
  /* the slots the last backward converted, or all of them if full */
  if (d->flushing || d->nfill == d->nslots) slots_flush(d);
  d->first = d->shard++ == 0;
  d->reported0 = d->reported;
  d->nbad0 = d->nbad;
  d->wbufs = (double)n;
  if (d->nbufs) {
    /* this micro-shard's forward moved the running statistics from bufs0:
     * keep its result (weighted by its samples) and start the next one
     * from bufs0 again, so no micro-shard sees another's update */
    det_add(d, d->acc, d->bufs, d->nbufs, (double)n, d->nparams);
    if (d->steal) memcpy(d->bufs_last, d->bufs, d->nbufs * sizeof *d->bufs);
    memcpy(d->bufs, d->bufs0, d->nbufs * sizeof *d->bufs);
  }
  d->w = d->gw != 0 ? d->gw : (double)n;
  d->last = last > 0;
  /* this micro-shard's gradients go to the next free slot */
  if (d->wst && n > d->srows) {
    /* a micro-shard longer than the stash's rows (dt__ddp_det_rows was
     * told less): the filled slots as they are, then no stash any more */
    slots_flush(d);
    dt__ddp_det_nofuse(d);
  }
  int j = d->nfill++;
  d->slot_w[j] = d->w;
  if (d->wst) {
    d->slot_n[j] = n;
    dt__model_set_wstash(d->model, d->wst, j * d->srows);
  }
  if (d->nslots > 1) dt__model_point_grads(d->model, d->slot[j]);
  /* its backward converts every filled slot, layer by layer, when it is
   * the worker's last (known: not stealing) or fills the last slot; under
   * stealing only between micro-shards (a dropped one is then forgotten) */
  d->flushing = last >= 0 && (last > 0 || d->nfill == d->nslots);
  d->fstore = !d->gstored;
}

void dt_ddp_grad_ready(void *ud, size_t off, size_t n) {
  dt_ddp *d = ud;
  if (!n) return;
  if (d->det) {
    d->reported += n;
    if (!d->flushing) return; /* kept in its slot for now */
    slots_add(d, off, n, d->fstore);
    if (!d->last) return;
  }
  if (!d->overlap) return;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->nb; i++) {
    bucket *b = &d->b[i];
    if (off >= b->off && off < b->off + b->n) {
      if (b->pending > 0 && --b->pending == 0) enqueue_locked(d, i);
      break;
    }
  }
  pthread_mutex_unlock(&d->mu);
}

void dt_ddp_all_ready(dt_ddp *d) {
  /* deterministic: no micro-shard here, so this worker adds zeros */
  if (d->det && d->shard == 0) memset(d->acc, 0, (d->head + d->nparams) * sizeof *d->acc);
  slots_settle(d);
  if (!d->overlap) return;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->nb; i++) enqueue_locked(d, i);
  pthread_mutex_unlock(&d->mu);
}

/* Deterministic mode, after the head's allreduce: every rank knows how many
 * values left the fixed-point range anywhere, so all fail in the same step. */
static int det_verdict(dt_ddp *d) {
  if (!d->det) return DT_OK;
  /* a span backward never reported would hold the previous step's sums */
  if (d->reported != d->nparams * (size_t)d->shard)
    return dt__seterr(DT_EINVAL, "deterministic mode: backward reported %zu gradient values over "
                      "%d micro-shard(s) of a model with %zu parameters", d->reported, d->shard,
                      d->nparams);
  if (d->overflow_total == 0) return DT_OK;
  char here[160] = "";
  if (d->nbad && d->bad_index < d->nparams)
    snprintf(here, sizeof here, "; here: parameter %zu, micro-shard gradient %g", d->bad_index,
             (double)d->bad_value);
  else if (d->nbad)
    snprintf(here, sizeof here, "; here: running statistic %zu = %g", d->bad_index - d->nparams,
             (double)d->bad_value);
  return dt__seterr(DT_ERANGE, "deterministic mode: %lld gradient or running-statistics value(s) "
                    "left the fixed-point range (|value x samples| > %.3g, or not finite)%s; "
                    "training diverged? try a smaller optim.lr",
                    (long long)d->overflow_total, ldexp(d->bound, -DT_FIX_BITS), here);
}

/* Without overlap: every bucket on the calling thread, in queue order. */
static int finish_inline(dt_ddp *d) {
  double t0 = dt_now();
  int rc = DT_OK;
  slots_settle(d);
  if (d->det) d->acc[d->nbufs] = (int64_t)d->nbad;
  for (int i = 0; i < d->nb && rc == DT_OK; i++) rc = reduce_bucket(d, i, d->scale, 0);
  double dt = dt_now() - t0;
  dt_obs_add(d->m_wait, dt);
  pthread_mutex_lock(&d->mu);
  d->st.comm_seconds += dt;
  d->st.exposed_seconds += dt;
  d->st.steps++;
  pthread_mutex_unlock(&d->mu);
  if (rc < 0) {
    /* the reason may be this thread's own message buffer: copy it first */
    char why[512];
    snprintf(why, sizeof why, "%s", reduce_errmsg(d));
    return dt__seterr(rc, "gradient allreduce: %s: %s", dt_strerror(rc), why);
  }
  return det_verdict(d);
}

int dt_ddp_finish_step(dt_ddp *d) {
  if (!d->overlap) return finish_inline(d);
  slots_settle(d);
  double t0 = dt_now();
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < d->nb; i++) enqueue_locked(d, i);
  while (d->ndone < d->nb) pthread_cond_wait(&d->done_cv, &d->mu);
  int rc = d->err;
  double waited = dt_now() - t0;
  d->st.exposed_seconds += waited;
  dt_obs_add(d->m_wait, waited);
  d->st.steps++;
  pthread_mutex_unlock(&d->mu);
  if (rc < 0) return dt__seterr(rc, "gradient allreduce: %s: %s", dt_strerror(rc), d->errmsg);
  return det_verdict(d);
}

/* ---- work stealing ------------------------------------------------------------ */

dt_steal *dt_ddp_steal(dt_ddp *d) { return d->det ? d->steal : NULL; }

void dt_ddp_det_drop(dt_ddp *d) {
  if (!d->det || !d->shard) return;
  if (d->first) {
    /* its buffer terms were stored rather than added: the next micro-shard
     * stores afresh, or dt_ddp_all_ready zeroes the sums */
    d->shard = 0;
  } else {
    if (d->nbufs) dt_fix_sub(d->acc, d->bufs_last, d->nbufs, d->wbufs, d->bound);
    d->shard--;
  }
  /* its gradients are still in their slot (stealing converts between
   * micro-shards): forget them */
  if (d->nfill > 0 && !d->flushing) d->nfill--;
  d->reported = d->reported0;
  d->nbad = d->nbad0;
}

int dt__ddp_det_rows(dt_ddp *d, int rows) {
  if (!d || !d->wst || rows < 1 || rows >= d->srows || d->nfill) return DT_OK;
  dt__wstash *s = NULL;
  if (dt__wstash_create(&s, d->model, d->nslots * rows) < 0) {
    dt__clearerr(); /* keep the larger stash */
    return DT_OK;
  }
  dt__wstash_destroy(d->wst);
  d->wst = s;
  d->srows = rows;
  dt__model_set_wstash(d->model, d->wst, 0);
  return DT_OK;
}

void dt__ddp_det_nofuse(dt_ddp *d) {
  if (!d || !d->wst) return;
  dt__model_set_wstash(d->model, NULL, 0);
  dt__wstash_destroy(d->wst);
  d->wst = NULL;
  d->nwl = 0;
}

int dt_ddp_set_apply(dt_ddp *d, dt_window_apply_fn fn, void *ud) {
  if (fn && (d->det || d->cz || !d->win))
    return dt__seterr(DT_ENOTSUP, "ddp: the update in the reduction needs a shared gradient "
                      "window, plain float sums and no compression");
  d->apply = fn;
  d->apply_ud = ud;
  return DT_OK;
}

double dt_ddp_blocked_seconds(const dt_ddp *d) {
  return d->win ? dt_comm_window_blocked(d->win) : -1;
}

int dt_ddp_set_shares(dt_ddp *d, const double *weights) {
  return d->win ? dt_comm_window_set_shares(d->win, weights) : DT_OK;
}

void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *out) {
  pthread_mutex_lock((pthread_mutex_t *)&d->mu);
  *out = d->st;
  if (d->win) dt_comm_window_bytes(d->win, &out->window_written, &out->window_read);
  pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
}

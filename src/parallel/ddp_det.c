/*
 * ddp_det.c — deterministic mode of the data-parallel gradient exchange
 * (docs/ddp.md "Deterministic mode"; the shared state is in ddp_int.h).
 *
 * The engine runs forward/backward once per fixed micro-shard; the
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
 * sums, the same conversion, the same bits. On one host the accumulator
 * lives in a shared window (exact sums in one pass, the same bits as
 * through the transport), followed by work stealing's queue
 * (parallel/steal.h), whose hooks (dt_ddp_det_drop) are here too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ddp_int.h"
#include "parallel/fixsum.h"
#include "tensor/tensor.h"

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

void dt__ddp_slots_settle(dt_ddp *d) {
  if (!d->det) return;
  slots_flush(d);
  if (d->nslots > 1) dt__model_point_grads(d->model, d->slot[0]);
}

/* Every filled slot's span [off, off + n) when this micro-shard converts. */
void dt__ddp_det_grad_ready(dt_ddp *d, size_t off, size_t n) {
  d->reported += n;
  if (d->flushing) slots_add(d, off, n, d->fstore);
}

int dt__ddp_det_init(dt_ddp *d, int rewritten) {
  dt_model *m = d->model;
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
  d->slot = calloc((size_t)ns, sizeof *d->slot);
  d->slot_w = calloc((size_t)ns, sizeof *d->slot_w);
  if (d->slot) {
    d->nslots = (int)ns;
    d->slot[0] = d->grads;
    for (int j = 1; j < ns; j++)
      if (!(d->slot[j] = dt_alloc(pb))) {
        d->nslots = j; /* dt__ddp_det_free frees slots 1..j-1 */
        break;
      }
  }
  if (!d->acc || !d->bufs0 || !d->bufs_last || !d->slot || !d->slot_w || d->nslots < ns)
    return dt__seterr(DT_ENOMEM, "ddp: out of memory");
  if (!dt_param(DT_PARAM_DET_FUSE) || !dt_fix_wgrad_ok()) return DT_OK;
  int nl = dt_model_nlayers(m), nw = 0;
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
    return DT_OK;
  }
  for (int i = 0; i < nl; i++) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if (li->kind != DT_L_LINEAR) continue;
    int C = li->in_c * li->in_h * li->in_w;
    d->wl[d->nwl++] = (struct wlayer){li->param_off, li->out_c, C, i};
  }
  dt__model_set_wstash(m, d->wst, 0);
  return DT_OK;
}

int dt__ddp_det_window(dt_ddp *d, dt_comm *c, int rewritten) {
  /* the accumulator, then the work-stealing queue, then (DTRAIN_DET_FWIN,
   * a model whose backward rewrites every gradient) the float gradients */
  size_t acc_bytes = ((d->head + d->nparams) * sizeof *d->acc + 63) & ~(size_t)63;
  const int nr = dt_comm_size(c);
  size_t fwin = 0;
  if (dt_param(DT_PARAM_DET_FWIN) && rewritten && d->nparams)
    fwin = (acc_bytes + dt_steal_bytes(nr) + 63) & ~(size_t)63;
  int rc = dt_comm_window_create(c, fwin ? fwin + d->nparams * sizeof(float)
                                         : acc_bytes + dt_steal_bytes(nr), &d->win);
  if (rc == DT_ENOTSUP) return DT_OK;
  if (rc != DT_OK) return dt__preerr(rc, "ddp: fixed-point window");
  free(d->acc);
  d->acc = dt_comm_window_base(d->win);
  d->acc_in_win = 1;
  if (fwin) {
    /* slot 0 (the model's gradients, which the optimizer reads) moves
     * into the window: peers write their slices of the sums there */
    dt_model_set_grads(d->model, (float *)((char *)d->acc + fwin));
    d->grads = dt_model_grads(d->model);
    d->slot[0] = d->grads;
    d->fwin_off = fwin;
  }
  return dt_steal_create(&d->steal, (char *)dt_comm_window_peer(d->win, 0) + acc_bytes,
                         dt_comm_rank(c), nr);
}

void dt__ddp_det_free(dt_ddp *d) {
  if (d->fwin_off) { /* the model's own gradient buffer again, before the unmap */
    dt__model_point_grads(d->model, d->slot[0]);
    dt_model_set_grads(d->model, NULL);
    d->slot[0] = dt_model_grads(d->model);
  }
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
}

int dt__ddp_det_reduce(dt_ddp *d, int i) {
  float *g = d->grads + d->b[i].off;
  size_t n = d->b[i].n;
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

void dt_ddp_begin_step_det(dt_ddp *d, int64_t n_global, int64_t shards_global, int sum) {
  pthread_mutex_lock(&d->mu);
  dt__ddp_reset_locked(d);
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

/* Deterministic mode, after the head's allreduce: every rank knows how many
 * values left the fixed-point range anywhere, so all fail in the same step. */
int dt__ddp_det_verdict(dt_ddp *d) {
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

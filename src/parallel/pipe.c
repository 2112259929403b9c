/*
 * pipe.c — one pipeline stage and its schedules (pipe.h). Memory per stage:
 * K stage models (activations of one micro-batch each; K = m for gpipe,
 * min(P - s, m) for 1f1b, 1 with recompute) sharing the stage's span of the
 * whole model's parameters and gradients, S input slots (the received
 * activations a backward still needs), S send slots for activations and S
 * for gradients (so a model can be reused while its output is in flight).
 *
 * Messages: activations of micro-batch j go to the next stage with tag
 * TAG_ACT + j; gradients of j go back with tag TAG_GRAD + j, followed in the
 * same message by two floats, j's loss and correct count. It does not
 * reduce over replicas or step the optimizer.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "obs/obs.h"
#include "parallel/ddp.h"
#include "parallel/pipe.h"
#include "tensor/tensor.h"

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
};

enum { JOB_WGRAD = 1, JOB_PACK = 2 };

int dt__pipe_tail_delay_us = 0;
int dt__pipe_offload_at = -1;

static void *tail_main(void *arg) {
  dt_pipe *p = arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->tail_mu);
  for (;;) {
    while (!p->tail_quit && p->tail_gen == seen) pthread_cond_wait(&p->tail_cv, &p->tail_mu);
    if (p->tail_quit) break;
    seen = p->tail_gen;
    int kind = p->tail_kind, rows = p->tail_rows, acc = p->tail_acc;
    pthread_mutex_unlock(&p->tail_mu);
    if (dt__pipe_tail_delay_us > 0) {
      struct timespec ts = {dt__pipe_tail_delay_us / 1000000, dt__pipe_tail_delay_us % 1000000 * 1000L};
      nanosleep(&ts, NULL);
    }
    if (kind == JOB_WGRAD) dt__model_wgrad_flush_part(p->inst[0], p->wst, rows, acc, 1);
    else dt__wpack_refresh(p->wpk, p->inst[0]);
    pthread_mutex_lock(&p->tail_mu);
    p->tail_done = seen;
    pthread_cond_broadcast(&p->tail_cv);
  }
  pthread_mutex_unlock(&p->tail_mu);
  return NULL;
}

/* 1f1b: forwards before the first backward. With e extra ones a stage
 * before the last computes while its first micro-batch goes through the
 * later stages and its gradients come back (that round trip is longer than
 * one forward of its own); the last stage has no one to wait for. */
static int nwarm(const dt_pipe_cfg *c) {
  int s = c->stage, P = c->nstages;
  int w = P - 1 - s + (s < P - 1 ? c->warm_extra : 0);
  return w < c->micro ? w : c->micro;
}

static int nslots(const dt_pipe_cfg *c) {
  int inflight = c->schedule == DT_PIPE_GPIPE ? c->micro : nwarm(c) + 1;
  return inflight < c->micro ? inflight : c->micro;
}

void dt_pipe_destroy(dt_pipe *p) {
  if (!p) return;
  if (p->tail_on) {
    pthread_mutex_lock(&p->tail_mu);
    p->tail_quit = 1;
    pthread_cond_broadcast(&p->tail_cv);
    pthread_mutex_unlock(&p->tail_mu);
    pthread_join(p->tail, NULL);
    pthread_cond_destroy(&p->tail_cv);
    pthread_mutex_destroy(&p->tail_mu);
  }
  /* pending sends are finished by dt_pipe_step before it returns */
  for (int k = 0; p->inst && k < p->K; k++) dt_model_destroy(p->inst[k]);
  for (int s = 0; s < p->S; s++) {
    if (p->in) dt_free(p->in[s]);
    if (p->aout) dt_free(p->aout[s]);
    if (p->gout) dt_free(p->gout[s]);
  }
  free(p->inst), free(p->inst_mb), free(p->in), free(p->aout), free(p->gout);
  dt_free(p->gin);
  dt_free(p->xg);
  dt_free(p->bufsave);
  free(p->areq), free(p->greq), free(p->apend), free(p->gpend), free((void *)p->xin);
  dt__wstash_destroy(p->wst);
  dt__wpack_destroy(p->wpk);
  if (!p->oleak) {
    /* receives still pending after an error may yet write here */
    dt_free(p->ox), dt_free(p->ody), dt_free(p->odw);
    free(p->oreq), free(p->opend);
  }
  free(p);
}

/* DTRAIN_PIPE_OFFLOAD: with 2 stages the deep MLP's best cut at layer
 * granularity gives stage 0 0.53 of the GEMM work, and the last stage
 * idles at the step's end while stage 0 makes its last backward, its
 * deferred weight gradients and its optimizer step. Moving stage 0's first
 * linear layer's weight gradient (784 x 2048 there: 1.6M of stage 0's
 * 28.4M multiply-adds per sample, which makes both stages 26.8M) onto the
 * last stage balances them below layer granularity: ~11 KB of rows per
 * sample go over, the product (6.4 MB) comes back, made by the same call
 * (dt__wgrad_product), so the same bits. Both stages decide alike from the
 * same configuration (a mismatch would leave one waiting). Only where:
 *  - 2 stages: the move balances the 2-stage cut (it was measured there);
 *    with more the last stage is not stage 0's pair, and the partition
 *    would have to know of it;
 *  - stage 0 stashes its weight gradients for one product per step
 *    (deferred weight gradients on, m > 1, not deterministic mode, which
 *    makes its own per-micro-shard fixed-point sums, not recomputation,
 *    whose stash holds groups flushed during the step);
 *  - not with DTRAIN_PIPE_TAIL (the other answer to the same imbalance:
 *    the helper thread splits the very flush this shortens);
 *  - stage 0 has a linear layer. */
static int offload_setup(dt_pipe *p) {
  const dt_pipe_cfg *c = &p->c;
  if (!dt_param(DT_PARAM_PIPE_OFFLOAD) || c->nstages != 2 || c->det || c->micro < 2 ||
      !c->wgrad || c->recompute || c->tail || !c->whole)
    return DT_OK;
  /* stage 0's layers: [0, l1) on stage 0, [0, l0) seen from stage 1 */
  const int end = c->stage == 0 ? c->l1 : c->l0;
  int f = -1;
  for (int i = 0; i < end && f < 0; i++) {
    const dt_layer_info *l = dt_model_layer(c->whole, i);
    if (l->kind == DT_L_LINEAR && l->nparams) f = i;
  }
  if (f < 0) return DT_OK;
  const dt_layer_info *l = dt_model_layer(c->whole, f);
  p->olayer = f; /* stage 0's models start at layer 0: the same index */
  p->oC = l->in_c * l->in_h * l->in_w;
  p->oOC = l->out_c;
  const size_t rows = (size_t)c->micro * c->max_batch;
  if (!(p->oreq = calloc(2 * (size_t)c->micro + 1, sizeof *p->oreq)) ||
      !(p->opend = calloc(2 * (size_t)c->micro + 1, sizeof *p->opend)))
    goto nomem;
  if (c->stage == 0) {
    if (!p->wst || !dt__model_wgrad_dst(p->inst[0], f)) return DT_OK; /* cannot happen: see above */
    p->off = 1;
    return DT_OK;
  }
  if (!(p->ox = dt_alloc(rows * p->oC * sizeof(float))) ||
      !(p->ody = dt_alloc(rows * p->oOC * sizeof(float))) ||
      !(p->odw = dt_alloc((size_t)p->oC * p->oOC * sizeof(float))))
    goto nomem;
  /* the product goes after the layers (last first) that make about half of
   * the stage's own flush: the last micro-batch's rows arrive a backward
   * of stage 0 after this stage's flush starts, and stage 0 needs the
   * product only after its own other products */
  double tot = 0, acc = 0;
  const int n = dt_model_nlayers(p->inst[0]);
  for (int i = 0; i < n; i++) {
    const float *x, *dy;
    dt__wstash_rows(p->wst, i, &x, &dy);
    const dt_layer_info *li = dt_model_layer(p->inst[0], i);
    if (x) tot += (double)li->out_c * li->in_c * li->in_h * li->in_w;
  }
  p->ocut = 0;
  for (int i = n - 1; i >= 0; i--) {
    const float *x, *dy;
    dt__wstash_rows(p->wst, i, &x, &dy);
    const dt_layer_info *li = dt_model_layer(p->inst[0], i);
    if (x) acc += (double)li->out_c * li->in_c * li->in_h * li->in_w;
    if (acc >= tot / 2) {
      p->ocut = i;
      break;
    }
  }
  if (dt__pipe_offload_at >= 0) p->ocut = dt__pipe_offload_at;
  p->off = 2;
  return DT_OK;
nomem:
  return dt__seterr(DT_ENOMEM, "pipeline stage %d: out of memory for the offloaded weight gradient",
                    c->stage);
}

int dt_pipe_create(dt_pipe **out, const dt_pipe_cfg *cfg) {
  *out = NULL;
  if (cfg->micro < 1 || cfg->micro > MAX_SLOTS || cfg->max_batch < 1 || cfg->nstages < 1 ||
      cfg->stage < 0 || cfg->stage >= cfg->nstages || (cfg->nstages > 1 && !cfg->comm))
    return dt__seterr(DT_EINVAL, "pipeline stage %d of %d: bad arguments (micro-batches %d, "
                      "batch %d)", cfg->stage, cfg->nstages, cfg->micro, cfg->max_batch);
  dt_pipe *p = calloc(1, sizeof *p);
  if (!p) return dt__seterr(DT_ENOMEM, "pipeline: out of memory");
  p->c = *cfg;
  p->S = nslots(cfg);
  p->K = cfg->recompute || cfg->det ? 1 : p->S;
  /* recompute: groups of about rc_rows rows, never fewer than 1 or more
   * than m micro-batches */
  int group = cfg->micro;
  if (cfg->recompute) {
    group = (cfg->rc_rows + cfg->max_batch / 2) / cfg->max_batch;
    if (group > cfg->micro) group = cfg->micro;
    if (group < 1) group = 1;
  }
  /* gpipe with recompute: the backward goes group by group, the group's
   * forward repeated in one product per layer over all its rows (not with
   * batch norm, whose statistics are per micro-batch) */
  p->G = cfg->recompute && !cfg->det && cfg->schedule == DT_PIPE_GPIPE && !cfg->nbufs && cfg->wgrad
             ? group
             : 1;
  p->obs = dt_comm_obs(cfg->comm);
  p->m_send = dt_obs_histogram(p->obs, "dtrain_pipeline_send_wait_seconds",
                               "Time a stage waited for a send to a neighbour stage to finish", NULL, 0);
  p->m_recv = dt_obs_histogram(p->obs, "dtrain_pipeline_recv_seconds",
                               "Time a stage waited to receive activations or gradients", NULL, 0);
  const int first = cfg->stage == 0, last = cfg->stage == cfg->nstages - 1;
  int rc = DT_OK;
  p->inst = calloc((size_t)p->K, sizeof *p->inst);
  p->inst_mb = calloc((size_t)p->K, sizeof *p->inst_mb);
  p->in = calloc((size_t)p->S, sizeof *p->in);
  p->aout = calloc((size_t)p->S, sizeof *p->aout);
  p->gout = calloc((size_t)p->S, sizeof *p->gout);
  p->areq = calloc((size_t)p->S, sizeof *p->areq);
  p->greq = calloc((size_t)p->S, sizeof *p->greq);
  p->apend = calloc((size_t)p->S, sizeof *p->apend);
  p->gpend = calloc((size_t)p->S, sizeof *p->gpend);
  p->xin = calloc((size_t)cfg->micro, sizeof *p->xin);
  if (!p->inst || !p->inst_mb || !p->in || !p->aout || !p->gout || !p->areq || !p->greq ||
      !p->apend || !p->gpend || !p->xin)
    goto nomem;
  for (int k = 0; k < p->K; k++) {
    int fl = (first ? 0 : DT__STAGE_NEED_DX) | (cfg->det ? DT__STAGE_KEEP_CHUNKS : 0);
    DT_CHECK_GOTO(dt__model_create_range(&p->inst[k], cfg->spec, cfg->c, cfg->h, cfg->w,
                                         p->G * cfg->max_batch, cfg->l0, cfg->l1, fl), rc, fail);
    /* the first model's gradients (its own, stage-sized) serve them all */
    dt__model_share(p->inst[k], cfg->whole, cfg->param_off, cfg->buf_off,
                    k ? dt_model_grads(p->inst[0]) : NULL);
    if (cfg->det) dt_model_set_gemm_flags(p->inst[k], DT_GEMM_FIXED);
    p->inst_mb[k] = -1;
  }
  p->in_dim = (size_t)dt_model_in_dim(p->inst[0]);
  p->out_dim = (size_t)dt_model_out_dim(p->inst[0]);
  const size_t B = (size_t)cfg->max_batch;
  for (int s = 0; s < p->S; s++) {
    if (!first && !(p->in[s] = dt_alloc(B * p->in_dim * sizeof(float)))) goto nomem;
    if (!last && !(p->aout[s] = dt_alloc(B * p->out_dim * sizeof(float)))) goto nomem;
    if (!first && !(p->gout[s] = dt_alloc((B * p->in_dim + 2) * sizeof(float)))) goto nomem;
  }
  if (!last && !(p->gin = dt_alloc(((size_t)p->G * B * p->out_dim + 2) * sizeof(float))))
    goto nomem;
  if (p->G > 1 && !first && !(p->xg = dt_alloc((size_t)p->G * B * p->in_dim * sizeof(float))))
    goto nomem;
  if ((cfg->recompute || cfg->det) && !(p->bufsave = dt_alloc((cfg->nbufs + 1) * sizeof(float)))) goto nomem;
  /* weight gradients in one product per step over every micro-batch (a
   * pass over each weight gradient per step, not per micro-batch); with
   * recompute, whose point is to keep no micro-batch's activations, one
   * product per group of about rc_rows rows (a bounded stash; gpipe's
   * groups need none); not in deterministic mode (its own per-micro-shard
   * path) */
  if (!cfg->det && cfg->micro > 1 && cfg->wgrad && group > 1 && p->G == 1) {
    p->wcap = group * cfg->max_batch;
    DT_CHECK_GOTO(dt__wstash_create(&p->wst, p->inst[0], p->wcap), rc, fail);
  }
  /* the forward products' weights packed once per step rather than once
   * per micro-batch (not in deterministic mode, whose products are fixed
   * kernels of their own) */
  if (!cfg->det && cfg->micro > 1 && cfg->wpack) {
    DT_CHECK_GOTO(dt__wpack_create(&p->wpk, p->inst[0]), rc, fail);
    for (int k = 0; k < p->K; k++) dt__model_set_wpack(p->inst[k], p->wpk);
  }
  {
    /* the helper on a stage before the last: that stage finishes each
     * step after the next one (its last backward comes after theirs), and
     * the next starts each step waiting for its first activations */
    if (cfg->tail && cfg->stage < cfg->nstages - 1 && !cfg->recompute && !cfg->det &&
        (p->wst || p->wpk)) {
      if (pthread_mutex_init(&p->tail_mu, NULL)) goto nomem;
      if (pthread_cond_init(&p->tail_cv, NULL)) {
        pthread_mutex_destroy(&p->tail_mu);
        goto nomem;
      }
      if (pthread_create(&p->tail, NULL, tail_main, p)) {
        pthread_cond_destroy(&p->tail_cv);
        pthread_mutex_destroy(&p->tail_mu);
        rc = dt__seterr(DT_ENOMEM, "pipeline stage %d: cannot start the weight-gradient thread",
                        cfg->stage);
        goto fail;
      }
      p->tail_on = 1;
    }
  }
  DT_CHECK_GOTO(offload_setup(p), rc, fail);
  *out = p;
  return DT_OK;
nomem:
  rc = dt__seterr(DT_ENOMEM, "pipeline stage %d: out of memory for micro-batches of %d samples",
                  cfg->stage, cfg->max_batch);
fail:
  dt_pipe_destroy(p);
  return rc;
}

dt_model *dt_pipe_model(dt_pipe *p) { return p->inst[0]; }
size_t dt_pipe_act_bytes(const dt_pipe *p, int *models, int *slots) {
  size_t b = 0, B = (size_t)p->c.max_batch;
  for (int k = 0; k < p->K; k++) b += dt__model_act_bytes(p->inst[k]);
  b += dt__wstash_bytes(p->wst);
  int first = p->c.stage == 0, last = p->c.stage == p->c.nstages - 1;
  b += (size_t)p->S * B * sizeof(float) *
       ((first ? 0 : 2 * p->in_dim + 2) + (last ? 0 : p->out_dim));
  if (!last) b += ((size_t)p->G * B * p->out_dim + 2) * sizeof(float);
  if (p->xg) b += (size_t)p->G * B * p->in_dim * sizeof(float);
  *models = p->K;
  *slots = p->S;
  return b;
}

void dt_pipe_set_det(dt_pipe *p, struct dt_ddp *ddp) { p->ddp = ddp; }

void dt_pipe_set_ready(dt_pipe *p, dt_grad_ready_fn fn, void *ud) {
  p->ready = fn;
  p->ready_ud = ud;
}

void dt_pipe_grads_moved(dt_pipe *p) {
  for (int k = 1; k < p->K; k++) dt__model_point_grads(p->inst[k], dt_model_grads(p->inst[0]));
}

void dt_pipe_times(const dt_pipe *p, double *compute_s, double *wait_s) {
  *compute_s = p->compute_s;
  *wait_s = p->wait_s;
}

void dt_pipe_phases(const dt_pipe *p, dt_pipe_phase *ph) {
  ph->fwd = p->fwd_s;
  ph->pack = p->pack_s;
  ph->wgrad = p->wgrad_s;
  ph->bwd = p->compute_s - p->fwd_s - p->pack_s - p->wgrad_s;
  ph->recv = p->recv_s;
  ph->send = p->send_s;
}

/* A communication failure, naming both ends. */
static int comm_err(dt_pipe *p, int rc, const char *what, int j, int peer) {
  dt_comm *c = p->c.comm;
  const char *m = dt_comm_errmsg(c);
  return dt__seterr(rc, "pipeline stage %d (rank %d): %s micro-batch %d %s stage %d (rank %d): %s",
                    p->c.stage, dt_comm_world_rank(c, p->c.stage), what, j,
                    what[0] == 's' ? "to" : "from", peer, dt_comm_world_rank(c, peer),
                    m && *m ? m : dt_errmsg());
}

static int wait_send(dt_pipe *p, dt_comm_req *req, int *pend, int peer, int j) {
  if (!*pend) return DT_OK;
  *pend = 0;
  int64_t t0 = dt_now_ns();
  int rc = dt_comm_waitall(p->c.comm, req, 1);
  double w = dt_obs_lap(p->obs, p->m_send, "send", 0, t0, j);
  p->wait_s += w;
  p->send_s += w;
  return rc < 0 ? comm_err(p, rc, "sending", j, peer) : DT_OK;
}

static int recv_msg(dt_pipe *p, int peer, int tag, void *buf, size_t bytes, int j,
                    const char *what) {
  int64_t t0 = dt_now_ns();
  int rc = dt_comm_recv(p->c.comm, peer, tag, buf, bytes);
  double w = dt_obs_lap(p->obs, p->m_recv, "recv", 0, t0, j);
  p->wait_s += w;
  p->recv_s += w;
  return rc < 0 ? comm_err(p, rc, what, j, peer) : DT_OK;
}

/* Seconds since t0 less what went into waits for sends and into weight
 * gradient flushes meanwhile (they are counted as such), given the
 * counters' values at t0. */
static double lap(const dt_pipe *p, double t0, double send0, double wg0) {
  return dt_now() - t0 - (p->send_s - send0) - (p->wgrad_s - wg0);
}

/* Forward of micro-batch j. */
static int fwd(dt_pipe *p, const dt_pipe_mb *mb, int j, uint64_t seed, uint64_t step) {
  const int s = p->c.stage, P = p->c.nstages, slot = j % p->S, n = mb[j].n;
  if (s > 0) {
    DT_CHECK(recv_msg(p, s - 1, TAG_ACT + j, p->in[slot], (size_t)n * p->in_dim * sizeof(float),
                      j, "receiving activations of"));
    p->xin[j] = p->in[slot];
  } else {
    p->xin[j] = mb[j].x;
  }
  int k = p->K == 1 ? 0 : j % p->K;
  dt_step_ctx ctx = {1, seed, step, mb[j].sample0};
  /* the waits for earlier sends inside are waiting, not forward */
  double t0 = dt_now(), sent0 = p->send_s, wg0 = p->wgrad_s;
  if (p->c.det) {
    /* micro-shard by micro-shard, running statistics untouched (the
     * backward's repeat is the forward that counts) */
    if (s < P - 1) DT_CHECK(wait_send(p, &p->areq[slot], &p->apend[slot], s + 1, j));
    const int u = mb[j].shard;
    for (int q0 = 0; q0 < n; q0 += u) {
      int nq = n - q0 < u ? n - q0 : u;
      if (p->c.nbufs) memcpy(p->bufsave, dt_model_bufs(p->inst[0]), p->c.nbufs * sizeof(float));
      ctx.sample0 = mb[j].sample0 + q0;
      DT_CHECK(dt_model_forward(p->inst[0], p->xin[j] + (size_t)q0 * p->in_dim, nq, &ctx));
      if (p->c.nbufs) memcpy(dt_model_bufs(p->inst[0]), p->bufsave, p->c.nbufs * sizeof(float));
      if (s < P - 1)
        memcpy(p->aout[slot] + (size_t)q0 * p->out_dim, dt_model_logits(p->inst[0]),
               (size_t)nq * p->out_dim * sizeof(float));
    }
    p->inst_mb[0] = -1;
  } else {
    DT_CHECK(dt_model_forward(p->inst[k], p->xin[j], n, &ctx));
    p->inst_mb[k] = j;
  }
  if (s < P - 1) {
    DT_CHECK(wait_send(p, &p->areq[slot], &p->apend[slot], s + 1, j));
    size_t bytes = (size_t)n * p->out_dim * sizeof(float);
    if (!p->c.det) memcpy(p->aout[slot], dt_model_logits(p->inst[k]), bytes);
    double t = lap(p, t0, sent0, wg0);
    p->compute_s += t;
    p->fwd_s += t;
    int rc = dt_comm_isend(p->c.comm, s + 1, TAG_ACT + j, p->aout[slot], bytes, &p->areq[slot]);
    if (rc < 0) return comm_err(p, rc, "sending activations of", j, s + 1);
    p->apend[slot] = 1;
  } else {
    double t = lap(p, t0, sent0, wg0);
    p->compute_s += t;
    p->fwd_s += t;
  }
  return DT_OK;
}

/* Deterministic mode: micro-batch j's micro-shards, each forward again,
 * counted (dt_ddp_det_shard) and backward into the fixed-point sums; its
 * input gradient goes to the gradient send slot (its trailer is the
 * caller's). The loss is the micro-batch's mean. */
static int det_backward(dt_pipe *p, const dt_pipe_mb *mb, int j, uint64_t seed, uint64_t step,
                        float *loss, int *correct) {
  const int s = p->c.stage, P = p->c.nstages, slot = j % p->S, n = mb[j].n, u = mb[j].shard;
  dt_model *m = p->inst[0];
  double lsum = 0;
  int csum = 0;
  dt__model_set_accum(m, 0, 1.0f);
  for (int q0 = 0; q0 < n; q0 += u) {
    int nq = n - q0 < u ? n - q0 : u;
    dt_step_ctx ctx = {1, seed, step, mb[j].sample0 + q0};
    DT_CHECK(dt_model_forward(m, p->xin[j] + (size_t)q0 * p->in_dim, nq, &ctx));
    dt_ddp_det_shard(p->ddp, nq, --p->nshards_left == 0);
    const float *dx = NULL;
    if (s == P - 1) {
      float l = 0;
      int c = 0;
      DT_CHECK(dt_model_backward(m, mb[j].y + q0, nq, &l, &c, dt_ddp_grad_ready, p->ddp));
      lsum += (double)l * nq;
      csum += c;
      dx = dt__model_dx(m);
    } else {
      DT_CHECK(dt__model_backward_dy(m, p->gin + (size_t)q0 * p->out_dim, nq, &dx,
                                     dt_ddp_grad_ready, p->ddp));
    }
    if (s > 0)
      memcpy(p->gout[slot] + (size_t)q0 * p->in_dim, dx, (size_t)nq * p->in_dim * sizeof(float));
  }
  if (s == P - 1) {
    loss[j] = (float)(lsum / n);
    correct[j] = csum;
  } else {
    loss[j] = p->gin[(size_t)n * p->out_dim];
    correct[j] = (int)p->gin[(size_t)n * p->out_dim + 1];
  }
  p->inst_mb[0] = -1;
  return DT_OK;
}

/* The stashed rows' weight gradients into the stage's (the step's first
 * flush overwrites them, later ones add). */
static void wflush(dt_pipe *p) {
  double t0 = dt_now();
  dt__model_wgrad_flush(p->inst[0], p->wst, p->wrows, p->wflushed > 0);
  double t = dt_now() - t0;
  p->compute_s += t;
  p->wgrad_s += t;
  p->wflushed++;
  p->wrows = 0;
}

/* A job for the helper; its number for tail_wait. */
static uint64_t tail_post(dt_pipe *p, int kind, int rows, int acc) {
  pthread_mutex_lock(&p->tail_mu);
  while (p->tail_done < p->tail_gen) pthread_cond_wait(&p->tail_cv, &p->tail_mu); /* one at a time */
  p->tail_kind = kind;
  p->tail_rows = rows;
  p->tail_acc = acc;
  uint64_t gen = ++p->tail_gen;
  pthread_cond_broadcast(&p->tail_cv);
  pthread_mutex_unlock(&p->tail_mu);
  return gen;
}

static void tail_wait(dt_pipe *p, uint64_t gen) {
  pthread_mutex_lock(&p->tail_mu);
  while (p->tail_done < gen) pthread_cond_wait(&p->tail_cv, &p->tail_mu);
  pthread_mutex_unlock(&p->tail_mu);
}

/* The input-gradient packing posted at the step's start, finished. */
static void pack_wait(dt_pipe *p) {
  if (!p->pack_gen) return;
  double t0 = dt_now();
  tail_wait(p, p->pack_gen);
  p->pack_gen = 0;
  double t = dt_now() - t0;
  p->compute_s += t;
  p->pack_s += t;
}

/* The step's last flush (wflush's), part 1 of the layers on the helper
 * thread when there is one. */
static void wflush_tail(dt_pipe *p) {
  if (!p->tail_on) {
    wflush(p);
    return;
  }
  double t0 = dt_now();
  uint64_t gen = tail_post(p, JOB_WGRAD, p->wrows, p->wflushed > 0);
  dt__model_wgrad_flush_part(p->inst[0], p->wst, p->wrows, p->wflushed > 0, 0);
  tail_wait(p, gen);
  double t = dt_now() - t0;
  p->compute_s += t;
  p->wgrad_s += t;
  p->wflushed++;
  p->wrows = 0;
}

/* Offload, stage 0: micro-batch j's stashed rows [row0, row0 + n) of the
 * offloaded layer to the last stage (its inputs, then its output
 * gradients), while the next backward or forward runs. */
static int offload_send(dt_pipe *p, int j, int row0, int n) {
  const float *x, *dy;
  dt__wstash_rows(p->wst, p->olayer, &x, &dy);
  const int peer = p->c.nstages - 1;
  int rc = dt_comm_isend(p->c.comm, peer, TAG_OX + j, x + (size_t)row0 * p->oC,
                         (size_t)n * p->oC * sizeof(float), &p->oreq[2 * j]);
  if (rc < 0) return comm_err(p, rc, "sending the first layer's inputs of", j, peer);
  p->opend[2 * j] = 1;
  rc = dt_comm_isend(p->c.comm, peer, TAG_ODY + j, dy + (size_t)row0 * p->oOC,
                     (size_t)n * p->oOC * sizeof(float), &p->oreq[2 * j + 1]);
  if (rc < 0) return comm_err(p, rc, "sending the first layer's output gradients of", j, peer);
  p->opend[2 * j + 1] = 1;
  return DT_OK;
}

/* Offload, the last stage: receives for the step's rows, micro-batch j's
 * at the rows stage 0 stashed them in (backwards go in micro-batch order). */
static int offload_post(dt_pipe *p, const dt_pipe_mb *mb, int m) {
  size_t r = 0;
  for (int j = 0; j < m; j++) {
    const size_t n = (size_t)mb[j].n;
    int rc = dt_comm_irecv(p->c.comm, 0, TAG_OX + j, p->ox + r * p->oC, n * p->oC * sizeof(float),
                           &p->oreq[2 * j]);
    if (rc >= 0) {
      p->opend[2 * j] = 1;
      rc = dt_comm_irecv(p->c.comm, 0, TAG_ODY + j, p->ody + r * p->oOC,
                         n * p->oOC * sizeof(float), &p->oreq[2 * j + 1]);
    }
    if (rc < 0) {
      p->oleak = 1;
      return comm_err(p, rc, "posting receives of stage 0's first-layer rows of", j, 0);
    }
    p->opend[2 * j + 1] = 1;
    r += n;
  }
  return DT_OK;
}

/* Offload: the pending row messages moved on (tested), without waiting.
 * A message that did not fit in the transport's ring when it was sent
 * goes on only when its sender drives the transport, and a received one
 * leaves the ring only when its receiver does: both stages are in their
 * weight-gradient products at the step's end (the last micro-batches'
 * rows, about 1 MiB, waited there for stage 0's next call otherwise,
 * 50 ms later), so both call this between their layers' products. */
static void offload_progress(dt_pipe *p) {
  for (int i = 0; p->off && i < 2 * p->c.micro; i++) {
    if (!p->opend[i]) continue;
    bool done = false;
    if (dt_comm_test(p->c.comm, &p->oreq[i], &done) < 0) return; /* the wait reports it */
    if (done) p->opend[i] = 0;
  }
}

/* Offload, the last stage: waits for the step's rows, makes the product
 * and sends it to stage 0. */
static int offload_product(dt_pipe *p, int m, int rows) {
  int64_t t0 = dt_now_ns();
  int rc = DT_OK;
  for (int i = 0; i < 2 * m && rc >= 0; i++)
    if (p->opend[i]) rc = dt_comm_waitall(p->c.comm, &p->oreq[i], 1);
  double w = dt_obs_lap(p->obs, p->m_recv, "recv", 0, t0, -1);
  p->wait_s += w;
  p->recv_s += w;
  for (int i = 0; i < 2 * m; i++) p->opend[i] = 0;
  if (rc < 0) return comm_err(p, rc, "receiving stage 0's first-layer rows of", m - 1, 0);
  double t1 = dt_now();
  dt__wgrad_product(p->inst[0], p->oOC, p->oC, rows, p->ody, p->ox, p->odw);
  double t = dt_now() - t1;
  p->compute_s += t;
  p->wgrad_s += t;
  const int q = 2 * p->c.micro;
  rc = dt_comm_isend(p->c.comm, 0, TAG_ODW, p->odw, (size_t)p->oC * p->oOC * sizeof(float),
                     &p->oreq[q]);
  if (rc < 0) return comm_err(p, rc, "sending stage 0's first-layer weight gradient after", m - 1, 0);
  p->opend[q] = 1;
  return DT_OK;
}

/* The step's weight gradients not yet made (all of them, in one product
 * per layer over the step's rows), last layer first, each reported to
 * p->ready (if set) right after: dt__model_wgrad_flush_ready's order and
 * products, with the offload's part: stage 0 receives its first linear
 * layer's product from the last stage instead of making it, the last
 * stage makes that product after its layers from ocut up. With reports
 * (hybrid replicas) a report may start a reduction on ddp's thread over
 * the same transport, which one thread at a time may drive: the offload's
 * messages come first then (the last stage makes the product before its
 * own; stage 0 reports its layers once the product is in). */
static int offload_flush(dt_pipe *p, int m) {
  dt_model *md = p->inst[0];
  const int rows = p->wrows, n = dt_model_nlayers(md);
  const int cut = p->ready ? n : p->ocut, defer = p->ready && p->off == 1;
  int made = p->off != 2;
  for (int i = n - 1; i >= 0; i--) {
    offload_progress(p);
    if (!made && i < cut) {
      DT_CHECK(offload_product(p, m, rows));
      made = 1;
    }
    const dt_layer_info *l = dt_model_layer(md, i);
    if (p->off == 1 && i == p->olayer) {
      DT_CHECK(recv_msg(p, p->c.nstages - 1, TAG_ODW, dt__model_wgrad_dst(md, i),
                        (size_t)p->oC * p->oOC * sizeof(float), m - 1,
                        "receiving the first layer's weight gradient after"));
    } else {
      double t0 = dt_now();
      dt__model_wgrad_layer(md, p->wst, i, rows, p->wflushed > 0);
      double t = dt_now() - t0;
      p->compute_s += t;
      p->wgrad_s += t;
    }
    if (p->ready && !defer && l->nparams) p->ready(p->ready_ud, l->param_off, l->nparams);
  }
  if (!made) DT_CHECK(offload_product(p, m, rows));
  for (int i = n - 1; defer && i >= 0; i--) {
    const dt_layer_info *l = dt_model_layer(md, i);
    if (l->nparams) p->ready(p->ready_ud, l->param_off, l->nparams);
  }
  p->wflushed++;
  p->wrows = 0;
  return DT_OK;
}

/* Backward of micro-batch j; first: the step's first backward (overwrites). */
static int bwd(dt_pipe *p, const dt_pipe_mb *mb, int j, int first, int n_global, uint64_t seed,
               uint64_t step, float *loss, int *correct) {
  const int s = p->c.stage, P = p->c.nstages, slot = j % p->S, n = mb[j].n;
  int k = p->K == 1 ? 0 : j % p->K;
  dt_model *m = p->inst[k];
  if (s < P - 1 && (p->c.det || p->inst_mb[k] == j))
    DT_CHECK(recv_msg(p, s + 1, TAG_GRAD + j, p->gin, ((size_t)n * p->out_dim + 2) * sizeof(float),
                      j, "receiving gradients of"));
  pack_wait(p);
  double t0 = dt_now(), sent0 = p->send_s, wg0 = p->wgrad_s;
  if (p->c.det) {
    DT_CHECK(wait_send(p, &p->greq[slot], &p->gpend[slot], s - 1, j));
    DT_CHECK(det_backward(p, mb, j, seed, step, loss, correct));
    if (s > 0) {
      size_t nd = (size_t)n * p->in_dim;
      p->gout[slot][nd] = loss[j];
      p->gout[slot][nd + 1] = (float)correct[j];
      p->compute_s += lap(p, t0, sent0, wg0);
      int rc = dt_comm_isend(p->c.comm, s - 1, TAG_GRAD + j, p->gout[slot],
                             (nd + 2) * sizeof(float), &p->greq[slot]);
      if (rc < 0) return comm_err(p, rc, "sending gradients of", j, s - 1);
      p->gpend[slot] = 1;
    } else {
      p->compute_s += lap(p, t0, sent0, wg0);
    }
    return DT_OK;
  }
  if (p->inst_mb[k] != j) {
    /* recompute: the forward again, from the kept input, without counting
     * its batch statistics twice */
    float *bufs = dt_model_bufs(m);
    if (p->c.nbufs) memcpy(p->bufsave, bufs, p->c.nbufs * sizeof(float));
    dt_step_ctx ctx = {1, seed, step, mb[j].sample0};
    DT_CHECK(dt_model_forward(m, p->xin[j], n, &ctx));
    if (p->c.nbufs) memcpy(bufs, p->bufsave, p->c.nbufs * sizeof(float));
    p->inst_mb[k] = j;
    /* the repeat needs only the kept input: it ran while the gradients
     * were on their way */
    if (s < P - 1) {
      p->compute_s += lap(p, t0, sent0, wg0);
      DT_CHECK(recv_msg(p, s + 1, TAG_GRAD + j, p->gin,
                        ((size_t)n * p->out_dim + 2) * sizeof(float), j, "receiving gradients of"));
      t0 = dt_now(), sent0 = p->send_s, wg0 = p->wgrad_s;
    }
  }
  dt__model_set_accum(m, !first, (float)n / (float)n_global);
  const int row0 = p->wrows;
  if (p->wst) {
    if (p->wrows + n > p->wcap) wflush(p);
    dt__model_set_wstash(m, p->wst, p->wrows);
    p->wrows += n;
  }
  const float *dx = NULL;
  if (s == P - 1) {
    DT_CHECK(dt_model_backward(m, mb[j].y, n, &loss[j], &correct[j], NULL, NULL));
    dx = dt__model_dx(m);
  } else {
    DT_CHECK(dt__model_backward_dy(m, p->gin, n, &dx, NULL, NULL));
    loss[j] = p->gin[(size_t)n * p->out_dim];
    correct[j] = (int)p->gin[(size_t)n * p->out_dim + 1];
  }
  if (s > 0) {
    DT_CHECK(wait_send(p, &p->greq[slot], &p->gpend[slot], s - 1, j));
    size_t nd = (size_t)n * p->in_dim;
    float *g = p->gout[slot];
    memcpy(g, dx, nd * sizeof(float));
    g[nd] = loss[j];
    g[nd + 1] = (float)correct[j];
    p->compute_s += lap(p, t0, sent0, wg0);
    int rc = dt_comm_isend(p->c.comm, s - 1, TAG_GRAD + j, g, (nd + 2) * sizeof(float),
                           &p->greq[slot]);
    if (rc < 0) return comm_err(p, rc, "sending gradients of", j, s - 1);
    p->gpend[slot] = 1;
  } else {
    p->compute_s += lap(p, t0, sent0, wg0);
  }
  if (p->off == 1) DT_CHECK(offload_send(p, j, row0, n));
  p->inst_mb[k] = -1;
  /* a full group (recompute's bounded stash; without recompute the whole
   * step's rows, after the last backward): its weight gradients now, while
   * the previous stage goes on with the gradients just sent (with the
   * offload, whose stash holds the whole step, at the step's end:
   * offload_flush) */
  if (p->wst && !p->off && p->wrows + p->c.max_batch > p->wcap) wflush(p);
  return DT_OK;
}

/* gpipe with recompute (p->G > 1): the backward of micro-batches
 * [j0, j0 + g) at once. Their samples are consecutive, so the forward is
 * repeated over all their rows in one pass (dropout draws the same masks:
 * they are keyed by sample position) and the backward is one pass with the
 * loss gradient scaled by rows / n_global, so every layer's products have
 * g micro-batches' rows (the weights are read once per group, not once per
 * micro-batch). Each micro-batch's input gradient still goes back on its
 * own. On the last stage each micro-batch gets the group's mean loss, and
 * the first of them the group's correct count (the sums are the same). */
static int bwd_group(dt_pipe *p, const dt_pipe_mb *mb, int j0, int g, int first, int n_global,
                     uint64_t seed, uint64_t step, float *loss, int *correct) {
  const int s = p->c.stage, P = p->c.nstages;
  dt_model *m = p->inst[0];
  int rows = 0;
  for (int j = j0; j < j0 + g; j++) rows += mb[j].n;
  double t0 = dt_now();
  const float *x = mb[j0].x;
  if (s > 0) {
    size_t off = 0;
    for (int j = j0; j < j0 + g; j++) {
      size_t nd = (size_t)mb[j].n * p->in_dim;
      memcpy(p->xg + off, p->xin[j], nd * sizeof(float));
      off += nd;
    }
    x = p->xg;
  }
  dt_step_ctx ctx = {1, seed, step, mb[j0].sample0};
  DT_CHECK(dt_model_forward(m, x, rows, &ctx));
  /* the repeated forward needs only the kept inputs: it ran while the
   * group's gradients were on their way */
  if (s < P - 1) {
    p->compute_s += dt_now() - t0;
    /* each gradient right after the previous one's rows (its trailer,
     * read first, is overwritten by the next) */
    size_t off = 0;
    for (int j = j0; j < j0 + g; j++) {
      size_t nd = (size_t)mb[j].n * p->out_dim;
      DT_CHECK(recv_msg(p, s + 1, TAG_GRAD + j, p->gin + off, (nd + 2) * sizeof(float), j,
                        "receiving gradients of"));
      loss[j] = p->gin[off + nd];
      correct[j] = (int)p->gin[off + nd + 1];
      off += nd;
    }
    t0 = dt_now();
  }
  dt__model_set_accum(m, !first, (float)rows / (float)n_global);
  const float *dx = NULL;
  if (s == P - 1) {
    float l = 0;
    int c = 0;
    DT_CHECK(dt_model_backward(m, mb[j0].y, rows, &l, &c, NULL, NULL));
    for (int j = j0; j < j0 + g; j++) loss[j] = l, correct[j] = j == j0 ? c : 0;
    dx = dt__model_dx(m);
  } else {
    DT_CHECK(dt__model_backward_dy(m, p->gin, rows, &dx, NULL, NULL));
  }
  p->inst_mb[0] = -1;
  p->compute_s += dt_now() - t0;
  if (s > 0) {
    for (int j = j0; j < j0 + g; j++) {
      const int slot = j % p->S;
      DT_CHECK(wait_send(p, &p->greq[slot], &p->gpend[slot], s - 1, j));
      size_t nd = (size_t)mb[j].n * p->in_dim;
      float *gb = p->gout[slot];
      memcpy(gb, dx, nd * sizeof(float));
      dx += nd;
      gb[nd] = loss[j];
      gb[nd + 1] = (float)correct[j];
      int rc = dt_comm_isend(p->c.comm, s - 1, TAG_GRAD + j, gb, (nd + 2) * sizeof(float),
                             &p->greq[slot]);
      if (rc < 0) return comm_err(p, rc, "sending gradients of", j, s - 1);
      p->gpend[slot] = 1;
    }
  }
  return DT_OK;
}

/* Every send of the step delivered (or the first error). */
static int drain(dt_pipe *p, int rc) {
  for (int i = 0; i < p->S; i++) {
    int r1 = wait_send(p, &p->areq[i], &p->apend[i], p->c.stage + 1, -1);
    int r2 = wait_send(p, &p->greq[i], &p->gpend[i], p->c.stage - 1, -1);
    if (rc == DT_OK) rc = r1 < 0 ? r1 : r2;
  }
  if (p->off == 1) {
    /* the offloaded rows (delivered: the product came back after them) */
    for (int i = 0; i < 2 * p->c.micro; i++) {
      int r = wait_send(p, &p->oreq[i], &p->opend[i], p->c.nstages - 1, i / 2);
      if (rc == DT_OK) rc = r;
    }
  } else if (p->off == 2) {
    int r = wait_send(p, &p->oreq[2 * p->c.micro], &p->opend[2 * p->c.micro], 0, -1);
    if (rc == DT_OK) rc = r;
    /* receives of rows still pending after an error: their buffers stay
     * (never freed) rather than be written after free */
    for (int i = 0; i < 2 * p->c.micro; i++)
      if (p->opend[i]) p->oleak = 1;
  }
  return rc;
}

int dt_pipe_step(dt_pipe *p, const dt_pipe_mb *mb, int m, int n_global, uint64_t seed,
                 uint64_t step, float *loss, int *correct) {
  if (m < 0 || m > p->c.micro)
    return dt__seterr(DT_EINVAL, "pipeline stage %d: %d micro-batches (at most %d)", p->c.stage,
                      m, p->c.micro);
  if (p->c.det) {
    p->nshards_left = 0;
    for (int j = 0; j < m; j++) p->nshards_left += (mb[j].n + mb[j].shard - 1) / mb[j].shard;
    if (m == 0) {
      dt_ddp_all_ready(p->ddp);
      return DT_OK;
    }
  }
  if (m == 0) {
    /* nothing to train on this step: zero gradients */
    memset(dt_model_grads(p->inst[0]), 0, dt_model_nparams(p->inst[0]) * sizeof(float));
    if (p->ready) dt__model_wgrad_flush_ready(p->inst[0], NULL, 0, 0, p->ready, p->ready_ud);
    return DT_OK;
  }
  int rc = DT_OK;
  if (p->wpk) {
    /* the parameters changed since the last step (the optimizer, a
     * checkpoint's import, a broadcast): pack them for this step */
    double t0 = dt_now();
    if (p->tail_on) {
      /* on the helper, layer by layer, forward forms first: each forward
       * product waits for its layer's (dt__wpack_get), so the first
       * forward starts after one layer's packing; the first backward waits
       * for the whole job */
      dt__wpack_refresh_begin(p->wpk);
      p->pack_gen = tail_post(p, JOB_PACK, 0, 0);
    } else {
      dt__wpack_refresh(p->wpk, p->inst[0]);
    }
    double t = dt_now() - t0;
    p->compute_s += t;
    p->pack_s += t;
  }
  p->wrows = p->wflushed = 0;
  if (p->off == 2) rc = offload_post(p, mb, m);
  if (rc != DT_OK) return p->c.comm ? drain(p, rc) : rc;
  if (p->c.schedule == DT_PIPE_GPIPE) {
    for (int j = 0; j < m && rc == DT_OK; j++) rc = fwd(p, mb, j, seed, step);
    if (p->G > 1)
      for (int j = 0; j < m && rc == DT_OK; j += p->G)
        rc = bwd_group(p, mb, j, m - j < p->G ? m - j : p->G, j == 0, n_global, seed, step, loss,
                       correct);
    else
      for (int j = 0; j < m && rc == DT_OK; j++)
        rc = bwd(p, mb, j, j == 0, n_global, seed, step, loss, correct);
  } else {
    int warm = nwarm(&p->c) < m ? nwarm(&p->c) : m;
    for (int j = 0; j < warm && rc == DT_OK; j++) rc = fwd(p, mb, j, seed, step);
    for (int i = 0; i < m && rc == DT_OK; i++) {
      if (warm + i < m) rc = fwd(p, mb, warm + i, seed, step);
      if (rc == DT_OK) rc = bwd(p, mb, i, i == 0, n_global, seed, step, loss, correct);
    }
  }
  if (p->ready) {
    /* every send of the step delivered before the caller's reduction
     * starts (it may run on another thread, over another communicator);
     * then the weight gradients not yet flushed, layer by layer, last
     * first, each reported as soon as it is made, so its reduction over
     * the replicas overlaps the products of the layers before it (without
     * deferred weight gradients, or with none left, only the reports) */
    if (p->c.comm) rc = drain(p, rc);
    if (rc == DT_OK && p->off) {
      rc = offload_flush(p, m);
    } else if (rc == DT_OK) {
      int rows = p->wst ? p->wrows : 0;
      double t0 = dt_now();
      dt__model_wgrad_flush_ready(p->inst[0], p->wst, rows, p->wflushed > 0, p->ready,
                                  p->ready_ud);
      double t = dt_now() - t0;
      p->compute_s += t;
      p->wgrad_s += t;
      if (rows) p->wflushed++, p->wrows = 0;
    }
    return rc;
  }
  /* the stage's weight gradients over the micro-batches not yet flushed
   * (without recompute: every one, in one product per layer, after the
   * last backward's gradients went to the previous stage) */
  if (rc == DT_OK && p->off) rc = offload_flush(p, m);
  else if (rc == DT_OK && p->wst && p->wrows) wflush_tail(p);
  return p->c.comm ? drain(p, rc) : rc;
}

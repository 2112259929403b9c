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
#include "parallel/pipe_int.h"
#include "tensor/tensor.h"

enum { JOB_WGRAD = 1, JOB_PACK = 2 };

int dt__pipe_tail_delay_us = 0;

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
  dt__pipe_offload_free(p);
  free(p);
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
  /* gpipe with recompute: the last stage's forwards wait for its
   * backwards, which repeat them anyway (one model; every micro-batch's
   * input is kept in its slot); the repeat then counts the batch
   * statistics. Its forwards no longer compete with stage 0's for the
   * memory bandwidth while stage 0 makes the step's first forwards. */
  p->lazy = cfg->recompute && !cfg->det && cfg->schedule == DT_PIPE_GPIPE &&
            cfg->stage == cfg->nstages - 1;
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
  DT_CHECK_GOTO(dt__pipe_offload_setup(p), rc, fail);
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
int dt__stage_comm_err(dt_pipe *p, int rc, const char *what, int j, int peer) {
  dt_comm *c = p->c.comm;
  const char *m = dt_comm_errmsg(c);
  return dt__seterr(rc, "pipeline stage %d (rank %d): %s micro-batch %d %s stage %d (rank %d): %s",
                    p->c.stage, dt_comm_world_rank(c, p->c.stage), what, j,
                    what[0] == 's' ? "to" : "from", peer, dt_comm_world_rank(c, peer),
                    m && *m ? m : dt_errmsg());
}

int dt__stage_wait_send(dt_pipe *p, dt_comm_req *req, int *pend, int peer, int j) {
  if (!*pend) return DT_OK;
  *pend = 0;
  int64_t t0 = dt_now_ns();
  int rc = dt_comm_waitall(p->c.comm, req, 1);
  double w = dt_obs_lap(p->obs, p->m_send, "send", 0, t0, j);
  p->wait_s += w;
  p->send_s += w;
  return rc < 0 ? dt__stage_comm_err(p, rc, "sending", j, peer) : DT_OK;
}

int dt__stage_recv_msg(dt_pipe *p, int peer, int tag, void *buf, size_t bytes, int j,
                       const char *what) {
  int64_t t0 = dt_now_ns();
  int rc = dt_comm_recv(p->c.comm, peer, tag, buf, bytes);
  double w = dt_obs_lap(p->obs, p->m_recv, "recv", 0, t0, j);
  p->wait_s += w;
  p->recv_s += w;
  return rc < 0 ? dt__stage_comm_err(p, rc, what, j, peer) : DT_OK;
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
    DT_CHECK(dt__stage_recv_msg(p, s - 1, TAG_ACT + j, p->in[slot],
                                (size_t)n * p->in_dim * sizeof(float), j,
                                "receiving activations of"));
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
    if (s < P - 1) DT_CHECK(dt__stage_wait_send(p, &p->areq[slot], &p->apend[slot], s + 1, j));
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
  } else if (!p->lazy) {
    DT_CHECK(dt_model_forward(p->inst[k], p->xin[j], n, &ctx));
    p->inst_mb[k] = j;
  }
  if (s < P - 1) {
    DT_CHECK(dt__stage_wait_send(p, &p->areq[slot], &p->apend[slot], s + 1, j));
    size_t bytes = (size_t)n * p->out_dim * sizeof(float);
    if (!p->c.det) memcpy(p->aout[slot], dt_model_logits(p->inst[k]), bytes);
    double t = lap(p, t0, sent0, wg0);
    p->compute_s += t;
    p->fwd_s += t;
    int rc = dt_comm_isend(p->c.comm, s + 1, TAG_ACT + j, p->aout[slot], bytes, &p->areq[slot]);
    if (rc < 0) return dt__stage_comm_err(p, rc, "sending activations of", j, s + 1);
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

/* Recomputation: the forward of micro-batches [j0, j0 + g) (n rows, input
 * x) again. A stage before the last still holds what it sent of them in
 * its send slots (slot j % S is next written by the forward of j + S,
 * which comes after the backward of j in both schedules), so the trailing
 * layers whose backward needs only that output are not repeated
 * (dt__model_forward_kept: on the deep MLP's stage 0 its last linear
 * layer, 4.2M of its 10M multiply-adds per sample). */
static int repeat_forward(dt_pipe *p, dt_model *m, const float *x, int n, const dt_step_ctx *ctx,
                          const dt_pipe_mb *mb, int j0, int g) {
  if (p->c.stage == p->c.nstages - 1 || !dt__model_tail_skip(m))
    return dt_model_forward(m, x, n, ctx);
  float *out;
  DT_CHECK(dt__model_forward_kept(m, x, n, ctx, &out));
  for (int j = j0; j < j0 + g; j++) {
    size_t nd = (size_t)mb[j].n * p->out_dim;
    memcpy(out, p->aout[j % p->S], nd * sizeof(float));
    out += nd;
  }
  return DT_OK;
}

/* Backward of micro-batch j; first: the step's first backward (overwrites). */
static int bwd(dt_pipe *p, const dt_pipe_mb *mb, int j, int first, int n_global, uint64_t seed,
               uint64_t step, float *loss, int *correct) {
  const int s = p->c.stage, P = p->c.nstages, slot = j % p->S, n = mb[j].n;
  int k = p->K == 1 ? 0 : j % p->K;
  dt_model *m = p->inst[k];
  if (s < P - 1 && (p->c.det || p->inst_mb[k] == j))
    DT_CHECK(dt__stage_recv_msg(p, s + 1, TAG_GRAD + j, p->gin,
                                ((size_t)n * p->out_dim + 2) * sizeof(float), j,
                                "receiving gradients of"));
  pack_wait(p);
  double t0 = dt_now(), sent0 = p->send_s, wg0 = p->wgrad_s;
  if (p->c.det) {
    DT_CHECK(dt__stage_wait_send(p, &p->greq[slot], &p->gpend[slot], s - 1, j));
    DT_CHECK(det_backward(p, mb, j, seed, step, loss, correct));
    if (s > 0) {
      size_t nd = (size_t)n * p->in_dim;
      p->gout[slot][nd] = loss[j];
      p->gout[slot][nd + 1] = (float)correct[j];
      p->compute_s += lap(p, t0, sent0, wg0);
      int rc = dt_comm_isend(p->c.comm, s - 1, TAG_GRAD + j, p->gout[slot],
                             (nd + 2) * sizeof(float), &p->greq[slot]);
      if (rc < 0) return dt__stage_comm_err(p, rc, "sending gradients of", j, s - 1);
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
    if (p->c.nbufs && !p->lazy) memcpy(p->bufsave, bufs, p->c.nbufs * sizeof(float));
    dt_step_ctx ctx = {1, seed, step, mb[j].sample0};
    DT_CHECK(repeat_forward(p, m, p->xin[j], n, &ctx, mb, j, 1));
    if (p->c.nbufs && !p->lazy) memcpy(bufs, p->bufsave, p->c.nbufs * sizeof(float));
    p->inst_mb[k] = j;
    /* the repeat needs only the kept input: it ran while the gradients
     * were on their way */
    if (s < P - 1) {
      p->compute_s += lap(p, t0, sent0, wg0);
      DT_CHECK(dt__stage_recv_msg(p, s + 1, TAG_GRAD + j, p->gin,
                                  ((size_t)n * p->out_dim + 2) * sizeof(float), j,
                                  "receiving gradients of"));
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
    DT_CHECK(dt__stage_wait_send(p, &p->greq[slot], &p->gpend[slot], s - 1, j));
    size_t nd = (size_t)n * p->in_dim;
    float *g = p->gout[slot];
    memcpy(g, dx, nd * sizeof(float));
    g[nd] = loss[j];
    g[nd + 1] = (float)correct[j];
    p->compute_s += lap(p, t0, sent0, wg0);
    int rc = dt_comm_isend(p->c.comm, s - 1, TAG_GRAD + j, g, (nd + 2) * sizeof(float),
                           &p->greq[slot]);
    if (rc < 0) return dt__stage_comm_err(p, rc, "sending gradients of", j, s - 1);
    p->gpend[slot] = 1;
  } else {
    p->compute_s += lap(p, t0, sent0, wg0);
  }
  if (p->off == 1) DT_CHECK(dt__pipe_offload_send(p, j, row0, n));
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
  DT_CHECK(repeat_forward(p, m, x, rows, &ctx, mb, j0, g));
  /* the repeated forward needs only the kept inputs: it ran while the
   * group's gradients were on their way */
  if (s < P - 1) {
    p->compute_s += dt_now() - t0;
    /* each gradient right after the previous one's rows (its trailer,
     * read first, is overwritten by the next) */
    size_t off = 0;
    for (int j = j0; j < j0 + g; j++) {
      size_t nd = (size_t)mb[j].n * p->out_dim;
      DT_CHECK(dt__stage_recv_msg(p, s + 1, TAG_GRAD + j, p->gin + off, (nd + 2) * sizeof(float),
                                  j, "receiving gradients of"));
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
      DT_CHECK(dt__stage_wait_send(p, &p->greq[slot], &p->gpend[slot], s - 1, j));
      size_t nd = (size_t)mb[j].n * p->in_dim;
      float *gb = p->gout[slot];
      memcpy(gb, dx, nd * sizeof(float));
      dx += nd;
      gb[nd] = loss[j];
      gb[nd + 1] = (float)correct[j];
      int rc = dt_comm_isend(p->c.comm, s - 1, TAG_GRAD + j, gb, (nd + 2) * sizeof(float),
                             &p->greq[slot]);
      if (rc < 0) return dt__stage_comm_err(p, rc, "sending gradients of", j, s - 1);
      p->gpend[slot] = 1;
    }
  }
  return DT_OK;
}

/* Every send of the step delivered (or the first error). */
static int drain(dt_pipe *p, int rc) {
  for (int i = 0; i < p->S; i++) {
    int r1 = dt__stage_wait_send(p, &p->areq[i], &p->apend[i], p->c.stage + 1, -1);
    int r2 = dt__stage_wait_send(p, &p->greq[i], &p->gpend[i], p->c.stage - 1, -1);
    if (rc == DT_OK) rc = r1 < 0 ? r1 : r2;
  }
  return p->off ? dt__pipe_offload_drain(p, rc) : rc;
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
  if (p->off == 2) rc = dt__pipe_offload_post(p, mb, m);
  if (rc != DT_OK) return p->c.comm ? drain(p, rc) : rc;
  if (p->lazy) {
    /* gpipe's last stage, its forwards lazy: each group (or micro-batch) goes
     * forward and backward as soon as its activations are in, while stage
     * 0 still makes the step's forwards; stage 0 finds the gradients of
     * its backward waiting (no fill at the start of its backward) */
    for (int j0 = 0; j0 < m && rc == DT_OK; j0 += p->G) {
      const int g = m - j0 < p->G ? m - j0 : p->G;
      for (int j = j0; j < j0 + g && rc == DT_OK; j++) rc = fwd(p, mb, j, seed, step);
      if (rc == DT_OK && p->G > 1)
        rc = bwd_group(p, mb, j0, g, j0 == 0, n_global, seed, step, loss, correct);
      else if (rc == DT_OK)
        rc = bwd(p, mb, j0, j0 == 0, n_global, seed, step, loss, correct);
    }
  } else if (p->c.schedule == DT_PIPE_GPIPE) {
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
      rc = dt__pipe_offload_flush(p, m);
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
  if (rc == DT_OK && p->off) rc = dt__pipe_offload_flush(p, m);
  else if (rc == DT_OK && p->wst && p->wrows) wflush_tail(p);
  return p->c.comm ? drain(p, rc) : rc;
}

/*
 * pipe_eval.c — evaluation through the pipeline (pipe.h dt_pipe_eval_*):
 * the test samples go forward only, chunk by chunk, through the stages of
 * one replica, each stage running its own layers on its own span of the
 * parameters (so no rank needs the others' parameters), and the last stage
 * computes each chunk's loss and correct count as the whole model's
 * evaluation does on the same rows: a chunk has the whole model's
 * evaluation chunk size, so every product has the same shape and the
 * logits are the same bits.
 *
 * Memory: one stage model at the chunk's rows (its activations, no
 * gradients), made for one evaluation and freed after, plus two send
 * slots (a stage forwards the next chunk while the previous one's output
 * is in flight) and one receive buffer. Messages: chunk k's activations
 * with tag TAG_EVAL + k, in order on each link.
 *
 * It does not split the test set over replicas or sum the tallies over
 * them (the pipeline strategy does), and it keeps nothing between chunks.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "parallel/pipe.h"
#include "tensor/tensor.h"

#define TAG_EVAL 0x320000 /* pipe.c: 0x100000, 0x200000; checkpoints 0x300000, 0x310000 */

struct dt_pipe_eval {
  dt_model *m;        /* this stage's layers at `rows` samples, over the whole model's span */
  dt_comm *comm;
  int stage, nstages, rows;
  size_t in_dim, out_dim;
  float *in;          /* stages after the first: a chunk's input */
  float *out[2];      /* stages before the last: send slots */
  dt_comm_req req[2];
  int pend[2];
};

void dt_pipe_eval_destroy(dt_pipe_eval *e) {
  if (!e) return;
  for (int k = 0; k < 2; k++)
    if (e->pend[k]) dt_comm_waitall(e->comm, &e->req[k], 1);
  dt_model_destroy(e->m);
  dt_free(e->in);
  dt_free(e->out[0]);
  dt_free(e->out[1]);
  free(e);
}

int dt_pipe_eval_create(dt_pipe_eval **out, const dt_pipe_cfg *cfg, int rows, int loss) {
  *out = NULL;
  if (rows < 1 || !cfg->whole || (cfg->nstages > 1 && !cfg->comm))
    return dt__seterr(DT_EINVAL, "pipeline evaluation: bad arguments (rows %d)", rows);
  dt_pipe_eval *e = calloc(1, sizeof *e);
  if (!e) return dt__seterr(DT_ENOMEM, "pipeline evaluation: out of memory");
  e->comm = cfg->comm;
  e->stage = cfg->stage;
  e->nstages = cfg->nstages;
  e->rows = rows;
  int rc = dt__model_create_range(&e->m, cfg->spec, cfg->c, cfg->h, cfg->w, rows, cfg->l0,
                                  cfg->l1, cfg->det ? DT__STAGE_KEEP_CHUNKS : 0);
  if (rc < 0) goto fail;
  /* forward only: no gradients, the parameters and statistics the stage trains */
  dt__model_share(e->m, cfg->whole, cfg->param_off, cfg->buf_off, NULL);
  dt__model_drop_grads(e->m);
  if (cfg->det) dt_model_set_gemm_flags(e->m, DT_GEMM_FIXED);
  if (loss && (rc = dt__model_set_loss(e->m, loss)) < 0) goto fail;
  e->in_dim = (size_t)dt_model_in_dim(e->m);
  e->out_dim = (size_t)dt_model_out_dim(e->m);
  const size_t R = (size_t)rows;
  if ((e->stage > 0 && !(e->in = dt_alloc(R * e->in_dim * sizeof(float)))) ||
      (e->stage < e->nstages - 1 && (!(e->out[0] = dt_alloc(R * e->out_dim * sizeof(float))) ||
                                     !(e->out[1] = dt_alloc(R * e->out_dim * sizeof(float)))))) {
    rc = dt__seterr(DT_ENOMEM, "pipeline evaluation: out of memory for %d rows", rows);
    goto fail;
  }
  *out = e;
  return DT_OK;
fail:
  dt_pipe_eval_destroy(e);
  return rc;
}

static int eval_err(dt_pipe_eval *e, int rc, const char *what, int64_t k, int peer) {
  return dt__preerr(rc, "pipeline stage %d: evaluation: %s chunk %lld %s stage %d", e->stage,
                    what, (long long)k, what[0] == 's' ? "to" : "from", peer);
}

int dt_pipe_eval_run(dt_pipe_eval *e, const float *x, const int32_t *y, int64_t lo, int64_t hi,
                     dt_pipe_eval_fn fn, void *ud) {
  const int s = e->stage, last = e->nstages - 1;
  dt_step_ctx ctx = {0, 0, 0, 0};
  int rc = DT_OK;
  int64_t k = 0;
  for (int64_t i = lo; i < hi && rc == DT_OK; i += e->rows, k++) {
    const int n = (int)(hi - i < e->rows ? hi - i : e->rows);
    const int tag = TAG_EVAL + (int)(k & 0xffff);
    const float *in = x + (size_t)i * e->in_dim;
    if (s > 0) {
      rc = dt_comm_recv(e->comm, s - 1, tag, e->in, (size_t)n * e->in_dim * sizeof(float));
      if (rc < 0) return eval_err(e, rc, "receiving", k, s - 1);
      in = e->in;
    }
    ctx.sample0 = i;
    DT_CHECK(dt_model_forward(e->m, in, n, &ctx));
    if (s == last) {
      float l = 0.0f;
      int nc = 0;
      DT_CHECK(dt_model_loss(e->m, y + i, n, &l, &nc));
      fn(ud, l, n, nc);
      continue;
    }
    const int slot = (int)(k & 1);
    if (e->pend[slot]) {
      e->pend[slot] = 0;
      rc = dt_comm_waitall(e->comm, &e->req[slot], 1);
      if (rc < 0) return eval_err(e, rc, "sending", k - 2, s + 1);
    }
    const size_t bytes = (size_t)n * e->out_dim * sizeof(float);
    memcpy(e->out[slot], dt_model_logits(e->m), bytes);
    rc = dt_comm_isend(e->comm, s + 1, tag, e->out[slot], bytes, &e->req[slot]);
    if (rc < 0) return eval_err(e, rc, "sending", k, s + 1);
    e->pend[slot] = 1;
  }
  for (int j = 0; j < 2 && rc == DT_OK; j++)
    if (e->pend[j]) {
      e->pend[j] = 0;
      rc = dt_comm_waitall(e->comm, &e->req[j], 1);
      if (rc < 0) return eval_err(e, rc, "sending", k, s + 1);
    }
  return rc;
}

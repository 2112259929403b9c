/*
 * pipeline_parts.c — what a pipeline stage does about the parts of the
 * model it does not hold (pipeline_int.h). With P > 1 stages a rank writes
 * only its own span of the whole model's parameter buffer, which costs no
 * memory until written (nn.h dt__model_init_range), so per-stage
 * parameters, gradients and optimizer state are about 1/P of the model's:
 *  - start: the stage initialises its span itself (the engine leaves the
 *    buffer unwritten, so the process that forks the workers never holds
 *    the whole model either) and replica 0's span goes to the stage's
 *    other replicas;
 *  - evaluation: the test set goes forward through the stages
 *    (parallel/pipe_eval.c), each replica its share in whole chunks of
 *    the whole model's evaluation size, the last stages' tallies summed on
 *    every rank;
 *  - end: each stage's replicas checked equal, and params_sha256 made from
 *    the stages' spans in order: replica 0's stages stream theirs to rank
 *    0 in 1 MiB chunks, which hashes them as they come (no rank holds the
 *    whole model for it).
 * With P = 1 (micro-batches in one process, replicas of it) every rank
 * holds the whole model, as ddp's do.
 *
 * It does not checkpoint: checkpoints still gather every stage's span to
 * rank 0 (strategy_pipeline.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/pipeline_int.h"

#define TAG_HASH 0x330000 /* pipe.c 0x1/0x2, checkpoints 0x3/0x31, evaluation 0x32 (x 0x100000) */
#define HASH_CHUNK ((size_t)1 << 18) /* floats per message of the end's hash */

int dt__pipe_start(dt_strategy *s, pipe_impl *d) {
  if (d->P == 1) {
    if (!s->comm) return DT_OK;
    int rc = dt_ddp_broadcast_params(s->model, s->comm);
    return rc < 0 ? dt__pipe_name_lost(s, dt__preerr(rc, "rank %d", s->rank)) : DT_OK;
  }
  const int st = d->stage;
  const size_t off = d->part.param_off[st], n = d->part.params[st];
  s->own = 1;
  s->own_off = off;
  s->own_n = n;
  if (s->params_lazy) {
    if (s->params_load) /* a resumed run: the stage's tensors from the checkpoint */
      DT_CHECK(s->params_load(s->params_load_ud, s->model, d->part.first[st], d->part.first[st + 1]));
    else
      DT_CHECK(dt__model_init_range(s->model, s->cfg->seed, d->part.first[st], d->part.first[st + 1]));
    s->params_lazy = 0;
  }
  if (!d->scomm) return DT_OK;
  int rc = DT_OK;
  if (n) rc = dt_comm_broadcast(d->scomm, dt_model_params(s->model) + off, n, DT_F32, 0);
  if (rc == DT_OK && d->part.nbufs[st])
    rc = dt_comm_broadcast(d->scomm, dt_model_bufs(s->model) + d->part.buf_off[st],
                           d->part.nbufs[st], DT_F32, 0);
  return rc < 0 ? dt__pipe_comm_err(s, rc, "stage parameters from replica 0") : DT_OK;
}

/* ---- evaluation ------------------------------------------------------------------ */

struct eval_add {
  dt_tally *t;
  int64_t terms;
};

static void eval_add(void *ud, float loss, int n, int correct) {
  struct eval_add *a = ud;
  dt__tally_add(a->t, loss, n, correct, a->terms);
}

/* The last stages' tallies (the others' are empty) summed on every rank. */
static int eval_sum(dt_strategy *s, dt_tally *t) {
  int rc;
  if (t->fixed) {
    int64_t v[3] = {t->loss_q, t->correct, t->bad};
    rc = dt_comm_allreduce(s->comm, v, v, 3, DT_I64, DT_OP_SUM);
    t->loss_q = v[0], t->correct = v[1], t->bad = v[2] != 0;
  } else {
    double v[2] = {t->loss, (double)t->correct};
    rc = dt_comm_allreduce(s->comm, v, v, 2, DT_F64, DT_OP_SUM);
    t->loss = v[0], t->correct = (int64_t)(v[1] + 0.5);
  }
  return rc < 0 ? dt__pipe_comm_err(s, rc, "evaluation") : DT_OK;
}

int dt__pipe_evaluate(dt_strategy *s, const dt_dataset *test, int chunk, dt_tally *t) {
  pipe_impl *d = s->impl;
  if (!d || d->P == 1) return 1; /* the loop's whole-model evaluation */
  const int st = d->stage;
  int rc;
  /* batch-norm running statistics averaged over the stage's replicas
   * (deterministic mode: the same bits on every replica already) */
  if (!d->det && d->scomm && d->part.nbufs[st]) {
    float *b = dt_model_bufs(s->model) + d->part.buf_off[st];
    rc = dt_comm_allreduce(d->scomm, b, b, d->part.nbufs[st], DT_F32, DT_OP_AVG);
    if (rc < 0) return dt__pipe_comm_err(s, rc, "evaluation buffers");
  }
  /* this replica's samples; deterministic mode: whole chunks, so the
   * fixed-point sum is one ddp_det worker's */
  const int64_t n = test->n, R = d->R, r = d->replica;
  int64_t lo = n * r / R, hi = n * (r + 1) / R;
  if (d->det) {
    const int64_t C = (n + chunk - 1) / chunk;
    lo = C * r / R * chunk;
    hi = C * (r + 1) / R * chunk;
    if (hi > n) hi = n;
    if (lo > n) lo = n;
  }
  dt_pipe_eval *ev = NULL;
  rc = dt_pipe_eval_create(&ev, &d->pc, chunk, s->cfg->loss);
  if (rc < 0) return dt__preerr(rc, "rank %d (stage %d)", s->rank, st);
  struct eval_add a = {t, (n + chunk - 1) / chunk};
  rc = dt_pipe_eval_run(ev, test->x, test->y, lo, hi, eval_add, &a);
  dt_pipe_eval_destroy(ev);
  if (rc < 0) return dt__pipe_name_lost(s, dt__preerr(rc, "rank %d", s->rank));
  return eval_sum(s, t);
}

/* ---- the end ---------------------------------------------------------------------- */

/* n floats into the digest as little-endian float32 (the byte order
 * dt__params_sha256 hashes), through tmp (HASH_CHUNK floats) on a
 * big-endian host. */
static void hash_floats(dt_sha256_ctx *c, const float *p, size_t n, unsigned char *tmp) {
  const uint32_t one = 1;
  if (*(const unsigned char *)&one) {
    dt_sha256_update(c, p, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i += HASH_CHUNK) {
    size_t k = n - i < HASH_CHUNK ? n - i : HASH_CHUNK;
    for (size_t j = 0; j < k; j++) {
      uint32_t u;
      memcpy(&u, &p[i + j], 4);
      for (int b = 0; b < 4; b++) tmp[4 * j + b] = (unsigned char)(u >> (8 * b));
    }
    dt_sha256_update(c, tmp, 4 * k);
  }
}

/* Rank 0: the whole model's digest, its own span then each later stage's
 * as it arrives; stages 1.. of replica 0: their span to rank 0. */
static int hash_whole(dt_strategy *s, pipe_impl *d, uint8_t out[32]) {
  const float *params = dt_model_params(s->model);
  int rc = DT_OK;
  if (d->stage) {
    const int t = d->stage;
    const float *p = params + d->part.param_off[t];
    for (size_t i = 0; i < d->part.params[t] && rc == DT_OK; i += HASH_CHUNK) {
      size_t k = d->part.params[t] - i < HASH_CHUNK ? d->part.params[t] - i : HASH_CHUNK;
      rc = dt_comm_send(d->pcomm, 0, TAG_HASH, p + i, k * sizeof(float));
    }
    return rc < 0 ? dt__pipe_comm_err(s, rc, "sending a stage's parameters for the hash") : DT_OK;
  }
  float *buf = dt_alloc(HASH_CHUNK * sizeof(float));
  unsigned char *tmp = dt_alloc(HASH_CHUNK * sizeof(float));
  dt_sha256_ctx *c = dt_sha256_begin();
  if (!buf || !tmp || !c) {
    dt_free(buf), dt_free(tmp), dt_sha256_end(c, out);
    return dt__seterr(DT_ENOMEM, "rank 0: the parameters' hash: out of memory");
  }
  hash_floats(c, params + d->part.param_off[0], d->part.params[0], tmp);
  for (int t = 1; t < d->P && rc == DT_OK; t++)
    for (size_t i = 0; i < d->part.params[t] && rc == DT_OK; i += HASH_CHUNK) {
      size_t k = d->part.params[t] - i < HASH_CHUNK ? d->part.params[t] - i : HASH_CHUNK;
      rc = dt_comm_recv(d->pcomm, t, TAG_HASH, buf, k * sizeof(float));
      if (rc == DT_OK) hash_floats(c, buf, k, tmp);
    }
  dt_sha256_end(c, out);
  dt_free(buf);
  dt_free(tmp);
  return rc < 0 ? dt__pipe_comm_err(s, rc, "receiving the stages' parameters for the hash") : DT_OK;
}

int dt__pipe_end_check(dt_strategy *s, pipe_impl *d) {
  const int st = d->stage;
  const float *p = dt_model_params(s->model) + d->part.param_off[st];
  const size_t n = d->part.params[st];
  int rc;
  if (d->scomm) {
    /* the stage's replicas hold the same span (its reduced gradients, the
     * same step); every rank learns whether any differs */
    uint8_t mine[32], first[32];
    dt_sha256(p, n * sizeof(float), mine);
    memcpy(first, mine, 32);
    rc = dt_comm_broadcast(d->scomm, first, 32, DT_U8, 0);
    if (rc < 0) return dt__pipe_comm_err(s, rc, "parameter check");
    int32_t bad = memcmp(mine, first, 32) != 0;
    rc = dt_comm_allreduce(s->comm, &bad, &bad, 1, DT_I32, DT_OP_MAX);
    if (rc < 0) return dt__pipe_comm_err(s, rc, "parameter check");
    if (bad) {
      char a[65], b[65];
      dt_hex(mine, 32, a);
      dt_hex(first, 32, b);
      return dt__seterr(DT_EMISMATCH, "rank %d (stage %d of replica %d): parameter check: the "
                        "replicas of a stage ended with different parameters (this one's "
                        "sha256 %.16s..., replica 0's %.16s...)", s->rank, st, d->replica, a, b);
    }
  }
  uint8_t sha[32] = {0};
  if (d->replica == 0) DT_CHECK(hash_whole(s, d, sha));
  rc = dt_comm_broadcast(s->comm, sha, 32, DT_U8, 0);
  if (rc < 0) return dt__pipe_comm_err(s, rc, "the parameters' hash");
  memcpy(s->params_sha, sha, 32);
  s->params_hashed = 1;
  return DT_OK;
}

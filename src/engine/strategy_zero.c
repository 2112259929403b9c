/*
 * strategy_zero.c — the "zero" strategy (dist.zero = 1, docs/pipeline.md
 * "ZeRO-1"): data parallelism with the optimizer state sharded over the N
 * workers (ZeRO stage 1). Every worker trains on a balanced slice of each
 * global batch as in ddp and scales its gradients by its share; then a
 * reduce-scatter leaves worker r the summed gradient of its block r of the
 * parameters (n / N of them, rounded down), worker r updates that block with
 * an optimizer that holds state for it alone, and an allgather (in place)
 * gives every worker every block. The n mod N parameters past the last
 * whole block are summed and updated by every worker (a few floats). So
 * optimizer memory per worker is 1/N of ddp's (the reduce-scatter runs in
 * place on the gradient buffer: no buffer-sized scratch) and the traffic is
 * ddp's (reduce-scatter + allgather is how a ring allreduce runs anyway).
 * On one host the gradients live in a shared window as ddp's do and the
 * reduce-scatter is the window's rank-order scaled sum, so the results are
 * ddp's bits for any N and optimizer; across hosts the transport's
 * reduce-scatter adds in ring order (last-bit differences, which AdamW
 * magnifies).
 *
 * It is not fused into the allreduce and does not write into peers'
 * memory: bench/RESULTS.md records that a fused sharded step writing peers'
 * parameter windows was slower (coherence misses in the next forward). Not
 * with the pipeline or deterministic mode (refused at start). Checkpoints
 * gather the blocks on rank 0 and hold the whole model's state in ddp's
 * form (below).
 */
#define _GNU_SOURCE /* O_TMPFILE */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/window.h"
#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/spill.h"
#include "engine/strategy.h"

typedef struct zero_impl {
  size_t blk, tail0, ntail; /* block per rank; the tail [tail0, n) */
  dt_optim *opt, *opt_tail; /* state for the block, and for the tail */
  dt_comm_window *win;      /* one host: the gradients live here (as ddp's) */
  dt_step_plan plan;
  /* rank 0, checkpoints: the parameters and the whole model's optimizer
   * state go to a spill file (two alternate), never to memory */
  int ck_fd[2], ck_cur;
  float *ck_buf;            /* one chunk of a peer's block */
  dt_ckpt_range ck_range;   /* the parameters, at byte 0 of the spill */
  dt_ckpt_spill ck_spill;
  uint64_t ck_ooff;         /* byte of the optimizer state in the spill */
  char ck_err[256];         /* the spill's write failed: this checkpoint is not taken */
  int ck_ready;             /* the spill holds the state gathered for this checkpoint */
  uint64_t sent0, recv0;
  double comm_s;
} zero_impl;

static int zero_source(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out) {
  if (cfg->pipeline_stages > 1 || cfg->deterministic)
    return dt__seterr(DT_EINVAL, "dist.zero = 1: not with %s yet", cfg->deterministic
                      ? "dist.deterministic" : "dist.pipeline_stages > 1");
  return dt__source_shards(out, train, cfg->batch, cfg->seed, cfg->shuffle, 0);
}

static void zero_teardown(dt_strategy *s) {
  zero_impl *z = s->impl;
  if (!z) return;
  dt_optim_destroy(z->opt);
  dt_optim_destroy(z->opt_tail);
  for (int i = 0; i < 2; i++)
    if (z->ck_buf && z->ck_fd[i] >= 0) close(z->ck_fd[i]);
  dt_free(z->ck_buf);
  if (z->win) {
    dt_model_set_grads(s->model, NULL);
    dt_comm_window_destroy(z->win);
  }
  free(z);
  s->impl = NULL;
}

static int zero_setup(dt_strategy *s) {
  if (!s->comm)
    return dt__seterr(DT_EINVAL, "dist.zero = 1 with %d workers: the engine needs a communicator",
                      s->cfg->workers);
  DT_CHECK(dt__ddp_startup(s));
  zero_impl *z = calloc(1, sizeof *z);
  if (!z) return dt__seterr(DT_ENOMEM, "zero: out of memory");
  s->impl = z;
  const size_t n = dt_model_nparams(s->model), N = (size_t)s->nranks;
  z->blk = n / N;
  z->tail0 = z->blk * N;
  z->ntail = n - z->tail0;
  /* optimizers need at least one parameter: an empty block or tail gets a
   * one-float one that is never stepped */
  int rc = dt_optim_create(&z->opt, &s->cfg->optim, z->blk ? z->blk : 1);
  if (rc == DT_OK) rc = dt_optim_create(&z->opt_tail, &s->cfg->optim, z->ntail ? z->ntail : 1);
  /* one host: the gradients in a shared window, as ddp keeps them, so the
   * reduce-scatter is ddp's rank-order scaled sum (the same bits) */
  if (rc == DT_OK && N > 1 && n) {
    rc = dt_comm_window_create(s->comm, n * sizeof(float), &z->win);
    if (rc == DT_OK) dt_model_set_grads(s->model, dt_comm_window_base(z->win));
    else if (rc == DT_ENOTSUP) rc = DT_OK;
    else rc = dt__preerr(rc, "rank %d: ZeRO-1 gradient window", s->rank);
  }
  if (rc < 0) {
    zero_teardown(s);
    return rc;
  }
  dt_comm_bytes(s->comm, &z->sent0, &z->recv0);
  return DT_OK;
}

static int zero_step_begin(dt_strategy *s, const dt_step_plan *plan) {
  ((zero_impl *)s->impl)->plan = *plan;
  return DT_OK;
}

static int zero_step_finish(dt_strategy *s, float lr) {
  zero_impl *z = s->impl;
  const size_t n = dt_model_nparams(s->model);
  float *g = dt_model_grads(s->model), *p = dt_model_params(s->model);
  /* ddp's scale: avg, n_local / n_global (the sum is the global-batch
   * mean); sum, every worker's own mean; no samples, zeros */
  float scale = !z->plan.pieces ? 0.0f
                : s->cfg->reduce == DT_DIST_SUM ? 1.0f
                                                 : (float)z->plan.n_local / (float)z->plan.n_global;
  if (!z->plan.pieces) memset(g, 0, n * sizeof(float));
  const int r = s->rank, N = s->nranks;
  double t0 = dt_now();
  int rc = DT_OK;
  if (z->win) {
    /* rank r sums block r over every rank's window (and the last rank the
     * tail too) with the scale fused in, in rank order: ddp's bits. Then
     * the tail's sum goes from the last rank to every rank. */
    size_t rg[2] = {(size_t)r * z->blk, (size_t)(r + 1) * z->blk};
    if (r == N - 1) rg[1] = n;
    rc = dt_comm_window_reduce_local_f32(z->win, 0, n, scale, rg, 1);
    if (rc == DT_OK && z->ntail)
      rc = dt_comm_broadcast(s->comm, g + z->tail0, z->ntail, DT_F32, N - 1);
  } else {
    if (scale != 1.0f)
      for (size_t i = 0; i < n; i++) g[i] *= scale;
    /* in place: block r of the gradient buffer ends up summed, no scratch */
    rc = z->blk ? dt_comm_reduce_scatter(s->comm, g, g, z->blk, DT_F32, DT_OP_SUM) : DT_OK;
    if (rc == DT_OK && z->ntail)
      rc = dt_comm_allreduce(s->comm, g + z->tail0, g + z->tail0, z->ntail, DT_F32, DT_OP_SUM);
  }
  z->comm_s += dt_now() - t0;
  if (rc < 0) return dt__ddp_comm_err(s, rc, "ZeRO-1 gradient reduce-scatter");
  float *mine = p + (size_t)r * z->blk;
  if (z->blk) DT_CHECK(dt_optim_step(z->opt, mine, g + (size_t)r * z->blk, lr));
  if (z->ntail) DT_CHECK(dt_optim_step(z->opt_tail, p + z->tail0, g + z->tail0, lr));
  t0 = dt_now();
  if (z->blk) rc = dt_comm_allgather(s->comm, mine, p, z->blk, DT_F32);
  z->comm_s += dt_now() - t0;
  if (rc < 0) return dt__ddp_comm_err(s, rc, "ZeRO-1 parameter allgather");
  s->step++;
  return DT_OK;
}

static int zero_epoch_end(dt_strategy *s, int epoch, dt_tally *t) {
  (void)epoch;
  return dt__ddp_epoch_reduce(s, t);
}

static int zero_run_end(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all) {
  zero_impl *z = s->impl;
  int rc = dt_ddp_check_params(s->model, s->comm);
  if (rc < 0) return dt__preerr(rc, "rank %d", s->rank);
  uint64_t sent = 0, recv = 0;
  dt_comm_bytes(s->comm, &sent, &recv);
  me->compute_seconds = me->train_seconds - z->comm_s;
  me->comm_seconds = z->comm_s;
  me->comm_hidden = 0;
  me->bytes_sent = (double)(sent - z->sent0);
  me->bytes_received = (double)(recv - z->recv0);
  rc = dt_comm_allgather(s->comm, me, all, DT_WORKER_STATS_FIELDS, DT_F64);
  return rc < 0 ? dt__ddp_comm_err(s, rc, "summary statistics") : DT_OK;
}

/* ---- checkpoints ---------------------------------------------------------
 * A checkpoint holds the optimizer state of the whole model in ddp's form
 * ("optim": slots x n floats, slot-major; "optim_step"; "step"), so a ZeRO-1
 * checkpoint resumes under ddp, local, the pipeline or ZeRO-1 with any
 * worker count, and ZeRO-1 resumes any of theirs. At a checkpoint rank 0
 * decides (ckpt_run.c: its clock, its stop flag) and broadcasts the
 * decision; when it says take, every other rank sends its block's state
 * (slots x blk floats) to rank 0 in chunks of CK_CHUNK floats, and rank 0
 * puts each chunk where it lies in the whole model's slot-major state in a
 * spill file (an unlinked file in the checkpoint root, as the pipeline's:
 * pipeline_ckpt.c), after its own block, the tail and the parameters
 * (replicated after every step by the allgather, so rank 0's are the
 * model's). The snapshot names those bytes by their place in the spill
 * (dt_strategy.ckpt_spill, put_fd) and copies none of them: at a
 * checkpoint rank 0 holds one chunk more than between checkpoints, never
 * the others' blocks nor a copy of the parameters (1/N of the optimizer
 * state stays 1/N: tests/pipeline/test_zero_ckpt_mem.sh). Resuming, each
 * rank reads its block and the tail out of the file (dt_state_reader
 * get_part), nothing else. Two spill files alternate: the background
 * writer may still be writing the previous checkpoint from one. */

#define TAG_ZERO_CKPT 0x310000 /* the pipeline's checkpoint tag is 0x300000 */
#define CK_CHUNK ((size_t)1 << 18) /* floats per message: rank 0's only buffer */

/* Floats of state per parameter (0 for plain SGD, 1 momentum, 2 AdamW). */
static size_t zero_slots(const zero_impl *z) {
  return dt_optim_state_floats(z->opt) / (z->blk ? z->blk : 1);
}

/* m floats of a slot-major state of blocks of len floats (slots x len),
 * starting at its float i0, into the whole model's slot-major state
 * (slots x n) at the spill's byte o, the block starting at parameter at. */
static void spill_block(int fd, const float *p, size_t i0, size_t m, size_t len, size_t n,
                        size_t at, uint64_t o, int *werr) {
  while (m) {
    const size_t k = i0 / len, j = i0 % len, c = len - j < m ? len - j : m;
    dt__spill_put(fd, p, c, o + (uint64_t)(k * n + at + j) * sizeof(float), werr);
    p += c, i0 += c, m -= c;
  }
}

static int zero_gather(dt_strategy *s, int32_t *flags) {
  zero_impl *z = s->impl;
  int rc = dt_comm_broadcast(s->comm, flags, 1, DT_I32, 0);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "agreeing on a checkpoint");
  const size_t slots = zero_slots(z), n = dt_model_nparams(s->model), blk = z->blk;
  if (!(*flags & DT__CK_TAKE)) return DT_OK;
  if (s->rank) {
    const float *st = dt_optim_state(z->opt);
    for (size_t at = 0; rc == DT_OK && slots && at < slots * blk; at += CK_CHUNK) {
      size_t k = slots * blk - at < CK_CHUNK ? slots * blk - at : CK_CHUNK;
      rc = dt_comm_send(s->comm, 0, TAG_ZERO_CKPT, st + at, k * sizeof(float));
    }
    return rc < 0 ? dt__ddp_comm_err(s, rc, "sending a block's optimizer state to rank 0")
                  : DT_OK;
  }
  /* rank 0 */
  if (!z->ck_buf) {
    if (!(z->ck_buf = dt_alloc(CK_CHUNK * sizeof(float))))
      return dt__seterr(DT_ENOMEM, "ZeRO-1 checkpoint: out of memory");
    z->ck_fd[0] = z->ck_fd[1] = -1;
  }
  z->ck_cur ^= 1;
  z->ck_err[0] = '\0';
  int *fd = &z->ck_fd[z->ck_cur], werr = 0;
  if (*fd < 0) {
    if (!s->ckpt_root) return dt__seterr(DT_EINVAL, "ZeRO-1 checkpoint: no checkpoint root");
    *fd = dt__spill_open(s->ckpt_root, "zero");
    if (*fd < 0) werr = errno ? errno : EIO; /* still receive: the others are sending */
  }
  /* the parameters, then the state: own block, tail, the others' blocks */
  dt__spill_put(*fd, dt_model_params(s->model), n, 0, &werr);
  const uint64_t o = (uint64_t)n * sizeof(float);
  z->ck_ooff = o;
  if (slots && blk) spill_block(*fd, dt_optim_state(z->opt), 0, slots * blk, blk, n, 0, o, &werr);
  if (slots && z->ntail)
    spill_block(*fd, dt_optim_state(z->opt_tail), 0, slots * z->ntail, z->ntail, n, z->tail0, o,
                &werr);
  for (int r = 1; r < s->nranks && rc == DT_OK && slots && blk; r++)
    for (size_t at = 0; rc == DT_OK && at < slots * blk; at += CK_CHUNK) {
      size_t k = slots * blk - at < CK_CHUNK ? slots * blk - at : CK_CHUNK;
      rc = dt_comm_recv(s->comm, r, TAG_ZERO_CKPT, z->ck_buf, k * sizeof(float));
      if (rc == DT_OK) spill_block(*fd, z->ck_buf, at, k, blk, n, (size_t)r * blk, o, &werr);
    }
  if (rc < 0) return dt__ddp_comm_err(s, rc, "gathering the blocks' optimizer state");
  if (werr)
    snprintf(z->ck_err, sizeof z->ck_err, "spill file in '%s': %s", s->ckpt_root,
             strerror(werr));
  z->ck_range = (dt_ckpt_range){0, 0, n, 0};
  z->ck_spill = (dt_ckpt_spill){*fd, 1, &z->ck_range};
  s->ckpt_spill = &z->ck_spill;
  z->ck_ready = 1;
  return DT_OK;
}

/* Rank 0, after zero_gather: ddp's blobs for the whole model. */
static int zero_export(dt_strategy *s, const dt_state_writer *w) {
  zero_impl *z = s->impl;
  const size_t slots = zero_slots(z), n = dt_model_nparams(s->model);
  if (!z->ck_ready)
    return dt__seterr(DT_EINVAL, "strategy 'zero': the blocks' optimizer state was not gathered");
  z->ck_ready = 0;
  if (z->ck_err[0]) return dt__seterr(DT_EIO, "ZeRO-1 checkpoint: %s", z->ck_err);
  if (!w->put_fd)
    return dt__seterr(DT_ENOTSUP, "strategy 'zero': its state needs a checkpoint writer that "
                      "reads a spill file");
  static const float none = 0; /* plain SGD keeps no state: an empty blob, as ddp's */
  if (slots)
    DT_CHECK(w->put_fd(w->ud, "optim", z->ck_spill.fd, z->ck_ooff, slots * n * sizeof(float)));
  else
    DT_CHECK(w->put(w->ud, "optim", &none, 0));
  DT_CHECK(w->put(w->ud, "optim_step", dt_optim_step_count(z->opt), sizeof(int64_t)));
  return w->put(w->ud, "step", &s->step, sizeof s->step);
}

static int get_exact(const dt_state_reader *r, const char *name, void *buf, size_t want) {
  size_t len = 0;
  DT_CHECK(r->get(r->ud, name, buf, want, &len));
  if (len != want)
    return dt__seterr(DT_ECORRUPT, "strategy state '%s': %zu bytes, expected %zu", name, len,
                      want);
  return DT_OK;
}

/* Every rank: its block and the tail out of the whole model's state (a
 * ddp, local, pipeline or ZeRO-1 checkpoint: dt__import_optim_span). */
static int zero_import(dt_strategy *s, const dt_state_reader *r) {
  zero_impl *z = s->impl;
  int64_t step = 0, ostep = 0;
  DT_CHECK(get_exact(r, "optim_step", &ostep, sizeof ostep));
  DT_CHECK(get_exact(r, "step", &step, sizeof step));
  if (step < 0 || ostep < 0)
    return dt__seterr(DT_ECORRUPT, "strategy state: negative step count (%lld, %lld)",
                      (long long)step, (long long)ostep);
  const size_t slots = zero_slots(z), n = dt_model_nparams(s->model);
  if (z->blk)
    DT_CHECK(dt__import_optim_span(r, n, slots, (size_t)s->rank * z->blk, z->blk,
                                   dt_optim_state(z->opt)));
  if (z->ntail)
    DT_CHECK(dt__import_optim_span(r, n, slots, z->tail0, z->ntail, dt_optim_state(z->opt_tail)));
  *dt_optim_step_count(z->opt) = *dt_optim_step_count(z->opt_tail) = ostep;
  s->step = step;
  return DT_OK;
}

const struct dt_strategy_ops dt__strategy_zero = {
    .name = "zero",
    .fixed_point = 0,
    .own_optim = 1,
    .state_sharded = 1, /* each rank its own block of the optimizer state */
    .open_source = zero_source,
    .setup = zero_setup,
    .step_begin = zero_step_begin,
    .run_pieces = NULL,
    .backward_begin = NULL,
    .grad_ready = NULL,
    .step_finish = zero_step_finish,
    .eval_begin = dt__ddp_eval_begin,
    .eval_reduce = dt__ddp_eval_reduce,
    .epoch_end = zero_epoch_end,
    .state_gather = zero_gather,
    .state_export = zero_export,
    .state_import = zero_import,
    .membership_change = dt__strategy_no_membership,
    .run_end = zero_run_end,
    .teardown = zero_teardown,
};

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
#include <stdlib.h>
#include <string.h>

#include "comm/window.h"
#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/strategy.h"

typedef struct zero_impl {
  size_t blk, tail0, ntail; /* block per rank; the tail [tail0, n) */
  dt_optim *opt, *opt_tail; /* state for the block, and for the tail */
  dt_comm_window *win;      /* one host: the gradients live here (as ddp's) */
  dt_step_plan plan;
  float *ck_optim, *ck_blk; /* rank 0, checkpoints: the whole state, a peer's block */
  int ck_ready;             /* ck_optim holds the state gathered for this checkpoint */
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
  dt_free(z->ck_optim);
  dt_free(z->ck_blk);
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
 * (slots x blk floats) to rank 0, which lays the blocks and its own tail
 * into one buffer and writes it. The parameters are replicated after every
 * step (the allgather), so rank 0's are the model's. */

#define TAG_ZERO_CKPT 0x310000 /* the pipeline's checkpoint tag is 0x300000 */

/* Floats of state per parameter (0 for plain SGD, 1 momentum, 2 AdamW). */
static size_t zero_slots(const zero_impl *z) {
  return dt_optim_state_floats(z->opt) / (z->blk ? z->blk : 1);
}

static int zero_gather(dt_strategy *s, int32_t *flags) {
  zero_impl *z = s->impl;
  int rc = dt_comm_broadcast(s->comm, flags, 1, DT_I32, 0);
  if (rc < 0) return dt__ddp_comm_err(s, rc, "agreeing on a checkpoint");
  const size_t slots = zero_slots(z), n = dt_model_nparams(s->model), blk = z->blk;
  if (!(*flags & DT__CK_TAKE) || !slots) return DT_OK;
  if (s->rank) {
    rc = blk ? dt_comm_send(s->comm, 0, TAG_ZERO_CKPT, dt_optim_state(z->opt),
                            slots * blk * sizeof(float))
             : DT_OK;
    return rc < 0 ? dt__ddp_comm_err(s, rc, "sending a block's optimizer state to rank 0")
                  : DT_OK;
  }
  if (!z->ck_optim && !(z->ck_optim = dt_alloc(slots * n * sizeof(float))))
    return dt__seterr(DT_ENOMEM, "ZeRO-1 checkpoint: out of memory for %zu floats of "
                      "optimizer state", slots * n);
  if (blk && !z->ck_blk && !(z->ck_blk = dt_alloc(slots * blk * sizeof(float))))
    return dt__seterr(DT_ENOMEM, "ZeRO-1 checkpoint: out of memory");
  const float *own = dt_optim_state(z->opt), *tail = dt_optim_state(z->opt_tail);
  for (int r = 0; r < s->nranks && rc == DT_OK; r++) {
    const float *src = own;
    if (r && blk) {
      rc = dt_comm_recv(s->comm, r, TAG_ZERO_CKPT, z->ck_blk, slots * blk * sizeof(float));
      src = z->ck_blk;
    }
    for (size_t k = 0; rc == DT_OK && k < slots && blk; k++)
      memcpy(z->ck_optim + k * n + (size_t)r * blk, src + k * blk, blk * sizeof(float));
  }
  for (size_t k = 0; rc == DT_OK && k < slots && z->ntail; k++)
    memcpy(z->ck_optim + k * n + z->tail0, tail + k * z->ntail, z->ntail * sizeof(float));
  z->ck_ready = rc == DT_OK;
  return rc < 0 ? dt__ddp_comm_err(s, rc, "gathering the blocks' optimizer state") : DT_OK;
}

/* Rank 0, after zero_gather: ddp's blobs for the whole model. */
static int zero_export(dt_strategy *s, const dt_state_writer *w) {
  zero_impl *z = s->impl;
  const size_t slots = zero_slots(z), n = dt_model_nparams(s->model);
  if (slots && !z->ck_ready)
    return dt__seterr(DT_EINVAL, "strategy 'zero': the blocks' optimizer state was not gathered");
  z->ck_ready = 0;
  static const float none = 0; /* plain SGD keeps no state: an empty blob, as ddp's */
  DT_CHECK(w->put(w->ud, "optim", slots ? (const float *)z->ck_optim : &none,
                  slots * n * sizeof(float)));
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

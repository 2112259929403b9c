/*
 * pipeline_zero.c — a pipeline stage's optimizer (pipeline_int.h), and
 * with dist.zero = 1 its state sharded over the stage's replicas (ZeRO-1
 * inside the hybrid data x pipeline groups, docs/pipeline.md): after the
 * stage's gradient is summed over its R replicas (ddp's buckets or one
 * allreduce, as without ZeRO), replica r updates block r of the stage's
 * span (n / R parameters, rounded down) with an optimizer holding state
 * for that block alone, every replica updates the n mod R parameters past
 * the last block (a few floats), and an in-place allgather over the
 * stage's communicator gives every replica every block. The update is
 * per parameter, so the parameters are the bits of the unsharded step;
 * optimizer memory per stage rank is 1/R of the stage's. The price is the
 * allgather (n floats per step on top of the allreduce's 2n): the
 * reduction is not a reduce-scatter here, because ddp's buckets overlap
 * it with the drain.
 *
 * Checkpoints hold the stage's whole state as without ZeRO (one file per
 * stage, resumable with any stage count, replica count or none): at a
 * checkpoint each replica sends its block's state to replica 0, which
 * puts the stage's state together (and holds it until the next one).
 * Not in deterministic mode (refused at start).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/pipeline_int.h"

#define TAG_ZSTATE 0x340000 /* pipe.c 0x1/0x2, ckpt 0x3/0x31, eval 0x32, hash 0x33 (x 0x100000) */

int dt__pipe_optim_create(dt_strategy *s, pipe_impl *d) {
  const dt_run_cfg *c = s->cfg;
  const size_t n = d->part.params[d->stage];
  d->zero = c->zero && !d->det && n > 0;
  if (!d->zero) return dt_optim_create(&d->optim, &c->optim, n ? n : 1);
  d->zblk = n / (size_t)d->R;
  d->ztail0 = d->zblk * (size_t)d->R;
  d->zntail = n - d->ztail0;
  DT_CHECK(dt_optim_create(&d->optim, &c->optim, d->zblk ? d->zblk : 1));
  if (d->zntail) DT_CHECK(dt_optim_create(&d->otail, &c->optim, d->zntail));
  return DT_OK;
}

void dt__pipe_optim_destroy(pipe_impl *d) {
  dt_optim_destroy(d->optim);
  dt_optim_destroy(d->otail);
  dt_free(d->zfull);
}

int dt__pipe_optim_step(dt_strategy *s, pipe_impl *d, float *params, const float *g, float lr) {
  if (!d->zero) return dt_optim_step(d->optim, params, g, lr);
  const size_t mine = (size_t)d->replica * d->zblk;
  if (d->zblk) DT_CHECK(dt_optim_step(d->optim, params + mine, g + mine, lr));
  if (d->zntail) DT_CHECK(dt_optim_step(d->otail, params + d->ztail0, g + d->ztail0, lr));
  if (!d->scomm || !d->zblk) return DT_OK;
  double t0 = dt_now();
  int rc = dt_comm_allgather(d->scomm, params + mine, params, d->zblk, DT_F32);
  d->reduce_s += dt_now() - t0;
  return rc < 0 ? dt__pipe_comm_err(s, rc, "ZeRO-1 parameter allgather") : DT_OK;
}

/* The optimizer holding the stage's (or its block's) state and its size. */
static dt_optim *main_optim(const pipe_impl *d, size_t *n) {
  if (!d->zero) {
    *n = d->part.params[d->stage];
    return d->optim;
  }
  *n = d->zblk ? d->zblk : d->zntail;
  return d->zblk ? d->optim : d->otail;
}

size_t dt__pipe_optim_slots(const pipe_impl *d) {
  size_t n;
  dt_optim *o = main_optim(d, &n);
  return dt_optim_state_floats(o) / (n ? n : 1);
}

int64_t *dt__pipe_optim_count(pipe_impl *d) {
  size_t n;
  return dt_optim_step_count(main_optim(d, &n));
}

/* Block b's state (slots x zblk, slot-major) into the whole state w. */
static void put_block(const pipe_impl *d, float *w, const float *blk, int b, size_t slots) {
  const size_t n = d->part.params[d->stage];
  for (size_t k = 0; k < slots; k++)
    memcpy(w + k * n + (size_t)b * d->zblk, blk + k * d->zblk, d->zblk * sizeof(float));
}

int dt__pipe_optim_whole(dt_strategy *s, pipe_impl *d, const float **state) {
  *state = NULL;
  if (!d->zero) {
    *state = dt_optim_state(d->optim);
    return DT_OK;
  }
  const size_t slots = dt__pipe_optim_slots(d), n = d->part.params[d->stage];
  const size_t bf = slots * d->zblk;
  int rc = DT_OK;
  if (d->replica) {
    if (bf) rc = dt_comm_send(d->scomm, 0, TAG_ZSTATE, dt_optim_state(d->optim), bf * sizeof(float));
    return rc < 0 ? dt__pipe_comm_err(s, rc, "sending a ZeRO-1 block's state") : DT_OK;
  }
  if (!d->zfull && !(d->zfull = dt_alloc((slots * n > 0 ? slots * n : 1) * sizeof(float))))
    return dt__seterr(DT_ENOMEM, "pipeline checkpoint: out of memory for the stage's state");
  float *tmp = d->R > 1 && bf ? dt_alloc(bf * sizeof(float)) : NULL;
  if (d->R > 1 && bf && !tmp)
    return dt__seterr(DT_ENOMEM, "pipeline checkpoint: out of memory for a block's state");
  if (bf) put_block(d, d->zfull, dt_optim_state(d->optim), 0, slots);
  for (int q = 1; q < d->R && bf && rc == DT_OK; q++) {
    rc = dt_comm_recv(d->scomm, q, TAG_ZSTATE, tmp, bf * sizeof(float));
    if (rc == DT_OK) put_block(d, d->zfull, tmp, q, slots);
  }
  dt_free(tmp);
  if (rc < 0) return dt__pipe_comm_err(s, rc, "gathering the ZeRO-1 blocks' state");
  for (size_t k = 0; k < slots && d->zntail; k++)
    memcpy(d->zfull + k * n + d->ztail0, dt_optim_state(d->otail) + k * d->zntail,
           d->zntail * sizeof(float));
  *state = d->zfull;
  return DT_OK;
}

int dt__pipe_optim_import(dt_strategy *s, pipe_impl *d, const dt_state_reader *r) {
  const size_t total = dt_model_nparams(s->model), slots = dt__pipe_optim_slots(d);
  const size_t off = d->part.param_off[d->stage], n = d->part.params[d->stage];
  if (!n) return DT_OK;
  if (!d->zero) return dt__import_optim_span(r, total, slots, off, n, dt_optim_state(d->optim));
  if (d->zblk)
    DT_CHECK(dt__import_optim_span(r, total, slots, off + (size_t)d->replica * d->zblk, d->zblk,
                                   dt_optim_state(d->optim)));
  if (d->zntail)
    DT_CHECK(dt__import_optim_span(r, total, slots, off + d->ztail0, d->zntail,
                                   dt_optim_state(d->otail)));
  return DT_OK;
}

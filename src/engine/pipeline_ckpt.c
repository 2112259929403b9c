/*
 * pipeline_ckpt.c — checkpoints of the pipeline strategy (docs/pipeline.md
 * "Checkpoints") without the whole model on rank 0.
 *
 * A checkpoint holds the whole model's parameters in model.safetensors
 * (as any run's: `dtrain export` and PyTorch read it) and each stage's
 * optimizer state in stage-T.safetensors (owner "stage-T"). Rank 0 (stage
 * 0 of replica 0) decides at every step boundary and broadcasts the
 * decision; when a checkpoint is due every other stage of replica 0 sends
 * its span of the parameters and running statistics, its optimizer state
 * and its step count to rank 0 in chunks of CK_CHUNK floats, and rank 0
 * puts each chunk straight into a spill file (an unlinked file in the
 * checkpoint root) instead of its memory, after stage 0's own state
 * (written from its buffers). The snapshot then names those bytes by
 * their place in the spill file (dt_strategy.ckpt_spill, dt__st_add_fd)
 * and copies none of them; the background writer reads them in bounded
 * chunks as it writes the checkpoint. So at a checkpoint rank 0 holds one
 * chunk more than between checkpoints — never the other stages' state,
 * nor a copy of its own (tests/pipeline/test_pipeline_ckpt_mem.sh).
 *
 * Two spill files alternate: the writer may still be writing checkpoint
 * N (from one) while checkpoint N + 1 is gathered (into the other); the
 * snapshot of N + 1 waits for N's write (dt__writer_acquire), so N - 1's
 * file is free again by then.
 *
 * Why through rank 0 and not each stage writing its own tensors into the
 * file: the stages may be on other hosts without the checkpoint's file
 * system (`dtrain launch`), and the atomic protocol (temporary directory,
 * hashes, manifest, rename: src/ckpt/write.c) stays one writer's. The
 * cost is the other stages' bytes going through rank 0's disk twice (the
 * spill, then the checkpoint) and the other stages waiting for the spill's
 * writes (page cache) at the checkpoint's step boundary.
 */
#define _GNU_SOURCE /* O_TMPFILE */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "engine/spill.h"
#include "engine/pipeline_int.h"

#define TAG_CKPT 0x300000 /* pipe.c 0x1/0x2, checkpoints 0x3 (x 0x100000) */
/* floats per message; rank 0's only buffer for the other stages' state */
#define CK_CHUNK ((size_t)1 << 18)

static int send_seg(dt_comm *c, const float *p, size_t n) {
  for (size_t at = 0; at < n; at += CK_CHUNK) {
    size_t k = n - at < CK_CHUNK ? n - at : CK_CHUNK;
    int rc = dt_comm_send(c, 0, TAG_CKPT, p + at, k * sizeof(float));
    if (rc < 0) return rc;
  }
  return DT_OK;
}

/* n floats from stage t into the spill at byte foff. A failed write is
 * remembered in *werr and the rest still received, so the stages stay in
 * step; the checkpoint is then not taken (dt__pipe_export). */
static int recv_seg(dt_comm *c, int t, float *buf, int fd, uint64_t foff, size_t n, int *werr) {
  for (size_t at = 0; at < n; at += CK_CHUNK) {
    size_t k = n - at < CK_CHUNK ? n - at : CK_CHUNK;
    int rc = dt_comm_recv(c, t, TAG_CKPT, buf, k * sizeof(float));
    if (rc < 0) return rc;
    dt__spill_put(fd, buf, k, foff + at * sizeof(float), werr);
  }
  return DT_OK;
}

int dt__pipe_gather(dt_strategy *s, int32_t *flags) {
  pipe_impl *d = s->impl;
  if (s->comm && s->nranks > 1) {
    /* after every step: the other ranks wait here for rank 0 (stage 0)
     * to finish its step; that is waiting for a stage, counted as such */
    double t0 = dt_now();
    int rc = dt_comm_broadcast(s->comm, flags, 1, DT_I32, 0);
    d->agree_s += dt_now() - t0;
    if (rc < 0) return dt__pipe_comm_err(s, rc, "agreeing on a checkpoint");
  }
  if (!(*flags & DT__CK_TAKE)) return DT_OK;
  /* the stage's whole optimizer state on replica 0 (with ZeRO-1 its
   * replicas' blocks put together) */
  const float *state = NULL;
  DT_CHECK(dt__pipe_optim_whole(s, d, &state));
  if (!d->pcomm || d->replica != 0) return DT_OK;
  const size_t slots = dt__pipe_optim_slots(d);
  const dt_partition *pt = &d->part;
  dt_comm *c = d->pcomm;
  int rc = DT_OK;
  if (d->stage) {
    const int t = d->stage;
    rc = send_seg(c, dt_model_params(s->model) + pt->param_off[t], pt->params[t]);
    if (rc == DT_OK) rc = send_seg(c, dt_model_bufs(s->model) + pt->buf_off[t], pt->nbufs[t]);
    if (rc == DT_OK && slots) rc = send_seg(c, state, slots * pt->params[t]);
    if (rc == DT_OK) rc = dt_comm_send(c, 0, TAG_CKPT, dt__pipe_optim_count(d), sizeof(int64_t));
    return rc < 0 ? dt__pipe_comm_err(s, rc, "sending a stage's state for a checkpoint") : DT_OK;
  }
  /* rank 0 */
  if (!d->ck_ostep) {
    const int P = d->P;
    d->ck_ostep = calloc((size_t)P, sizeof *d->ck_ostep);
    d->ck_range = calloc(2 * (size_t)P, sizeof *d->ck_range);
    d->ck_ooff = calloc((size_t)P, sizeof *d->ck_ooff);
    d->ck_buf = dt_alloc(CK_CHUNK * sizeof(float));
    if (!d->ck_ostep || !d->ck_range || !d->ck_ooff || !d->ck_buf)
      return dt__seterr(DT_ENOMEM, "pipeline checkpoint: out of memory");
    d->ck_fd[0] = d->ck_fd[1] = -1;
  }
  d->ck_cur ^= 1;
  d->ck_err[0] = '\0';
  int *fd = &d->ck_fd[d->ck_cur], werr = 0;
  if (*fd < 0) {
    if (!s->ckpt_root) return dt__seterr(DT_EINVAL, "pipeline checkpoint: no checkpoint root");
    *fd = dt__spill_open(s->ckpt_root, "pipe");
    if (*fd < 0) werr = errno ? errno : EIO; /* still receive: the stages are sending */
  }
  /* stage 0's own state first, straight from its buffers: the snapshot
   * then copies nothing of it either (it would be a copy of the stage's
   * parameters and optimizer state in rank 0's memory) */
  uint64_t foff = 0;
  int nr = 0;
  d->ck_range[nr++] = (dt_ckpt_range){0, pt->param_off[0], pt->params[0], foff};
  dt__spill_put(*fd, dt_model_params(s->model) + pt->param_off[0], pt->params[0], foff, &werr);
  foff += pt->params[0] * sizeof(float);
  if (pt->nbufs[0]) d->ck_range[nr++] = (dt_ckpt_range){1, pt->buf_off[0], pt->nbufs[0], foff};
  dt__spill_put(*fd, dt_model_bufs(s->model) + pt->buf_off[0], pt->nbufs[0], foff, &werr);
  foff += pt->nbufs[0] * sizeof(float);
  d->ck_ooff[0] = foff;
  if (slots) dt__spill_put(*fd, state, slots * pt->params[0], foff, &werr);
  foff += slots * pt->params[0] * sizeof(float);
  for (int t = 1; t < d->P && rc == DT_OK; t++) {
    d->ck_range[nr++] = (dt_ckpt_range){0, pt->param_off[t], pt->params[t], foff};
    rc = recv_seg(c, t, d->ck_buf, *fd, foff, pt->params[t], &werr);
    foff += pt->params[t] * sizeof(float);
    if (pt->nbufs[t]) d->ck_range[nr++] = (dt_ckpt_range){1, pt->buf_off[t], pt->nbufs[t], foff};
    if (rc == DT_OK) rc = recv_seg(c, t, d->ck_buf, *fd, foff, pt->nbufs[t], &werr);
    foff += pt->nbufs[t] * sizeof(float);
    d->ck_ooff[t] = foff;
    if (rc == DT_OK && slots) rc = recv_seg(c, t, d->ck_buf, *fd, foff, slots * pt->params[t], &werr);
    foff += slots * pt->params[t] * sizeof(float);
    if (rc == DT_OK) rc = dt_comm_recv(c, t, TAG_CKPT, &d->ck_ostep[t], sizeof(int64_t));
  }
  if (rc < 0) return dt__pipe_comm_err(s, rc, "gathering the stages' state for a checkpoint");
  if (werr)
    snprintf(d->ck_err, sizeof d->ck_err, "spill file in '%s': %s", s->ckpt_root,
             strerror(werr));
  d->ck_spill = (dt_ckpt_spill){*fd, nr, d->ck_range};
  s->ckpt_spill = &d->ck_spill;
  return DT_OK;
}

/* Rank 0 (stage 0 of replica 0), after dt__pipe_gather (or alone: P = 1). */
int dt__pipe_export(dt_strategy *s, const dt_state_writer *w) {
  pipe_impl *d = s->impl;
  if (!w->put_file || (d->P > 1 && !w->put_file_fd))
    return dt__seterr(DT_ENOTSUP, "strategy '%s': the stages' state needs a checkpoint with "
                      "files of their own", s->ops->name);
  if (d->P > 1 && !d->ck_ostep)
    return dt__seterr(DT_EINVAL, "strategy '%s': the stages' state was not gathered",
                      s->ops->name);
  if (d->P > 1 && d->ck_err[0])
    return dt__seterr(DT_EIO, "pipeline checkpoint: %s", d->ck_err);
  const size_t slots = dt__pipe_optim_slots(d);
  const int32_t P = d->P;
  const float *state0 = d->zero ? d->zfull : dt_optim_state(d->optim);
  if (!state0) DT_CHECK(dt__pipe_optim_whole(s, d, &state0)); /* ZeRO-1 alone (R = 1) */
  int64_t *span = malloc(2 * (size_t)P * sizeof *span);
  if (!span) return dt__seterr(DT_ENOMEM, "pipeline checkpoint: out of memory");
  for (int t = 0; t < P; t++) {
    span[2 * t] = (int64_t)d->part.param_off[t];
    span[2 * t + 1] = (int64_t)d->part.params[t];
  }
  /* the optimizer's step count: every stage with parameters has the same
   * (a stage without any never steps) */
  int64_t ostep = *dt__pipe_optim_count(d);
  for (int t = 1; t < P; t++)
    if (d->ck_ostep[t] > ostep) ostep = d->ck_ostep[t];
  int rc = w->put(w->ud, "step", &s->step, sizeof s->step);
  if (rc == DT_OK) rc = w->put(w->ud, "optim_step", &ostep, sizeof ostep);
  if (rc == DT_OK) rc = w->put(w->ud, "pipe.stages", &P, sizeof P);
  if (rc == DT_OK) rc = w->put(w->ud, "pipe.spans", span, 2 * (size_t)P * sizeof *span);
  free(span);
  for (int t = 0; t < P && rc == DT_OK; t++) {
    char file[64], owner[32];
    snprintf(file, sizeof file, "stage-%d.safetensors", t);
    snprintf(owner, sizeof owner, "stage-%d", t);
    const int64_t *os = t ? &d->ck_ostep[t] : dt__pipe_optim_count(d);
    const size_t n = slots * d->part.params[t];
    rc = w->put_file(w->ud, file, owner, "optim_step", os, sizeof *os);
    if (rc != DT_OK || !n) continue;
    if (d->P > 1) /* in the spill file (dt__pipe_gather) */
      rc = w->put_file_fd(w->ud, file, owner, "optim", d->ck_spill.fd, d->ck_ooff[t],
                          n * sizeof(float));
    else
      rc = w->put_file(w->ud, file, owner, "optim", state0, n * sizeof(float));
  }
  return rc;
}

void dt__pipe_ckpt_free(pipe_impl *d) {
  for (int i = 0; i < 2; i++)
    if (d->ck_ostep && d->ck_fd[i] >= 0) close(d->ck_fd[i]);
  free(d->ck_ostep);
  free(d->ck_range);
  free(d->ck_ooff);
  dt_free(d->ck_buf);
}

/*
 * ckpt_state.c — what a checkpoint of a run holds, and putting it back:
 *
 *  - model.safetensors: the parameters and batch-norm statistics under
 *    PyTorch's nn.Sequential state_dict names for the same layer list
 *    ("0.weight", "0.bias", "3.running_mean", "3.num_batches_tracked"),
 *    with PyTorch's shapes (linear (out, in), conv (out, in, k, k)), the
 *    layer spec, input shape and normalisation in __metadata__, so the file
 *    loads into the equivalent PyTorch model (tools/torch_safetensors.py);
 *  - state.safetensors: the strategy's named blobs (state_export: optimizer
 *    moments, step counts) as U8 tensors "strategy/<name>";
 *  - trainer.json: where the loop stands (epoch, step within it, global
 *    step: the data cursor, the schedule position and every RNG counter,
 *    since all randomness is keyed by seed, epoch, step and sample index),
 *    the epoch's tally so far, the config fingerprint, worker count and
 *    versions.
 *
 * Snapshots copy the flat buffers into the snapshot's own memory (the only
 * work on the training thread); loading checks names, dtypes and shapes
 * before changing anything. The config fingerprint names the first key
 * that differs. It does not decide when to write (ckpt_run.c) and does not
 * touch the disk except through the ckpt layer.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"

/* ---- tensor names -------------------------------------------------------------- */

typedef struct tref {
  char name[48];
  int ndim;
  int64_t shape[4];
  int dtype;       /* DT_ST_F32, or DT_ST_I64 for num_batches_tracked */
  size_t off, n;   /* floats in params (buf = 0) or bufs (buf = 1) */
  int buf;
  int layer;       /* index in model.layers */
} tref;

/* Every tensor of the model, in state_dict order. Returns the count. */
static int model_trefs(const dt_model *m, tref *t, int cap) {
  int n = 0;
  for (int i = 0; i < dt_model_nlayers(m) && n + 5 <= cap; i++) {
    const dt_layer_info *l = dt_model_layer(m, i);
    if (!l->nparams) continue;
    const int64_t in = (int64_t)l->in_c * l->in_h * l->in_w;
    const int64_t out = (int64_t)l->out_c * l->out_h * l->out_w;
    tref w = {.ndim = 1, .dtype = DT_ST_F32, .off = l->param_off, .layer = i}, b = w;
    snprintf(w.name, sizeof w.name, "%d.weight", i);
    snprintf(b.name, sizeof b.name, "%d.bias", i);
    if (l->kind == DT_L_LINEAR) {
      w.ndim = 2, w.shape[0] = out, w.shape[1] = in, w.n = (size_t)(out * in);
      b.shape[0] = out, b.n = (size_t)out;
    } else if (l->kind == DT_L_CONV2D) {
      int64_t oc = l->out_c, ic = l->in_c;
      int64_t kk = (int64_t)l->nparams - oc;
      int64_t k = (int64_t)lround(sqrt((double)(kk / (oc * ic))));
      w.ndim = 4, w.shape[0] = oc, w.shape[1] = ic, w.shape[2] = k, w.shape[3] = k;
      w.n = (size_t)kk;
      b.shape[0] = oc, b.n = (size_t)oc;
    } else if (l->kind == DT_L_LAYERNORM) {
      int64_t d = (int64_t)l->nparams / 2;
      if (l->in_h > 1 || l->in_w > 1)
        w.ndim = 3, w.shape[0] = l->in_c, w.shape[1] = l->in_h, w.shape[2] = l->in_w;
      else
        w.shape[0] = d;
      w.n = (size_t)d;
      b.ndim = w.ndim;
      memcpy(b.shape, w.shape, sizeof b.shape);
      b.n = (size_t)d;
    } else if (l->kind == DT_L_BATCHNORM) {
      int64_t c = (int64_t)l->nparams / 2;
      w.shape[0] = c, w.n = (size_t)c;
      b.shape[0] = c, b.n = (size_t)c;
    } else if (l->kind == DT_L_EMBEDDING || l->kind == DT_L_DOT) {
      /* embedding: weight (V, D); dot: bias (1) — one tensor each */
      tref *o = l->kind == DT_L_DOT ? &b : &w;
      int64_t per = in > 0 ? out / in : 1;
      o->off = l->param_off;
      o->n = l->nparams;
      if (l->kind == DT_L_EMBEDDING)
        o->ndim = 2, o->shape[0] = (int64_t)l->nparams / per, o->shape[1] = per;
      else
        o->shape[0] = 1;
      t[n++] = *o;
      continue;
    } else {
      continue;
    }
    b.off = l->param_off + w.n;
    t[n++] = w;
    t[n++] = b;
    if (l->kind == DT_L_BATCHNORM) {
      int64_t c = (int64_t)l->nparams / 2;
      tref rm = {.ndim = 1, .shape = {c}, .dtype = DT_ST_F32, .off = l->buf_off, .n = (size_t)c,
                 .buf = 1, .layer = i};
      tref rv = rm, nb = {.ndim = 0, .dtype = DT_ST_I64, .n = 0, .buf = 2, .layer = i};
      rv.off = l->buf_off + (size_t)c;
      snprintf(rm.name, sizeof rm.name, "%d.running_mean", i);
      snprintf(rv.name, sizeof rv.name, "%d.running_var", i);
      snprintf(nb.name, sizeof nb.name, "%d.num_batches_tracked", i);
      t[n++] = rm;
      t[n++] = rv;
      t[n++] = nb;
    }
  }
  return n;
}

#define MAX_TREFS 1024

/* The spill range holding tensor x whole, or NULL (in memory). */
static const dt_ckpt_range *spilled(const dt_ckpt_spill *sp, const tref *x) {
  if (!sp || x->buf == 2) return NULL;
  for (int i = 0; i < sp->n; i++) {
    const dt_ckpt_range *r = &sp->r[i];
    if (r->buf == x->buf && x->off >= r->off && x->off + x->n <= r->off + r->n) return r;
  }
  return NULL;
}

/* model.safetensors into st: tensors point at params/bufs as given (the
 * snapshot's copies, or the model's own buffers for export; params[i]
 * holds float lo[0] + i, bufs[i] float lo[1] + i), or with sp those sp
 * holds at their place in its file. */
static int add_model(const dt_engine *e, dt_st *st, const float *params, const float *bufs,
                     const int64_t *nbt, int64_t step, const dt_ckpt_spill *sp,
                     const size_t lo[2]) {
  tref *t = malloc(MAX_TREFS * sizeof *t);
  if (!t) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
  int n = model_trefs(e->model, t, MAX_TREFS), rc = DT_OK;
  for (int i = 0; i < n && rc == DT_OK; i++) {
    const dt_ckpt_range *r = spilled(sp, &t[i]);
    if (r) {
      rc = dt__st_add_fd(st, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, sp->fd,
                         r->foff + (uint64_t)(t[i].off - r->off) * sizeof(float));
      continue;
    }
    const void *p = t[i].buf == 2 ? (const void *)nbt
                    : t[i].buf  ? (const void *)(bufs + (t[i].off - lo[1]))
                                : (const void *)(params + (t[i].off - lo[0]));
    rc = dt__st_add(st, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, p);
  }
  free(t);
  DT_CHECK(rc);
  char v[64];
  DT_CHECK(dt__st_set_meta(st, "format", "pt"));
  DT_CHECK(dt__st_set_meta(st, "dtrain.layers", e->cfg.layers));
  snprintf(v, sizeof v, "%d,%d,%d", e->train.c, e->train.h, e->train.w);
  DT_CHECK(dt__st_set_meta(st, "dtrain.input", v));
  snprintf(v, sizeof v, "%d", dt_model_out_dim(e->model));
  DT_CHECK(dt__st_set_meta(st, "dtrain.classes", v));
  snprintf(v, sizeof v, "%.9g", (double)e->mean);
  DT_CHECK(dt__st_set_meta(st, "dtrain.normalize_mean", v));
  snprintf(v, sizeof v, "%.9g", (double)e->std);
  DT_CHECK(dt__st_set_meta(st, "dtrain.normalize_std", v));
  snprintf(v, sizeof v, "%lld", (long long)step);
  DT_CHECK(dt__st_set_meta(st, "dtrain.step", v));
  return dt__st_set_meta(st, "dtrain.version", DT_VERSION_STRING);
}

/* ---- the configuration fingerprint ----------------------------------------------- */

/* Calls f(key, value) for every setting a checkpoint must agree on: the
 * model, the training data and everything that shapes the trajectory
 * (batch, seed, optimizer, schedule, deterministic mode). train.epochs,
 * train.eval_every, the worker count and transport, bucket size, test data
 * and ckpt.* may change between the run and its resumption. */
typedef void (*fp_fn)(void *ud, const char *key, const char *value);

static void fingerprint(const dt_engine *e, fp_fn f, void *ud) {
  const dt_run_cfg *c = &e->cfg;
  char v[DT_CFG_SPEC_MAX + 8];
#define FPS(k, s) f(ud, k, s)
#define FPF(k, fmt, x) (snprintf(v, sizeof v, fmt, x), f(ud, k, v))
  FPS("model.layers", c->layers);
  FPF("model.parameters", "%zu", dt_model_nparams(e->model));
  FPS("data.format", dt__enum_name(dt__format_names, c->format));
  if (!e->from_memory) {
    FPS("data.train_images", c->train_images);
    if (c->format != DT_FMT_CSV) FPS("data.train_labels", c->train_labels);
  }
  FPF("data.train_samples", "%lld", (long long)e->train.n);
  FPF("data.input", "%lld", (long long)e->train.dim);
  FPF("data.normalize", "%d", c->normalize);
  FPF("data.shuffle", "%d", c->shuffle);
  FPF("train.batch", "%d", c->batch);
  FPF("train.seed", "%llu", (unsigned long long)c->seed);
  FPS("optim.name", dt__enum_name(dt__optim_names, c->optim.kind));
  FPF("optim.lr", "%.9g", (double)c->optim.lr);
  FPF("optim.momentum", "%.9g", (double)c->optim.momentum);
  FPF("optim.nesterov", "%d", c->optim.nesterov);
  FPF("optim.weight_decay", "%.9g", (double)c->optim.weight_decay);
  FPF("optim.beta1", "%.9g", (double)c->optim.beta1);
  FPF("optim.beta2", "%.9g", (double)c->optim.beta2);
  FPF("optim.eps", "%.9g", (double)c->optim.eps);
  FPS("schedule.kind", dt__enum_name(dt__sched_names, c->sched.kind));
  FPF("schedule.warmup_steps", "%lld", (long long)c->sched.warmup_steps);
  FPF("schedule.step_size", "%lld", (long long)c->sched.step_size);
  FPF("schedule.gamma", "%.9g", (double)c->sched.gamma);
  FPF("schedule.min_lr", "%.9g", (double)c->sched.min_lr);
  FPF("dist.deterministic", "%d", c->deterministic);
  if (c->deterministic) FPF("dist.micro_batch", "%d", c->micro_batch);
  FPS("dist.reduce", dt__enum_name(dt__reduce_names, c->reduce));
  FPF("dist.scale_lr", "%d", c->scale_lr);
  if (c->scale_lr) FPF("dist.base_batch", "%d", c->base_batch);
#undef FPS
#undef FPF
}

static void fp_to_json(void *ud, const char *k, const char *v) {
  cJSON_AddStringToObject((cJSON *)ud, k, v);
}

struct fp_check {
  const cJSON *saved;
  const char *dir;
  int rc;
};

static void fp_check(void *ud, const char *k, const char *v) {
  struct fp_check *c = ud;
  if (c->rc < 0) return;
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(c->saved, k);
  if (cJSON_IsString(s) && !strcmp(s->valuestring, v)) return;
  c->rc = dt__seterr(DT_EMISMATCH, "checkpoint '%s' was written with %s = '%.200s', this run "
                     "has '%.200s' (a checkpoint continues the same model and data; only "
                     "train.epochs, the worker count and ckpt.* may change)", c->dir, k,
                     cJSON_IsString(s) ? s->valuestring : "(not recorded)", v);
}

/* ---- snapshots -------------------------------------------------------------------- */

struct blob_ctx {
  dt_ckpt_snap *snap;
  dt_st *st;
};

static int blob_put(void *ud, const char *name, const void *data, size_t len) {
  struct blob_ctx *b = ud;
  void *copy = dt__snap_alloc(b->snap, len);
  if (!copy) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory for '%s'", name);
  if (len) memcpy(copy, data, len); /* an empty blob may come with data NULL */
  char tn[DT_ST_NAME_MAX];
  snprintf(tn, sizeof tn, "strategy/%s", name);
  int64_t shape[1] = {(int64_t)len};
  return dt__st_add(b->st, tn, DT_ST_U8, 1, shape, copy);
}

/* The file of owner's blobs in the snapshot, made on first use; its role
 * is the owner without its number ("ps-shard-2": "ps-shard"). */
static int owner_st(dt_ckpt_snap *snap, const char *file, const char *owner, dt_st **out) {
  for (int i = 0; i < snap->nfiles; i++)
    if (!strcmp(snap->files[i].name, file)) return *out = &snap->files[i].st, DT_OK;
  char role[32];
  snprintf(role, sizeof role, "%s", owner);
  size_t n = strlen(role);
  while (n && role[n - 1] >= '0' && role[n - 1] <= '9') n--;
  if (n && n < strlen(role) && role[n - 1] == '-') role[n - 1] = '\0';
  return dt__snap_st(snap, file, owner, role, out);
}

/* A blob of another file of the snapshot (made on first use, with its owner). */
static int blob_put_file_fd(void *ud, const char *file, const char *owner, const char *name,
                            int fd, uint64_t foff, size_t len) {
  struct blob_ctx *b = ud;
  dt_st *st = NULL;
  DT_CHECK(owner_st(b->snap, file, owner, &st));
  int64_t shape[1] = {(int64_t)len};
  return dt__st_add_fd(st, name, DT_ST_U8, 1, shape, fd, foff);
}

/* A strategy blob whose bytes are in a spill file (not copied). */
static int blob_put_fd(void *ud, const char *name, int fd, uint64_t foff, size_t len) {
  struct blob_ctx *b = ud;
  char tn[DT_ST_NAME_MAX];
  snprintf(tn, sizeof tn, "strategy/%s", name);
  int64_t shape[1] = {(int64_t)len};
  return dt__st_add_fd(b->st, tn, DT_ST_U8, 1, shape, fd, foff);
}

static int blob_put_file(void *ud, const char *file, const char *owner, const char *name,
                         const void *data, size_t len) {
  struct blob_ctx *b = ud;
  dt_st *st = NULL;
  DT_CHECK(owner_st(b->snap, file, owner, &st));
  void *copy = dt__snap_alloc(b->snap, len);
  if (!copy) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory for '%s'", name);
  if (len) memcpy(copy, data, len);
  int64_t shape[1] = {(int64_t)len};
  return dt__st_add(st, name, DT_ST_U8, 1, shape, copy);
}

void dt__ckpt_rank_file(int r, char *file, size_t cap) {
  snprintf(file, cap, "worker-%d.safetensors", r);
}

/* Every rank's per-rank state gathered at this step (ckpt_run.c): one file
 * per worker, owner "worker-R", blob "rank_state" (one copy for all). */
static int put_rank_state(dt_engine *e, dt_ckpt_snap *s) {
  const dt_ckpt_run *k = &e->ck;
  const size_t len = k->rs_len;
  uint8_t *copy = dt__snap_alloc(s, len * (size_t)e->strat.nranks);
  if (!copy) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory for per-worker state");
  memcpy(copy, k->rs_buf, len * (size_t)e->strat.nranks);
  for (int r = 0; r < e->strat.nranks; r++) {
    char file[64], owner[32];
    dt__ckpt_rank_file(r, file, sizeof file);
    snprintf(owner, sizeof owner, "worker-%d", r);
    dt_st *st = NULL;
    DT_CHECK(owner_st(s, file, owner, &st));
    DT_CHECK(dt__st_set_meta(st, "dtrain.strategy", e->strat.ops->name));
    int64_t shape[1] = {(int64_t)len};
    DT_CHECK(dt__st_add(st, "rank_state", DT_ST_U8, 1, shape, copy + (size_t)r * len));
  }
  return DT_OK;
}

static cJSON *tally_json(const dt_tally *t) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  char q[32];
  cJSON_AddNumberToObject(o, "fixed", t->fixed);
  cJSON_AddNumberToObject(o, "loss", t->loss);
  snprintf(q, sizeof q, "%lld", (long long)t->loss_q);
  cJSON_AddStringToObject(o, "loss_q", q);
  cJSON_AddNumberToObject(o, "samples", (double)t->samples);
  cJSON_AddNumberToObject(o, "correct", (double)t->correct);
  cJSON_AddNumberToObject(o, "global", (double)t->global);
  cJSON_AddNumberToObject(o, "bad", t->bad);
  cJSON_AddNumberToObject(o, "seconds", t->seconds);
  return o;
}

static char *trainer_json(const dt_engine *e, const dt_ckpt_pos *p) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  char seed[32];
  cJSON_AddStringToObject(o, "dtrain", DT_VERSION_STRING);
  cJSON_AddNumberToObject(o, "epoch", p->epoch);
  cJSON_AddNumberToObject(o, "step_in_epoch", (double)p->k);
  cJSON_AddNumberToObject(o, "step", (double)e->strat.step);
  cJSON_AddNumberToObject(o, "steps_per_epoch", (double)e->steps_per_epoch);
  cJSON_AddNumberToObject(o, "data_cursor", (double)(p->k * e->cfg.batch));
  cJSON_AddNumberToObject(o, "epochs", e->cfg.epochs);
  cJSON_AddNumberToObject(o, "workers", e->nranks);
  cJSON_AddStringToObject(o, "strategy", e->strat.ops->name);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)e->cfg.seed);
  cJSON_AddStringToObject(o, "seed", seed);
  cJSON_AddStringToObject(o, "rng", "philox4x32-10, counter-based: data order keyed by (seed, "
                          "epoch), dropout by (seed, step, sample index); no hidden state");
  cJSON_AddNumberToObject(o, "lr", (double)dt_sched_lr(&e->sched, e->strat.step));
  cJSON_AddNumberToObject(o, "first_loss", p->first_loss);
  cJSON_AddNumberToObject(o, "test_loss", p->test_loss);
  cJSON_AddNumberToObject(o, "test_accuracy", p->test_acc);
  cJSON *t = tally_json(&p->ep);
  if (t) cJSON_AddItemToObject(o, "epoch_tally", t);
  cJSON *fp = cJSON_AddObjectToObject(o, "fingerprint");
  if (fp) fingerprint(e, fp_to_json, fp);
  char *s = cJSON_Print(o);
  cJSON_Delete(o);
  return s;
}

/* With a spill (dt_strategy.ckpt_spill): a copy of the floats of the
 * model's parameters and buffers outside the spill's ranges, [lo, hi) of
 * each, in snapshot memory (*params holds float lo[0] on, *bufs lo[1]).
 * Floats of [lo, hi) inside a spill range are copied too (harmless; with
 * pipeline stages the own span is contiguous and there are none). */
static int snap_own(dt_engine *e, dt_ckpt_snap *s, const dt_ckpt_spill *sp, float **params,
                    float **bufs, size_t out_lo[2]) {
  for (int b = 0; b < 2; b++) {
    const size_t n = b ? dt_model_nbufs(e->model) : dt_model_nparams(e->model);
    const float *src = b ? dt_model_bufs(e->model) : dt_model_params(e->model);
    /* the floats not in any range of this kind: [lo, hi) bounds them */
    size_t lo = n, hi = 0;
    for (size_t at = 0; at < n;) {
      size_t next = n, in = 0;
      for (int i = 0; i < sp->n; i++) {
        const dt_ckpt_range *r = &sp->r[i];
        if (r->buf != b) continue;
        if (at >= r->off && at < r->off + r->n) in = 1, next = r->off + r->n;
      }
      if (in) {
        at = next;
        continue;
      }
      for (int i = 0; i < sp->n; i++)
        if (sp->r[i].buf == b && sp->r[i].off > at && sp->r[i].off < next) next = sp->r[i].off;
      if (at < lo) lo = at;
      if (next > hi) hi = next;
      at = next;
    }
    float *copy = dt__snap_alloc(s, (hi > lo ? hi - lo : 1) * sizeof(float));
    if (!copy) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
    if (hi > lo) memcpy(copy, src + lo, (hi - lo) * sizeof(float));
    *(b ? bufs : params) = copy;
    out_lo[b] = hi > lo ? lo : 0;
  }
  return DT_OK;
}

int dt__ckpt_snapshot(dt_engine *e, dt_ckpt_snap *s, const dt_ckpt_pos *p) {
  /* the manifest's epoch counts finished epochs; trainer.json has the position */
  dt__snap_reset(s, e->strat.step, p->epoch - 1);
  const size_t np = dt_model_nparams(e->model), nb = dt_model_nbufs(e->model);
  const dt_ckpt_spill *sp = e->strat.ckpt_spill;
  float *params = NULL, *bufs = NULL;
  size_t lo[2] = {0, 0};
  int64_t *nbt = dt__snap_alloc(s, sizeof(int64_t));
  if (!nbt) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
  *nbt = e->strat.step;
  if (sp) {
    /* the other ranks' parts are in the spill file: copy only the rest
     * (this rank's span) */
    DT_CHECK(snap_own(e, s, sp, &params, &bufs, lo));
  } else {
    params = dt__snap_alloc(s, np * sizeof(float));
    bufs = dt__snap_alloc(s, (nb ? nb : 1) * sizeof(float));
    if (!params || !bufs) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
    memcpy(params, dt_model_params(e->model), np * sizeof(float));
    if (nb) memcpy(bufs, dt_model_bufs(e->model), nb * sizeof(float));
  }
  dt_st *st;
  DT_CHECK(dt__snap_st(s, "model.safetensors", "rank0", "model", &st));
  DT_CHECK(add_model(e, st, params, bufs, nbt, e->strat.step, sp, lo));
  DT_CHECK(dt__snap_st(s, "state.safetensors", "rank0", "state", &st));
  struct blob_ctx bc = {s, st};
  dt_state_writer w = {blob_put, &bc, blob_put_file, blob_put_file_fd, blob_put_fd};
  DT_CHECK(e->strat.ops->state_export(&e->strat, &w));
  DT_CHECK(dt__st_set_meta(st, "dtrain.strategy", e->strat.ops->name));
  /* per-rank state, when every rank sent its own for this very step */
  if (e->ck.gather && e->ck.rs_step == e->strat.step) DT_CHECK(put_rank_state(e, s));
  char *tj = trainer_json(e, p);
  if (!tj) return dt__seterr(DT_ENOMEM, "checkpoint: out of memory");
  int rc = dt__snap_text(s, "trainer.json", "rank0", "trainer", tj, strlen(tj));
  free(tj);
  return rc;
}

int dt__ckpt_export_model(dt_engine *e, dt_st *st) {
  static int64_t nbt;
  nbt = e->strat.step;
  static const size_t lo[2] = {0, 0};
  return add_model(e, st, dt_model_params(e->model), dt_model_bufs(e->model), &nbt,
                   e->strat.step, NULL, lo);
}

/* ---- loading ---------------------------------------------------------------------- */

/* Copies every model tensor of st into the model after checking them all.
 * strict: a tensor st holds that the model has not is an error too. */
/* Every model tensor of st present with the model's dtype and shape (and
 * with strict, nothing else in st); t[0..n) the model's. */
static int check_model(const dt_model *m, const char *layers, const dt_st *st, const char *what,
                       int strict, const tref *t, int n) {
  int rc = DT_OK;
  for (int i = 0; i < n && rc == DT_OK; i++) {
    const dt_st_tensor *x = dt__st_find(st, t[i].name);
    if (!x) {
      if (t[i].buf == 2) continue; /* num_batches_tracked: informative only */
      rc = dt__seterr(DT_EMISMATCH, "%s: no tensor '%s' (model.layers '%s' expects it)", what,
                      t[i].name, layers);
      break;
    }
    int same = x->dtype == t[i].dtype && x->ndim == t[i].ndim;
    for (int d = 0; same && d < t[i].ndim; d++) same = x->shape[d] == t[i].shape[d];
    if (!same) {
      char a[96] = "", b[96] = "";
      for (int d = 0; d < x->ndim && d < 8; d++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? "," : "", (long long)x->shape[d]);
      for (int d = 0; d < t[i].ndim; d++)
        snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
      rc = dt__seterr(DT_EMISMATCH, "%s: tensor '%s' is %s [%s], the model needs %s [%s]", what,
                      t[i].name, dt__st_dtype_name(x->dtype), a, dt__st_dtype_name(t[i].dtype), b);
    }
  }
  for (int j = 0; strict && rc == DT_OK && j < st->n; j++) {
    int known = 0;
    for (int i = 0; i < n && !known; i++) known = !strcmp(st->t[j].name, t[i].name);
    if (!known)
      rc = dt__seterr(DT_EMISMATCH, "%s: tensor '%s' has no place in model.layers '%s'", what,
                      st->t[j].name, layers);
  }
  (void)m;
  return rc;
}

int dt__ckpt_check_model(dt_engine *e, const dt_st *st, const char *what) {
  tref *t = malloc(MAX_TREFS * sizeof *t);
  if (!t) return dt__seterr(DT_ENOMEM, "%s: out of memory", what);
  int n = model_trefs(e->model, t, MAX_TREFS);
  int rc = check_model(e->model, e->cfg.layers, st, what, 1, t, n);
  free(t);
  return rc;
}

int dt__ckpt_read_layers(void *resume, dt_model *m, int first, int last) {
  const dt_ckpt_resume *r = resume;
  char what[DT_CKPT_PATH_MAX + 32], path[DT_CKPT_PATH_MAX + 80];
  snprintf(what, sizeof what, "checkpoint '%s'", r->info.dir);
  snprintf(path, sizeof path, "%s/model.safetensors", r->info.dir);
  tref *t = malloc(MAX_TREFS * sizeof *t);
  if (!t) return dt__seterr(DT_ENOMEM, "%s: out of memory", what);
  dt_st st;
  int fd = -1;
  int n = model_trefs(m, t, MAX_TREFS);
  int rc = dt__ckpt_open_st(&r->info, "model.safetensors", &st, &fd);
  /* the file is the one the launcher checked; its header is checked again */
  if (rc == DT_OK) rc = check_model(m, "", &st, what, 1, t, n);
  for (int i = 0; i < n && rc == DT_OK; i++) {
    if (t[i].layer < first || t[i].layer >= last || t[i].buf == 2) continue;
    const dt_st_tensor *x = dt__st_find(&st, t[i].name);
    if (!x) continue;
    float *dst = (t[i].buf ? dt_model_bufs(m) : dt_model_params(m)) + t[i].off;
    rc = dt__ckpt_pread(fd, dst, t[i].n * sizeof(float), st.data_off + x->begin, path);
    if (rc < 0) rc = dt__preerr(rc, "tensor '%s'", t[i].name);
  }
  if (fd >= 0) close(fd);
  dt__st_free(&st);
  free(t);
  return rc;
}

int dt__ckpt_load_model(dt_engine *e, const dt_st *st, const char *what, int strict) {
  tref *t = malloc(MAX_TREFS * sizeof *t);
  if (!t) return dt__seterr(DT_ENOMEM, "%s: out of memory", what);
  int n = model_trefs(e->model, t, MAX_TREFS);
  int rc = check_model(e->model, e->cfg.layers, st, what, strict, t, n);
  /* everything checked: copy */
  for (int i = 0; i < n && rc == DT_OK; i++) {
    const dt_st_tensor *x = dt__st_find(st, t[i].name);
    if (!x || t[i].buf == 2) continue;
    float *dst = (t[i].buf ? dt_model_bufs(e->model) : dt_model_params(e->model)) + t[i].off;
    memcpy(dst, x->data, t[i].n * sizeof(float));
  }
  free(t);
  return rc;
}

/* Bytes [off, off + len) of blob `name` of checkpoint file `file` (its
 * header parsed, the bytes read where they lie: no copy of the file).
 * part 0: len is a capacity, *total bytes of the blob from off = 0 are
 * read up to it; part 1: exactly that range, or DT_ECORRUPT. */
static int read_blob(const dt_ckpt_resume *r, const char *file, const char *name, uint64_t off,
                     void *buf, size_t len, size_t *total, int part) {
  dt_st st;
  int fd = -1;
  char path[DT_CKPT_PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/%s", r->info.dir, file);
  int rc = dt__ckpt_open_st(&r->info, file, &st, &fd);
  if (rc < 0) return rc;
  const dt_st_tensor *t = dt__st_find(&st, name);
  if (!t) {
    rc = dt__seterr(DT_ENOENT, "checkpoint '%s': %s has no blob '%s'", r->info.dir, file, name);
  } else {
    const uint64_t size = t->end - t->begin;
    *total = (size_t)size;
    if (!part) len = size < len ? (size_t)size : len, off = 0;
    if (part && (off > size || len > size - off))
      rc = dt__seterr(DT_ECORRUPT, "'%s': blob '%s' holds %llu bytes, bytes [%llu, %llu) were "
                      "asked for (another model or optimizer?)", path, name,
                      (unsigned long long)size, (unsigned long long)off,
                      (unsigned long long)(off + len));
    else if (len)
      rc = dt__ckpt_pread(fd, buf, len, st.data_off + t->begin + off, path);
  }
  close(fd);
  dt__st_free(&st);
  return rc;
}

/* A blob of another file of the checkpoint being resumed. */
static int blob_get_file(void *ud, const char *file, const char *name, void *buf, size_t cap,
                         size_t *len) {
  return read_blob(ud, file, name, 0, buf, cap, len, 0);
}

static int blob_get_part(void *ud, const char *file, const char *name, uint64_t off, void *buf,
                         size_t len, size_t *total) {
  char tn[DT_ST_NAME_MAX];
  if (!file) snprintf(tn, sizeof tn, "strategy/%s", name);
  return read_blob(ud, file ? file : "state.safetensors", file ? name : tn, off, buf, len,
                   total, 1);
}

static int blob_get_r(void *ud, const char *name, void *buf, size_t cap, size_t *len) {
  char tn[DT_ST_NAME_MAX];
  snprintf(tn, sizeof tn, "strategy/%s", name);
  int rc = read_blob(ud, "state.safetensors", tn, 0, buf, cap, len, 0);
  if (rc == DT_ENOENT && dt__st_find(&((dt_ckpt_resume *)ud)->state_st, tn) == NULL)
    return dt__seterr(DT_ENOENT, "checkpoint state: no blob '%s'", name);
  return rc;
}

void dt__ckpt_reader(dt_ckpt_resume *r, dt_state_reader *out) {
  out->get = blob_get_r;
  out->ud = r;
  out->get_file = blob_get_file;
  out->get_part = blob_get_part;
}


static int num(const cJSON *o, const char *k, double *v, const char *dir) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(j))
    return dt__seterr(DT_ECORRUPT, "checkpoint '%s': trainer.json has no number '%s'", dir, k);
  *v = j->valuedouble;
  return DT_OK;
}

static int read_tally(const cJSON *o, dt_tally *t, const char *dir) {
  if (!cJSON_IsObject(o))
    return dt__seterr(DT_ECORRUPT, "checkpoint '%s': trainer.json has no epoch_tally", dir);
  double v;
  DT_CHECK(num(o, "fixed", &v, dir));
  t->fixed = (int)v;
  DT_CHECK(num(o, "loss", &t->loss, dir));
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(o, "loss_q");
  t->loss_q = cJSON_IsString(q) ? strtoll(q->valuestring, NULL, 10) : 0;
  DT_CHECK(num(o, "samples", &v, dir));
  t->samples = (int64_t)v;
  DT_CHECK(num(o, "correct", &v, dir));
  t->correct = (int64_t)v;
  DT_CHECK(num(o, "global", &v, dir));
  t->global = (int64_t)v;
  DT_CHECK(num(o, "bad", &v, dir));
  t->bad = (int)v;
  return num(o, "seconds", &t->seconds, dir);
}

/* Reads trainer.json of the checkpoint in r and checks it against e. */
int dt__ckpt_read_trainer(dt_engine *e, dt_ckpt_resume *r, const uint8_t *text, size_t len) {
  const char *dir = r->info.dir;
  cJSON *o = cJSON_ParseWithLength((const char *)text, len);
  if (!o) return dt__seterr(DT_ECORRUPT, "checkpoint '%s': trainer.json is not JSON", dir);
  struct fp_check fc = {cJSON_GetObjectItemCaseSensitive(o, "fingerprint"), dir, DT_OK};
  int rc = DT_OK;
  double v = 0;
  if (!cJSON_IsObject(fc.saved))
    rc = dt__seterr(DT_ECORRUPT, "checkpoint '%s': trainer.json has no fingerprint", dir);
  if (rc == DT_OK) {
    fingerprint(e, fp_check, &fc);
    rc = fc.rc;
  }
  if (rc == DT_OK) rc = num(o, "epoch", &v, dir), r->pos.epoch = (int)v;
  if (rc == DT_OK) rc = num(o, "step_in_epoch", &v, dir), r->pos.k = (int64_t)v;
  if (rc == DT_OK) rc = num(o, "step", &v, dir), r->step = (int64_t)v;
  if (rc == DT_OK) rc = num(o, "workers", &v, dir), r->workers = (int)v;
  if (rc == DT_OK) rc = num(o, "first_loss", &r->pos.first_loss, dir);
  if (rc == DT_OK) rc = num(o, "test_loss", &r->pos.test_loss, dir);
  if (rc == DT_OK) rc = num(o, "test_accuracy", &r->pos.test_acc, dir);
  if (rc == DT_OK) rc = read_tally(cJSON_GetObjectItemCaseSensitive(o, "epoch_tally"), &r->pos.ep, dir);
  if (rc == DT_OK && (r->pos.epoch < 1 || r->pos.k < 0 || r->pos.k > e->steps_per_epoch ||
                      r->step < 0))
    rc = dt__seterr(DT_ECORRUPT, "checkpoint '%s': position epoch %d step %lld of %lld is "
                    "impossible", dir, r->pos.epoch, (long long)r->pos.k,
                    (long long)e->steps_per_epoch);
  cJSON_Delete(o);
  return rc;
}

static int has_file(const dt_ckpt_info *info, const char *name) {
  for (int i = 0; i < info->nfiles; i++)
    if (!strcmp(info->files[i].name, name)) return 1;
  return 0;
}

/* This rank's per-rank state (compression residuals) from its own file.
 * It is kept only when the same worker count wrote it and the strategy
 * takes it as it is (same codec and settings); otherwise it starts at
 * zero and rank 0 says why in one line (docs/checkpoint.md). */
static int load_rank_state(dt_engine *e, dt_ckpt_resume *r, const dt_state_reader *rd) {
  dt_strategy *S = &e->strat;
  if (!S->ops->rank_state_load) return DT_OK;
  size_t want = 0;
  DT_CHECK(S->ops->rank_state_save(S, NULL, &want));
  char file[64];
  dt__ckpt_rank_file(e->rank, file, sizeof file);
  const int has = has_file(&r->info, file) || has_file(&r->info, "worker-0.safetensors");
  const char *dir = r->info.dir;
  const int talk = e->rank == 0;
  if (!want) {
    if (has && talk)
      DT_LOG_INFO("checkpoint '%s': its per-worker compression state is not used by this run "
                  "(no compression, or compression left off)", dir);
    return DT_OK;
  }
  if (!has) {
    if (talk)
      DT_LOG_WARN("checkpoint '%s' holds no per-worker compression state (written by a run "
                  "without compression, an elastic run or a dtrain before 2026-11-27): "
                  "error-feedback residuals and worker momentum start at zero", dir);
    return DT_OK;
  }
  if (r->workers != e->nranks) {
    if (talk)
      DT_LOG_WARN("checkpoint '%s' was written by %d workers, this run has %d: error-feedback "
                  "residuals and worker momentum start at zero", dir, r->workers, e->nranks);
    return DT_OK;
  }
  uint8_t *buf = malloc(want);
  if (!buf) return dt__seterr(DT_ENOMEM, "checkpoint '%s': out of memory", dir);
  size_t len = 0;
  int rc = rd->get_file(rd->ud, file, "rank_state", buf, want, &len);
  if (rc == DT_OK && len != want) {
    /* another size: another codec or model; the header says which */
    uint8_t *b2 = realloc(buf, len);
    if (!b2) rc = dt__seterr(DT_ENOMEM, "checkpoint '%s': out of memory", dir);
    else buf = b2, rc = rd->get_file(rd->ud, file, "rank_state", buf, len, &len);
  }
  if (rc == DT_OK) rc = S->ops->rank_state_load(S, buf, len);
  free(buf);
  if (rc == DT_EMISMATCH) {
    if (talk)
      DT_LOG_WARN("checkpoint '%s': per-worker compression state %s; it starts at zero", dir,
                  dt_errmsg());
    return DT_OK;
  }
  return rc < 0 ? dt__preerr(rc, "checkpoint '%s': %s", dir, file) : DT_OK;
}

int dt__ckpt_apply(dt_engine *e, dt_ckpt_resume *r) {
  char what[DT_CKPT_PATH_MAX + 32];
  snprintf(what, sizeof what, "checkpoint '%s'", r->info.dir);
  /* the weights were loaded by dt_engine_resume */
  dt_state_reader rd;
  dt__ckpt_reader(r, &rd);
  int rc = e->strat.ops->state_import(&e->strat, &rd);
  if (rc < 0) return dt__preerr(rc, "%s", what);
  DT_CHECK(load_rank_state(e, r, &rd));
  if (e->strat.step != r->step)
    return dt__seterr(DT_ECORRUPT, "%s: the strategy state is at step %lld, trainer.json says "
                      "%lld", what, (long long)e->strat.step, (long long)r->step);
  return DT_OK;
}

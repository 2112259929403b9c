/*
 * engine.c — making an engine: everything that can fail on bad input (data
 * files, model spec, settings) is checked here, before anything is written:
 * the data set loaded and normalised with train-set statistics, the model
 * built and initialised, the optimizer and schedule, the strategy picked by
 * name (strategy.h) and its batch source opened. Also the communicator
 * hand-over and the read-only views. Training is train.c; files are
 * records.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "tensor/tensor.h"

/* access(), not open(): opening a FIFO would block here; the reader then
 * refuses anything that is not a regular file. */
static int check_file(const char *key, const char *path) {
  if (access(path, R_OK) != 0)
    return dt__seterr(errno == ENOENT ? DT_ENOENT : DT_EIO, "data.%s '%s': %s", key, path,
                      strerror(errno));
  return DT_OK;
}

static int load_split(dt_dataset *ds, const dt_run_cfg *c, const char *xkey, const char *x,
                      const char *ykey, const char *y) {
  DT_CHECK(check_file(xkey, x));
  if (c->format != DT_FMT_CSV) DT_CHECK(check_file(ykey, y));
  int rc;
  switch (c->format) {
  case DT_FMT_IDX: rc = dt_idx_load(ds, x, y); break;
  case DT_FMT_NPY: rc = dt_npy_load(ds, x, y); break;
  case DT_FMT_CSV: rc = dt_csv_load(ds, x, c->label_col); break;
  default: return dt__seterr(DT_EINVAL, "data.format %d: unknown", c->format);
  }
  if (rc < 0) return rc;
  if (c->shape[0]) {
    int64_t d = (int64_t)c->shape[0] * c->shape[1] * c->shape[2];
    if (d != ds->dim)
      return dt__seterr(DT_EINVAL, "data.shape %d,%d,%d (%lld values) does not match '%s' (%lld "
                        "features per sample)", c->shape[0], c->shape[1], c->shape[2],
                        (long long)d, x, (long long)ds->dim);
    ds->c = c->shape[0];
    ds->h = c->shape[1];
    ds->w = c->shape[2];
  }
  if (ds->n <= 0) return dt__seterr(DT_EINVAL, "data.%s '%s': no samples", xkey, x);
  return DT_OK;
}

/* The schedule's base rate is optim.lr, or with dist.scale_lr the linear
 * scaling rule (Goyal et al.): optim.lr x train.batch / dist.base_batch,
 * reached through schedule.warmup_steps of linear warm-up when set. */
static void set_schedule(dt_engine *e) {
  const dt_run_cfg *c = &e->cfg;
  e->sched = c->sched;
  e->sched.base_lr = c->optim.lr;
  if (c->scale_lr) e->sched.base_lr *= (float)c->batch / (float)c->base_batch;
  e->sched.total_steps = e->steps_per_epoch * c->epochs;
}

/* The settings the loop relies on; the config parser checks the same keys
 * with file and line, this is for callers of the library. */
static int check_cfg(const dt_run_cfg *c) {
  if (c->workers < 1)
    return dt__seterr(DT_EINVAL, "dist.workers = %d: expects at least 1", c->workers);
  if (c->format < 0 || c->format > DT_FMT_NPY)
    return dt__seterr(DT_EINVAL, "data.format %d: unknown", c->format);
  if (!memchr(c->layers, '\0', sizeof c->layers) || !c->layers[0])
    return dt__seterr(DT_EINVAL, "model.layers: empty or not NUL-terminated");
  if (c->batch < 1) return dt__seterr(DT_EINVAL, "train.batch = %d: expects at least 1", c->batch);
  if (c->epochs < 1)
    return dt__seterr(DT_EINVAL, "train.epochs = %d: expects at least 1", c->epochs);
  if (c->eval_every < 1)
    return dt__seterr(DT_EINVAL, "train.eval_every = %d: expects at least 1", c->eval_every);
  if (c->deterministic && c->micro_batch < 1)
    return dt__seterr(DT_EINVAL, "dist.micro_batch = %d: expects at least 1", c->micro_batch);
  if (c->scale_lr && c->base_batch < 1)
    return dt__seterr(DT_EINVAL, "dist.base_batch = %d: expects at least 1", c->base_batch);
  if (c->reduce != DT_DIST_AVG && c->reduce != DT_DIST_SUM)
    return dt__seterr(DT_EINVAL, "dist.reduce %d: unknown", c->reduce);
  if (c->balance < DT_BALANCE_STATIC || c->balance > DT_BALANCE_STEAL)
    return dt__seterr(DT_EINVAL, "dist.balance %d: unknown", c->balance);
  if (c->balance == DT_BALANCE_STEAL && !c->deterministic)
    return dt__seterr(DT_EINVAL, "dist.balance = steal: needs dist.deterministic = true (stolen "
                      "micro-shards give the same sums only in fixed point); use dynamic");
  if (!(c->straggler_threshold > 0.0f) || !isfinite(c->straggler_threshold))
    return dt__seterr(DT_EINVAL, "dist.straggler_threshold = %g: expects a number > 0",
                      (double)c->straggler_threshold);
  if (c->balance_every < 1)
    return dt__seterr(DT_EINVAL, "dist.balance_every = %d: expects at least 1", c->balance_every);
  if (!(c->optim.lr >= 0.0f) || !isfinite(c->optim.lr))
    return dt__seterr(DT_EINVAL, "optim.lr = %g: expects a finite number >= 0", (double)c->optim.lr);
  return DT_OK;
}

/* A caller's data set, checked and copied: the engine normalises its own copy. */
static int copy_dataset(dt_dataset *dst, const dt_dataset *src, const char *arg) {
  memset(dst, 0, sizeof *dst);
  if (!src) return dt__seterr(DT_EINVAL, "dt_engine_create_with_data: %s is NULL", arg);
  if (src->n <= 0 || !src->x || !src->y)
    return dt__seterr(DT_EINVAL, "dt_engine_create_with_data: %s has no samples (n = %lld%s%s)",
                      arg, (long long)src->n, src->x ? "" : ", x NULL", src->y ? "" : ", y NULL");
  if (src->c < 1 || src->h < 1 || src->w < 1 || src->dim != (int64_t)src->c * src->h * src->w)
    return dt__seterr(DT_EINVAL, "dt_engine_create_with_data: %s: shape %dx%dx%d does not give "
                      "dim %lld", arg, src->c, src->h, src->w, (long long)src->dim);
  int32_t maxy = -1;
  for (int64_t i = 0; i < src->n; i++) {
    if (src->y[i] < 0)
      return dt__seterr(DT_EINVAL, "dt_engine_create_with_data: %s: label %d of sample %lld is "
                        "negative", arg, src->y[i], (long long)i);
    if (src->y[i] > maxy) maxy = src->y[i];
  }
  size_t nx = (size_t)src->n * (size_t)src->dim;
  dst->x = dt_alloc(nx * sizeof(float));
  dst->y = dt_alloc((size_t)src->n * sizeof(int32_t));
  if (!dst->x || !dst->y) {
    dt_free(dst->x);
    dt_free(dst->y);
    dst->x = NULL;
    dst->y = NULL;
    return dt__seterr(DT_ENOMEM, "dt_engine_create_with_data: %s: out of memory for %lld samples",
                      arg, (long long)src->n);
  }
  memcpy(dst->x, src->x, nx * sizeof(float));
  memcpy(dst->y, src->y, (size_t)src->n * sizeof(int32_t));
  dst->n = src->n;
  dst->c = src->c;
  dst->h = src->h;
  dst->w = src->w;
  dst->dim = src->dim;
  dst->nclasses = maxy + 1 > src->nclasses ? maxy + 1 : src->nclasses;
  return DT_OK;
}

/* Everything after the data sets are in e->train and e->test. */
static int build(dt_engine *e) {
  const dt_run_cfg *cfg = &e->cfg;
  int rc;
  if (e->train.dim != e->test.dim || e->train.c != e->test.c || e->train.h != e->test.h)
    return dt__seterr(DT_EINVAL, "data: train samples are %dx%dx%d but test samples are %dx%dx%d "
                      "('%s' vs '%s')", e->train.c, e->train.h, e->train.w, e->test.c, e->test.h,
                      e->test.w, e->from_memory ? "train" : cfg->train_images,
                      e->from_memory ? "test" : cfg->test_images);
  if (cfg->limit_train > 0 && cfg->limit_train < e->train.n) e->train.n = cfg->limit_train;
  if (cfg->limit_test > 0 && cfg->limit_test < e->test.n) e->test.n = cfg->limit_test;
  if (cfg->normalize) {
    dt_dataset_stats(&e->train, &e->mean, &e->std);
    if (!(e->std > 1e-12f)) e->std = 1.0f; /* constant features: only centre */
    dt_dataset_normalize(&e->train, e->mean, e->std);
    dt_dataset_normalize(&e->test, e->mean, e->std);
  }

  /* The strategy, by name; its batch source below (data-parallel sources
   * start no thread, so the engine may be created before the workers
   * fork). Pipeline stages initialise their own spans (strategy.h
   * init_own): the whole model's parameter buffer is then never written
   * here, so the forked workers do not inherit it resident. */
  const char *name = dt__strategy_for(cfg);
  e->strat.ops = dt__strategy_find(name);
  if (!e->strat.ops) return dt__seterr(DT_EINVAL, "engine: no strategy called '%s'", name);
  e->strat.params_lazy = e->strat.ops->init_own && cfg->pipeline_stages > 1 && !cfg->model_init[0];
  rc = (e->strat.params_lazy ? dt__model_create_noinit : dt_model_create)(
      &e->model, cfg->layers, e->train.c, e->train.h, e->train.w, cfg->batch);
  if (rc < 0) return dt__preerr(rc, "model.layers");
  int classes = e->train.nclasses > e->test.nclasses ? e->train.nclasses : e->test.nclasses;
  if (cfg->loss) {
    rc = dt__model_set_loss(e->model, cfg->loss);
    if (rc < 0) return rc;
  } else if (dt_model_out_dim(e->model) < classes)
    return dt__seterr(DT_EINVAL, "model.layers: the last layer has %d outputs but the data has %d "
                      "classes", dt_model_out_dim(e->model), classes);
  if (!e->strat.params_lazy) dt_model_init(e->model, cfg->seed);
  if (cfg->model_init[0]) DT_CHECK(dt__ckpt_model_init(e, cfg->model_init));
  /* a strategy with optimizers of its own gets a one-float one here */
  DT_CHECK(dt_optim_create(&e->optim, &cfg->optim,
                           e->strat.ops->own_optim ? 1 : dt_model_nparams(e->model)));
  DT_CHECK(e->strat.ops->open_source(&e->cfg, &e->train, &e->source));
  e->steps_per_epoch = e->source->ops->steps_per_epoch(e->source);
  set_schedule(e);
  dt__engine_lend(e);
  return DT_OK;
}

static int engine_new(dt_engine **out, const dt_run_cfg *cfg, const char *fn) {
  *out = NULL;
  if (!cfg) return dt__seterr(DT_EINVAL, "%s: cfg is NULL", fn);
  DT_CHECK(check_cfg(cfg));
  dt_engine *e = calloc(1, sizeof *e);
  if (!e) return dt__seterr(DT_ENOMEM, "engine: out of memory");
  e->cfg = *cfg;
  e->nranks = 1;
  e->mean = 0.0f;
  e->std = 1.0f;
  e->out_fd = -1;
  /* One compute thread per worker unless the user asks OpenBLAS for more. */
  if (!getenv("OPENBLAS_NUM_THREADS")) dt_tensor_set_threads(1);
  *out = e;
  return DT_OK;
}

int dt_engine_create(dt_engine **out, const dt_run_cfg *cfg) {
  if (!out) return dt__seterr(DT_EINVAL, "dt_engine_create: out is NULL");
  *out = NULL;
  dt_engine *e;
  DT_CHECK(engine_new(&e, cfg, "dt_engine_create"));
  int rc;
  DT_CHECK_GOTO(load_split(&e->train, cfg, "train_images", cfg->train_images, "train_labels",
                           cfg->train_labels), rc, fail);
  DT_CHECK_GOTO(load_split(&e->test, cfg, "test_images", cfg->test_images, "test_labels",
                           cfg->test_labels), rc, fail);
  DT_CHECK_GOTO(build(e), rc, fail);
  *out = e;
  return DT_OK;
fail:
  dt_engine_destroy(e);
  return rc;
}

int dt_engine_create_with_data(dt_engine **out, const dt_run_cfg *cfg, const dt_dataset *train,
                               const dt_dataset *test) {
  if (!out) return dt__seterr(DT_EINVAL, "dt_engine_create_with_data: out is NULL");
  *out = NULL;
  dt_engine *e;
  DT_CHECK(engine_new(&e, cfg, "dt_engine_create_with_data"));
  e->from_memory = 1;
  int rc;
  DT_CHECK_GOTO(copy_dataset(&e->train, train, "train"), rc, fail);
  DT_CHECK_GOTO(copy_dataset(&e->test, test, "test"), rc, fail);
  DT_CHECK_GOTO(build(e), rc, fail);
  *out = e;
  return DT_OK;
fail:
  dt_engine_destroy(e);
  return rc;
}

void dt_engine_destroy(dt_engine *e) {
  if (!e) return;
  if (e->out_fd >= 0) close(e->out_fd);
  dt__ckpt_resume_free(e->ck.res);
  dt__snap_free(&e->ck.snap);
  dt__source_destroy(e->source);
  dt_optim_destroy(e->optim);
  dt_model_destroy(e->model);
  dt_dataset_free(&e->train);
  dt_dataset_free(&e->test);
  free(e->el_blob);
  dt__standby_unmap(e);
  free(e);
}

const dt_model *dt_engine_model(const dt_engine *e) { return e ? e->model : NULL; }
int64_t dt_engine_train_samples(const dt_engine *e) { return e ? e->train.n : 0; }
int64_t dt_engine_test_samples(const dt_engine *e) { return e ? e->test.n : 0; }
const char *dt_engine_strategy(const dt_engine *e) { return e ? e->strat.ops->name : NULL; }

void dt__engine_param_span(const dt_engine *e, size_t *off, size_t *n) {
  *off = e && e->strat.own ? e->strat.own_off : 0;
  *n = e && e->strat.own ? e->strat.own_n : dt_model_nparams(e ? e->model : NULL);
}

int dt_engine_set_out_dir(dt_engine *e, const char *dir) {
  if (!e) return dt__seterr(DT_EINVAL, "dt_engine_set_out_dir: engine is NULL");
  if (!dir) return dt__seterr(DT_EINVAL, "dt_engine_set_out_dir: dir is NULL");
  if (e->ran) return dt__seterr(DT_EINVAL, "dt_engine_set_out_dir: engine already ran");
  /* a checkpoint directory that cannot be written is bad input: refused now,
   * before the output directory is made when it lies elsewhere */
  if (e->cfg.ckpt_dir[0]) DT_CHECK(dt__ckpt_check_root(e, dir));
  int fd;
  DT_CHECK(dt__outdir_claim(dir, &fd));
  int rc = e->cfg.ckpt_dir[0] ? DT_OK : dt__ckpt_check_root(e, dir);
  if (rc < 0) {
    close(fd);
    return rc;
  }
  if (e->out_fd >= 0) close(e->out_fd);
  e->out_fd = fd;
  snprintf(e->out_dir, sizeof e->out_dir, "%s", dir);
  return DT_OK;
}

int dt_engine_set_comm(dt_engine *e, dt_comm *c) {
  if (!e) return dt__seterr(DT_EINVAL, "dt_engine_set_comm: engine is NULL");
  if (!c) return dt__seterr(DT_EINVAL, "dt_engine_set_comm: communicator is NULL");
  if (e->ran) return dt__seterr(DT_EINVAL, "dt_engine_set_comm: engine already ran");
  int n = dt_comm_size(c);
  if (n != e->cfg.workers)
    return dt__seterr(DT_EINVAL, "dist.workers = %d but the communicator has %d ranks",
                      e->cfg.workers, n);
  e->comm = c;
  e->rank = dt_comm_rank(c);
  e->nranks = n;
  dt__engine_lend(e);
  return DT_OK;
}

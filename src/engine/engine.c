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

int dt_engine_create(dt_engine **out, const dt_run_cfg *cfg) {
  *out = NULL;
  if (cfg->workers < 1)
    return dt__seterr(DT_EINVAL, "dist.workers = %d: expects at least 1", cfg->workers);
  if (cfg->format < 0 || cfg->format > DT_FMT_NPY)
    return dt__seterr(DT_EINVAL, "data.format %d: unknown", cfg->format);
  dt_engine *e = calloc(1, sizeof *e);
  if (!e) return dt__seterr(DT_ENOMEM, "engine: out of memory");
  e->cfg = *cfg;
  e->nranks = 1;
  e->mean = 0.0f;
  e->std = 1.0f;
  int rc;
  /* One compute thread per worker unless the user asks OpenBLAS for more. */
  if (!getenv("OPENBLAS_NUM_THREADS")) dt_tensor_set_threads(1);

  DT_CHECK_GOTO(load_split(&e->train, cfg, "train_images", cfg->train_images, "train_labels",
                           cfg->train_labels), rc, fail);
  DT_CHECK_GOTO(load_split(&e->test, cfg, "test_images", cfg->test_images, "test_labels",
                           cfg->test_labels), rc, fail);
  if (e->train.dim != e->test.dim || e->train.c != e->test.c || e->train.h != e->test.h) {
    rc = dt__seterr(DT_EINVAL, "data: train samples are %dx%dx%d but test samples are %dx%dx%d "
                    "('%s' vs '%s')", e->train.c, e->train.h, e->train.w, e->test.c, e->test.h,
                    e->test.w, cfg->train_images, cfg->test_images);
    goto fail;
  }
  if (cfg->limit_train > 0 && cfg->limit_train < e->train.n) e->train.n = cfg->limit_train;
  if (cfg->limit_test > 0 && cfg->limit_test < e->test.n) e->test.n = cfg->limit_test;
  if (cfg->normalize) {
    dt_dataset_stats(&e->train, &e->mean, &e->std);
    if (!(e->std > 1e-12f)) e->std = 1.0f; /* constant features: only centre */
    dt_dataset_normalize(&e->train, e->mean, e->std);
    dt_dataset_normalize(&e->test, e->mean, e->std);
  }

  rc = dt_model_create(&e->model, cfg->layers, e->train.c, e->train.h, e->train.w, cfg->batch);
  if (rc < 0) {
    dt__preerr(rc, "model.layers");
    goto fail;
  }
  int classes = e->train.nclasses > e->test.nclasses ? e->train.nclasses : e->test.nclasses;
  if (dt_model_out_dim(e->model) < classes) {
    rc = dt__seterr(DT_EINVAL, "model.layers: the last layer has %d outputs but the data has %d "
                    "classes", dt_model_out_dim(e->model), classes);
    goto fail;
  }
  dt_model_init(e->model, cfg->seed);
  DT_CHECK_GOTO(dt_optim_create(&e->optim, &cfg->optim, dt_model_nparams(e->model)), rc, fail);

  /* The strategy, by name; its batch source now (data-parallel sources start
   * no thread, so the engine may be created before the workers fork). */
  const char *name = dt__strategy_for(cfg);
  e->strat.ops = dt__strategy_find(name);
  if (!e->strat.ops) {
    rc = dt__seterr(DT_EINVAL, "engine: no strategy called '%s'", name);
    goto fail;
  }
  DT_CHECK_GOTO(e->strat.ops->open_source(&e->cfg, &e->train, &e->source), rc, fail);
  e->steps_per_epoch = e->source->ops->steps_per_epoch(e->source);
  set_schedule(e);
  *out = e;
  return DT_OK;
fail:
  dt_engine_destroy(e);
  return rc;
}

void dt_engine_destroy(dt_engine *e) {
  if (!e) return;
  dt__source_destroy(e->source);
  dt_optim_destroy(e->optim);
  dt_model_destroy(e->model);
  dt_dataset_free(&e->train);
  dt_dataset_free(&e->test);
  free(e);
}

const dt_model *dt_engine_model(const dt_engine *e) { return e->model; }
int64_t dt_engine_train_samples(const dt_engine *e) { return e->train.n; }
int64_t dt_engine_test_samples(const dt_engine *e) { return e->test.n; }

int dt_engine_set_comm(dt_engine *e, dt_comm *c) {
  int n = dt_comm_size(c);
  if (n != e->cfg.workers)
    return dt__seterr(DT_EINVAL, "dist.workers = %d but the communicator has %d ranks",
                      e->cfg.workers, n);
  e->comm = c;
  e->rank = dt_comm_rank(c);
  e->nranks = n;
  return DT_OK;
}

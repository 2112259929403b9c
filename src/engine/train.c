/*
 * train.c — the single-process training loop. dt_engine_create does
 * everything that can fail on bad input (data files, model spec, settings)
 * before anything is written; dt_engine_run then trains epoch by epoch
 * (loader thread prefetching batches, forward, backward, optimizer step,
 * schedule), evaluates on the test set, appends events.jsonl records and
 * writes summary.json last, atomically.
 *
 * With several workers (or in deterministic mode, even with one) the
 * data-parallel loop runs instead: no loader thread, global batches cut from
 * the epoch order, gradients reduced through parallel/ddp.h; deterministic
 * mode's micro-shard step and evaluation live in train_det.c.
 *
 * Timing: train_seconds counts only the step loop (waiting for a batch,
 * forward, backward, update); evaluation, data loading from disk and writing
 * files are excluded. It does not print; callers get hooks.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "data/data.h"
#include "parallel/ddp.h"
#include "parallel/fixsum.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "tensor/tensor.h"

static const char *const fmt_name[] = {"idx", "csv", "npy"};

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

  if (cfg->deterministic && cfg->micro_batch < 1) {
    rc = dt__seterr(DT_EINVAL, "dist.micro_batch = %d: expects at least 1", cfg->micro_batch);
    goto fail;
  }
  if (cfg->workers > 1 || cfg->deterministic) {
    /* Data parallel: the engine slices global batches itself (no loader
     * thread, so the engine may be created before the workers fork).
     * Deterministic mode takes this path with one worker too, so one
     * worker cuts micro-shards exactly as N do. */
    e->order = dt_alloc((size_t)e->train.n * sizeof *e->order);
    e->xbuf = dt_alloc((size_t)cfg->batch * (size_t)e->train.dim * sizeof(float));
    e->ybuf = dt_alloc((size_t)cfg->batch * sizeof(int32_t));
    if (!e->order || !e->xbuf || !e->ybuf) {
      rc = dt__seterr(DT_ENOMEM, "engine: out of memory for %lld samples", (long long)e->train.n);
      goto fail;
    }
    e->steps_per_epoch = (e->train.n + cfg->batch - 1) / cfg->batch;
    set_schedule(e);
    *out = e;
    return DT_OK;
  }
  dt_loader_cfg lc = DT_LOADER_CFG_INIT;
  lc.batch = cfg->batch;
  lc.drop_last = 0;
  lc.prefetch = 2;
  lc.seed = cfg->seed;
  lc.shuffle = cfg->shuffle;
  DT_CHECK_GOTO(dt_loader_create(&e->loader, &e->train, &lc), rc, fail);
  e->steps_per_epoch = dt_loader_batches(e->loader);

  set_schedule(e);
  *out = e;
  return DT_OK;
fail:
  dt_engine_destroy(e);
  return rc;
}

void dt_engine_destroy(dt_engine *e) {
  if (!e) return;
  dt_loader_destroy(e->loader);
  dt_free(e->order);
  dt_free(e->xbuf);
  dt_free(e->ybuf);
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
  if (n > 1 && !e->order)
    return dt__seterr(DT_EINVAL, "engine: created for 1 worker, cannot join a %d-rank job", n);
  e->comm = c;
  e->rank = dt_comm_rank(c);
  e->nranks = n;
  return DT_OK;
}

static int comm_err(dt_engine *e, int rc, const char *what) {
  const char *m = dt_comm_errmsg(e->comm);
  return dt__seterr(rc, "rank %d: %s: %s", e->rank, what, m && *m ? m : dt_errmsg());
}

int dt_engine_evaluate(dt_engine *e, double *loss, double *accuracy) {
  if (e->cfg.deterministic) return dt__det_evaluate(e, loss, accuracy);
  int B = e->cfg.batch;
  double loss_sum = 0;
  int64_t correct = 0;
  dt_step_ctx ctx = {0, e->cfg.seed, 0, 0};
  int64_t lo = 0, hi = e->test.n;
  if (e->comm && e->nranks > 1) {
    /* every rank evaluates with the same (averaged) non-trainable state */
    dt_model *m = e->model;
    if (dt_model_nbufs(m)) {
      int rc = dt_comm_allreduce(e->comm, dt_model_bufs(m), dt_model_bufs(m), dt_model_nbufs(m),
                                 DT_F32, DT_OP_AVG);
      if (rc < 0) return comm_err(e, rc, "evaluation buffers");
    }
    lo = e->test.n * e->rank / e->nranks;
    hi = e->test.n * (e->rank + 1) / e->nranks;
  }
  for (int64_t i = lo; i < hi; i += B) {
    int n = (int)(hi - i < B ? hi - i : B);
    ctx.sample0 = i;
    dt_model_forward(e->model, e->test.x + i * e->test.dim, n, &ctx);
    int nc = 0;
    float l = dt_model_loss(e->model, e->test.y + i, n, &nc);
    loss_sum += (double)l * n;
    correct += nc;
  }
  if (e->comm && e->nranks > 1) {
    double v[2] = {loss_sum, (double)correct};
    int rc = dt_comm_allreduce(e->comm, v, v, 2, DT_F64, DT_OP_SUM);
    if (rc < 0) return comm_err(e, rc, "evaluation");
    loss_sum = v[0];
    correct = (int64_t)(v[1] + 0.5);
  }
  *loss = loss_sum / (double)e->test.n;
  *accuracy = (double)correct / (double)e->test.n;
  return DT_OK;
}

/* ---- records -------------------------------------------------------------- */

static int append_event(FILE *f, const char *path, const dt_epoch_report *r) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return dt__seterr(DT_ENOMEM, "events: out of memory");
  cJSON_AddNumberToObject(o, "epoch", r->epoch);
  cJSON_AddNumberToObject(o, "step", (double)r->step);
  cJSON_AddNumberToObject(o, "train_loss", r->train_loss);
  cJSON_AddNumberToObject(o, "train_accuracy", r->train_accuracy);
  if (r->evaluated) {
    cJSON_AddNumberToObject(o, "test_loss", r->test_loss);
    cJSON_AddNumberToObject(o, "test_accuracy", r->test_accuracy);
  } else {
    cJSON_AddNullToObject(o, "test_loss");
    cJSON_AddNullToObject(o, "test_accuracy");
  }
  cJSON_AddNumberToObject(o, "samples_per_second", r->samples_per_second);
  cJSON_AddNumberToObject(o, "lr", r->lr);
  cJSON_AddNumberToObject(o, "time", r->time);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return dt__seterr(DT_ENOMEM, "events: out of memory");
  int bad = fprintf(f, "%s\n", s) < 0 || fflush(f) != 0;
  cJSON_free(s);
  if (bad) return dt__seterr(DT_EIO, "'%s': write: %s", path, strerror(errno));
  return DT_OK;
}

static void add_worker(cJSON *o, const dt_worker_stats *w) {
  cJSON_AddNumberToObject(o, "samples", w->samples);
  cJSON_AddNumberToObject(o, "samples_per_second", w->samples_per_second);
  cJSON_AddNumberToObject(o, "train_seconds", w->train_seconds);
  cJSON_AddNumberToObject(o, "compute_seconds", w->compute_seconds);
  cJSON_AddNumberToObject(o, "comm_seconds", w->comm_seconds);
  cJSON_AddNumberToObject(o, "comm_hidden_fraction", w->comm_hidden);
  cJSON_AddNumberToObject(o, "bytes_sent", w->bytes_sent);
  cJSON_AddNumberToObject(o, "bytes_received", w->bytes_received);
}

/* per/nper: every worker's numbers (rank order), NULL/0 for one worker. */
static int write_summary(const char *dir, const dt_engine *e, const dt_run_summary *s,
                         const dt_worker_stats *per, int nper) {
  char path[DT_CFG_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  cJSON *o = cJSON_CreateObject();
  if (!o) return dt__seterr(DT_ENOMEM, "summary: out of memory");
  cJSON_AddNumberToObject(o, "test_accuracy", s->test_accuracy);
  cJSON_AddNumberToObject(o, "test_loss", s->test_loss);
  cJSON_AddNumberToObject(o, "epochs", s->epochs);
  cJSON_AddNumberToObject(o, "steps", (double)s->steps);
  cJSON_AddNumberToObject(o, "train_samples", (double)s->train_samples);
  cJSON_AddNumberToObject(o, "train_seconds", s->train_seconds);
  cJSON_AddNumberToObject(o, "samples_per_second", s->samples_per_second);
  cJSON_AddNumberToObject(o, "gflops", s->gflops);
  cJSON_AddNumberToObject(o, "flops_per_sample", dt_model_flops_per_sample(e->model, 1));
  cJSON_AddNumberToObject(o, "workers", s->workers);
  cJSON_AddNumberToObject(o, "params", (double)s->params);
  cJSON_AddStringToObject(o, "params_sha256", s->params_sha256);
  cJSON_AddStringToObject(o, "model", e->cfg.layers);
  cJSON_AddStringToObject(o, "config_sha256", s->config_sha256);
  cJSON_AddNumberToObject(o, "batch", e->cfg.batch);
  cJSON_AddBoolToObject(o, "deterministic", e->cfg.deterministic != 0);
  if (e->cfg.deterministic) cJSON_AddNumberToObject(o, "micro_batch", e->cfg.micro_batch);
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)e->cfg.seed);
  cJSON_AddStringToObject(o, "seed", seed);
  cJSON_AddStringToObject(o, "data_format", fmt_name[e->cfg.format]);
  cJSON_AddNumberToObject(o, "train_set", (double)e->train.n);
  cJSON_AddNumberToObject(o, "test_set", (double)e->test.n);
  double sent = 0, recv = 0, comm_s = 0, comp_s = 0, hidden = 0;
  for (int r = 0; r < nper; r++) {
    sent += per[r].bytes_sent;
    recv += per[r].bytes_received;
    comm_s += per[r].comm_seconds;
    comp_s += per[r].compute_seconds;
    hidden += per[r].comm_hidden * per[r].comm_seconds;
  }
  if (!nper) comp_s = s->train_seconds;
  cJSON_AddNumberToObject(o, "bytes_sent", sent);
  cJSON_AddNumberToObject(o, "bytes_received", recv);
  cJSON_AddNumberToObject(o, "compute_seconds", nper ? comp_s / nper : comp_s);
  cJSON_AddNumberToObject(o, "comm_seconds", nper ? comm_s / nper : 0);
  cJSON_AddNumberToObject(o, "comm_hidden_fraction", comm_s > 0 ? hidden / comm_s : 0);
  if (nper) {
    cJSON *arr = cJSON_AddArrayToObject(o, "per_worker");
    for (int r = 0; arr && r < nper; r++) {
      cJSON *w = cJSON_CreateObject();
      if (!w) break;
      cJSON_AddNumberToObject(w, "rank", r);
      add_worker(w, &per[r]);
      cJSON_AddItemToArray(arr, w);
    }
    cJSON_AddStringToObject(o, "transport", dt_comm_transport_name(e->comm, e->rank ? 0 : 1));
  }
  cJSON_AddStringToObject(o, "blas_core", dt_tensor_blas_core());
  cJSON_AddStringToObject(o, "gemm", dt_tensor_gemm_impl());
  cJSON_AddStringToObject(o, "dtrain_version", dt_version());
  char *txt = cJSON_Print(o);
  cJSON_Delete(o);
  if (!txt) return dt__seterr(DT_ENOMEM, "summary: out of memory");
  size_t n = strlen(txt);
  char *buf = malloc(n + 2);
  if (!buf) {
    cJSON_free(txt);
    return dt__seterr(DT_ENOMEM, "summary: out of memory");
  }
  memcpy(buf, txt, n);
  buf[n] = '\n';
  cJSON_free(txt);
  int rc = dt_write_file_atomic(path, buf, n + 1);
  free(buf);
  return rc;
}

/* SHA-256 of the parameters as little-endian float32. */
static void params_hash(const dt_model *m, char out[65]) {
  const float *p = dt_model_params((dt_model *)m);
  size_t n = dt_model_nparams(m);
  const uint32_t one = 1;
  if (*(const unsigned char *)&one) {
    dt_sha256_hex(p, n * sizeof(float), out);
    return;
  }
  unsigned char *b = malloc(n > 0 ? n * 4 : 1);
  if (!b) {
    memset(out, '0', 64);
    out[64] = '\0';
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &p[i], 4);
    for (int j = 0; j < 4; j++) b[4 * i + j] = (unsigned char)(u >> (8 * j));
  }
  dt_sha256_hex(b, n * 4, out);
  free(b);
}

/* ---- the loop ------------------------------------------------------------- */

/* The end of epoch r->epoch (train fields filled in by the caller): the
 * evaluation when it is due (a collective with a communicator), the
 * events.jsonl record (ev may be NULL: ranks other than 0) and the hook.
 * *test_loss / *test_acc keep the last evaluation. */
static int end_epoch(dt_engine *e, dt_epoch_report *r, double t_start, FILE *ev,
                     const char *events_path, const dt_engine_hooks *hooks, double *test_loss,
                     double *test_acc) {
  const dt_run_cfg *c = &e->cfg;
  if (r->epoch % c->eval_every == 0 || r->epoch == c->epochs) {
    DT_CHECK(dt_engine_evaluate(e, test_loss, test_acc));
    r->evaluated = 1;
    r->test_loss = *test_loss;
    r->test_accuracy = *test_acc;
  }
  r->time = dt_now() - t_start;
  if (ev) DT_CHECK(append_event(ev, events_path, r));
  if (hooks->on_epoch) hooks->on_epoch(hooks->ud, r);
  return DT_OK;
}

static int run_dist(dt_engine *e, const char *out_dir, const char *config_text,
                    const dt_engine_hooks *hooks, dt_run_summary *sum);

int dt_engine_run(dt_engine *e, const char *out_dir, const char *config_text,
                  const dt_engine_hooks *hooks, dt_run_summary *sum) {
  if ((e->comm && e->nranks > 1) || (e->cfg.deterministic && e->cfg.workers == 1))
    return run_dist(e, out_dir, config_text, hooks, sum);
  if (!e->loader)
    return dt__seterr(DT_EINVAL, "dist.workers = %d: the engine needs a communicator "
                      "(dt_engine_set_comm) to train with several workers", e->cfg.workers);
  const dt_run_cfg *c = &e->cfg;
  dt_engine_hooks none = {NULL, NULL, NULL};
  if (!hooks) hooks = &none;
  char path[DT_CFG_PATH_MAX + 32], events_path[DT_CFG_PATH_MAX + 32];
  DT_CHECK(dt_mkdirs(out_dir));
  dt_run_summary s;
  memset(&s, 0, sizeof s);
  const char *ctext = config_text ? config_text : "";
  dt_sha256_hex(ctext, strlen(ctext), s.config_sha256);
  if (config_text) {
    snprintf(path, sizeof path, "%s/config.ini", out_dir);
    DT_CHECK(dt_write_file_atomic(path, config_text, strlen(config_text)));
  }
  snprintf(events_path, sizeof events_path, "%s/events.jsonl", out_dir);
  FILE *ev = fopen(events_path, "w");
  if (!ev) return dt__seterr(DT_EIO, "'%s': %s", events_path, strerror(errno));

  int rc = DT_OK;
  double t_start = dt_now(), train_seconds = 0;
  int64_t step = 0, samples_total = 0;
  float *params = dt_model_params(e->model);
  const float *grads = dt_model_grads(e->model);
  dt_progress p = {0};
  p.epochs = c->epochs;
  p.steps_per_epoch = e->steps_per_epoch;
  double test_loss = 0, test_acc = 0;
  float lr = 0;
  for (int epoch = 1; epoch <= c->epochs; epoch++) {
    DT_CHECK_GOTO(dt_loader_start_epoch(e->loader, (uint64_t)(epoch - 1)), rc, done);
    double t_epoch = 0, loss_sum = 0;
    int64_t seen = 0, correct = 0, k = 0;
    for (;;) {
      double t0 = dt_now();
      dt_batch b;
      int more = dt_loader_next(e->loader, &b);
      if (more < 0) {
        rc = more;
        goto done;
      }
      if (!more) {
        t_epoch += dt_now() - t0;
        break;
      }
      lr = dt_sched_lr(&e->sched, step);
      dt_step_ctx ctx = {1, c->seed, (uint64_t)step, b.sample0};
      dt_model_forward(e->model, b.x, b.n, &ctx);
      int nc = 0;
      float loss = dt_model_backward(e->model, b.y, b.n, &nc, NULL, NULL);
      dt_optim_step(e->optim, params, grads, lr);
      t_epoch += dt_now() - t0;
      if (!isfinite(loss)) {
        rc = dt__seterr(DT_ERANGE, "training diverged at epoch %d step %lld (loss %g); try a "
                        "smaller optim.lr", epoch, (long long)step + 1, (double)loss);
        goto done;
      }
      step++;
      k++;
      seen += b.n;
      correct += nc;
      loss_sum += (double)loss * b.n;
      if (hooks->on_step) {
        p.epoch = epoch;
        p.step_in_epoch = k;
        p.step = step;
        p.loss = loss_sum / (double)seen;
        p.samples_per_second = t_epoch > 0 ? (double)seen / t_epoch : 0;
        p.lr = lr;
        hooks->on_step(hooks->ud, &p);
      }
    }
    train_seconds += t_epoch;
    samples_total += seen;
    dt_epoch_report r;
    memset(&r, 0, sizeof r);
    r.epoch = epoch;
    r.step = step;
    r.train_loss = seen ? loss_sum / (double)seen : 0;
    r.train_accuracy = seen ? (double)correct / (double)seen : 0;
    r.samples_per_second = t_epoch > 0 ? (double)seen / t_epoch : 0;
    r.lr = lr;
    DT_CHECK_GOTO(end_epoch(e, &r, t_start, ev, events_path, hooks, &test_loss, &test_acc), rc,
                  done);
  }

  s.test_accuracy = test_acc;
  s.test_loss = test_loss;
  s.epochs = c->epochs;
  s.steps = step;
  s.train_samples = samples_total;
  s.train_seconds = train_seconds;
  s.samples_per_second = train_seconds > 0 ? (double)samples_total / train_seconds : 0;
  s.gflops = train_seconds > 0 ? dt_model_flops_per_sample(e->model, 1) * (double)samples_total /
                                     train_seconds / 1e9
                               : 0;
  s.workers = 1;
  s.params = dt_model_nparams(e->model);
  params_hash(e->model, s.params_sha256);
  if (fsync(fileno(ev))) {
    /* events are best effort on file systems without fsync */
  }
  s.self.samples = (double)samples_total;
  s.self.train_seconds = s.self.compute_seconds = train_seconds;
  s.self.samples_per_second = s.samples_per_second;
  DT_CHECK_GOTO(write_summary(out_dir, e, &s, NULL, 0), rc, done);
  if (sum) *sum = s;
done:
  fclose(ev);
  return rc;
}

/* ---- the data-parallel loop ------------------------------------------------ */

/* Fingerprint of what must agree between workers. */
static void fingerprint(const dt_engine *e, const char *config_text, dt_ddp_fingerprint *fp) {
  memset(fp, 0, sizeof *fp);
  const dt_run_cfg *c = &e->cfg;
  fp->batch = c->batch;
  fp->epochs = c->epochs;
  fp->train_n = e->train.n;
  fp->test_n = e->test.n;
  fp->nparams = (int64_t)dt_model_nparams(e->model);
  fp->workers = c->workers;
  fp->seed = c->seed;
  fp->deterministic = c->deterministic;
  fp->micro_batch = c->deterministic ? c->micro_batch : 0;
  char hex[65];
  unsigned char raw[32];
  /* hex to raw keeps the struct small and fixed */
#define HASH(dst, buf, len)                                                         \
  do {                                                                              \
    dt_sha256_hex(buf, len, hex);                                                   \
    for (int i_ = 0; i_ < 32; i_++) {                                               \
      unsigned v_;                                                                  \
      sscanf(hex + 2 * i_, "%2x", &v_);                                             \
      raw[i_] = (unsigned char)v_;                                                  \
    }                                                                               \
    memcpy(dst, raw, 32);                                                           \
  } while (0)
  HASH(fp->layers_sha, c->layers, strlen(c->layers));
  struct {
    dt_optim_cfg o;
    int kind;
    int64_t warmup, step_size;
    float gamma, min_lr;
    int shuffle, normalize;
  } os;
  memset(&os, 0, sizeof os);
  os.o = c->optim;
  os.kind = c->sched.kind;
  os.warmup = c->sched.warmup_steps;
  os.step_size = c->sched.step_size;
  os.gamma = c->sched.gamma;
  os.min_lr = c->sched.min_lr;
  os.shuffle = c->shuffle;
  os.normalize = c->normalize;
  HASH(fp->optim_sha, &os, sizeof os);
  const char *t = config_text ? config_text : "";
  HASH(fp->config_sha, t, strlen(t));
#undef HASH
}

/* Positions [*lo, *hi) of the epoch order that this worker trains on in
 * global batch k: the global batch's samples split into nranks contiguous
 * slices whose sizes differ by at most one (the first slices are the
 * shorter ones); a worker may get 0 samples of a short last batch. */
static void my_slice(const dt_engine *e, int64_t k, int64_t *lo, int64_t *hi, int *bg) {
  int64_t B = e->cfg.batch, start = k * B;
  int64_t g = e->train.n - start < B ? e->train.n - start : B;
  *bg = (int)g;
  *lo = start + g * e->rank / e->nranks;
  *hi = start + g * (e->rank + 1) / e->nranks;
}

/* One data-parallel step outside deterministic mode: this worker's slice
 * of global batch k through forward and backward, gradients reduced through
 * ddp (averaged over the global batch, or summed with dist.reduce = sum). */
static int slice_step(dt_engine *e, dt_ddp *ddp, int64_t k, int64_t step, int *n_out, int *bg,
                      int *nc, float *loss) {
  const dt_run_cfg *c = &e->cfg;
  const int64_t dim = e->train.dim;
  int64_t lo, hi;
  my_slice(e, k, &lo, &hi, bg);
  int n = (int)(hi - lo);
  *n_out = n;
  for (int64_t j = 0; j < n; j++) {
    int64_t si = e->order[lo + j];
    memcpy(e->xbuf + j * dim, e->train.x + si * dim, (size_t)dim * sizeof(float));
    e->ybuf[j] = e->train.y[si];
  }
  /* avg: scale by n / bg, so the sum is the global-batch mean; sum:
   * every worker's own mean, summed */
  if (c->reduce == DT_DIST_SUM) dt_ddp_begin_step(ddp, n > 0, 1);
  else dt_ddp_begin_step(ddp, n, *bg);
  if (n > 0) {
    dt_step_ctx ctx = {1, c->seed, (uint64_t)step, lo};
    dt_model_forward(e->model, e->xbuf, n, &ctx);
    *loss = dt_model_backward(e->model, e->ybuf, n, nc, dt_ddp_grad_ready, ddp);
  } else {
    memset(dt_model_grads(e->model), 0, dt_model_nparams(e->model) * sizeof(float));
    dt_ddp_all_ready(ddp);
  }
  return dt_ddp_finish_step(ddp);
}

static int run_dist(dt_engine *e, const char *out_dir, const char *config_text,
                    const dt_engine_hooks *hooks, dt_run_summary *sum) {
  const dt_run_cfg *c = &e->cfg;
  dt_engine_hooks none = {NULL, NULL, NULL};
  if (!hooks) hooks = &none;
  int lead = e->rank == 0, rc = DT_OK;
  char path[DT_CFG_PATH_MAX + 32], events_path[DT_CFG_PATH_MAX + 32];
  dt_run_summary s;
  memset(&s, 0, sizeof s);
  s.rank = e->rank;
  const char *ctext = config_text ? config_text : "";
  dt_sha256_hex(ctext, strlen(ctext), s.config_sha256);

  /* Start-up: same config everywhere, then rank 0's parameters. (No
   * communicator: deterministic mode with one worker.) */
  dt_comm *comm = e->comm;
  const int det = c->deterministic;
  if (comm) {
    dt_ddp_fingerprint fp;
    fingerprint(e, config_text, &fp);
    rc = dt_ddp_check_config(comm, &fp);
    if (rc < 0) return dt__preerr(rc, "rank %d", e->rank);
    rc = dt_ddp_broadcast_params(e->model, comm);
    if (rc < 0) return dt__preerr(rc, "rank %d", e->rank);
  }

  FILE *ev = NULL;
  if (lead) {
    DT_CHECK(dt_mkdirs(out_dir));
    if (config_text) {
      snprintf(path, sizeof path, "%s/config.ini", out_dir);
      DT_CHECK(dt_write_file_atomic(path, config_text, strlen(config_text)));
    }
    snprintf(events_path, sizeof events_path, "%s/events.jsonl", out_dir);
    ev = fopen(events_path, "w");
    if (!ev) return dt__seterr(DT_EIO, "'%s': %s", events_path, strerror(errno));
  }
  dt_ddp *ddp = NULL;
  rc = det ? dt_ddp_create_det(&ddp, e->model, comm, c->bucket_bytes)
           : dt_ddp_create(&ddp, e->model, comm, c->bucket_bytes);
  if (rc < 0) {
    if (ev) fclose(ev);
    return rc;
  }
  uint64_t sent0 = 0, recv0 = 0;
  if (comm) dt_comm_bytes(comm, &sent0, &recv0);

  double t_start = dt_now(), train_seconds = 0;
  int64_t step = 0, samples_total = 0, global_total = 0;
  float *params = dt_model_params(e->model);
  float *grads = dt_model_grads(e->model);
  dt_progress p = {0};
  p.epochs = c->epochs;
  p.steps_per_epoch = e->steps_per_epoch;
  double test_loss = 0, test_acc = 0;
  float lr = 0;
  for (int epoch = 1; epoch <= c->epochs; epoch++) {
    dt_epoch_order(e->order, e->train.n, c->seed, (uint64_t)(epoch - 1), c->shuffle);
    double t_epoch = 0, loss_sum = 0;
    int64_t seen = 0, gseen = 0, correct = 0, loss_fix = 0;
    for (int64_t k = 0; k < e->steps_per_epoch; k++) {
      double t0 = dt_now();
      float loss = 0;
      int nc = 0, n = 0, bg = 0;
      lr = dt_sched_lr(&e->sched, step);
      if (det) {
        dt__det_step_out o;
        rc = dt__det_step(e, ddp, k, step, &o);
        n = o.n;
        bg = o.global;
        nc = o.correct;
        loss_fix += o.loss_fix;
        loss = o.loss_bad ? NAN : n ? (float)(ldexp((double)o.loss_fix, -DT_FIX_BITS) / n) : 0;
      } else {
        rc = slice_step(e, ddp, k, step, &n, &bg, &nc, &loss);
      }
      if (rc < 0) {
        dt__preerr(rc, "rank %d: epoch %d step %lld", e->rank, epoch, (long long)step + 1);
        goto done;
      }
      dt_optim_step(e->optim, params, grads, lr);
      t_epoch += dt_now() - t0;
      if (!isfinite(loss)) {
        rc = dt__seterr(DT_ERANGE, "rank %d: training diverged at epoch %d step %lld (loss %g); "
                        "try a smaller optim.lr", e->rank, epoch, (long long)step + 1,
                        (double)loss);
        goto done;
      }
      step++;
      seen += n;
      gseen += bg;
      correct += nc;
      loss_sum += (double)loss * n;
      if (hooks->on_step) {
        p.epoch = epoch;
        p.step_in_epoch = k + 1;
        p.step = step;
        p.loss = seen ? loss_sum / (double)seen : 0;
        /* global samples/s, as seen from this worker's clock */
        p.samples_per_second = t_epoch > 0 ? (double)gseen / t_epoch : 0;
        p.lr = lr;
        hooks->on_step(hooks->ud, &p);
      }
    }
    train_seconds += t_epoch;
    samples_total += seen;
    global_total += gseen;
    /* the epoch's train numbers over all workers; time: the slowest worker.
     * Deterministic mode sums the loss in fixed point (int64), so the
     * reported train loss has the same bits for any worker count. */
    double v[4] = {loss_sum, (double)correct, (double)seen, 0};
    int64_t vi[3] = {loss_fix, correct, seen};
    double tmax = t_epoch;
    if (comm) {
      rc = det ? dt_comm_allreduce(comm, vi, vi, 3, DT_I64, DT_OP_SUM)
               : dt_comm_allreduce(comm, v, v, 3, DT_F64, DT_OP_SUM);
      if (rc == DT_OK) rc = dt_comm_allreduce(comm, &tmax, &tmax, 1, DT_F64, DT_OP_MAX);
      if (rc < 0) {
        rc = comm_err(e, rc, "epoch statistics");
        goto done;
      }
    }
    if (det) {
      v[0] = ldexp((double)vi[0], -DT_FIX_BITS);
      v[1] = (double)vi[1];
      v[2] = (double)vi[2];
    }
    dt_epoch_report r;
    memset(&r, 0, sizeof r);
    r.epoch = epoch;
    r.step = step;
    r.train_loss = v[2] > 0 ? v[0] / v[2] : 0;
    r.train_accuracy = v[2] > 0 ? v[1] / v[2] : 0;
    r.samples_per_second = tmax > 0 ? v[2] / tmax : 0;
    r.lr = lr;
    DT_CHECK_GOTO(end_epoch(e, &r, t_start, ev, events_path, hooks, &test_loss, &test_acc), rc,
                  done);
  }

  /* Every worker must end with the same parameters. */
  if (comm) {
    rc = dt_ddp_check_params(e->model, comm);
    if (rc < 0) {
      dt__preerr(rc, "rank %d", e->rank);
      goto done;
    }
  }
  dt_ddp_stats st;
  dt_ddp_get_stats(ddp, &st);
  uint64_t sent = 0, recv = 0;
  if (comm) dt_comm_bytes(comm, &sent, &recv);
  dt_worker_stats me;
  me.samples = (double)samples_total;
  me.train_seconds = train_seconds;
  me.samples_per_second = train_seconds > 0 ? (double)samples_total / train_seconds : 0;
  me.compute_seconds = train_seconds - st.exposed_seconds;
  me.comm_seconds = st.comm_seconds;
  double h = st.comm_seconds > 0 ? 1.0 - st.exposed_seconds / st.comm_seconds : 0;
  me.comm_hidden = h < 0 ? 0 : h > 1 ? 1 : h;
  me.bytes_sent = (double)(sent - sent0 + st.window_written);
  me.bytes_received = (double)(recv - recv0 + st.window_read);
  dt_worker_stats *all = calloc((size_t)e->nranks, sizeof *all);
  if (!all) {
    rc = dt__seterr(DT_ENOMEM, "summary: out of memory");
    goto done;
  }
  all[0] = me;
  if (comm) rc = dt_comm_allgather(comm, &me, all, DT_WORKER_STATS_FIELDS, DT_F64);
  if (rc < 0) {
    free(all);
    rc = comm_err(e, rc, "summary statistics");
    goto done;
  }
  double tmax = 0;
  for (int r = 0; r < e->nranks; r++)
    if (all[r].train_seconds > tmax) tmax = all[r].train_seconds;
  s.test_accuracy = test_acc;
  s.test_loss = test_loss;
  s.epochs = c->epochs;
  s.steps = step;
  s.train_samples = global_total;
  s.train_seconds = tmax;
  s.samples_per_second = tmax > 0 ? (double)global_total / tmax : 0;
  s.gflops = tmax > 0 ? dt_model_flops_per_sample(e->model, 1) * (double)global_total / tmax / 1e9
                      : 0;
  s.workers = e->nranks;
  s.params = dt_model_nparams(e->model);
  params_hash(e->model, s.params_sha256);
  s.self = me;
  if (lead) {
    if (fsync(fileno(ev))) {
      /* best effort */
    }
    /* one worker without a communicator: the summary of a 1-worker run */
    rc = write_summary(out_dir, e, &s, comm ? all : NULL, comm ? e->nranks : 0);
  }
  free(all);
  if (rc == DT_OK && sum) *sum = s;
done:
  dt_ddp_destroy(ddp);
  if (ev) fclose(ev);
  return rc;
}

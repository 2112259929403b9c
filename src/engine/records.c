/*
 * records.c — what a run leaves behind, in one place: DIR/config.ini (the
 * effective configuration), DIR/events.jsonl (one JSON line per epoch,
 * flushed as it goes), DIR/summary.json (written last, atomically), and the
 * fingerprints those carry or workers compare: the parameter hash and the
 * configuration fingerprint. Only rank 0 writes. It does not decide when to
 * write (the loop in train.c does) and never prints.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "engine/engine_int.h"
#include "tensor/tensor.h"


int dt__records_open(dt_records *r, const char *dir, const char *config_text) {
  memset(r, 0, sizeof *r);
  DT_CHECK(dt_mkdirs(dir));
  snprintf(r->dir, sizeof r->dir, "%s", dir);
  r->open = 1; /* from here a failure can be recorded */
  if (config_text) {
    char path[DT_CFG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.ini", dir);
    DT_CHECK(dt_write_file_atomic(path, config_text, strlen(config_text)));
  }
  snprintf(r->events_path, sizeof r->events_path, "%s/events.jsonl", dir);
  r->events = fopen(r->events_path, "w");
  if (!r->events) {
    char sp[DT_SHORT_PATH];
    r->open = 0;
    return dt__seterr(DT_EIO, "'%s': %s", dt__short_path(r->events_path, sp), strerror(errno));
  }
  return DT_OK;
}

int dt__records_append(dt_records *r, const char *dir) {
  memset(r, 0, sizeof *r);
  snprintf(r->dir, sizeof r->dir, "%s", dir);
  snprintf(r->events_path, sizeof r->events_path, "%s/events.jsonl", dir);
  r->open = 1;
  r->events = fopen(r->events_path, "a");
  if (!r->events) {
    char sp[DT_SHORT_PATH];
    r->open = 0;
    return dt__seterr(DT_EIO, "'%s': %s", dt__short_path(r->events_path, sp), strerror(errno));
  }
  return DT_OK;
}

void dt__records_close(dt_records *r) {
  if (!r->events) return;
  if (fsync(fileno(r->events))) {
    /* events are best effort on file systems without fsync */
  }
  fclose(r->events);
  r->events = NULL;
}

/* Work stealing's backup tasks of one rank (only where there were any). */
static void add_backups(cJSON *w, const dt_rank_perf *p) {
  if (!(p->backups > 0 || p->dropped > 0)) return;
  cJSON_AddNumberToObject(w, "backups", p->backups);
  cJSON_AddNumberToObject(w, "backups_won", p->backups_won);
  cJSON_AddNumberToObject(w, "dropped", p->dropped);
}

/* Per-rank speed and wait (balance.h): "ranks" [{rank, ms_per_sample,
 * compute_seconds, wait_seconds, samples, share, slower, straggler}] and
 * "stragglers" [ranks flagged]. */
static void add_ranks(cJSON *o, const dt_rank_perf *p, int n) {
  cJSON *arr = cJSON_AddArrayToObject(o, "ranks");
  cJSON *fl = cJSON_AddArrayToObject(o, "stragglers");
  for (int i = 0; arr && fl && i < n; i++) {
    cJSON *w = cJSON_CreateObject();
    if (!w) break;
    cJSON_AddNumberToObject(w, "rank", i);
    cJSON_AddNumberToObject(w, "ms_per_sample", 1e3 * p[i].sec_per_sample);
    cJSON_AddNumberToObject(w, "compute_seconds", p[i].compute_seconds);
    cJSON_AddNumberToObject(w, "wait_seconds", p[i].wait_seconds);
    cJSON_AddNumberToObject(w, "samples", p[i].samples);
    cJSON_AddNumberToObject(w, "share", p[i].share);
    cJSON_AddNumberToObject(w, "slower", p[i].slower);
    cJSON_AddBoolToObject(w, "straggler", p[i].straggler);
    add_backups(w, &p[i]);
    cJSON_AddItemToArray(arr, w);
    if (p[i].straggler) cJSON_AddItemToArray(fl, cJSON_CreateNumber(i));
  }
}

int dt__records_event(dt_records *r, const dt_epoch_report *rep) {
  if (!r->events) return DT_OK;
  cJSON *o = cJSON_CreateObject();
  if (!o) return dt__seterr(DT_ENOMEM, "events: out of memory");
  cJSON_AddNumberToObject(o, "epoch", rep->epoch);
  cJSON_AddNumberToObject(o, "step", (double)rep->step);
  cJSON_AddNumberToObject(o, "train_loss", rep->train_loss);
  cJSON_AddNumberToObject(o, "train_accuracy", rep->train_accuracy);
  if (rep->evaluated) {
    cJSON_AddNumberToObject(o, "test_loss", rep->test_loss);
    cJSON_AddNumberToObject(o, "test_accuracy", rep->test_accuracy);
  } else {
    cJSON_AddNullToObject(o, "test_loss");
    cJSON_AddNullToObject(o, "test_accuracy");
  }
  cJSON_AddNumberToObject(o, "samples_per_second", rep->samples_per_second);
  cJSON_AddNumberToObject(o, "lr", rep->lr);
  cJSON_AddNumberToObject(o, "time", rep->time);
  if (r->strat && r->strat->perf_epoch && r->strat->nperf > 1)
    add_ranks(o, r->strat->perf_epoch, r->strat->nperf);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return dt__seterr(DT_ENOMEM, "events: out of memory");
  int bad = fprintf(r->events, "%s\n", s) < 0 || fflush(r->events) != 0;
  cJSON_free(s);
  if (bad) {
    char sp[DT_SHORT_PATH];
    return dt__seterr(DT_EIO, "'%s': write: %s", dt__short_path(r->events_path, sp),
                      strerror(errno));
  }
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
  cJSON_AddNumberToObject(o, "cpu_seconds", w->cpu_seconds);
  cJSON_AddNumberToObject(o, "peak_rss_bytes", w->peak_rss_bytes);
}

/* Pretty-printed JSON plus a final newline, written atomically. */
static int write_json(const char *path, cJSON *o) {
  char *txt = cJSON_Print(o);
  if (!txt) return dt__seterr(DT_ENOMEM, "'%s': out of memory", path);
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

/* What checkpointing did in this run, and where it resumed from. */
static void add_checkpoints(cJSON *o, const dt_engine *e) {
  const dt_ckpt_run *k = &e->ck;
  if (k->res) {
    cJSON *r = cJSON_AddObjectToObject(o, "resumed_from");
    if (r) {
      cJSON_AddStringToObject(r, "dir", k->res->info.dir);
      cJSON_AddNumberToObject(r, "step", (double)k->res->step);
      cJSON_AddNumberToObject(r, "workers", k->res->workers);
    }
  }
  if (!k->on) return;
  const dt_ckpt_stats *st = &k->stats;
  cJSON *c = cJSON_AddObjectToObject(o, "checkpoints");
  if (!c) return;
  cJSON_AddStringToObject(c, "dir", k->root);
  cJSON_AddNumberToObject(c, "written", st->written);
  cJSON_AddNumberToObject(c, "failed", st->failed);
  if (st->written) cJSON_AddStringToObject(c, "last", st->last_dir);
  if (st->failed) {
    cJSON_AddNumberToObject(c, "failed_step", (double)st->failed_step);
    cJSON_AddStringToObject(c, "last_error", st->last_error);
  }
  cJSON_AddBoolToObject(c, "async", e->cfg.ckpt_async != 0);
  cJSON_AddNumberToObject(c, "snapshot_seconds", k->snap_seconds);
  cJSON_AddNumberToObject(c, "wait_seconds", k->wait_seconds);
  cJSON_AddNumberToObject(c, "write_seconds", st->write_seconds);
  cJSON_AddNumberToObject(c, "bytes", st->bytes);
}

int dt__records_summary(dt_records *r, const dt_engine *e, const dt_run_summary *s,
                        const dt_worker_stats *per, int nper) {
  if (!r->open) return DT_OK;
  dt__records_close(r); /* events.jsonl is complete: fsync it before the summary */
  char path[DT_CFG_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/summary.json", r->dir);
  cJSON *o = cJSON_CreateObject();
  if (!o) return dt__seterr(DT_ENOMEM, "summary: out of memory");
  cJSON_AddStringToObject(o, "status", "succeeded");
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
  /* The seed as an exact JSON integer (raw digits: a double would round
   * seeds above 2^53; readers that parse numbers as doubles still may). */
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)e->cfg.seed);
  cJSON_AddRawToObject(o, "seed", seed);
  cJSON_AddStringToObject(o, "data_format", dt__enum_name(dt__format_names, e->cfg.format));
  cJSON_AddNumberToObject(o, "train_set", (double)e->train.n);
  cJSON_AddNumberToObject(o, "test_set", (double)e->test.n);
  double sent = 0, recv = 0, comm_s = 0, comp_s = 0, hidden = 0;
  for (int i = 0; i < nper; i++) {
    sent += per[i].bytes_sent;
    recv += per[i].bytes_received;
    comm_s += per[i].comm_seconds;
    comp_s += per[i].compute_seconds;
    hidden += per[i].comm_hidden * per[i].comm_seconds;
  }
  if (!nper) comp_s = s->train_seconds;
  cJSON_AddNumberToObject(o, "bytes_sent", sent);
  cJSON_AddNumberToObject(o, "bytes_received", recv);
  cJSON_AddNumberToObject(o, "compute_seconds", nper ? comp_s / nper : comp_s);
  cJSON_AddNumberToObject(o, "comm_seconds", nper ? comm_s / nper : 0);
  cJSON_AddNumberToObject(o, "comm_hidden_fraction", comm_s > 0 ? hidden / comm_s : 0);
  /* the largest worker's peak resident memory (per_worker has each) */
  double rss = s->self.peak_rss_bytes;
  for (int i = 0; i < nper; i++)
    if (per[i].peak_rss_bytes > rss) rss = per[i].peak_rss_bytes;
  cJSON_AddNumberToObject(o, "peak_rss_bytes", rss);
  if (nper) {
    cJSON *arr = cJSON_AddArrayToObject(o, "per_worker");
    for (int i = 0; arr && i < nper; i++) {
      cJSON *w = cJSON_CreateObject();
      if (!w) break;
      cJSON_AddNumberToObject(w, "rank", i);
      add_worker(w, &per[i]);
      const dt_strategy *S = &e->strat;
      if (S->perf_run && i < S->nperf) {
        const dt_rank_perf *q = &S->perf_run[i];
        cJSON_AddNumberToObject(w, "ms_per_sample", 1e3 * q->sec_per_sample);
        cJSON_AddNumberToObject(w, "wait_seconds", q->wait_seconds);
        cJSON_AddNumberToObject(w, "share", q->share);
        cJSON_AddNumberToObject(w, "slower", q->slower);
        cJSON_AddBoolToObject(w, "straggler", q->straggler);
        add_backups(w, q);
      }
      cJSON_AddItemToArray(arr, w);
    }
    cJSON_AddStringToObject(o, "transport", dt_comm_transport_name(e->comm, e->rank ? 0 : 1));
    cJSON_AddStringToObject(o, "balance", dt__enum_name(dt__balance_names, e->cfg.balance));
    const dt_strategy *S = &e->strat;
    cJSON *fl = cJSON_AddArrayToObject(o, "stragglers");
    double ran = 0, won = 0;
    for (int i = 0; fl && S->perf_run && i < S->nperf; i++) {
      if (S->perf_run[i].straggler) cJSON_AddItemToArray(fl, cJSON_CreateNumber(i));
      ran += S->perf_run[i].backups;
      won += S->perf_run[i].backups_won;
    }
    /* work stealing: backup copies run, and those that counted */
    if (e->cfg.balance == DT_BALANCE_STEAL && e->cfg.deterministic) {
      cJSON_AddNumberToObject(o, "backups", ran);
      cJSON_AddNumberToObject(o, "backups_won", won);
    }
  }
  cJSON_AddStringToObject(o, "strategy", e->strat.ops->name);
  add_checkpoints(o, e);
  cJSON_AddStringToObject(o, "blas_core", dt_tensor_blas_core());
  cJSON_AddStringToObject(o, "gemm", dt_tensor_gemm_impl());
  cJSON_AddStringToObject(o, "dtrain_version", dt_version());
  int rc = write_json(path, o);
  cJSON_Delete(o);
  return rc;
}

int dt__records_failure(dt_records *r, const dt_engine *e, int rc, const char *msg, int epoch,
                        int64_t step) {
  if (!r->open) return DT_OK;
  char path[DT_CFG_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", r->dir, DT_FAILURE_RECORD);
  cJSON *o = cJSON_CreateObject();
  if (!o) return dt__seterr(DT_ENOMEM, "failure record: out of memory");
  cJSON_AddStringToObject(o, "status", "failed");
  cJSON_AddStringToObject(o, "error", msg);
  cJSON_AddStringToObject(o, "error_code", dt_strerror(rc));
  cJSON_AddNumberToObject(o, "epoch", epoch);
  cJSON_AddNumberToObject(o, "step", (double)step);
  cJSON_AddNumberToObject(o, "workers", e->nranks);
  cJSON_AddStringToObject(o, "strategy", e->strat.ops->name);
  cJSON_AddStringToObject(o, "dtrain_version", dt_version());
  dt__records_close(r);
  int wrc = write_json(path, o);
  cJSON_Delete(o);
  return wrc;
}

/* ---- fingerprints ------------------------------------------------------------- */

void dt__params_sha256(const dt_model *m, uint8_t out[32]) {
  const float *p = dt_model_params((dt_model *)m);
  size_t n = dt_model_nparams(m);
  const uint32_t one = 1;
  if (*(const unsigned char *)&one) {
    dt_sha256(p, n * sizeof(float), out);
    return;
  }
  unsigned char *b = malloc(n > 0 ? n * 4 : 1);
  if (!b) {
    memset(out, 0, 32);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &p[i], 4);
    for (int j = 0; j < 4; j++) b[4 * i + j] = (unsigned char)(u >> (8 * j));
  }
  dt_sha256(b, n * 4, out);
  free(b);
}

void dt__config_fingerprint(const dt_run_cfg *c, int64_t train_n, int64_t test_n, size_t nparams,
                            const uint8_t config_sha[32], dt_ddp_fingerprint *fp) {
  memset(fp, 0, sizeof *fp);
  fp->batch = c->batch;
  fp->epochs = c->epochs;
  fp->train_n = train_n;
  fp->test_n = test_n;
  fp->nparams = (int64_t)nparams;
  fp->workers = c->workers;
  fp->seed = c->seed;
  fp->deterministic = c->deterministic;
  fp->micro_batch = c->deterministic ? c->micro_batch : 0;
  fp->balance = c->balance;
  fp->balance_every = c->balance != DT_BALANCE_STATIC ? c->balance_every : 0;
  fp->det_probe = c->deterministic ? dt_tensor_det_probe() : 0;
  dt_sha256(c->layers, strlen(c->layers), fp->layers_sha);
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
  dt_sha256(&os, sizeof os, fp->optim_sha);
  memcpy(fp->config_sha, config_sha, 32);
}

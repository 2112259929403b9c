/*
 * engine_job.h — what the engine tests that fork a job of workers share:
 * a temporary directory with CSV data sets, one forked worker per run
 * config (each file defines child(), the worker's body, and writes
 * <tmp>/<tag>_<rank>.params / .span / .acc / .err), and readers of what the
 * workers left. Included by one test file each (static functions, like
 * fork_workers.h); the including file defines setup() (its own tmpdir
 * name and data sizes) and child(). Include it after <cmocka.h> and
 * fork_workers.h.
 */
#ifndef DT_TESTS_ENGINE_JOB_H
#define DT_TESTS_ENGINE_JOB_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "csv_blobs.h"

static int child(const dt_run_cfg *c, int rank, const char *tag);

static char tmpdir[256];

/* A worker's results: its parameters (<tag>_<rank>.params) and test
 * accuracy (.acc); DT_EIO if a file cannot be written. */
__attribute__((unused)) static int job_write_results(dt_engine *e, const dt_run_summary *sum,
                                                     const char *tag, int rank) {
  char p[400];
  int rc = DT_OK;
  snprintf(p, sizeof p, "%s/%s_%d.params", tmpdir, tag, rank);
  FILE *f = fopen(p, "wb");
  const dt_model *m = dt_engine_model(e);
  size_t n = dt_model_nparams(m);
  if (!f || fwrite(dt_model_params((dt_model *)m), sizeof(float), n, f) != n) rc = DT_EIO;
  if (f) fclose(f);
  /* the span this rank holds (a pipeline stage: its own) */
  size_t off = 0, len = 0;
  dt__engine_param_span(e, &off, &len);
  snprintf(p, sizeof p, "%s/%s_%d.span", tmpdir, tag, rank);
  f = fopen(p, "w");
  if (!f || fprintf(f, "%zu %zu\n", off, len) < 0) rc = DT_EIO;
  if (f) fclose(f);
  snprintf(p, sizeof p, "%s/%s_%d.acc", tmpdir, tag, rank);
  f = fopen(p, "w");
  if (!f || fprintf(f, "%.17g\n", sum->test_accuracy) < 0) rc = DT_EIO;
  if (f) fclose(f);
  return rc;
}

/* A failed rank's message (dt_errmsg()) into <tag>_<rank>.err. */
__attribute__((unused)) static void job_write_err(const char *tag, int rank) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_%d.err", tmpdir, tag, rank);
  FILE *f = fopen(p, "w");
  if (f) {
    fprintf(f, "%s\n", dt_errmsg());
    fclose(f);
  }
}

/* The usual worker body: the engine over a communicator of c->workers ranks
 * (a file store under <tmp>/<tag>_store), trained with hooks (may be NULL);
 * leaves <tag>_<rank>.params and .acc, or .err with the message. Returns the
 * exit status: 0, 3 for DT_EMISMATCH, 1 otherwise. */
__attribute__((unused)) static int job_worker(const dt_run_cfg *c, int rank, const char *tag,
                                              const dt_engine_hooks *hooks, int timeout_s) {
  char outd[400], sdir[400];
  snprintf(outd, sizeof outd, "%s/%s_run", tmpdir, tag);
  snprintf(sdir, sizeof sdir, "%s/%s_store", tmpdir, tag);
  dt_engine *e = NULL;
  dt_store *s = NULL;
  dt_comm *comm = NULL;
  int rc = dt_engine_create(&e, c);
  if (rc == DT_OK && c->workers > 1) {
    struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
    cc.transport = "auto";
    cc.rank = rank;
    cc.size = c->workers;
    cc.job = tag;
    cc.timeout_s = timeout_s;
    rc = dt_store_open_file(&s, sdir);
    if (rc == DT_OK) rc = dt_comm_create(&comm, s, &cc);
    if (rc == DT_OK) rc = dt_engine_set_comm(e, comm);
  }
  dt_run_summary sum;
  if (rc == DT_OK) rc = dt_engine_run(e, outd, "cfg", hooks, &sum);
  if (rc == DT_OK) rc = job_write_results(e, &sum, tag, rank);
  else job_write_err(tag, rank);
  dt_comm_destroy(comm);
  dt_store_destroy(s);
  dt_engine_destroy(e);
  return rc == DT_OK ? 0 : rc == DT_EMISMATCH ? 3 : 1;
}

__attribute__((unused)) static void path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* n samples of 3 classes in 6 dimensions (csv_blobs.h, centre 1, jitter 1.5). */
__attribute__((unused)) static void write_csv(const char *file, int n, uint64_t seed) {
  assert_int_equal(write_csv_blobs(file, n, seed, 1.0f, 1.5f), 0);
}

struct job_arg {
  const dt_run_cfg *cfgs;
  const char *tag;
};

static int job_child(void *arg, int r) {
  const struct job_arg *a = arg;
  return child(&a->cfgs[r], r, a->tag);
}

/* One forked worker per config; status[r] as fork_workers reports it. */
/* How long run_job waits for a job's workers before it kills them. */
static double job_deadline_s = 50;

__attribute__((unused)) static void run_job(const dt_run_cfg *cfgs, int n, const char *tag,
                                            int *status) {
  struct job_arg a = {cfgs, tag};
  fork_workers(n, job_child, &a, job_deadline_s, tag, status);
}

__attribute__((unused)) static float *read_params(const char *tag, int rank, size_t *n) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_%d.params", tmpdir, tag, rank);
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  float *v = malloc((size_t)len);
  assert_non_null(v);
  assert_int_equal(fread(v, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len / sizeof(float);
  return v;
}

/* The span of the parameters rank held ([*off, *off + *n)). */
__attribute__((unused)) static void read_span(const char *tag, int rank, size_t *off, size_t *n) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_%d.span", tmpdir, tag, rank);
  FILE *f = fopen(p, "r");
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%zu %zu", off, n), 2);
  fclose(f);
}

__attribute__((unused)) static double read_acc(const char *tag, int rank) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_%d.acc", tmpdir, tag, rank);
  FILE *f = fopen(p, "r");
  assert_non_null(f);
  double a = -1;
  assert_int_equal(fscanf(f, "%lf", &a), 1);
  fclose(f);
  return a;
}

__attribute__((unused)) static void read_err(const char *tag, int rank, char *buf, size_t cap) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_%d.err", tmpdir, tag, rank);
  buf[0] = '\0';
  FILE *f = fopen(p, "r");
  if (!f) return;
  size_t k = fread(buf, 1, cap - 1, f);
  buf[k] = '\0';
  fclose(f);
}

/* Relative L2 difference of two parameter vectors. */
__attribute__((unused)) static double rel_diff(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return sqrt(num / den);
}

__attribute__((unused)) static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

#endif

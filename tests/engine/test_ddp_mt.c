/*
 * test_ddp_mt.c — data-parallel training through the engine, with worker
 * processes forked by the test and joined through a file store:
 *   - equivalence: 2, 3 and 4 workers with global batch B end with the
 *     parameters of 1 worker with batch B (same seed, 51 steps of an MLP
 *     with dropout, the last global batch a single sample so some workers
 *     get none) to 1e-5 relative, and every worker holds the same bytes and
 *     reports the same test accuracy — with one bucket, with a bucket per
 *     layer (overlapped on the communication thread) and without the
 *     thread (DTRAIN_DDP_OVERLAP=0);
 *   - a worker whose config differs (batch, model) is refused at start on
 *     every rank with DT_EMISMATCH naming rank 1 and the key.
 * Every child is waited for with a deadline and SIGKILLed past it.
 * The forked workers run the communication thread and the shared gradient
 * window, so the test is also built with TSan (the _mt suffix).
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "fork_workers.h"
#include "engine_job.h"

static void base_cfg(dt_run_cfg *c, int workers) {
  dt_run_cfg_defaults(c);
  snprintf(c->layers, sizeof c->layers, "linear(32) relu dropout(0.2) linear(16) relu linear(3)");
  c->format = DT_FMT_CSV;
  path(c->train_images, sizeof c->train_images, "train.csv");
  path(c->test_images, sizeof c->test_images, "test.csv");
  c->train_labels[0] = c->test_labels[0] = '\0';
  c->label_col = 0;
  c->epochs = 1;
  c->batch = 32;
  c->optim.lr = 0.05f;
  c->workers = workers;
}

static int child(const dt_run_cfg *c, int rank, const char *tag) {
  return job_worker(c, rank, tag, NULL, 20);
}

static void test_equivalence(void **state) {
  (void)state;
  dt_run_cfg one;
  base_cfg(&one, 1);
  int st[4];
  run_job(&one, 1, "ref", st);
  assert_int_equal(st[0], 0);
  size_t n0;
  float *ref = read_params("ref", 0, &n0);
  /* 2 workers, default buckets (one here, reduced without the thread); 3
   * workers with 256-byte buckets (one per layer: the overlapped path); 2
   * workers with per-layer buckets but the thread turned off; 4 workers,
   * overlapped; 3 workers with per-layer buckets and the automatic choice
   * (no thread on a small host, where the gradients share a window) */
  static const struct { int n; const char *bucket, *overlap; } runs[] = {
      {2, NULL, NULL}, {3, "256", "1"}, {2, "256", "0"}, {4, "256", "1"}, {3, "256", NULL}};
  for (int k = 0; k < 5; k++) {
    int N = runs[k].n;
    dt_run_cfg cfgs[4];
    for (int r = 0; r < N; r++) {
      base_cfg(&cfgs[r], N);
      if (runs[k].bucket) cfgs[r].bucket_bytes = atoi(runs[k].bucket);
    }
    char tag[16];
    snprintf(tag, sizeof tag, "eq%d", k);
    if (runs[k].overlap) setenv("DTRAIN_DDP_OVERLAP", runs[k].overlap, 1);
    dt__param_reload(); /* the knob table caches the environment */
    run_job(cfgs, N, tag, st);
    unsetenv("DTRAIN_DDP_OVERLAP");
    dt__param_reload(); /* the knob table caches the environment */
    for (int r = 0; r < N; r++) {
      char msg[600];
      read_err(tag, r, msg, sizeof msg);
      if (st[r] != 0) fail_msg("%d workers: rank %d exit %d: %s", N, r, st[r], msg);
    }
    size_t n;
    float *p0 = read_params(tag, 0, &n);
    assert_int_equal(n, n0);
    double num = 0, den = 0, maxd = 0;
    for (size_t i = 0; i < n; i++) {
      double d = (double)p0[i] - (double)ref[i];
      num += d * d;
      den += (double)ref[i] * ref[i];
      if (fabs(d) > maxd) maxd = fabs(d);
    }
    double rel = sqrt(num / den);
    printf("# %d workers (buckets %s, overlap %s) vs 1: relative difference %.3g, max abs %.3g\n",
           N, runs[k].bucket ? runs[k].bucket : "default", runs[k].overlap ? (runs[k].overlap[0] == '0' ? "off" : "on") : "auto", rel,
           maxd);
    assert_true(rel < 1e-5);
    /* every worker holds the same bytes and reports the same test accuracy */
    double acc0 = read_acc(tag, 0);
    assert_true(fabs(acc0 - read_acc("ref", 0)) < 0.02);
    for (int r = 1; r < N; r++) {
      size_t m;
      float *pr = read_params(tag, r, &m);
      assert_int_equal(m, n);
      assert_memory_equal(pr, p0, n * sizeof(float));
      free(pr);
      assert_true(read_acc(tag, r) == acc0);
    }
    free(p0);
  }
  free(ref);
}

static void expect_mismatch(const char *tag, dt_run_cfg *cfgs, const char *key) {
  int st[2];
  run_job(cfgs, 2, tag, st);
  for (int r = 0; r < 2; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 3) fail_msg("%s: rank %d exit %d (want 3, DT_EMISMATCH): %s", tag, r, st[r], msg);
    if (!strstr(msg, "rank 1") || !strstr(msg, key))
      fail_msg("%s: rank %d message '%s' does not name rank 1 and '%s'", tag, r, msg, key);
  }
  char p[400];
  snprintf(p, sizeof p, "%s/%s_run/summary.json", tmpdir, tag);
  assert_int_not_equal(access(p, F_OK), 0);
}

static void test_config_mismatch(void **state) {
  (void)state;
  dt_run_cfg cfgs[2];
  base_cfg(&cfgs[0], 2);
  base_cfg(&cfgs[1], 2);
  cfgs[1].batch = 16;
  expect_mismatch("mm_batch", cfgs, "train.batch");
  base_cfg(&cfgs[1], 2);
  snprintf(cfgs[1].layers, sizeof cfgs[1].layers, "linear(8) relu linear(3)");
  expect_mismatch("mm_model", cfgs, "model.layers");
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_ddp_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[300];
  path(p, sizeof p, "train.csv");
  write_csv(p, 32 * 50 + 1, 7); /* 51 steps; the last global batch holds 1 sample */
  path(p, sizeof p, "test.csv");
  write_csv(p, 301, 8);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equivalence),
      cmocka_unit_test(test_config_mismatch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

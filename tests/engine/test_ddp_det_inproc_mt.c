/*
 * test_ddp_det_inproc_mt.c — deterministic mode with the workers as threads
 * of one process over the inproc transport (a TCP store server on a thread),
 * so ThreadSanitizer (make test-tsan: names ending _mt) sees the compute
 * thread hand fixed-point buckets to the communication thread and read the
 * converted gradients and running statistics back:
 *   - 2 workers with one bucket (reduced on the compute thread) and 3 with
 *     per-layer buckets (overlapped on the communication thread) end with
 *     the SHA-256 of one worker without a communicator, in the same process;
 *   - every rank's summary reports the same hash and test accuracy.
 * The data: batch 23 in micro-shards of 8 (8, 8, 7), a last global batch of
 * 5, an MLP with batch norm and dropout (as test_ddp_det.c, smaller).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "csv_blobs.h"

static char tmpdir[256];

static void write_csv(const char *file, int n, uint64_t seed) {
  assert_int_equal(write_csv_blobs(file, n, seed, 1.0f, 1.5f), 0);
}

static void make_cfg(dt_run_cfg *c, int workers, int64_t bucket) {
  dt_run_cfg_defaults(c);
  snprintf(c->layers, sizeof c->layers, "linear(16) batchnorm relu dropout(0.2) linear(3)");
  c->format = DT_FMT_CSV;
  snprintf(c->train_images, sizeof c->train_images, "%s/train.csv", tmpdir);
  snprintf(c->test_images, sizeof c->test_images, "%s/test.csv", tmpdir);
  c->label_col = 0;
  c->epochs = 2;
  c->batch = 23;
  c->optim.lr = 0.05f;
  c->workers = workers;
  c->deterministic = 1;
  c->micro_batch = 8;
  c->bucket_bytes = bucket;
}

typedef struct rank_arg {
  int rank, size, port;
  int64_t bucket;
  const char *job;
  int rc;
  char err[512];
  dt_run_summary sum;
} rank_arg;

/* One worker: engine, store client, inproc communicator, run. */
static void *rank_main(void *p) {
  rank_arg *a = p;
  dt_run_cfg c;
  make_cfg(&c, a->size, a->bucket);
  dt_engine *e = NULL;
  dt_store *s = NULL;
  dt_comm *comm = NULL;
  char out[400];
  snprintf(out, sizeof out, "%s/%s_%d", tmpdir, a->job, a->rank);
  int rc = dt_engine_create(&e, &c);
  if (rc == DT_OK && a->size > 1) {
    struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
    cc.transport = "inproc";
    cc.rank = a->rank;
    cc.size = a->size;
    cc.job = a->job;
    cc.timeout_s = 30;
    rc = dt_store_connect(&s, "127.0.0.1", a->port, NULL, 10);
    if (rc == DT_OK) rc = dt_comm_create(&comm, s, &cc);
    if (rc == DT_OK) rc = dt_engine_set_comm(e, comm);
  }
  if (rc == DT_OK) rc = dt_engine_run(e, out, "cfg", NULL, &a->sum);
  if (rc < 0) snprintf(a->err, sizeof a->err, "%s", dt_errmsg());
  a->rc = rc;
  dt_comm_destroy(comm);
  dt_store_destroy(s);
  dt_engine_destroy(e);
  return NULL;
}

/* Runs n ranks as threads; every rank must succeed with the same hash and
 * accuracy, which go to sum0. */
static void run_threads(int n, int64_t bucket, const char *job, dt_run_summary *sum0) {
  dt_store_server *srv = NULL;
  if (n > 1) assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, NULL), DT_OK);
  rank_arg a[4];
  pthread_t th[4];
  for (int r = 0; r < n; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].rank = r;
    a[r].size = n;
    a[r].port = srv ? dt_store_server_port(srv) : 0;
    a[r].bucket = bucket;
    a[r].job = job;
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  dt_store_server_stop(srv);
  for (int r = 0; r < n; r++)
    if (a[r].rc != DT_OK) fail_msg("%s: rank %d: %s", job, r, a[r].err);
  for (int r = 1; r < n; r++) {
    assert_string_equal(a[r].sum.params_sha256, a[0].sum.params_sha256);
    assert_true(a[r].sum.test_accuracy == a[0].sum.test_accuracy);
  }
  *sum0 = a[0].sum;
}

static void test_inproc(void **state) {
  (void)state;
  dt_run_summary one, two, three;
  run_threads(1, 0, "one", &one);
  run_threads(2, 0, "two", &two);       /* one bucket: reduced inline */
  run_threads(3, 256, "three", &three); /* per-layer buckets: the thread */
  printf("# 1 worker %.16s..., 2: %.16s..., 3: %.16s...\n", one.params_sha256,
         two.params_sha256, three.params_sha256);
  assert_string_equal(two.params_sha256, one.params_sha256);
  assert_string_equal(three.params_sha256, one.params_sha256);
  assert_true(two.test_accuracy == one.test_accuracy);
  assert_true(three.test_loss == one.test_loss);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_ddp_det_mt_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[300];
  snprintf(p, sizeof p, "%s/train.csv", tmpdir);
  write_csv(p, 23 * 4 + 5, 7);
  snprintf(p, sizeof p, "%s/test.csv", tmpdir);
  write_csv(p, 60, 8);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_inproc)};
  return cmocka_run_group_tests(tests, setup, teardown);
}

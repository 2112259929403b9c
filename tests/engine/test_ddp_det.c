/*
 * test_ddp_det.c — deterministic mode (dist.deterministic): the final
 * parameters are bit-identical for 1, 2, 3 and 4 workers, over shm and tcp,
 * with every allreduce algorithm forced (ring, rhd, tree, and hier with
 * fake host ids), with one bucket (reduced inline), per-layer buckets
 * (overlapped on the communication thread) and no thread; and between two
 * runs. Test loss and accuracy have the same bits too.
 *
 * The data make every awkward case happen: train.batch 23 is divisible by
 * neither micro_batch 8 nor any N in 2..4 (micro-shards of 8, 8, 7: with 4
 * workers one worker has none in every step), the last global batch holds
 * 5 samples (one short micro-shard), and the MLP has batch norm (running
 * statistics combined in fixed point) and dropout. A small CNN with 2d
 * batch norm runs 1 vs 3 workers. Also: reduce = sum is N-independent too;
 * one worker with micro_batch >= batch agrees with normal mode to float
 * rounding (the fixed-point mean is the right gradient); a diverging run
 * stops with DT_ERANGE on every rank, naming the fixed-point range and the
 * step; ranks that disagree on dist.deterministic are refused.
 *
 * Workers are processes forked by the test, joined through a file store;
 * every child is waited for with a deadline and SIGKILLed past it. Nothing
 * depends on timing.
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

static char tmpdir[256];

#define MLP "linear(32) batchnorm relu dropout(0.2) linear(16) relu linear(3)"
#define CNN "conv(4,3,pad=1) batchnorm relu maxpool(2) flatten dropout(0.1) linear(3)"

static void path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* n samples of 3 classes in dim dimensions with deterministic jitter. */
static void write_csv(const char *file, int n, int dim, uint64_t seed) {
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fprintf(f, "label");
  for (int d = 0; d < dim; d++) fprintf(f, ",f%d", d);
  fprintf(f, "\n");
  for (int i = 0; i < n; i++) {
    int k = i % 3;
    float j[16];
    dt_rng_uniform(j, (size_t)dim, -1.5f, 1.5f, seed, DT_RNG_USER, (uint64_t)i);
    fprintf(f, "%d", k);
    for (int d = 0; d < dim; d++) fprintf(f, ",%.5f", (d % 3 == k ? 1.0f : 0.0f) + j[d]);
    fprintf(f, "\n");
  }
  fclose(f);
}

/* One job: N workers (1: no communicator) and how they talk. */
typedef struct job {
  int n;
  const char *transport; /* shm, tcp, auto */
  dt_algo algo;
  int host_mod;          /* > 0: rank r claims host "h<r / host_mod>" */
  int64_t bucket;        /* dist.bucket_bytes; 0 = default (one bucket here) */
  const char *overlap;   /* DTRAIN_DDP_OVERLAP, NULL = unset */
  int hier_tuned;         /* DTRAIN_HIER_MIN_BYTES=0: tuning picks hier */
  int cnn, reduce_sum, deterministic, micro;
  float lr;
} job;

static const job DEF = {1, "shm", DT_ALGO_AUTO, 0, 0, NULL, 0, 0, 0, 1, 8, 0.05f};

static void make_cfg(dt_run_cfg *c, const job *j) {
  dt_run_cfg_defaults(c);
  snprintf(c->layers, sizeof c->layers, "%s", j->cnn ? CNN : MLP);
  c->format = DT_FMT_CSV;
  path(c->train_images, sizeof c->train_images, j->cnn ? "train16.csv" : "train.csv");
  path(c->test_images, sizeof c->test_images, j->cnn ? "test16.csv" : "test.csv");
  c->train_labels[0] = c->test_labels[0] = '\0';
  c->label_col = 0;
  if (j->cnn) {
    c->shape[0] = 1;
    c->shape[1] = c->shape[2] = 4;
  }
  c->epochs = 2;
  c->batch = 23;
  c->optim.lr = j->lr;
  c->optim.momentum = 0.9f;
  c->workers = j->n;
  c->deterministic = j->deterministic;
  c->micro_batch = j->micro;
  c->bucket_bytes = j->bucket;
  c->reduce = j->reduce_sum ? DT_DIST_SUM : DT_DIST_AVG;
}

/* Child body: writes <tag>_<rank>.params (raw floats) and .out (sha256,
 * test accuracy and loss as hex floats) or .err; returns the exit status. */
static int child(const job *j, int rank, const char *tag) {
  char p[400], outd[400], sdir[400];
  snprintf(outd, sizeof outd, "%s/%s_run", tmpdir, tag);
  snprintf(sdir, sizeof sdir, "%s/%s_store", tmpdir, tag);
  if (j->overlap) setenv("DTRAIN_DDP_OVERLAP", j->overlap, 1);
  dt__param_reload(); /* the knob table caches the environment */
  if (j->hier_tuned) setenv("DTRAIN_HIER_MIN_BYTES", "0", 1);
  dt__param_reload(); /* the knob table caches the environment */
  dt_run_cfg c;
  make_cfg(&c, j);
  dt_engine *e = NULL;
  dt_store *s = NULL;
  dt_comm *comm = NULL;
  int rc = dt_engine_create(&e, &c);
  if (rc == DT_OK && j->n > 1) {
    struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
    char host[32];
    cc.transport = j->transport;
    cc.rank = rank;
    cc.size = j->n;
    cc.job = tag;
    cc.timeout_s = 20;
    cc.algo = j->algo;
    if (j->host_mod > 0) {
      snprintf(host, sizeof host, "h%d", rank / j->host_mod);
      cc.host_id = host;
    }
    rc = dt_store_open_file(&s, sdir);
    if (rc == DT_OK) rc = dt_comm_create(&comm, s, &cc);
    if (rc == DT_OK) rc = dt_engine_set_comm(e, comm);
  }
  dt_run_summary sum;
  if (rc == DT_OK) rc = dt_engine_run(e, outd, "cfg", NULL, &sum);
  if (rc == DT_OK) {
    const dt_model *m = dt_engine_model(e);
    size_t n = dt_model_nparams(m);
    snprintf(p, sizeof p, "%s/%s_%d.params", tmpdir, tag, rank);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(dt_model_params((dt_model *)m), sizeof(float), n, f) != n) rc = DT_EIO;
    if (f) fclose(f);
    snprintf(p, sizeof p, "%s/%s_%d.out", tmpdir, tag, rank);
    f = fopen(p, "w");
    if (!f || fprintf(f, "%s %a %a\n", sum.params_sha256, sum.test_accuracy, sum.test_loss) < 0)
      rc = DT_EIO;
    if (f) fclose(f);
  } else {
    snprintf(p, sizeof p, "%s/%s_%d.err", tmpdir, tag, rank);
    FILE *f = fopen(p, "w");
    if (f) {
      fprintf(f, "%s\n", dt_errmsg());
      fclose(f);
    }
  }
  dt_comm_destroy(comm);
  dt_store_destroy(s);
  dt_engine_destroy(e);
  return rc == DT_OK ? 0 : rc == DT_EMISMATCH ? 3 : rc == DT_ERANGE ? 4 : 1;
}

struct ranks_arg {
  const job *js;
  const char *tag;
};

static int ranks_child(void *arg, int r) {
  const struct ranks_arg *a = arg;
  return child(&a->js[r], r, a->tag);
}

/* One forked worker per rank (js[r] is rank r's job); status[r] as
 * fork_workers reports it. */
static void run_ranks(const job *js, int n, const char *tag, int *status) {
  struct ranks_arg a = {js, tag};
  fork_workers(n, ranks_child, &a, 60, tag, status);
}

static void read_err(const char *tag, int rank, char *buf, size_t cap) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_%d.err", tmpdir, tag, rank);
  buf[0] = '\0';
  FILE *f = fopen(p, "r");
  if (!f) return;
  size_t k = fread(buf, 1, cap - 1, f);
  buf[k] = '\0';
  fclose(f);
}

/* Runs j on j->n ranks; every rank must succeed and print the same line
 * (hash, accuracy, loss), which goes to out. */
static void run_ok(const job *j, const char *tag, char *out, size_t cap) {
  job js[8];
  for (int r = 0; r < j->n; r++) js[r] = *j;
  int st[8];
  run_ranks(js, j->n, tag, st);
  for (int r = 0; r < j->n; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
  }
  for (int r = 0; r < j->n; r++) {
    char p[400], line[256] = "";
    snprintf(p, sizeof p, "%s/%s_%d.out", tmpdir, tag, r);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    if (r == 0) snprintf(out, cap, "%s", line);
    else if (strcmp(line, out)) fail_msg("%s: rank %d: %s, rank 0: %s", tag, r, line, out);
  }
}

static char ref_mlp_[256], ref_cnn[256];

/* The 1-worker MLP line every other run is compared with (computed once,
 * so a single test can run on its own: ./test_ddp_det test_hier). */

static void expect_ref(const job *j, const char *tag, const char *ref) {
  char got[256];
  run_ok(j, tag, got, sizeof got);
  printf("# %-14s %d workers: %.16s... %s", tag, j->n, got, strchr(got, ' '));
  if (strcmp(got, ref)) fail_msg("%s (%d workers): %s differs from 1 worker's %s", tag, j->n, got, ref);
}

static const char *ref_mlp(void) {
  if (!ref_mlp_[0]) run_ok(&DEF, "ref", ref_mlp_, sizeof ref_mlp_);
  return ref_mlp_;
}

static void test_one_worker(void **state) {
  (void)state;
  char again[256];
  run_ok(&DEF, "ref2", again, sizeof again);
  assert_string_equal(again, ref_mlp());
  /* the same with DTRAIN_DDP_OVERLAP=0 and tiny buckets: nothing changes */
  job j = DEF;
  j.bucket = 256;
  j.overlap = "0";
  expect_ref(&j, "ref_nothread", ref_mlp());
}

static void test_shm(void **state) {
  (void)state;
  static const dt_algo algos[] = {DT_ALGO_RING, DT_ALGO_RHD, DT_ALGO_TREE};
  static const char *names[] = {"ring", "rhd", "tree"};
  for (int a = 0; a < 3; a++)
    for (int n = 2; n <= 4; n++) {
      job j = DEF;
      j.n = n;
      j.algo = algos[a];
      /* ring: one bucket (inline); rhd: per-layer buckets on the thread;
       * tree: per-layer buckets without the thread */
      if (a > 0) j.bucket = 256;
      if (a == 2) j.overlap = "0";
      char tag[32];
      snprintf(tag, sizeof tag, "shm_%s_%d", names[a], n);
      expect_ref(&j, tag, ref_mlp());
    }
}

static void test_tcp(void **state) {
  (void)state;
  static const dt_algo algos[] = {DT_ALGO_RING, DT_ALGO_RHD, DT_ALGO_TREE};
  static const char *names[] = {"ring", "rhd", "tree"};
  for (int a = 0; a < 3; a++)
    for (int n = 2; n <= 4; n++) {
      job j = DEF;
      j.n = n;
      j.transport = "tcp";
      j.algo = algos[a];
      if (a != 1) j.bucket = 256;
      char tag[32];
      snprintf(tag, sizeof tag, "tcp_%s_%d", names[a], n);
      expect_ref(&j, tag, ref_mlp());
    }
}

/* hier with two fake hosts: shm inside a host, tcp between (auto).
 * Chosen by tuning (DTRAIN_HIER_MIN_BYTES=0 in the child), not forced:
 * a forced DT_ALGO_HIER is inherited by the leaders' sub-communicator,
 * which again spans several hosts, and recurses until the stack runs out
 * (a comm-layer bug, reported; tuning.c should refuse HIER when every
 * host has one rank). */
static void test_hier(void **state) {
  (void)state;
  for (int n = 3; n <= 4; n++) {
    job j = DEF;
    j.n = n;
    j.transport = "auto";
    j.hier_tuned = 1;
    j.host_mod = 2;
    j.bucket = 256;
    char tag[32];
    snprintf(tag, sizeof tag, "hier_%d", n);
    expect_ref(&j, tag, ref_mlp());
  }
}

static void test_cnn(void **state) {
  (void)state;
  job j = DEF;
  j.cnn = 1;
  run_ok(&j, "cnn_ref", ref_cnn, sizeof ref_cnn);
  j.n = 3;
  j.bucket = 256;
  expect_ref(&j, "cnn_shm_3", ref_cnn);
  j.n = 2;
  j.transport = "tcp";
  j.algo = DT_ALGO_RING;
  expect_ref(&j, "cnn_tcp_2", ref_cnn);
}

static void test_reduce_sum(void **state) {
  (void)state;
  job j = DEF;
  j.reduce_sum = 1;
  j.lr = 0.01f;
  char ref[256];
  run_ok(&j, "sum_ref", ref, sizeof ref);
  assert_string_not_equal(ref, ref_mlp());
  j.n = 3;
  expect_ref(&j, "sum_3", ref);
}

static float *read_params(const char *tag, size_t *n) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_0.params", tmpdir, tag);
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

/* With one micro-shard per global batch, deterministic mode computes what
 * normal mode computes, only rounded to 2^-32 before the update. */
static void test_matches_normal_mode(void **state) {
  (void)state;
  char a[256], b[256];
  job j = DEF;
  j.micro = 64;
  run_ok(&j, "big_micro", a, sizeof a);
  j.deterministic = 0;
  run_ok(&j, "normal", b, sizeof b);
  size_t n, m;
  float *p = read_params("big_micro", &n), *q = read_params("normal", &m);
  assert_int_equal(n, m);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)p[i] - q[i];
    num += d * d;
    den += (double)q[i] * q[i];
  }
  printf("# micro_batch >= batch vs normal mode: relative difference %.3g\n", sqrt(num / den));
  assert_true(sqrt(num / den) < 1e-5);
  free(p);
  free(q);
}

static void test_overflow(void **state) {
  (void)state;
  for (int n = 1; n <= 2; n++) {
    job js[2];
    js[0] = DEF;
    js[0].n = n;
    js[0].lr = 1e12f;
    js[1] = js[0];
    char tag[32];
    snprintf(tag, sizeof tag, "overflow_%d", n);
    int st[2];
    run_ranks(js, n, tag, st);
    for (int r = 0; r < n; r++) {
      char msg[600];
      read_err(tag, r, msg, sizeof msg);
      if (st[r] != 4) fail_msg("%s: rank %d exit %d (want 4, DT_ERANGE): %s", tag, r, st[r], msg);
      if (!strstr(msg, "fixed-point range") || !strstr(msg, "step "))
        fail_msg("%s: rank %d: '%s' names neither the fixed-point range nor the step", tag, r, msg);
      if (r == 0) printf("# %s", msg);
    }
  }
}

static void test_mismatch(void **state) {
  (void)state;
  job js[2] = {DEF, DEF};
  js[0].n = js[1].n = 2;
  js[1].deterministic = 0;
  int st[2];
  run_ranks(js, 2, "mm_det", st);
  for (int r = 0; r < 2; r++) {
    char msg[600];
    read_err("mm_det", r, msg, sizeof msg);
    if (st[r] != 3 || !strstr(msg, "dist.deterministic") || !strstr(msg, "rank 1"))
      fail_msg("mm_det: rank %d exit %d: '%s'", r, st[r], msg);
  }
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_ddp_det_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[300];
  path(p, sizeof p, "train.csv");
  write_csv(p, 23 * 8 + 5, 6, 7); /* 9 steps per epoch; the last batch holds 5 */
  path(p, sizeof p, "test.csv");
  write_csv(p, 101, 6, 8);
  path(p, sizeof p, "train16.csv");
  write_csv(p, 23 * 4 + 5, 16, 9);
  path(p, sizeof p, "test16.csv");
  write_csv(p, 50, 16, 10);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]); /* e.g. test_hier, to debug one */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_worker),  cmocka_unit_test(test_shm),
      cmocka_unit_test(test_tcp),         cmocka_unit_test(test_hier),
      cmocka_unit_test(test_cnn),         cmocka_unit_test(test_reduce_sum),
      cmocka_unit_test(test_matches_normal_mode), cmocka_unit_test(test_overflow),
      cmocka_unit_test(test_mismatch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

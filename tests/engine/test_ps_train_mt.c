/*
 * test_ps_train_mt.c — training against parameter servers through the
 * engine ("ps" strategy, src/ps), with processes forked by the test and
 * joined through a file store:
 *   - equivalence: BSP with SGD + momentum, 2 workers and 1 or 2 separate
 *     servers, or 2 workers with colocated servers, and 3 workers with 2
 *     servers, end 50 steps with the parameters of 1 worker training alone
 *     to 1e-5 relative, every worker holding the same bytes;
 *   - determinism: the same BSP job twice gives the same bytes;
 *   - ssp (s = 2) and asp, separate or colocated (colocated asp: direct
 *     pushes, and with DTRAIN_PS_DIRECT=0 a server thread, and with lazy
 *     replies, DTRAIN_PS_LAZY=1; ssp: a server thread), finish
 *     with every worker holding the same parameters and learn the task as
 *     well as bsp (within 5 points);
 *   - AdamW on the servers matches 1-worker AdamW too;
 *   - sparse rows: matrix factorisation (embedding(1000,4) dot, model.loss =
 *     mse) over ratings, BSP with plain SGD, 2 workers and 1 or 2 servers
 *     or colocated, ends with 1 worker's parameters to 1e-5 while each
 *     worker's traffic per step stays under a sixth of the dense model's
 *     (only the batch's rows travel);
 *   - checkpoints: BSP with SGD momentum or AdamW over 1 separate server, 2
 *     separate servers or colocated ones, 1 epoch, then resumed for a
 *     second (every rank, servers too), ends with the bytes of 2 epochs
 *     straight; the checkpoint's manifest names each server's shard file
 *     as its own owner; colocated asp with AdamW (direct asp's shared
 *     table) checkpoints and resumes.
 * Every child is waited for with a deadline and SIGKILLed past it.
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
#include "ps/ps.h"

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
  c->optim.momentum = 0.9f;
  c->workers = workers;
}

/* Child body: returns the exit status; on failure the message goes to
 * <tmp>/<tag>_<rank>.err. */
/* Set: every rank (servers too) resumes from this checkpoint. */
static char resume_from[400];

static int child(const dt_run_cfg *c, int rank, const char *tag) {
  char outd[400], parp[400], sdir[400];
  snprintf(outd, sizeof outd, "%s/%s_run", tmpdir, tag);
  snprintf(sdir, sizeof sdir, "%s/%s_store", tmpdir, tag);
  dt_engine *e = NULL;
  dt_store *s = NULL;
  dt_comm *comm = NULL;
  dt_comm *wc = NULL;
  int server = 0;
  int rc = dt_engine_create(&e, c);
  if (rc == DT_OK && resume_from[0]) rc = dt_engine_resume(e, resume_from);
  int world = c->workers + c->ps.servers;
  if (rc == DT_OK && world > 1) {
    struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
    cc.transport = "auto";
    cc.rank = rank;
    cc.size = world;
    cc.job = tag;
    cc.timeout_s = 20;
    rc = dt_store_open_file(&s, sdir);
    if (rc == DT_OK) rc = dt_comm_create(&comm, s, &cc);
    if (rc == DT_OK && c->ps.servers > 0) {
      /* workers first, then servers (as the command line's job does) */
      rc = dt_comm_split(comm, rank < c->workers ? 0 : 1, rank, &wc);
      server = rank >= c->workers;
      if (rc == DT_OK && server) rc = dt__engine_serve(e, comm, rank - c->workers);
      else if (rc == DT_OK) rc = dt__engine_set_job_comm(e, comm);
      if (rc == DT_OK && !server) rc = dt_engine_set_comm(e, wc);
    } else if (rc == DT_OK) {
      rc = dt_engine_set_comm(e, comm);
    }
  }
  dt_run_summary sum;
  if (rc == DT_OK && !server) rc = dt_engine_run(e, outd, "cfg", NULL, &sum);
  if (server) {
    if (rc < 0) job_write_err(tag, rank);
    dt_comm_destroy(wc);
    dt_comm_destroy(comm);
    dt_store_destroy(s);
    dt_engine_destroy(e);
    return rc == DT_OK ? 0 : 1;
  }
  if (rc == DT_OK) {
    /* the traffic (bytes both ways) and the steps, for the sparse test */
    snprintf(parp, sizeof parp, "%s/%s_%d.bytes", tmpdir, tag, rank);
    FILE *fb = fopen(parp, "w");
    if (!fb || fprintf(fb, "%.17g %lld\n", sum.self.bytes_sent + sum.self.bytes_received,
                       (long long)sum.steps) < 0)
      rc = DT_EIO;
    if (fb) fclose(fb);
    if (rc == DT_OK) rc = job_write_results(e, &sum, tag, rank);
  } else {
    job_write_err(tag, rank);
  }
  dt_comm_destroy(wc);
  dt_comm_destroy(comm);
  dt_store_destroy(s);
  dt_engine_destroy(e);
  return rc == DT_OK ? 0 : rc == DT_EMISMATCH ? 3 : 1;
}


/* Runs a ps job of `workers` + `servers` processes (colocated when servers
 * is 0) with consistency cons; fails the test on any failed rank. Returns
 * rank 0's parameters (the caller frees) and checks every worker holds
 * the same bytes. */
/* ps.replicas of the next ps_job (1: none). */
static int g_replicas = 1;

static float *ps_job(const char *tag, int workers, int servers, int cons, int staleness,
                     int optim, size_t *n) {
  dt_run_cfg cfgs[8];
  int world = workers + servers;
  for (int r = 0; r < world; r++) {
    base_cfg(&cfgs[r], workers);
    cfgs[r].ps.replicas = g_replicas;
    cfgs[r].ps.servers = servers;
    cfgs[r].ps.colocate = servers == 0;
    cfgs[r].ps.consistency = cons;
    cfgs[r].ps.staleness = staleness;
    cfgs[r].optim.kind = optim;
    if (optim == DT_OPT_ADAMW) cfgs[r].optim.lr = 0.005f;
  }
  int st[8];
  run_job(cfgs, world, tag, st);
  int bad = -1;
  for (int r = 0; r < world; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 0) printf("# %s: rank %d exit %d: %s\n", tag, r, st[r], msg), bad = r;
  }
  if (bad >= 0) fail_msg("%s: rank %d failed", tag, bad);
  float *p0 = read_params(tag, 0, n);
  for (int r = 1; r < workers; r++) {
    size_t m;
    float *pr = read_params(tag, r, &m);
    assert_int_equal(m, *n);
    assert_memory_equal(pr, p0, m * sizeof(float));
    free(pr);
    assert_true(read_acc(tag, r) == read_acc(tag, 0));
  }
  return p0;
}

static float *reference(const char *tag, int optim, size_t *n) {
  dt_run_cfg one;
  base_cfg(&one, 1);
  one.optim.kind = optim;
  if (optim == DT_OPT_ADAMW) one.optim.lr = 0.005f;
  int st[1];
  run_job(&one, 1, tag, st);
  assert_int_equal(st[0], 0);
  return read_params(tag, 0, n);
}

static void test_bsp_equivalence(void **state) {
  (void)state;
  size_t n0, n;
  float *ref = reference("ref", DT_OPT_SGD, &n0);
  static const struct { int w, s; } runs[] = {{2, 1}, {2, 2}, {2, 0}, {3, 2}};
  for (int k = 0; k < 4; k++) {
    char tag[16];
    snprintf(tag, sizeof tag, "bsp%d", k);
    float *p = ps_job(tag, runs[k].w, runs[k].s, 0, 0, DT_OPT_SGD, &n);
    assert_int_equal(n, n0);
    double rel = rel_diff(p, ref, n);
    printf("# bsp, %d workers, %d %s servers vs 1 worker: relative difference %.3g\n", runs[k].w,
           runs[k].s ? runs[k].s : runs[k].w, runs[k].s ? "separate" : "colocated", rel);
    assert_true(rel < 1e-5);
    free(p);
  }
  free(ref);
}

static void test_bsp_deterministic(void **state) {
  (void)state;
  size_t n1, n2;
  float *a = ps_job("det1", 2, 2, 0, 0, DT_OPT_SGD, &n1);
  float *b = ps_job("det2", 2, 2, 0, 0, DT_OPT_SGD, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(a, b, n1 * sizeof(float));
  free(a);
  free(b);
}

static void test_adamw(void **state) {
  (void)state;
  size_t n0, n;
  float *ref = reference("refa", DT_OPT_ADAMW, &n0);
  float *p = ps_job("adamw", 2, 1, 0, 0, DT_OPT_ADAMW, &n);
  double rel = rel_diff(p, ref, n);
  printf("# bsp adamw, 2 workers, 1 server vs 1 worker: relative difference %.3g\n", rel);
  assert_true(rel < 1e-5);
  free(p);
  free(ref);
}

/* Colocated asp with knob = value: its accuracy. */
static double colocated_asp_with(const char *tag, const char *knob, const char *value) {
  size_t n;
  setenv(knob, value, 1);
  dt__param_reload();
  free(ps_job(tag, 2, 0, 2, 0, DT_OPT_SGD, &n));
  unsetenv(knob);
  dt__param_reload();
  return read_acc(tag, 0);
}

static void test_ssp_asp(void **state) {
  (void)state;
  size_t n;
  float *p = ps_job("ssp", 2, 1, 1, 2, DT_OPT_SGD, &n);
  double a = read_acc("ssp", 0);
  free(p);
  p = ps_job("asp", 2, 2, 2, 0, DT_OPT_SGD, &n);
  double b = read_acc("asp", 0);
  free(p);
  p = ps_job("aspc", 2, 0, 2, 0, DT_OPT_SGD, &n);
  double c = read_acc("aspc", 0);
  free(p);
  /* the same with lazy replies (taken at the next step's begin), and with
   * the pushes handed to the server thread instead of applied directly */
  double cl = colocated_asp_with("aspl", "DTRAIN_PS_LAZY", "1");
  double ct = colocated_asp_with("aspt", "DTRAIN_PS_DIRECT", "0");
  /* colocated ssp runs its servers on threads of their own */
  p = ps_job("sspc", 2, 0, 1, 2, DT_OPT_SGD, &n);
  double sc = read_acc("sspc", 0);
  free(p);
  p = ps_job("bspacc", 2, 1, 0, 0, DT_OPT_SGD, &n);
  double ref = read_acc("bspacc", 0);
  free(p);
  printf("# accuracy: bsp %.3f, ssp(2) %.3f, asp %.3f, asp colocated %.3f (lazy %.3f, server "
         "thread %.3f), ssp(2) colocated %.3f\n", ref, a, b, c, cl, ct, sc);
  /* three classes (chance 1/3): within a few points of bsp after one epoch */
  assert_true(ref > 0.6);
  assert_true(a > ref - 0.05 && b > ref - 0.05 && c > ref - 0.05 && cl > ref - 0.05 &&
              ct > ref - 0.05 && sc > ref - 0.05);
}

/* Ratings: label = a star 1..5, then a user id (0..599) and an item id
 * (600..999) of one table of 1000 rows. */
static void write_ratings(const char *file, int n, uint64_t seed) {
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  for (int i = 0; i < n; i++) {
    float r[2];
    dt_rng_uniform(r, 2, 0.0f, 1.0f, seed, DT_RNG_USER, (uint64_t)i);
    int u = (int)(r[0] * 600) % 600, it = 600 + (int)(r[1] * 400) % 400;
    fprintf(f, "%d,%d,%d\n", 1 + (u * 7 + it * 3) % 5, u, it);
  }
  fclose(f);
}

static void mf_cfg(dt_run_cfg *c, int workers, int servers) {
  base_cfg(c, workers);
  snprintf(c->layers, sizeof c->layers, "embedding(1000,4,std=0.3) dot");
  c->loss = 1; /* mse */
  c->normalize = 0;
  path(c->train_images, sizeof c->train_images, "rtrain.csv");
  path(c->test_images, sizeof c->test_images, "rtest.csv");
  c->optim.lr = 0.5f;
  c->optim.momentum = 0.0f;
  c->optim.weight_decay = 0.0f;
  c->ps.servers = servers;
  c->ps.colocate = workers > 1 && servers == 0;
}

static void test_sparse_rows(void **state) {
  (void)state;
  dt_run_cfg one;
  mf_cfg(&one, 1, 0);
  int st[8];
  run_job(&one, 1, "mfref", st);
  assert_int_equal(st[0], 0);
  size_t n0, n;
  float *ref = read_params("mfref", 0, &n0);
  assert_int_equal(n0, 4001);
  static const int servers[] = {1, 2, 0};
  for (int k = 0; k < 3; k++) {
    char tag[16];
    snprintf(tag, sizeof tag, "mf%d", k);
    dt_run_cfg cfgs[4];
    int world = 2 + servers[k];
    for (int r = 0; r < world; r++) mf_cfg(&cfgs[r], 2, servers[k]);
    run_job(cfgs, world, tag, st);
    for (int r = 0; r < world; r++) {
      char msg[600];
      read_err(tag, r, msg, sizeof msg);
      if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
    }
    float *p = read_params(tag, 0, &n);
    assert_int_equal(n, n0);
    double rel = rel_diff(p, ref, n);
    /* traffic per step: a dense push and pull would be 2 x 4001 floats */
    char bp[400];
    snprintf(bp, sizeof bp, "%s/%s_0.bytes", tmpdir, tag);
    FILE *f = fopen(bp, "r");
    double bytes = 0;
    long long steps = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lf %lld", &bytes, &steps), 2);
    fclose(f);
    assert_true(steps > 0);
    double dense = 2.0 * 4001 * sizeof(float);
    printf("# sparse rows, %d %s servers: relative difference %.3g, %.0f bytes/step "
           "(dense %.0f)\n", servers[k] ? servers[k] : 2, servers[k] ? "separate" : "colocated",
           rel, bytes / (double)steps, dense);
    assert_true(rel < 1e-5);
    assert_true(bytes / (double)steps < dense / 6);
    free(p);
  }
  free(ref);
}

/* Replicas take every push and change nothing: bsp with ps.replicas = 2
 * over 2 servers ends with the bytes of the run without replicas (SGD
 * momentum and AdamW), and so do sparse rows (matrix factorisation).
 * tests/ps/test_ps_failover.sh kills a server. */
static void test_replicas(void **state) {
  (void)state;
  resume_from[0] = '\0';
  static const int optims[] = {DT_OPT_SGD, DT_OPT_ADAMW};
  for (int o = 0; o < 2; o++) {
    size_t n0, n;
    g_replicas = 1;
    float *ref = ps_job(o ? "rep1a" : "rep1", 2, 2, 0, 0, optims[o], &n0);
    for (int R = 2; R <= 2; R++) {
      char tag[16];
      snprintf(tag, sizeof tag, "rep%d_%d", R, o);
      g_replicas = R;
      float *p = ps_job(tag, 2, 2, 0, 0, optims[o], &n);
      g_replicas = 1;
      assert_int_equal(n, n0);
      assert_memory_equal(p, ref, n * sizeof(float));
      free(p);
    }
    free(ref);
  }
  dt_run_cfg cfgs[4];
  int st[4];
  size_t n1, n2;
  for (int k = 0; k < 2; k++) {
    for (int r = 0; r < 4; r++) {
      mf_cfg(&cfgs[r], 2, 2);
      cfgs[r].ps.replicas = 1 + k;
    }
    run_job(cfgs, 4, k ? "mfrep2" : "mfrep1", st);
    for (int r = 0; r < 4; r++) {
      char msg[600];
      read_err(k ? "mfrep2" : "mfrep1", r, msg, sizeof msg);
      if (st[r] != 0) fail_msg("mfrep%d: rank %d exit %d: %s", 1 + k, r, st[r], msg);
    }
  }
  float *a = read_params("mfrep1", 0, &n1), *b = read_params("mfrep2", 0, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(a, b, n1 * sizeof(float));
  free(a);
  free(b);
}

static void test_checkpoint_resume(void **state) {
  (void)state;
  /* the last: colocated asp (direct asp's shared table: records read out
   * of it and restored into it; asp is not deterministic, so the resumed
   * run is checked to finish, not for its bytes) */
  static const struct { int servers, optim, consistency; } runs[] = {
      {1, DT_OPT_SGD, DT_PS_BSP}, {2, DT_OPT_ADAMW, DT_PS_BSP}, {0, DT_OPT_SGD, DT_PS_BSP},
      {0, DT_OPT_ADAMW, DT_PS_ASP}};
  for (int k = 0; k < 4; k++) {
    const int asp = runs[k].consistency == DT_PS_ASP;
    char t2[16], t1[16], tr[16];
    snprintf(t2, sizeof t2, "ck%d_2", k);
    snprintf(t1, sizeof t1, "ck%d_1", k);
    snprintf(tr, sizeof tr, "ck%d_r", k);
    dt_run_cfg cfgs[4];
    int world = 2 + runs[k].servers, st[4];
    size_t n2, nr;
    for (int pass = asp; pass < 3; pass++) {
      const char *tag = pass == 0 ? t2 : pass == 1 ? t1 : tr;
      for (int r = 0; r < world; r++) {
        base_cfg(&cfgs[r], 2);
        cfgs[r].ps.servers = runs[k].servers;
        cfgs[r].ps.colocate = runs[k].servers == 0;
        cfgs[r].optim.kind = runs[k].optim;
        cfgs[r].ps.consistency = runs[k].consistency;
        if (runs[k].optim == DT_OPT_ADAMW) cfgs[r].optim.lr = 0.005f;
        cfgs[r].sched.kind = DT_SCHED_CONSTANT;
        cfgs[r].epochs = pass == 1 ? 1 : 2;
      }
      resume_from[0] = '\0';
      if (pass == 2) snprintf(resume_from, sizeof resume_from, "%s/%s_run/ckpt", tmpdir, t1);
      run_job(cfgs, world, tag, st);
      resume_from[0] = '\0';
      for (int r = 0; r < world; r++) {
        char msg[600];
        read_err(tag, r, msg, sizeof msg);
        if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
      }
    }
    if (!asp) {
      float *a = read_params(t2, 0, &n2), *b = read_params(tr, 0, &nr);
      assert_int_equal(n2, nr);
      assert_memory_equal(a, b, n2 * sizeof(float));
      free(a);
      free(b);
    }
    /* the shard files, each its own owner */
    char mp[500];
    snprintf(mp, sizeof mp, "%s/%s_run/ckpt/step-00000050/manifest.json", tmpdir, t1);
    FILE *f = fopen(mp, "r");
    assert_non_null(f);
    char text[8192];
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    int shards = runs[k].servers ? runs[k].servers : 2;
    for (int sv = 0; sv < shards; sv++) {
      char owner[64];
      snprintf(owner, sizeof owner, "\"ps-shard-%d\"", sv);
      assert_non_null(strstr(text, owner));
    }
    printf("# checkpoint at step 50 and resume: %d %s servers, %s%s\n", shards,
           runs[k].servers ? "separate" : "colocated",
           runs[k].optim == DT_OPT_ADAMW ? "adamw" : "sgd momentum",
           asp ? ", asp: resumed" : ": same bytes as 2 epochs straight");
  }
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_ps_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[300];
  path(p, sizeof p, "train.csv");
  write_csv(p, 32 * 50, 7); /* 50 steps of batch 32 */
  path(p, sizeof p, "test.csv");
  write_csv(p, 301, 8);
  path(p, sizeof p, "rtrain.csv");
  write_ratings(p, 16 * 50, 9);
  path(p, sizeof p, "rtest.csv");
  write_ratings(p, 200, 10);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bsp_equivalence),
      cmocka_unit_test(test_bsp_deterministic),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_ssp_asp),
      cmocka_unit_test(test_sparse_rows),
      cmocka_unit_test(test_checkpoint_resume),
      cmocka_unit_test(test_replicas),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

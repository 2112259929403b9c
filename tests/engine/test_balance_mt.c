/*
 * test_balance_mt.c — stragglers (balance.h, docs/ddp.md "Stragglers"):
 *   - dt__split_range: ranges tile the batch, every share >= 1 with weights,
 *     shares follow the weights, bad weights fall back to the equal cut;
 *   - dt__balance_margin: no spread, no margin; the margin grows with the
 *     spread (1 - 0.41 v for rank 1 of 2 at half a core: 0.85 at v = 0.37,
 *     0.98 at v = 0.05), more under a smaller quota and with more ranks,
 *     never below 0.5;
 *   - dt__balance_margin_step: the margin under a quota rises while the
 *     cgroup is not throttled, falls when it is, settles at ~1% throttled,
 *     stays in its bounds;
 *   - dt__balance_slice_cut: a rank under a quota sums no slice of the
 *     reduction while some rank has none;
 *   - dist.balance = dynamic vs static with 2 forked workers, rank 1 slowed
 *     by the test knob (DTRAIN_TEST_SLOW_US per sample): after 51 steps the
 *     parameters agree to 1e-5 relative (the gradient is the global-batch
 *     mean whatever the cut), both ranks hold the same bytes, and the
 *     records show the cut moved (rank 1's share below one half) and name
 *     rank 1 as the straggler in events.jsonl and summary.json; the same
 *     again with the shared update (DTRAIN_SHUPD=2);
 *   - the shared update (parallel/shupd.h: each rank steps its slice of
 *     the parameters inside the reduction, DTRAIN_SHUPD=2 pulling the
 *     others' slices into its copy, =1 one copy for all, the default
 *     with AdamW =2): 3 workers with AdamW, dynamic that never re-plans (the equal cut) against static:
 *     bitwise equal on every rank in both modes (the sums and the
 *     element-wise update have the same bits whoever makes them), and
 *     no rank wrote sums into another's window;
 *   - the same in deterministic mode: dynamic cuts whole micro-shards, so
 *     the parameters are bitwise those of the static run;
 *   - dist.balance = steal (shared micro-shard queue): 2 workers with rank 1
 *     slowed, 3 with rank 0 slowed, 2 unslowed: every rank ends with the
 *     bits of the 1-worker run, and a slowed rank takes well under its
 *     equal share; with 2, the fast rank ran backup copies of micro-shards
 *     the slowed rank held, some counted, and the slowed rank dropped
 *     exactly those (summary.json's backups_won and dropped).
 * The slow rank sleeps 3 ms per sample (1 ms with stealing), hundreds of
 * times the tiny MLP's own compute, so the straggler is unmistakable even
 * on a loaded machine; sanitizer builds 20 ms (5 ms), see SLOW_US.
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
#include "engine/balance.h"
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
  c->balance_every = 2;
}

static int child(const dt_run_cfg *c, int rank, const char *tag) {
  return job_worker(c, rank, tag, NULL, 20);
}


static void test_split_range(void **state) {
  (void)state;
  const double w[3] = {1.0, 2.0, 5.0};
  for (int64_t g = 0; g < 70; g++) {
    int64_t prev = 0;
    for (int r = 0; r < 3; r++) {
      int64_t lo, hi;
      dt__split_range(w, 3, g, r, &lo, &hi);
      assert_int_equal(lo, prev); /* contiguous, in rank order */
      assert_true(hi >= lo);
      if (g >= 3) assert_true(hi - lo >= 1);
      prev = hi;
    }
    assert_int_equal(prev, g); /* tiles the whole batch */
  }
  int64_t lo, hi;
  dt__split_range(w, 3, 64, 2, &lo, &hi); /* 1 + 61 x 5/8 = 39.1 */
  assert_true(hi - lo >= 38 && hi - lo <= 40);
  dt__split_range(w, 3, 64, 0, &lo, &hi);
  assert_true(hi - lo >= 8 && hi - lo <= 9);
  /* equal cut without weights, or with a bad one */
  const double bad[2] = {1.0, NAN}, zero[2] = {1.0, 0.0};
  dt__split_range(NULL, 2, 7, 0, &lo, &hi);
  assert_int_equal(lo, 0);
  assert_int_equal(hi, 3);
  dt__split_range(bad, 2, 7, 1, &lo, &hi);
  assert_int_equal(lo, 3);
  assert_int_equal(hi, 7);
  dt__split_range(zero, 2, 8, 1, &lo, &hi);
  assert_int_equal(hi - lo, 4);
  /* fewer samples than ranks: the equal cut, some ranks empty */
  dt__split_range(w, 3, 2, 0, &lo, &hi);
  assert_int_equal(hi - lo, 0);
}

static char *slurp(const char *file) {
  FILE *f = fopen(file, "r");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  buf[k] = '\0';
  fclose(f);
  return buf;
}

/* Number `name` of rank r in summary.json's per_worker, or of the summary
 * itself with r < 0 (-1 if missing). */
static double summary_num(const char *tag, int r, const char *name) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s_run/summary.json", tmpdir, tag);
  char *s = slurp(p);
  assert_non_null(s);
  char key[64];
  char *w = s;
  if (r >= 0) {
    snprintf(key, sizeof key, "\"rank\":\t%d", r);
    w = strstr(s, key);
  } else {
    w = strstr(s, "\"stragglers\"");
  }
  if (!w) return -1;
  /* a per_worker entry is a flat object: look no further than its end */
  char *end = r >= 0 ? strchr(w, '}') : NULL;
  if (end) *end = '\0';
  snprintf(key, sizeof key, "\"%s\":", name);
  char *sh = strstr(w, key);
  return sh ? atof(sh + strlen(key)) : -1;
}

/* The slowed rank's sleep per sample must dwarf the other rank's own time
 * per sample, which is wall time (preemptions count). Sanitizer builds are
 * unoptimised and instrumented: in the ASan build at load 30 the unslowed
 * rank spent 8.7 ms per sample in deterministic mode and the static run no
 * longer flagged rank 1 behind its 3 ms (its ms_per_sample 8.90 vs 8.70),
 * and stealing's slowed rank took 0.341 of the micro-shards behind 1 ms
 * (bound 0.4). They sleep 20 ms and 5 ms, and wait longer for a job (rank
 * 1's 800 samples of a static run sleep 16 s). */
#include "../dt_sanitizer.h"
#ifdef UNDER_SANITIZER
#define SLOW_US "20000"
#define STEAL_SLOW_US "5000"
#else
#define SLOW_US "3000"
#define STEAL_SLOW_US "1000"
#endif

static double summary_share(const char *tag, int r) { return summary_num(tag, r, "share"); }

static void run_pair(const char *tag, int deterministic, int balance, int *st) {
  dt_run_cfg cfgs[2];
  for (int r = 0; r < 2; r++) {
    base_cfg(&cfgs[r], 2);
    cfgs[r].deterministic = deterministic;
    cfgs[r].micro_batch = 4;
    cfgs[r].balance = balance;
  }
  run_job(cfgs, 2, tag, st);
  for (int r = 0; r < 2; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
  }
}

static void check_balance(int deterministic, int shupd) {
  setenv("DTRAIN_TEST_SLOW_RANK", "1", 1);
  /* 3 ms: at load 20 on 2 cores the unslowed rank's busy time reached
   * 1.5 ms per sample, and the static run flagged it instead of rank 1 */
  setenv("DTRAIN_TEST_SLOW_US", SLOW_US, 1);
  dt__param_reload(); /* the knob table caches the environment; children inherit it */
  int st[2];
  const char *ts = deterministic ? "det_static" : shupd ? "shupd_static" : "static";
  const char *td = deterministic ? "det_dynamic" : shupd ? "shupd_dynamic" : "dynamic";
  run_pair(ts, deterministic, DT_BALANCE_STATIC, st);
  run_pair(td, deterministic, DT_BALANCE_DYNAMIC, st);
  unsetenv("DTRAIN_TEST_SLOW_RANK");
  unsetenv("DTRAIN_TEST_SLOW_US");
  dt__param_reload();
  size_t n, m;
  float *a = read_params(ts, 0, &n);
  float *b = read_params(td, 0, &m);
  assert_int_equal(n, m);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)a[i] * a[i];
  }
  double rel = sqrt(num / den);
  printf("# %s%s: dynamic vs static after 51 steps: relative difference %.3g; rank 1's share "
         "%.3f (static %.3f)\n", deterministic ? "deterministic" : "normal",
         shupd ? ", shared update" : "", rel,
         summary_share(td, 1), summary_share(ts, 1));
  if (deterministic) assert_memory_equal(a, b, n * sizeof(float));
  else assert_true(rel < 1e-5);
  float *b1 = read_params(td, 1, &m);
  assert_memory_equal(b, b1, n * sizeof(float));
  free(a);
  free(b);
  free(b1);
  /* the cut followed speed; the records name the straggler */
  assert_true(fabs(summary_share(ts, 1) - 0.5) < 0.02);
  assert_true(summary_share(td, 1) > 0 && summary_share(td, 1) < 0.4);
  const char *tags[2] = {ts, td};
  for (int k = 0; k < 2; k++) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s_run/events.jsonl", tmpdir, tags[k]);
    char *ev = slurp(p);
    assert_non_null(ev);
    if (!strstr(ev, "\"stragglers\":[1]")) fail_msg("%s: events.jsonl: %s", tags[k], ev);
    snprintf(p, sizeof p, "%s/%s_run/summary.json", tmpdir, tags[k]);
    char *sm = slurp(p);
    assert_non_null(strstr(sm, "\"straggler\":\ttrue"));
    assert_non_null(strstr(sm, deterministic || k == 0 ? "\"balance\":" : "\"dynamic\""));
  }
}

/* dist.balance = steal: the shared micro-shard queue gives the bits of one
 * worker whoever takes which micro-shard, and the slowed rank takes fewer. */
static void test_steal(void **state) {
  (void)state;
  int st[3];
  dt_run_cfg one;
  base_cfg(&one, 1);
  one.deterministic = 1;
  one.micro_batch = 4;
  run_job(&one, 1, "steal_ref", st);
  assert_int_equal(st[0], 0);
  size_t n0;
  float *ref = read_params("steal_ref", 0, &n0);
  static const struct { int n; const char *slow; } runs[] = {{2, "1"}, {3, "0"}, {2, NULL}};
  for (int k = 0; k < 3; k++) {
    int N = runs[k].n;
    if (runs[k].slow) {
      setenv("DTRAIN_TEST_SLOW_RANK", runs[k].slow, 1);
      setenv("DTRAIN_TEST_SLOW_US", STEAL_SLOW_US, 1);
    }
    dt__param_reload();
    dt_run_cfg cfgs[3];
    for (int r = 0; r < N; r++) {
      base_cfg(&cfgs[r], N);
      cfgs[r].deterministic = 1;
      cfgs[r].micro_batch = 4;
      cfgs[r].balance = DT_BALANCE_STEAL;
    }
    char tag[16];
    snprintf(tag, sizeof tag, "steal%d", k);
    run_job(cfgs, N, tag, st);
    unsetenv("DTRAIN_TEST_SLOW_RANK");
    unsetenv("DTRAIN_TEST_SLOW_US");
    dt__param_reload();
    for (int r = 0; r < N; r++) {
      char msg[600];
      read_err(tag, r, msg, sizeof msg);
      if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
      size_t n;
      float *p = read_params(tag, r, &n);
      assert_int_equal(n, n0);
      assert_memory_equal(p, ref, n * sizeof(float));
      free(p);
    }
    if (runs[k].slow) {
      int slow = atoi(runs[k].slow);
      double share = summary_share(tag, slow);
      printf("# steal, %d workers, rank %d slowed: its share %.3f, bits of 1 worker\n", N, slow,
             share);
      assert_true(share >= 0 && share < 0.8 / N);
      /* the queue ran dry while the slowed rank (4 ms per micro-shard)
       * still held one: the others ran backup copies, some of them
       * finished first and the slowed rank dropped exactly those — and
       * the bits above are still one worker's */
      double won = summary_num(tag, -1, "backups_won"), dropped = 0, wonr = 0;
      for (int r = 0; r < N; r++) {
        double x = summary_num(tag, r, "dropped"), y = summary_num(tag, r, "backups_won");
        dropped += x > 0 ? x : 0;
        wonr += y > 0 ? y : 0;
      }
      printf("# steal, %d workers: %.0f backup copies ran, %.0f counted, %.0f micro-shards "
             "dropped\n", N, summary_num(tag, -1, "backups"), won, dropped);
      /* with 3, the two others usually take every micro-shard before the
       * slowed rank holds one: no backup is needed there */
      if (N == 2) assert_true(won >= 1);
      assert_true(won == wonr && won == dropped);
    }
  }
  free(ref);
}

static void run_three(const char *tag, int balance) {
  dt_run_cfg cfgs[3];
  for (int r = 0; r < 3; r++) {
    base_cfg(&cfgs[r], 3);
    cfgs[r].optim.kind = DT_OPT_ADAMW;
    cfgs[r].optim.lr = 0.01f;
    cfgs[r].optim.weight_decay = 0.01f;
    cfgs[r].balance = balance;
    cfgs[r].balance_every = 1000000; /* no re-plan: the equal cut */
  }
  int st[3];
  run_job(cfgs, 3, tag, st);
  for (int r = 0; r < 3; r++) {
    char msg[600];
    read_err(tag, r, msg, sizeof msg);
    if (st[r] != 0) fail_msg("%s: rank %d exit %d: %s", tag, r, st[r], msg);
  }
}

static void test_shared_update(void **state) {
  (void)state;
  run_three("su_static", DT_BALANCE_STATIC);
  size_t n, m;
  float *a = read_params("su_static", 0, &n);
  /* NULL: the default, which with AdamW is the pull mode */
  const char *modes[3] = {"2", "1", NULL}, *tags[3] = {"su_pull", "su_one", "su_auto"};
  for (int k = 0; k < 3; k++) {
    if (modes[k]) setenv("DTRAIN_SHUPD", modes[k], 1);
    dt__param_reload(); /* children inherit it */
    run_three(tags[k], DT_BALANCE_DYNAMIC);
    unsetenv("DTRAIN_SHUPD");
    dt__param_reload();
    for (int r = 0; r < 3; r++) {
      float *b = read_params(tags[k], r, &m);
      assert_int_equal(n, m);
      assert_memory_equal(a, b, n * sizeof(float));
      free(b);
      /* and it was the shared update: the sums stayed in each rank's own
       * window, so the ranks wrote (almost) nothing into each other's */
      double ws = summary_num("su_static", r, "bytes_sent");
      double wd = summary_num(tags[k], r, "bytes_sent");
      printf("# shared update, DTRAIN_SHUPD=%s: rank %d sent %.0f bytes (static %.0f)\n",
             modes[k] ? modes[k] : "auto", r, wd, ws);
      assert_true(ws > 0 && wd >= 0 && wd < ws / 4);
    }
  }
  free(a);
}

static void test_dynamic_normal(void **state) {
  (void)state;
  check_balance(0, 0);
  /* again with the shared update, whose slices move with every re-plan */
  setenv("DTRAIN_SHUPD", "2", 1);
  check_balance(0, 1);
  unsetenv("DTRAIN_SHUPD");
  dt__param_reload();
}

static void test_dynamic_det(void **state) {
  (void)state;
  check_balance(1, 0);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_balance_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
#ifdef UNDER_SANITIZER
  job_deadline_s = 120;
#endif
  char p[300];
  path(p, sizeof p, "train.csv");
  write_csv(p, 32 * 50 + 1, 7); /* 51 steps; the last global batch holds 1 sample */
  path(p, sizeof p, "test.csv");
  write_csv(p, 301, 8);
  return 0;
}

static void test_margin(void **state) {
  (void)state;
  assert_true(dt__balance_margin(0, 0.5, 2) == 1.0);
  assert_true(dt__balance_margin(0.3, 0.5, 1) == 1.0);
  double mlp = dt__balance_margin(0.37, 0.5, 2), cnn = dt__balance_margin(0.05, 0.5, 2);
  assert_true(mlp > 0.83 && mlp < 0.87);
  assert_true(cnn > 0.975 && cnn < 0.985);
  /* a smaller quota or more ranks: overshooting costs more, a larger margin */
  assert_true(dt__balance_margin(0.37, 0.1, 2) < mlp);
  assert_true(dt__balance_margin(0.37, 0.5, 4) < mlp);
  assert_true(dt__balance_margin(5.0, 0.5, 2) == 0.5);
}

/* The reduction's cut with DTRAIN_DYNAMIC_QUOTA_SLICE: a rank under a
 * quota below one core gets weight 0 while some rank has none; the others
 * keep theirs; nothing changes when every rank or no rank is bound. */
static void test_slice_cut(void **state) {
  (void)state;
  const double w[3] = {3.0, 1.0, 2.0};
  double out[3] = {-1, -1, -1};
  const double q1[3] = {0, 0.5, 0};
  assert_int_equal(dt__balance_slice_cut(w, q1, 1, 3, out), 1);
  assert_true(out[0] == 3.0 && out[1] == 0.0 && out[2] == 2.0);
  const double q2[6] = {1.0, 9, 0.25, 9, 2.0, 9}; /* stride 2; a quota of >= 1 core binds nothing */
  assert_int_equal(dt__balance_slice_cut(w, q2, 2, 3, out), 1);
  assert_true(out[0] == 3.0 && out[1] == 0.0 && out[2] == 2.0);
  double keep[3] = {-1, -1, -1};
  const double none[3] = {0, 0, 0}, all[3] = {0.5, 0.3, 0.9};
  assert_int_equal(dt__balance_slice_cut(w, none, 1, 3, keep), 0);
  assert_int_equal(dt__balance_slice_cut(w, all, 1, 3, keep), 0);
  assert_true(keep[0] == -1 && keep[1] == -1 && keep[2] == -1);
}

/* The margin from the kernel's throttling: rises with wall time while the
 * rank is not throttled, falls when it is, settles where it is throttled
 * ~1% of the time, stays in [lo, hi], and is lo when hi <= lo. */
static void test_margin_step(void **state) {
  (void)state;
  double m = 0.8;
  for (int i = 0; i < 20; i++) m = dt__balance_margin_step(m, 0.1, 0, 0.8, 0.95);
  assert_true(fabs(m - 0.9) < 1e-9); /* 2 s unthrottled: +0.1 */
  for (int i = 0; i < 100; i++) m = dt__balance_margin_step(m, 0.1, 0, 0.8, 0.95);
  assert_true(m == 0.95);
  m = dt__balance_margin_step(m, 0.1, 0.02, 0.8, 0.95); /* a 20 ms stall */
  assert_true(fabs(m - (0.95 + 0.005 - 0.1)) < 1e-9);
  for (int i = 0; i < 10; i++) m = dt__balance_margin_step(m, 0.1, 0.05, 0.8, 0.95);
  assert_true(m == 0.8);
  /* throttled 1% of the time: no drift; 2%: down; 0.5%: up */
  double a = dt__balance_margin_step(0.9, 1.0, 0.01, 0.8, 0.95);
  assert_true(fabs(a - 0.9) < 1e-9);
  assert_true(dt__balance_margin_step(0.9, 1.0, 0.02, 0.8, 0.95) < 0.9);
  assert_true(dt__balance_margin_step(0.9, 1.0, 0.005, 0.8, 0.95) > 0.9);
  /* hi <= lo: fixed */
  assert_true(dt__balance_margin_step(0.9, 10.0, 0, 0.8, 0.8) == 0.8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_range),
      cmocka_unit_test(test_margin),
      cmocka_unit_test(test_margin_step),
      cmocka_unit_test(test_slice_cut),
      cmocka_unit_test(test_dynamic_normal),
      cmocka_unit_test(test_shared_update),
      cmocka_unit_test(test_dynamic_det),
      cmocka_unit_test(test_steal),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

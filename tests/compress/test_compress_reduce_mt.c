/*
 * test_compress_reduce_mt.c — the compressed reduction (dt_compress_reduce)
 * of every codec over the inproc and tcp transports with 1..5 ranks as
 * threads (shm, with processes, in test_compress_shm.c):
 *  - every rank ends each step with the same bits;
 *  - error feedback's bookkeeping holds: the sum over steps of what was
 *    reduced plus every rank's final residual equals the sum of every
 *    rank's scaled gradients (to rounding; fp16/bf16 also round inside the
 *    collective's sums, so their bound is looser);
 *  - a second run with the same seed gives the same bits (the randomness is
 *    counter-based);
 *  - one step of topk sends exactly k values per rank; the deterministic
 *    dense path (codec none) is exact.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../comm/comm_test_util.h"
#include "comm/compress/compress.h"
#include "core/core.h"

enum { NP = 2600, STEPS = 5, MAXR = 5 };
static const dt_cz_matrix MATS[] = {{0, 40, 50}, {2100, 10, 20}};
static const size_t BUCKETS[][2] = {{0, 2100}, {2100, 500}};

typedef struct job {
  dt_compress_cfg cfg;
  float *sum[MAXR];   /* per rank: sum over steps of the reduced gradient */
  float *resid[MAXR]; /* per rank: final residual */
} job;

static void grad(float *g, int rank, int step) {
  dt_rng_uniform(g, NP, -1.0f, 1.0f, 1234, DT_RNG_USER + 1, (uint64_t)(rank * 100 + step));
}

static int body(dt_comm *c, void *arg, char *fail, size_t cap) {
  job *j = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  dt_compress *z;
  int rc = dt_compress_create(&z, &j->cfg, NP, MATS, 2, r, n);
  if (rc < 0) {
    snprintf(fail, cap, "create: %s", dt_errmsg());
    return rc;
  }
  float *g = malloc(NP * sizeof *g);
  float *sum = j->sum[r];
  memset(sum, 0, NP * sizeof *sum);
  for (int s = 0; s < STEPS && rc == DT_OK; s++) {
    grad(g, r, s);
    dt_compress_begin_step(z, s, s / 2);
    for (int b = 0; b < 2 && rc == DT_OK; b++) {
      rc = dt_compress_reduce(z, c, g, BUCKETS[b][0], BUCKETS[b][1], 0.5f);
      if (rc < 0) snprintf(fail, cap, "reduce: %s", dt_errmsg());
    }
    for (int i = 0; i < NP; i++) sum[i] += g[i];
  }
  const float *res = dt_compress_residual(z);
  if (res) memcpy(j->resid[r], res, NP * sizeof *res);
  else memset(j->resid[r], 0, NP * sizeof(float));
  free(g);
  dt_compress_destroy(z);
  return rc;
}

static void run_one(const char *tp, int n, const dt_compress_cfg *cfg, float *out_sum) {
  job j = {*cfg, {0}, {0}};
  for (int r = 0; r < n; r++) {
    j.sum[r] = malloc(NP * sizeof(float));
    j.resid[r] = malloc(NP * sizeof(float));
  }
  int bad = run_ranks(tp, n, 60, body, &j, NULL, NULL);
  if (bad) fail_msg("%s n=%d codec %s: %d rank(s) failed", tp, n, dt__codec_names[cfg->codec], bad);
  /* the same bits on every rank */
  for (int r = 1; r < n; r++)
    if (memcmp(j.sum[0], j.sum[r], NP * sizeof(float)))
      fail_msg("%s n=%d codec %s: rank %d's result differs from rank 0's", tp, n,
               dt__codec_names[cfg->codec], r);
  /* error feedback: reduced + residuals = scaled gradients (with worker
   * momentum before the codec, and no DGC masking: = the velocities) */
  if (cfg->error_feedback && (cfg->momentum == 0 || cfg->codec != DT_CODEC_TOPK)) {
    double tol = cfg->codec == DT_CODEC_BF16 ? 0.3 : cfg->codec == DT_CODEC_FP16 ? 0.05 : 2e-4 * n;
    if (cfg->momentum > 0) tol *= 10; /* velocities reach 1 / (1 - m) times a gradient */
    float *g = malloc(NP * sizeof *g);
    double *want = calloc(NP, sizeof *want), *u = calloc(NP, sizeof *u);
    for (int r = 0; r < n; r++) {
      memset(u, 0, NP * sizeof *u);
      for (int s = 0; s < STEPS; s++) {
        grad(g, r, s);
        for (int i = 0; i < NP; i++) {
          u[i] = cfg->momentum * u[i] + 0.5 * g[i];
          want[i] += u[i];
        }
      }
    }
    free(u);
    double worst = 0;
    for (int i = 0; i < NP; i++) {
      double got = j.sum[0][i];
      for (int r = 0; r < n; r++) got += j.resid[r][i];
      double e = fabs(got - want[i]);
      worst = e > worst ? e : worst;
    }
    if (worst > tol)
      fail_msg("%s n=%d codec %s: sent + residual differs from the gradients by %g (> %g)", tp, n,
               dt__codec_names[cfg->codec], worst, tol);
    free(g);
    free(want);
  }
  memcpy(out_sum, j.sum[0], NP * sizeof(float));
  for (int r = 0; r < n; r++) {
    free(j.sum[r]);
    free(j.resid[r]);
  }
}

static void matrix(const char *tp, const int *ns, int nn) {
  float *a = malloc(NP * sizeof *a), *b = malloc(NP * sizeof *b);
  for (int k = 0; k < nn; k++)
    for (int codec = 0; codec < DT_CODEC_COUNT; codec++) {
      dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
      cfg.codec = codec;
      cfg.ratio = 0.05;
      cfg.qsgd_levels = 15;
      cfg.rank = 2;
      cfg.warmup_epochs = codec == DT_CODEC_TOPK ? 1 : 0;
      cfg.start_step = codec == DT_CODEC_POWERSGD ? 1 : 0;
      run_one(tp, ns[k], &cfg, a);
      run_one(tp, ns[k], &cfg, b);
      if (memcmp(a, b, NP * sizeof *a))
        fail_msg("%s n=%d codec %s: a second run gave different bits", tp, ns[k],
                 dt__codec_names[codec]);
      if (codec == DT_CODEC_NONE) {
        /* dense: the exact sum within float rounding */
        float *g = malloc(NP * sizeof *g);
        double *want = calloc(NP, sizeof *want);
        for (int r = 0; r < ns[k]; r++)
          for (int s = 0; s < STEPS; s++) {
            grad(g, r, s);
            for (int i = 0; i < NP; i++) want[i] += 0.5 * g[i];
          }
        for (int i = 0; i < NP; i++) assert_true(fabs(a[i] - want[i]) < 1e-4);
        free(g);
        free(want);
      }
    }
  /* without error feedback, and with DGC momentum correction: it runs, ranks agree */
  dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
  cfg.codec = DT_CODEC_SIGN;
  cfg.error_feedback = 0;
  run_one(tp, ns[nn - 1], &cfg, a);
  cfg.codec = DT_CODEC_TOPK;
  cfg.error_feedback = 1;
  cfg.momentum = 0.9f;
  cfg.clip = 5.0f;
  run_one(tp, ns[nn - 1], &cfg, a);
  /* worker momentum before sign (dist-EF-SGDM): the bookkeeping holds for velocities */
  cfg = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  cfg.codec = DT_CODEC_SIGN;
  cfg.momentum = 0.9f;
  run_one(tp, ns[nn - 1], &cfg, a);
  free(a);
  free(b);
}

static void test_inproc(void **st) {
  (void)st;
  int ns[] = {1, 2, 3, 4, 5};
  matrix("inproc", ns, 5);
}

static void test_tcp(void **st) {
  (void)st;
  int ns[] = {2, 3, 5};
  matrix("tcp", ns, 3);
}

/* Bad settings are refused naming the key. */
static void test_bad_cfg(void **st) {
  (void)st;
  dt_compress *z = NULL;
  dt_compress_cfg c = DT_COMPRESS_CFG_INIT;
  c.codec = DT_CODEC_TOPK;
  c.ratio = 0;
  assert_int_equal(dt_compress_create(&z, &c, 10, NULL, 0, 0, 1), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "dist.compress_ratio"));
  c.ratio = 0.1;
  c.momentum = 1;
  assert_int_equal(dt_compress_create(&z, &c, 10, NULL, 0, 0, 1), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "dist.compress_momentum"));
  c = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  c.codec = DT_CODEC_QSGD;
  c.qsgd_levels = 200;
  assert_int_equal(dt_compress_create(&z, &c, 10, NULL, 0, 0, 1), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "dist.qsgd_levels"));
  c = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  c.codec = DT_CODEC_POWERSGD;
  dt_cz_matrix m = {5, 4, 4};
  assert_int_equal(dt_compress_create(&z, &c, 10, &m, 1, 0, 1), DT_EINVAL);
  assert_null(z);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_cfg),
      cmocka_unit_test(test_inproc),
      cmocka_unit_test(test_tcp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

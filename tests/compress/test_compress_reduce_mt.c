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
 *    dense path (codec none) is exact;
 *  - powersgd's warm rank (higher for the first steps) keeps the
 *    bookkeeping across the switch.
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
  int fuse;           /* dt_compress_fuse over the two buckets */
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
  if (j->fuse) (void)dt_compress_fuse(z, 2);
  float *g = malloc(NP * sizeof *g);
  float *sum = j->sum[r];
  memset(sum, 0, NP * sizeof *sum);
  /* sign under the optimizer's momentum (cfg.opt_momentum): the optimizer's
   * buffer b = m b + g (weight decay 0) must be the summed decoded
   * velocities, which the bookkeeping below checks */
  float *b = calloc(NP, sizeof *b);
  const float om = j->cfg.opt_momentum;
  for (int s = 0; s < STEPS && rc == DT_OK; s++) {
    grad(g, r, s);
    dt_compress_begin_step(z, s, s / 2);
    for (int b = 0; b < 2 && rc == DT_OK; b++) {
      rc = dt_compress_reduce(z, c, g, BUCKETS[b][0], BUCKETS[b][1], 0.5f);
      if (rc < 0) snprintf(fail, cap, "reduce: %s", dt_errmsg());
    }
    if (om > 0)
      for (int i = 0; i < NP; i++) sum[i] += b[i] = om * b[i] + g[i];
    else
      for (int i = 0; i < NP; i++) sum[i] += g[i];
  }
  free(b);
  const float *res = dt_compress_residual(z);
  if (res) memcpy(j->resid[r], res, NP * sizeof *res);
  else memset(j->resid[r], 0, NP * sizeof(float));
  free(g);
  dt_compress_destroy(z);
  return rc;
}

static void run_one_f(const char *tp, int n, const dt_compress_cfg *cfg, float *out_sum, int fuse) {
  job j = {*cfg, {0}, {0}, fuse};
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

static void run_one(const char *tp, int n, const dt_compress_cfg *cfg, float *out_sum) {
  run_one_f(tp, n, cfg, out_sum, 0);
}

/* One allgather per step for both buckets (dt_compress_fuse): the same bits
 * as one per bucket, for every codec (the others ignore it), with the
 * error-feedback bookkeeping checked by run_one_f; topk also with worker
 * momentum and warm-up. */
static void test_fused(void **st) {
  (void)st;
  float *a = malloc(NP * sizeof *a), *b = malloc(NP * sizeof *b);
  const char *tps[] = {"inproc", "tcp"};
  for (int t = 0; t < 2; t++)
    for (int n = 1; n <= 3; n++)
      for (int codec = 0; codec <= DT_CODEC_COUNT; codec++) {
        dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
        cfg.codec = codec < DT_CODEC_COUNT ? codec : DT_CODEC_TOPK;
        cfg.ratio = 0.05;
        cfg.start_step = codec == DT_CODEC_POWERSGD ? 1 : 0;
        if (codec == DT_CODEC_POWERSGD) { /* rank 4 for steps 1-2, then 2 */
          cfg.warm_rank = 4;
          cfg.warm_steps = 3;
        }
        if (codec == DT_CODEC_COUNT) { /* topk + worker momentum, warm-up, a dense step */
          cfg.momentum = 0.9f;
          cfg.warmup_epochs = 1;
          cfg.start_step = 1;
        }
        if (!strcmp(tps[t], "tcp") && n == 1) continue;
        run_one_f(tps[t], n, &cfg, a, 0);
        run_one_f(tps[t], n, &cfg, b, 1);
        if (memcmp(a, b, NP * sizeof *a))
          fail_msg("%s n=%d codec %s%s: fused and per-bucket sums differ", tps[t], n,
                   dt__codec_names[cfg.codec], cfg.momentum > 0 ? "+mom" : "");
      }
  free(a);
  free(b);
}

/* signum (cfg.opt_momentum) fused: the same bits as per bucket, the
 * bookkeeping of run_one_f on both; the optimizer's momentum with another
 * codec, or unequal to the worker momentum, is refused. */
static void test_signum_fused(void **st) {
  (void)st;
  float *a = malloc(NP * sizeof *a), *b = malloc(NP * sizeof *b);
  for (int n = 1; n <= 3; n++) {
    dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
    cfg.codec = DT_CODEC_SIGN;
    cfg.sign_dense = 0; /* signs throughout (the default sends this small model dense) */
    cfg.momentum = cfg.opt_momentum = 0.9f;
    cfg.start_step = 1;
    run_one_f("inproc", n, &cfg, a, 0);
    run_one_f("inproc", n, &cfg, b, 1);
    if (memcmp(a, b, NP * sizeof *a)) fail_msg("inproc n=%d signum: fused and per-bucket differ", n);
  }
  dt_compress *z = NULL;
  dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
  cfg.codec = DT_CODEC_TOPK;
  cfg.momentum = cfg.opt_momentum = 0.9f;
  assert_int_equal(dt_compress_create(&z, &cfg, NP, MATS, 2, 0, 1), DT_EINVAL);
  cfg.codec = DT_CODEC_SIGN;
  cfg.sign_dense = 0; /* signs throughout (the default sends this small model dense) */
  cfg.momentum = 0.8f;
  assert_int_equal(dt_compress_create(&z, &cfg, NP, MATS, 2, 0, 1), DT_EINVAL);
  assert_null(z);
  free(a);
  free(b);
}

static void matrix(const char *tp, const int *ns, int nn) {
  float *a = malloc(NP * sizeof *a), *b = malloc(NP * sizeof *b);
  for (int k = 0; k < nn; k++)
    for (int codec = 0; codec < DT_CODEC_COUNT; codec++) {
      dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
      cfg.codec = codec;
      cfg.sign_dense = 0; /* sign: signs throughout */
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
  cfg.sign_dense = 0; /* signs throughout (the default sends this small model dense) */
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
  cfg.sign_dense = 0; /* signs throughout (the default sends this small model dense) */
  cfg.momentum = 0.9f;
  run_one(tp, ns[nn - 1], &cfg, a);
  /* the same with two dense steps first: they keep the velocity too (dense
   * momentum SGD; before, they reduced the bare gradients and the
   * bookkeeping against the velocities failed) */
  cfg.start_step = 2;
  run_one(tp, ns[nn - 1], &cfg, a);
  /* sign under the optimizer's momentum (signum, DTRAIN_CZ_SIGN_MOM): the
   * optimizer's buffer rebuilt from what it is handed is the summed decoded
   * velocities (run_one's bookkeeping), with and without dense steps */
  cfg.opt_momentum = 0.9f;
  cfg.start_step = 0;
  run_one(tp, ns[nn - 1], &cfg, a);
  cfg.start_step = 2;
  run_one(tp, ns[nn - 1], &cfg, a);
  /* sign with small tensors dense (DTRAIN_CZ_SIGN_DENSE): the 10x20
   * matrix, the 100 values before it and the 300 after it ride f32 in
   * the frames; the bookkeeping holds, with worker momentum too, fused
   * and the same bits run to run */
  cfg = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  cfg.codec = DT_CODEC_SIGN;
  cfg.sign_dense = 0; /* signs throughout (the default sends this small model dense) */
  run_one(tp, ns[nn - 1], &cfg, b);
  cfg.sign_dense = 300;
  run_one(tp, ns[nn - 1], &cfg, a);
  if (!memcmp(a, b, NP * sizeof *a))
    fail_msg("%s n=%d sign: dense small tensors gave the all-sign bits", tp, ns[nn - 1]);
  cfg.momentum = 0.9f;
  cfg.start_step = 2;
  run_one(tp, ns[nn - 1], &cfg, a);
  /* powersgd with a warm rank (dist.powersgd_warm_rank): rank 4 for two
   * steps, then rank 2 from Q's first columns; the 10x20 matrix rides
   * dense at rank 4 and is compressed at rank 2. The bookkeeping holds
   * across the switch (run_one), and the warm steps change the result. */
  cfg = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  cfg.codec = DT_CODEC_POWERSGD;
  cfg.rank = 2;
  run_one(tp, ns[nn - 1], &cfg, a);
  cfg.warm_rank = 4;
  cfg.warm_steps = 2;
  run_one(tp, ns[nn - 1], &cfg, b);
  if (!memcmp(a, b, NP * sizeof *a))
    fail_msg("%s n=%d powersgd: warm rank 4 for two steps gave rank 2's bits", tp, ns[nn - 1]);
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

/* ---- int8: the compressed ring ------------------------------------------
 * dt_compress_reduce of int8 against a serial model of the ring built from
 * the same frame functions (chunk c starts at rank c+1, each rank adds its
 * value to the decoded partial sum and requantises, the owner quantises the
 * full sum once more): the same bits (an exact reference), for world sizes
 * 1..4 and spans of 0, 1, odd and large sizes; and the result within the
 * quantisation bound of the exact sum. */
typedef struct ring_job {
  size_t n;
  int ef;
  float *out[MAXR];
  float *resid[MAXR];
} ring_job;

static void ring_value(float *w, size_t n, int rank) {
  dt_rng_uniform(w, n, -1.0f, 1.0f, 99, DT_RNG_USER + 2, (uint64_t)rank);
  /* blocks of very different magnitudes: a step per block keeps the small ones */
  for (size_t i = 0; i < n; i++) w[i] *= (i / 256) % 3 == 1 ? 1e-3f : (i / 256) % 3 == 2 ? 10.0f : 1.0f;
}

static int ring_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  ring_job *j = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
  cfg.codec = DT_CODEC_INT8;
  cfg.error_feedback = j->ef;
  dt_compress *z;
  int rc = dt_compress_create(&z, &cfg, j->n, NULL, 0, r, n);
  if (rc < 0) {
    snprintf(fail, cap, "create: %s", dt_errmsg());
    return rc;
  }
  float *g = j->out[r];
  ring_value(g, j->n, r);
  dt_compress_begin_step(z, 3, 0);
  rc = dt_compress_reduce(z, c, g, 0, j->n, 1.0f);
  if (rc < 0) snprintf(fail, cap, "reduce: %s", dt_errmsg());
  const float *res = dt_compress_residual(z);
  if (res && j->n) memcpy(j->resid[r], res, j->n * sizeof *res);
  dt_compress_destroy(z);
  return rc;
}

static void ring_reference(size_t n, int N, float *want) {
  float *w = malloc((size_t)N * (n + 1) * sizeof *w);
  uint8_t *f = malloc(dt__cz_i8b_bytes(n));
  float *p = malloc((n + 1) * sizeof *p);
  for (int r = 0; r < N; r++) ring_value(w + (size_t)r * (n + 1), n, r);
  size_t base = n / (size_t)N, extra = n % (size_t)N;
  for (int ch = 0; ch < N; ch++) {
    size_t o = (size_t)ch * base + ((size_t)ch < extra ? (size_t)ch : extra);
    size_t m = base + ((size_t)ch < extra);
    int r = (ch + 1) % N; /* the first to send chunk ch */
    memcpy(p, w + (size_t)r * (n + 1) + o, m * sizeof *p);
    for (int hop = 1; hop <= N; hop++) {
      dt_cz_rng rng = {42, 3, ((uint64_t)r << 32) | (uint32_t)o};
      dt__cz_i8b_encode(p, m, rng, f, NULL, 0);
      if (hop == N) break; /* r is the owner: its frame is the result */
      r = (r + 1) % N;
      memcpy(p, w + (size_t)r * (n + 1) + o, m * sizeof *p);
      assert_int_equal(dt__cz_i8b_decode_add(f, dt__cz_i8b_bytes(m), m, p, NULL), DT_OK);
    }
    memset(want + o, 0, m * sizeof *want);
    assert_int_equal(dt__cz_i8b_decode_add(f, dt__cz_i8b_bytes(m), m, want + o, NULL), DT_OK);
  }
  free(w);
  free(f);
  free(p);
}

static void ring_case(const char *tp, int N, size_t n, int ef) {
  ring_job j = {n, ef, {0}, {0}};
  for (int r = 0; r < N; r++) {
    j.out[r] = malloc((n + 1) * sizeof(float));
    j.resid[r] = calloc(n + 1, sizeof(float));
  }
  if (run_ranks(tp, N, 60, ring_body, &j, NULL, NULL))
    fail_msg("int8 ring %s N=%d n=%zu: a rank failed", tp, N, n);
  float *want = malloc((n + 1) * sizeof *want);
  ring_reference(n, N, want);
  if (n && memcmp(want, j.out[0], n * sizeof *want))
    fail_msg("int8 ring %s N=%d n=%zu: differs from the serial reference", tp, N, n);
  for (int r = 1; r < N; r++)
    if (n && memcmp(j.out[0], j.out[r], n * sizeof(float)))
      fail_msg("int8 ring %s N=%d n=%zu: rank %d's result differs from rank 0's", tp, N, n, r);
  /* the bound: each of the N quantisations of a value errs by less than its
   * block's step, at most (the block's largest partial sum) / 127 */
  float *v = malloc((n + 1) * sizeof *v);
  double *sum = calloc(n + 1, sizeof *sum), *abs = calloc(n + 1, sizeof *abs);
  for (int r = 0; r < N; r++) {
    ring_value(v, n, r);
    for (size_t i = 0; i < n; i++) sum[i] += v[i], abs[i] += fabs(v[i]);
  }
  for (size_t b = 0; b < n; b += 256) {
    size_t e = b + 256 < n ? b + 256 : n;
    /* a chunk's blocks need not line up with these: look one block either side */
    size_t lo = b >= 256 ? b - 256 : 0, hi = e + 256 < n ? e + 256 : n;
    double amax = 0;
    for (size_t i = lo; i < hi; i++) amax = abs[i] > amax ? abs[i] : amax;
    double bound = N * 1.05 * amax / 127 + 1e-6;
    for (size_t i = b; i < e; i++) {
      if (fabs(j.out[0][i] - sum[i]) > bound)
        fail_msg("int8 ring %s N=%d n=%zu: value %zu is %g, the sum %g (bound %g)", tp, N, n, i,
                 (double)j.out[0][i], sum[i], bound);
      if (ef) { /* the result plus every rank's residual is the sum */
        double got = j.out[0][i];
        for (int r = 0; r < N; r++) got += j.resid[r][i];
        if (fabs(got - sum[i]) > 1e-5 * (1 + abs[i]))
          fail_msg("int8 ring %s N=%d n=%zu: result + residuals %g, the sum %g", tp, N, n, got,
                   sum[i]);
      }
    }
  }
  free(v);
  free(sum);
  free(abs);
  free(want);
  for (int r = 0; r < N; r++) {
    free(j.out[r]);
    free(j.resid[r]);
  }
}

static void test_int8_ring(void **st) {
  (void)st;
  const size_t sizes[] = {0, 1, 2, 3, 257, 1001, 100003};
  for (int N = 1; N <= 4; N++)
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) ring_case("inproc", N, sizes[k], k % 2);
  ring_case("tcp", 3, 1001, 1);
  ring_case("tcp", 4, 100003, 0);
}

/* A malformed frame from a peer is DT_ECORRUPT naming that peer, not a
 * crash: rank 1 sends rank 0 a frame with a bad step in the ring's place. */
static int bad_ring_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  enum { N8 = 1000 };
  int r = dt_comm_rank(c);
  float *g = calloc(N8, sizeof *g);
  int rc = DT_OK;
  if (r == 0) {
    dt_compress_cfg cfg = DT_COMPRESS_CFG_INIT;
    cfg.codec = DT_CODEC_INT8;
    dt_compress *z;
    rc = dt_compress_create(&z, &cfg, N8, NULL, 0, 0, 2);
    if (rc == DT_OK) {
      ring_value(g, N8, 0);
      dt_compress_begin_step(z, 0, 0);
      rc = dt_compress_reduce(z, c, g, 0, N8, 1.0f);
      dt_compress_destroy(z);
      if (rc == DT_ECORRUPT && strstr(dt_errmsg(), "rank 1") && strstr(dt_errmsg(), "step"))
        rc = DT_OK;
      else {
        snprintf(fail, cap, "rank 0 got %d (%s), want DT_ECORRUPT naming rank 1", rc, dt_errmsg());
        rc = rc < 0 ? rc : DT_EINVAL;
      }
    }
  } else {
    size_t m = N8 / 2, fb = dt__cz_i8b_bytes(m);
    uint8_t *in = malloc(fb), *out = malloc(fb);
    ring_value(g, m, 1);
    dt_cz_rng rng = {1, 0, 1};
    dt__cz_i8b_encode(g, m, rng, out, NULL, 0);
    float bad = -1.0f;
    memcpy(out + DT_CZ_HDR_LEN + 4, &bad, 4); /* block 1's step */
    rc = dt_comm_send(c, 0, DT_CZ_RING_TAG, out, fb);
    if (rc == DT_OK) rc = dt_comm_recv(c, 0, DT_CZ_RING_TAG, in, fb);
    if (rc < 0) snprintf(fail, cap, "rank 1: %s", dt_errmsg());
    free(in);
    free(out);
  }
  free(g);
  return rc;
}

static void test_int8_ring_malformed(void **st) {
  (void)st;
  int rcs[2];
  char msgs[2][512];
  if (run_ranks("inproc", 2, 30, bad_ring_body, NULL, rcs, msgs))
    fail_msg("malformed int8 ring frame: %s / %s", msgs[0], msgs[1]);
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

/* One step of g (NP values in MATS's layout) through a compressor made
 * from cfg on this rank, in the two spans cut[] (one collective when
 * fuse); *zp: the compressor (NULL if it could not be made), for the
 * caller to read and destroy; fail: what failed. */
static int reduce_two(dt_comm *c, const dt_compress_cfg *cfg, int fuse, const size_t cut[][2],
                      float *g, dt_compress **zp, char *fail, size_t cap) {
  int rc = dt_compress_create(zp, cfg, NP, MATS, 2, dt_comm_rank(c), dt_comm_size(c));
  if (rc < 0) { /* *zp is NULL then */
    snprintf(fail, cap, "create: %s", dt_errmsg());
    return rc;
  }
  if (fuse) (void)dt_compress_fuse(*zp, 2);
  dt_compress_begin_step(*zp, 0, 0);
  for (int b = 0; b < 2 && rc == DT_OK; b++) {
    rc = dt_compress_reduce(*zp, c, g, cut[b][0], cut[b][1], 1.0f);
    if (rc < 0) snprintf(fail, cap, "reduce: %s", dt_errmsg());
  }
  return rc;
}

/* sign's block plan (cfg.sign_blocks): a gradient whose magnitude is
 * constant inside each block the rule makes — each row of MATS' matrices
 * (rows of 50 and 20), the 100 values between them, and the 300 after the
 * last cut into two near-equal pieces of 150 by rule 1 — comes through
 * exactly (every block's mean |x| is its |x|), with a zero residual, over
 * spans cut mid-row (1025 is inside row 20 of the first matrix), fused
 * and not, with one scale or two. With blocks of 256 from a span's start
 * (rule 0) or a whole 300-value segment (rule 2) a block mixes
 * magnitudes and the result differs. */
typedef struct { dt_compress_cfg cfg; int fuse, exact; char why[160]; } plan_job;
static float plan_mag(size_t i) {
  if (i < 2000) return (float)(1 + i / 50 % 7);            /* matrix 1: rows of 50 */
  if (i < 2100) return 64.0f;                              /* between the matrices */
  if (i < 2300) return 0.125f * (float)(1 + (i - 2100) / 20); /* matrix 2: rows of 20 */
  return i < 2450 ? 3.0f : 0.25f;                          /* after it: two pieces of 150 */
}
static int plan_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  plan_job *j = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  static const size_t cut[][2] = {{0, 1025}, {1025, 1575}};
  float *g = malloc(NP * sizeof *g);
  for (size_t i = 0; i < NP; i++) g[i] = (i * 7 % 5 < 2 ? -1.0f : 1.0f) * plan_mag(i);
  dt_compress *z;
  int rc = reduce_two(c, &j->cfg, j->fuse, cut, g, &z, fail, cap);
  if (!z) {
    free(g);
    return rc;
  }
  const float *res = dt_compress_residual(z);
  int exact = 1; /* every rank checks; rank 0 reports (no shared writes) */
  for (size_t i = 0; i < NP && rc == DT_OK && exact; i++) {
    float want = (float)n * (i * 7 % 5 < 2 ? -1.0f : 1.0f) * plan_mag(i);
    if (g[i] != want || res[i] != 0) {
      exact = 0;
      if (r == 0)
        snprintf(j->why, sizeof j->why, "value %zu: sum %g (want %g), residual %g", i,
                 (double)g[i], (double)want, (double)res[i]);
    }
  }
  if (r == 0) j->exact = exact;
  free(g);
  dt_compress_destroy(z);
  return rc;
}

static void test_sign_plan_rule(void **st) {
  (void)st;
  for (int rule = 0; rule <= 2; rule++)
    for (int two = 0; two < 2; two++)
      for (int fuse = 0; fuse < 2; fuse++) {
        if (rule == 0 && two) continue; /* two scales need a plan */
        plan_job j = {DT_COMPRESS_CFG_INIT, fuse, 0, ""};
        j.cfg.codec = DT_CODEC_SIGN;
        j.cfg.sign_blocks = rule;
        j.cfg.sign_two = two;
        j.cfg.sign_dense = 0; /* every block signed (the default sends this small model dense) */
        if (run_ranks("inproc", 2, 60, plan_body, &j, NULL, NULL))
          fail_msg("rule %d two %d fuse %d: a rank failed (above)", rule, two, fuse);
        if (j.exact != (rule == 1))
          fail_msg("rule %d two %d fuse %d: %s", rule, two, fuse,
                   j.exact ? "exact, but its blocks should mix magnitudes" : j.why);
      }
}

/* sign with small tensors dense (cfg.sign_dense = 300): values of any
 * magnitude in the 10x20 matrix and the stretches around it (2000..2600)
 * come through exactly as the sum of the ranks' values with a zero
 * residual, over spans cut mid-row, fused and not, on 1-3 ranks; the
 * 40x50 matrix (2000 values, above the threshold) goes as signs. A
 * threshold of 200 leaves the 300 after it signed; 0 none. */
typedef struct { dt_compress_cfg cfg; int fuse, lo, hi, ok; char why[160]; } dense_job;
static float dense_val(size_t i, int r) { return (float)((i * 2654435761u + (size_t)r * 977) % 1000) / 7.0f - 60.0f; }
static int dense_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  dense_job *j = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  static const size_t cut[][2] = {{0, 2150}, {2150, 450}};
  float *g = malloc(NP * sizeof *g);
  for (size_t i = 0; i < NP; i++) g[i] = dense_val(i, r);
  dt_compress *z;
  int rc = reduce_two(c, &j->cfg, j->fuse, cut, g, &z, fail, cap);
  if (!z) {
    free(g);
    return rc;
  }
  const float *res = dt_compress_residual(z);
  /* exact where dense: [lo, hi); elsewhere signs (some value inexact) */
  int ok = 1, inexact = 0;
  for (size_t i = 0; i < NP && rc == DT_OK; i++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += dense_val(i, q);
    int exact = g[i] == want && res[i] == 0;
    if (i >= (size_t)j->lo && i < (size_t)j->hi && !exact && ok) {
      ok = 0;
      if (r == 0)
        snprintf(j->why, sizeof j->why, "value %zu: sum %g (want %g), residual %g", i,
                 (double)g[i], (double)want, (double)res[i]);
    }
    if (i < (size_t)j->lo || i >= (size_t)j->hi) inexact |= !exact;
  }
  if (ok && !inexact && r == 0) snprintf(j->why, sizeof j->why, "the signed values came exactly");
  if (r == 0) j->ok = ok && inexact;
  free(g);
  dt_compress_destroy(z);
  return rc;
}

static void test_sign_dense_reduce(void **st) {
  (void)st;
  static const int thr[][3] = {{300, 2000, 2600}, {200, 2000, 2300}, {0, 0, 0}};
  for (int t = 0; t < 3; t++)
    for (int n = 1; n <= 3; n++)
      for (int fuse = 0; fuse < 2; fuse++) {
        dense_job j = {DT_COMPRESS_CFG_INIT, fuse, thr[t][1], thr[t][2], 0, ""};
        j.cfg.codec = DT_CODEC_SIGN;
        j.cfg.sign_dense = thr[t][0];
        if (run_ranks("inproc", n, 60, dense_body, &j, NULL, NULL))
          fail_msg("threshold %d n %d fuse %d: a rank failed (above)", thr[t][0], n, fuse);
        if (!j.ok) fail_msg("threshold %d n %d fuse %d: %s", thr[t][0], n, fuse, j.why);
      }
}

/* Huge finite gradients through every compressed reduction: the sum
 * stays finite (a sum of two ranks' |g| <= 1e19 cannot overflow), with
 * error feedback on. PowerSGD's warm-started Q carries the gradient's
 * magnitude, so P = M Q grows like |g|^2: at 1e19 it overflowed to Inf
 * and the sum was NaN although every gradient was finite. */
typedef struct { dt_compress_cfg cfg; double mag; } huge_job;
static int huge_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  huge_job *j = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  dt_compress *z;
  int rc = dt_compress_create(&z, &j->cfg, NP, MATS, 2, r, n);
  if (rc < 0) {
    snprintf(fail, cap, "create: %s", dt_errmsg());
    return rc;
  }
  float *g = malloc(NP * sizeof *g);
  for (int s = 0; s < STEPS && rc == DT_OK; s++) {
    grad(g, r, s);
    for (int i = 0; i < NP; i++) g[i] = (float)(g[i] * j->mag);
    dt_compress_begin_step(z, s, 0);
    for (int b = 0; b < 2 && rc == DT_OK; b++) {
      rc = dt_compress_reduce(z, c, g, BUCKETS[b][0], BUCKETS[b][1], 1.0f);
      if (rc < 0) snprintf(fail, cap, "reduce: %s", dt_errmsg());
    }
    for (int i = 0; i < NP && rc == DT_OK; i++)
      if (!isfinite(g[i])) {
        snprintf(fail, cap, "step %d: value %d of the sum is %g", s, i, (double)g[i]);
        rc = DT_EINVAL;
      }
  }
  free(g);
  dt_compress_destroy(z);
  return rc;
}

static void test_huge(void **st) {
  (void)st;
  const int codecs[] = {DT_CODEC_INT8, DT_CODEC_QSGD, DT_CODEC_SIGN, DT_CODEC_TOPK,
                        DT_CODEC_POWERSGD};
  const double mags[] = {1e19, 1e30, 1e-30};
  for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++)
    for (size_t m = 0; m < sizeof mags / sizeof *mags; m++) {
      huge_job j = {DT_COMPRESS_CFG_INIT, mags[m]};
      j.cfg.codec = codecs[c];
      j.cfg.start_step = 0;
      if (run_ranks("inproc", 2, 60, huge_body, &j, NULL, NULL))
        fail_msg("codec %s, |g| ~ %g: a rank failed (above)", dt__codec_names[codecs[c]], mags[m]);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_cfg),
      cmocka_unit_test(test_inproc),
      cmocka_unit_test(test_tcp),
      cmocka_unit_test(test_fused),
      cmocka_unit_test(test_signum_fused),
      cmocka_unit_test(test_int8_ring),
      cmocka_unit_test(test_int8_ring_malformed),
      cmocka_unit_test(test_huge),
      cmocka_unit_test(test_sign_plan_rule),
      cmocka_unit_test(test_sign_dense_reduce),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

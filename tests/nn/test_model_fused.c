/*
 * test_model_fused.c — the model's execution plan runs `relu maxpool(2)` as
 * one fused kernel; this checks that it changes nothing. Each spec is built
 * twice: as written (fused) and with `dropout(0)` between the relu and the
 * pool, an identity that keeps the two layers apart (unfused) without
 * changing the parameter layout. Both get the same parameters and data;
 * logits, loss, correct count and the whole gradient buffer must be bitwise
 * equal over several SGD steps, at full and partial batch, in train and
 * eval mode, and the caller's input must stay untouched when the relu is the
 * first layer. All of it under several DTRAIN_NN_CHUNK_BYTES settings, so
 * the chunked conv -> fused pool route runs with one sample per chunk, with
 * a partial last chunk, with one chunk and switched off. dt_model_loss (no
 * gradient) must give the backward's loss bitwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/core.h"
#include "nn/nn.h"

typedef struct pair {
  const char *fused, *unfused;
  int c, h, w;
} pair;

static const pair pairs[] = {
    {"conv(4,3,pad=1) relu maxpool(2) conv(6,3,pad=1) relu maxpool(2) flatten linear(12) relu "
     "linear(10)",
     "conv(4,3,pad=1) relu dropout(0) maxpool(2) conv(6,3,pad=1) relu dropout(0) maxpool(2) "
     "flatten linear(12) relu linear(10)",
     1, 28, 28},
    /* odd sizes (floor mode drops a row and a column), 3 channels */
    {"conv(5,3) relu maxpool(2) flatten linear(7)",
     "conv(5,3) relu dropout(0) maxpool(2) flatten linear(7)", 3, 13, 11},
    /* relu first (its input is the caller's x), chained fused pairs */
    {"relu maxpool(2) relu maxpool(2) conv(3,3,pad=1) relu maxpool(2,2) flatten linear(4)",
     "relu dropout(0) maxpool(2) relu dropout(0) maxpool(2) conv(3,3,pad=1) relu dropout(0) "
     "maxpool(2,2) flatten linear(4)",
     2, 16, 17},
};

enum { MB = 6, STEPS = 3 };

/* Records the gradient-ready callbacks (span offset, length) in order. */
typedef struct spans {
  int n;
  size_t v[64];
} spans;
static void on_ready(void *ud, size_t off, size_t n) {
  spans *s = ud;
  assert_true(s->n + 2 <= 64);
  s->v[s->n++] = off, s->v[s->n++] = n;
}

static dt_model *make(const char *spec, const pair *p) {
  dt_model *m = NULL;
  if (dt_model_create(&m, spec, p->c, p->h, p->w, MB) != DT_OK) fail_msg("%s", dt_errmsg());
  return m;
}

static void same(const char *what, const void *a, const void *b, size_t bytes, const char *spec) {
  if (memcmp(a, b, bytes) != 0)
    fail_msg("%s differs for %s (DTRAIN_NN_CHUNK_BYTES=%s)", what, spec,
             getenv("DTRAIN_NN_CHUNK_BYTES") ? getenv("DTRAIN_NN_CHUNK_BYTES") : "unset");
}

static void run_pairs(void) {
  for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
    const pair *p = &pairs[pi];
    dt_model *f = make(p->fused, p), *u = make(p->unfused, p);
    size_t np = dt_model_nparams(f);
    assert_int_equal(np, dt_model_nparams(u));
    dt_model_init(f, 3);
    memcpy(dt_model_params(u), dt_model_params(f), np * sizeof(float));
    size_t D = (size_t)dt_model_in_dim(f);
    int V = dt_model_out_dim(f);
    float *x = malloc(MB * D * sizeof(float)), *x0 = malloc(MB * D * sizeof(float));
    int32_t y[MB];
    for (int step = 0; step < STEPS; step++) {
      int B = step == 1 ? 3 : MB; /* a partial batch too */
      dt_rng_uniform(x, (size_t)B * D, -1.0f, 1.0f, 11, DT_RNG_USER, (uint64_t)step);
      for (int i = 0; i < B; i++) y[i] = (i * 3 + step) % V;
      memcpy(x0, x, (size_t)B * D * sizeof(float));
      dt_step_ctx ctx = {1, 5, (uint64_t)step, (int64_t)step * MB};
      assert_int_equal(dt_model_forward(f, x, B, &ctx), DT_OK);
      const float *lf = dt_model_logits(f);
      assert_non_null(lf);
      same("input", x, x0, (size_t)B * D * sizeof(float), p->fused);
      assert_int_equal(dt_model_forward(u, x, B, &ctx), DT_OK);
      const float *lu = dt_model_logits(u);
      assert_non_null(lu);
      same("logits", lf, lu, (size_t)B * V * sizeof(float), p->fused);
      int cf = -1, cu = -2;
      spans sf = {0}, su = {0};
      int c0 = -3;
      float loss0 = NAN, lossf = NAN, lossu = NAN;
      assert_int_equal(dt_model_loss(f, y, B, &loss0, &c0), DT_OK); /* no gradient: same loss, bitwise */
      assert_int_equal(dt_model_backward(f, y, B, &lossf, &cf, on_ready, &sf), DT_OK);
      assert_int_equal(dt_model_backward(u, y, B, &lossu, &cu, on_ready, &su), DT_OK);
      assert_true(sf.n > 0);
      assert_int_equal(sf.n, su.n);
      same("ready spans", sf.v, su.v, sizeof(size_t) * (size_t)sf.n, p->fused);
      assert_true(isfinite(lossf));
      same("loss", &lossf, &lossu, sizeof lossf, p->fused);
      assert_int_equal(cf, cu);
      same("dt_model_loss", &loss0, &lossf, sizeof lossf, p->fused);
      assert_int_equal(c0, cf);
      same("gradients", dt_model_grads(f), dt_model_grads(u), np * sizeof(float), p->fused);
      /* the gradient is not trivially zero */
      double g2 = 0.0;
      for (size_t j = 0; j < np; j++) g2 += (double)dt_model_grads(f)[j] * dt_model_grads(f)[j];
      assert_true(g2 > 0.0);
      /* plain SGD on both, so later steps see different weights */
      for (int k = 0; k < 2; k++) {
        dt_model *m = k ? u : f;
        float *w = dt_model_params(m);
        const float *g = dt_model_grads(m);
        for (size_t j = 0; j < np; j++) w[j] -= 0.1f * g[j];
      }
      /* eval mode goes through the same plan */
      dt_step_ctx ev = {0, 5, 0, 0};
      assert_int_equal(dt_model_forward(f, x, B, &ev), DT_OK);
      assert_int_equal(dt_model_forward(u, x, B, &ev), DT_OK);
      lf = dt_model_logits(f);
      lu = dt_model_logits(u);
      same("eval logits", lf, lu, (size_t)B * V * sizeof(float), p->fused);
    }
    free(x), free(x0);
    dt_model_destroy(f);
    dt_model_destroy(u);
  }
}

static void test_fused_equals_unfused(void **st) {
  (void)st;
  static const char *chunks[] = {"1", "30000", "0", NULL};
  for (int k = 0; k < 4; k++) {
    if (chunks[k])
      setenv("DTRAIN_NN_CHUNK_BYTES", chunks[k], 1);
    else
      unsetenv("DTRAIN_NN_CHUNK_BYTES");
    dt__param_reload(); /* the knob table caches the environment */
    run_pairs();
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fused_equals_unfused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

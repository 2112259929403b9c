/*
 * test_model_golden.c — whole training steps of the MLP (784-256-128-10) and
 * the 2-conv CNN against PyTorch 1.13, from fixtures written by
 * tools/golden_step.py (tests/nn/golden/step_*.bin): two steps of forward,
 * softmax cross-entropy, backward and SGD (momentum, Nesterov, weight decay)
 * or AdamW on a batch of 8. Checks logits, loss, gradients and updated
 * parameters, and that the grad-ready callback reports contiguous spans in
 * reverse layer order covering the whole gradient buffer.
 *
 * Error measure, per tensor (as in test_kernels_golden.c): max |a - b| /
 * max |b|, required <= 1e-4. The reference is float64; the model runs in
 * float32.
 */
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

#define TOL 1e-4
#define MAXT 24

typedef struct {
  char name[64];
  int dtype, ndim, dims[8];
  size_t n;
  void *data;
} gtensor;

typedef struct {
  char path[512];
  int count;
  gtensor t[MAXT];
} gfile;

static uint32_t rd32(FILE *f) {
  unsigned char b[4];
  if (fread(b, 1, 4, f) != 4) fail_msg("short read");
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Loads tests/nn/golden/<stem>.bin ("DTGF" v1, see tools/golden.py); a
 * missing or malformed file fails the test. */
static void gload(gfile *g, const char *stem) {
  snprintf(g->path, sizeof g->path, "%s/tests/nn/golden/%s.bin", DT_SOURCE_DIR, stem);
  FILE *f = fopen(g->path, "rb");
  if (!f) fail_msg("cannot open %s (run /usr/bin/python3 tools/golden_step.py)", g->path);
  char magic[4];
  assert_int_equal(fread(magic, 1, 4, f), 4);
  assert_memory_equal(magic, "DTGF", 4);
  assert_int_equal(rd32(f), 1);
  g->count = (int)rd32(f);
  assert_true(g->count > 0 && g->count <= MAXT);
  for (int i = 0; i < g->count; i++) {
    gtensor *t = &g->t[i];
    uint32_t nl = rd32(f);
    assert_true(nl < sizeof t->name);
    assert_int_equal(fread(t->name, 1, nl, f), nl);
    t->name[nl] = 0;
    t->dtype = (int)rd32(f);
    t->ndim = (int)rd32(f);
    assert_true(t->ndim >= 0 && t->ndim <= 8);
    t->n = 1;
    for (int d = 0; d < t->ndim; d++) {
      t->dims[d] = (int)rd32(f);
      t->n *= (size_t)t->dims[d];
    }
    t->data = malloc(t->n * 4 + 4);
    assert_non_null(t->data);
    assert_int_equal(fread(t->data, 4, t->n, f), t->n); /* host is little-endian */
  }
  fclose(f);
}

static void gfree(gfile *g) {
  for (int i = 0; i < g->count; i++) free(g->t[i].data);
  g->count = 0;
}

static gtensor *gfind(gfile *g, const char *name, int dtype) {
  for (int i = 0; i < g->count; i++)
    if (strcmp(g->t[i].name, name) == 0) {
      assert_int_equal(g->t[i].dtype, dtype);
      return &g->t[i];
    }
  fail_msg("%s: no tensor '%s'", g->path, name);
  return NULL;
}
static float *F32(gfile *g, const char *name) { return gfind(g, name, 0)->data; }
static int32_t *I32(gfile *g, const char *name) { return gfind(g, name, 1)->data; }

static double relerr(const float *a, const float *b, size_t n) {
  double md = 0.0, mb = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= md)) md = d; /* NaN-propagating max */
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return md / (mb > 1e-6 ? mb : 1e-6);
}

static void check(const char *path, const char *what, int step, const float *got,
                  const float *want, size_t n) {
  double e = relerr(got, want, n);
  if (!(e <= TOL)) fail_msg("%s: step %d: %s rel err %.3g > %g", path, step, what, e, TOL);
}

/* The fixture's initial parameters: tools/golden_step.py pattern(). */
static void pattern(float *p, size_t n, double bound, uint32_t salt) {
  for (size_t i = 0; i < n; i++) {
    uint32_t h = (uint32_t)(i + 1) * 0x9E3779B1u + salt * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    uint32_t u = h >> 8;
    p[i] = (float)(((double)u * (2.0 / 16777216.0) - 1.0) * bound);
  }
}

static void pattern_init(dt_model *m) {
  float *p = dt_model_params(m);
  uint32_t salt = 0;
  for (int i = 0; i < dt_model_nlayers(m); i++) {
    const dt_layer_info *li = dt_model_layer(m, i);
    if (!li->nparams) continue;
    assert_true(li->kind == DT_L_LINEAR || li->kind == DT_L_CONV2D);
    size_t nb = (size_t)li->out_c, nw = li->nparams - nb;
    double bound = 1.0 / sqrt((double)(nw / nb)); /* fan_in = weights per output */
    pattern(p + li->param_off, nw, bound, salt++);
    pattern(p + li->param_off + nw, nb, bound, salt++);
  }
}

typedef struct {
  size_t off[64], n[64];
  int calls;
} ready_log;

static void on_ready(void *ud, size_t off, size_t n) {
  ready_log *r = ud;
  assert_true(r->calls < 64);
  r->off[r->calls] = off;
  r->n[r->calls] = n;
  r->calls++;
}

static void run_case(const char *stem, int extra_batch) {
  gfile g = {0};
  gload(&g, stem);
  gtensor *st = gfind(&g, "spec", 1);
  char spec[512];
  assert_true(st->n < sizeof spec);
  for (size_t i = 0; i < st->n; i++) spec[i] = (char)((int32_t *)st->data)[i];
  spec[st->n] = 0;
  int32_t *meta = I32(&g, "meta");
  int B = meta[0], steps = meta[6];
  float *hy = F32(&g, "hyper");
  gtensor *idx = gfind(&g, "idx", 1);
  size_t K = idx->n;
  const int32_t *ix = idx->data;

  dt_model *m = NULL;
  int rc = dt_model_create(&m, spec, meta[1], meta[2], meta[3], B + extra_batch);
  if (rc) fail_msg("%s: %s", stem, dt_errmsg());
  size_t P = dt_model_nparams(m);
  assert_int_equal(dt_model_in_dim(m), meta[1] * meta[2] * meta[3]);
  int V = dt_model_out_dim(m);
  pattern_init(m);

  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.kind = meta[4] ? DT_OPT_ADAMW : DT_OPT_SGD;
  oc.lr = hy[0], oc.momentum = hy[1], oc.dampening = hy[2], oc.weight_decay = hy[3];
  oc.beta1 = hy[4], oc.beta2 = hy[5], oc.eps = hy[6], oc.nesterov = meta[5];
  dt_optim *o = NULL;
  assert_int_equal(dt_optim_create(&o, &oc, P), DT_OK);

  float *got = malloc(K * sizeof(float));
  const float *xs = F32(&g, "x");
  const int32_t *ys = I32(&g, "y");
  size_t D = (size_t)dt_model_in_dim(m);
  for (int s = 0; s < steps; s++) {
    dt_step_ctx ctx = {1, 7, (uint64_t)s, (int64_t)s * B};
    const float *logits = dt_model_forward(m, xs + (size_t)s * B * D, B, &ctx);
    assert_non_null(logits);
    if (s == 0) check(g.path, "logits", s, logits, F32(&g, "logits"), (size_t)B * V);
    /* Poison the gradients: backward must overwrite every element. */
    float *gr = dt_model_grads(m);
    for (size_t i = 0; i < P; i++) gr[i] = NAN;
    ready_log rl = {0};
    int ncorrect = -1;
    float loss = dt_model_backward(m, ys + (size_t)s * B, B, &ncorrect, on_ready, &rl);
    float want_loss = F32(&g, "loss")[s];
    check(g.path, "loss", s, &loss, &want_loss, 1);
    assert_true(ncorrect >= 0 && ncorrect <= B);
    /* Grad-ready spans: reverse order, contiguous, covering [0, P). */
    assert_true(rl.calls > 0);
    assert_int_equal(rl.off[0] + rl.n[0], P);
    for (int c = 1; c < rl.calls; c++) assert_int_equal(rl.off[c] + rl.n[c], rl.off[c - 1]);
    assert_int_equal(rl.off[rl.calls - 1], 0);
    for (size_t i = 0; i < P; i++)
      if (isnan(gr[i])) fail_msg("%s: gradient %zu not written", stem, i);
    for (size_t k = 0; k < K; k++) got[k] = gr[ix[k]];
    check(g.path, "grads", s, got, F32(&g, "grads") + (size_t)s * K, K);
    dt_optim_step(o, dt_model_params(m), gr, oc.lr);
    float *p = dt_model_params(m);
    for (size_t k = 0; k < K; k++) got[k] = p[ix[k]];
    check(g.path, "params", s, got, F32(&g, "params") + (size_t)s * K, K);
  }
  assert_int_equal(*dt_optim_step_count(o), steps);
  free(got);
  dt_optim_destroy(o);
  dt_model_destroy(m);
  gfree(&g);
}

static void test_mlp_sgd(void **st) { (void)st; run_case("step_mlp_sgd", 0); }
static void test_mlp_nesterov(void **st) { (void)st; run_case("step_mlp_nesterov", 0); }
static void test_mlp_adamw(void **st) { (void)st; run_case("step_mlp_adamw", 0); }
static void test_cnn_sgd(void **st) { (void)st; run_case("step_cnn_sgd", 0); }
static void test_cnn_nesterov(void **st) { (void)st; run_case("step_cnn_nesterov", 0); }
static void test_cnn_adamw(void **st) { (void)st; run_case("step_cnn_adamw", 0); }
/* A batch smaller than max_batch must give the same results. */
static void test_mlp_small_batch(void **st) { (void)st; run_case("step_mlp_sgd", 9); }
static void test_cnn_small_batch(void **st) { (void)st; run_case("step_cnn_adamw", 3); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_sgd),        cmocka_unit_test(test_mlp_nesterov),
      cmocka_unit_test(test_mlp_adamw),      cmocka_unit_test(test_cnn_sgd),
      cmocka_unit_test(test_cnn_nesterov),   cmocka_unit_test(test_cnn_adamw),
      cmocka_unit_test(test_mlp_small_batch), cmocka_unit_test(test_cnn_small_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

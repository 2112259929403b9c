/*
 * test_api_model.c — dtrain/model.h through the public API only: a model
 * built layer by layer is the model of the same spec string (same layout,
 * same initial bits, same logits); a refused layer leaves the builder as it
 * was; and every call that can fail does, with DT_EINVAL and a message
 * naming the argument or layer: NULL handles and pointers, bad shapes and
 * batch sizes, unknown or misfitting layers, backward before forward,
 * labels outside the classes. Errors leave outputs (loss, gradients)
 * untouched.
 */
#include <math.h>
#include <stdlib.h>

#include "api_test.h"

static const char *MLP = "flatten linear(16) relu linear(4)";

static void test_create_errors(void **st) {
  (void)st;
  dt_model *m = (dt_model *)&m; /* must be reset to NULL on failure */
  EXPECT_ERR(dt_model_create(NULL, MLP, 1, 4, 4, 8), DT_EINVAL, "out");
  EXPECT_ERR(dt_model_create(&m, NULL, 1, 4, 4, 8), DT_EINVAL, "spec");
  assert_null(m);
  EXPECT_ERR(dt_model_create(&m, MLP, 0, 4, 4, 8), DT_EINVAL, "shape");
  EXPECT_ERR(dt_model_create(&m, MLP, 1, 4, 4, 0), DT_EINVAL, "max_batch");
  EXPECT_ERR(dt_model_create(&m, MLP, 1, 4, 4, -3), DT_EINVAL, "max_batch");
  EXPECT_ERR(dt_model_create(&m, "", 1, 4, 4, 8), DT_EINVAL, "empty");
  EXPECT_ERR(dt_model_create(&m, "flatten linear(16) conv3d(2)", 1, 4, 4, 8), DT_EINVAL,
             "conv3d");
  /* a layer that does not fit: a convolution over a flat vector */
  EXPECT_ERR(dt_model_create(&m, "flatten conv(2,3)", 1, 4, 4, 8), DT_EINVAL, "layer 2");
  EXPECT_ERR(dt_model_create(&m, "linear(0)", 1, 4, 4, 8), DT_EINVAL, "linear(0)");
  assert_null(m);
  /* getters and destroy on NULL */
  assert_int_equal(dt_model_nparams(NULL), 0);
  assert_null(dt_model_params(NULL));
  assert_null(dt_model_grads(NULL));
  assert_null(dt_model_bufs(NULL));
  assert_int_equal(dt_model_nbufs(NULL), 0);
  assert_int_equal(dt_model_nlayers(NULL), 0);
  assert_null(dt_model_layer(NULL, 0));
  assert_int_equal(dt_model_in_dim(NULL), 0);
  assert_int_equal(dt_model_out_dim(NULL), 0);
  assert_int_equal(dt_model_max_batch(NULL), 0);
  assert_null(dt_model_logits(NULL));
  assert_true(dt_model_flops_per_sample(NULL, 1) == 0.0);
  dt_model_destroy(NULL);
  EXPECT_ERR(dt_model_init(NULL, 1), DT_EINVAL, "model is NULL");
}

static void test_builder_matches_spec(void **st) {
  (void)st;
  dt_model_builder *b = NULL;
  EXPECT_OK(dt_model_builder_create(&b, 1, 4, 4));
  assert_string_equal(dt_model_builder_spec(b), "");
  EXPECT_OK(dt_model_add(b, "flatten"));
  EXPECT_OK(dt_model_add(b, "linear(16)"));
  EXPECT_OK(dt_model_add(b, "relu"));
  EXPECT_OK(dt_model_add(b, "linear(4)"));
  assert_string_equal(dt_model_builder_spec(b), MLP);
  dt_model *mb = NULL, *ms = NULL;
  EXPECT_OK(dt_model_build(b, 8, &mb));
  EXPECT_OK(dt_model_create(&ms, MLP, 1, 4, 4, 8));
  dt_model_builder_destroy(b); /* the model outlives its builder */
  assert_int_equal(dt_model_nlayers(mb), 4);
  assert_int_equal(dt_model_nparams(mb), 16 * 16 + 16 + 16 * 4 + 4);
  assert_int_equal(dt_model_nparams(mb), dt_model_nparams(ms));
  assert_int_equal(dt_model_in_dim(mb), 16);
  assert_int_equal(dt_model_out_dim(mb), 4);
  assert_int_equal(dt_model_max_batch(mb), 8);
  assert_string_equal(dt_model_layer(mb, 1)->name, "linear");
  assert_null(dt_model_layer(mb, 4));
  assert_null(dt_model_layer(mb, -1));
  EXPECT_OK(dt_model_init(mb, 7));
  EXPECT_OK(dt_model_init(ms, 7));
  size_t np = dt_model_nparams(mb);
  assert_memory_equal(dt_model_params(mb), dt_model_params(ms), np * sizeof(float));
  float x[3 * 16];
  for (int i = 0; i < 3 * 16; i++) x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
  assert_null(dt_model_logits(mb));
  EXPECT_OK(dt_model_forward(mb, x, 3, NULL));
  EXPECT_OK(dt_model_forward(ms, x, 3, NULL));
  assert_memory_equal(dt_model_logits(mb), dt_model_logits(ms), 3 * 4 * sizeof(float));
  assert_true(dt_model_flops_per_sample(mb, 1) > dt_model_flops_per_sample(mb, 0));
  assert_true(dt_model_flops_per_sample(mb, 0) >= 2.0 * (16 * 16 + 16 * 4));
  dt_model_destroy(mb);
  dt_model_destroy(ms);
}

static void test_builder_errors(void **st) {
  (void)st;
  dt_model_builder *b = (dt_model_builder *)&b;
  EXPECT_ERR(dt_model_builder_create(NULL, 1, 2, 2), DT_EINVAL, "out");
  EXPECT_ERR(dt_model_builder_create(&b, 1, 0, 2), DT_EINVAL, "shape");
  assert_null(b);
  EXPECT_OK(dt_model_builder_create(&b, 3, 8, 8));
  dt_model *m = (dt_model *)&m;
  EXPECT_ERR(dt_model_build(b, 4, &m), DT_EINVAL, "no layers");
  assert_null(m);
  EXPECT_OK(dt_model_add(b, "conv(4,3,pad=1)"));
  const char *before = "conv(4,3,pad=1)";
  EXPECT_ERR(dt_model_add(NULL, "relu"), DT_EINVAL, "builder");
  EXPECT_ERR(dt_model_add(b, NULL), DT_EINVAL, "layer is NULL");
  EXPECT_ERR(dt_model_add(b, ""), DT_EINVAL, "exactly one");
  EXPECT_ERR(dt_model_add(b, "relu relu"), DT_EINVAL, "exactly one");
  EXPECT_ERR(dt_model_add(b, "softplus"), DT_EINVAL, "softplus");
  EXPECT_ERR(dt_model_add(b, "maxpool(9)"), DT_EINVAL, "maxpool(9)"); /* larger than 8x8 */
  EXPECT_ERR(dt_model_add(b, "linear(10"), DT_EINVAL, "linear(10");
  /* every refusal left the builder as it was */
  assert_string_equal(dt_model_builder_spec(b), before);
  EXPECT_OK(dt_model_add(b, "relu"));
  EXPECT_OK(dt_model_add(b, "flatten"));
  EXPECT_ERR(dt_model_add(b, "conv(2,3)"), DT_EINVAL, "conv(2,3)"); /* flat input */
  EXPECT_OK(dt_model_add(b, "linear(10)"));
  EXPECT_ERR(dt_model_build(NULL, 4, &m), DT_EINVAL, "builder");
  EXPECT_ERR(dt_model_build(b, 4, NULL), DT_EINVAL, "out");
  EXPECT_ERR(dt_model_build(b, 0, &m), DT_EINVAL, "max_batch");
  assert_null(m);
  EXPECT_OK(dt_model_build(b, 4, &m));
  assert_int_equal(dt_model_out_dim(m), 10);
  assert_null(dt_model_builder_spec(NULL));
  dt_model_destroy(m);
  dt_model_builder_destroy(b);
  dt_model_builder_destroy(NULL);
}

static void test_step_errors(void **st) {
  (void)st;
  dt_model *m = NULL;
  EXPECT_OK(dt_model_create(&m, MLP, 1, 4, 4, 4));
  EXPECT_OK(dt_model_init(m, 1));
  float x[4 * 16] = {0};
  int32_t y[4] = {0, 1, 2, 3};
  float loss = -1.0f;
  int nc = -1;
  EXPECT_ERR(dt_model_backward(m, y, 4, &loss, &nc, NULL, NULL), DT_EINVAL, "no forward");
  EXPECT_ERR(dt_model_loss(m, y, 4, &loss, &nc), DT_EINVAL, "no forward");
  EXPECT_ERR(dt_model_forward(NULL, x, 4, NULL), DT_EINVAL, "model is NULL");
  EXPECT_ERR(dt_model_forward(m, NULL, 4, NULL), DT_EINVAL, "x is NULL");
  EXPECT_ERR(dt_model_forward(m, x, 5, NULL), DT_EINVAL, "batch 5");
  EXPECT_ERR(dt_model_forward(m, x, 0, NULL), DT_EINVAL, "batch 0");
  dt_step_ctx ctx = DT_STEP_CTX_INIT;
  ctx.train = 1;
  EXPECT_OK(dt_model_forward(m, x, 4, &ctx));
  size_t np = dt_model_nparams(m);
  float *g = dt_model_grads(m);
  for (size_t i = 0; i < np; i++) g[i] = 42.0f;
  EXPECT_ERR(dt_model_backward(NULL, y, 4, &loss, &nc, NULL, NULL), DT_EINVAL, "model is NULL");
  EXPECT_ERR(dt_model_backward(m, NULL, 4, &loss, &nc, NULL, NULL), DT_EINVAL, "labels");
  EXPECT_ERR(dt_model_backward(m, y, 3, &loss, &nc, NULL, NULL), DT_EINVAL, "batch 3");
  int32_t bad[4] = {0, 1, 4, 3};
  EXPECT_ERR(dt_model_backward(m, bad, 4, &loss, &nc, NULL, NULL), DT_EINVAL, "labels[2] = 4");
  bad[2] = -1;
  EXPECT_ERR(dt_model_backward(m, bad, 4, &loss, &nc, NULL, NULL), DT_EINVAL, "labels[2] = -1");
  EXPECT_ERR(dt_model_loss(m, bad, 4, &loss, &nc), DT_EINVAL, "labels[2]");
  EXPECT_ERR(dt_model_loss(NULL, y, 4, &loss, &nc), DT_EINVAL, "model is NULL");
  /* nothing was written by the failed calls */
  assert_true(loss == -1.0f);
  assert_int_equal(nc, -1);
  for (size_t i = 0; i < np; i++) assert_true(g[i] == 42.0f);
  /* and the good call still works after them */
  EXPECT_OK(dt_model_backward(m, y, 4, &loss, &nc, NULL, NULL));
  assert_true(isfinite(loss) && loss > 0.0f);
  assert_true(nc >= 0 && nc <= 4);
  assert_true(g[0] != 42.0f);
  EXPECT_OK(dt_model_backward(m, y, 4, NULL, NULL, NULL, NULL)); /* outputs optional */
  dt_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_builder_matches_spec),
      cmocka_unit_test(test_builder_errors),
      cmocka_unit_test(test_step_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

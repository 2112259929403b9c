/*
 * test_model_spec.c — the model spec parser and shape inference through
 * dt_model_create: shapes, parameter layout (forward order, weight then
 * bias, contiguous) and sizes of the MLP and CNN, arguments, aliases and
 * whitespace, and every error: DT_EINVAL, no model, and a message naming the
 * layer number, its token and the problem.
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

static const char *CNN =
    "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1,stride=1) relu maxpool(2) flatten "
    "linear(128) relu linear(10)";

static dt_model *make(const char *spec, int c, int h, int w) {
  dt_model *m = NULL;
  int rc = dt_model_create(&m, spec, c, h, w, 4);
  if (rc != DT_OK) fail_msg("'%s': %s", spec, dt_errmsg());
  return m;
}

static void shape(const dt_layer_info *l, int c, int h, int w) {
  assert_int_equal(l->out_c, c);
  assert_int_equal(l->out_h, h);
  assert_int_equal(l->out_w, w);
}

static void test_cnn_shapes(void **st) {
  (void)st;
  dt_model *m = make(CNN, 1, 28, 28);
  assert_int_equal(dt_model_nlayers(m), 10);
  static const int want[10][3] = {{32, 28, 28}, {32, 28, 28}, {32, 14, 14}, {64, 14, 14},
                                  {64, 14, 14}, {64, 7, 7},   {3136, 1, 1}, {128, 1, 1},
                                  {128, 1, 1},  {10, 1, 1}};
  static const char *names[10] = {"conv", "relu",    "maxpool", "conv", "relu",
                                  "maxpool", "flatten", "linear", "relu", "linear"};
  for (int i = 0; i < 10; i++) {
    const dt_layer_info *l = dt_model_layer(m, i);
    shape(l, want[i][0], want[i][1], want[i][2]);
    assert_string_equal(l->name, names[i]);
    if (i) { /* each layer's input is the previous output */
      const dt_layer_info *p = dt_model_layer(m, i - 1);
      assert_int_equal(l->in_c * l->in_h * l->in_w, p->out_c * p->out_h * p->out_w);
    }
  }
  assert_null(dt_model_layer(m, 10));
  assert_null(dt_model_layer(m, -1));
  /* PyTorch's parameter count and state_dict layout. */
  assert_int_equal(dt_model_nparams(m), 320 + 18496 + 401536 + 1290);
  assert_int_equal(dt_model_layer(m, 0)->param_off, 0);
  assert_int_equal(dt_model_layer(m, 0)->nparams, 32 * 9 + 32);
  assert_int_equal(dt_model_layer(m, 3)->param_off, 320);
  assert_int_equal(dt_model_layer(m, 7)->param_off, 320 + 18496);
  assert_int_equal(dt_model_layer(m, 9)->param_off, 320 + 18496 + 401536);
  assert_int_equal(dt_model_nbufs(m), 0);
  assert_int_equal(dt_model_in_dim(m), 784);
  assert_int_equal(dt_model_out_dim(m), 10);
  double f = 2.0 * (9 * 32 * 784 + 288 * 64 * 196 + 3136 * 128 + 1280);
  assert_true(dt_model_flops_per_sample(m, 0) >= f);
  assert_true(dt_model_flops_per_sample(m, 0) < f * 1.05);
  assert_true(dt_model_flops_per_sample(m, 1) > 2.5 * f);
  assert_true(dt_model_params(m) != NULL && dt_model_grads(m) != NULL);
  dt_model_destroy(m);
  dt_model_destroy(NULL);
}

static void test_mlp_and_implicit_flatten(void **st) {
  (void)st;
  dt_model *m = make("flatten linear(256) relu linear(128) relu linear(10)", 1, 28, 28);
  assert_int_equal(dt_model_nparams(m), 200960 + 32896 + 1290);
  dt_model_destroy(m);
  /* linear on a (C,H,W) input treats it as C*H*W features. */
  m = make("linear(10)", 1, 28, 28);
  assert_int_equal(dt_model_nparams(m), 7850);
  dt_model_destroy(m);
  /* A flat input given as (784,1,1). */
  m = make("linear(256) relu linear(10)", 784, 1, 1);
  assert_int_equal(dt_model_nparams(m), 200960 + 2570);
  dt_model_destroy(m);
}

static void test_args_aliases_spaces(void **st) {
  (void)st;
  dt_model *m = make("  conv2d( 8 , 3 , padding = 1 )\trelu\n maxpool2d(3, stride=2) "
                     "avgpool(2,1) conv(4,3,2,1) fc(5) ",
                     2, 17, 17);
  shape(dt_model_layer(m, 0), 8, 17, 17);
  shape(dt_model_layer(m, 2), 8, 8, 8);  /* (17-3)/2+1 */
  shape(dt_model_layer(m, 3), 8, 7, 7);  /* stride 1 given positionally */
  shape(dt_model_layer(m, 4), 4, 4, 4);  /* (7+2-3)/2+1 */
  assert_int_equal(dt_model_layer(m, 5)->nparams, 64 * 5 + 5);
  dt_model_destroy(m);
  m = make("maxpool(2) avgpool(3) relu() gelu dropout dropout(0.25) dropout(p=0)", 3, 13, 13);
  shape(dt_model_layer(m, 0), 3, 6, 6); /* stride defaults to k */
  shape(dt_model_layer(m, 1), 3, 2, 2);
  dt_model_destroy(m);
  /* batchnorm: 2d over channels, 1d over features; layernorm over all. */
  m = make("batchnorm(eps=1e-3, momentum=0.2) layernorm flatten batchnorm layernorm(1e-6)", 3, 4,
           5);
  assert_int_equal(dt_model_layer(m, 0)->nparams, 6);
  assert_int_equal(dt_model_layer(m, 0)->nbufs, 6);
  assert_int_equal(dt_model_layer(m, 1)->nparams, 120);
  assert_int_equal(dt_model_layer(m, 3)->nparams, 120);
  assert_int_equal(dt_model_layer(m, 3)->nbufs, 120);
  assert_int_equal(dt_model_layer(m, 3)->buf_off, 6);
  assert_int_equal(dt_model_nbufs(m), 126);
  assert_int_equal(dt_model_nparams(m), 6 + 120 + 120 + 120);
  dt_model_destroy(m);
}

typedef struct {
  const char *spec;
  int c, h, w;
  const char *want[3]; /* substrings of the message */
} bad_case;

static const bad_case BAD[] = {
    {"conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu flatten linear(0)", 1, 28, 28,
     {"layer 7 'linear(0)': out features must be >= 1"}},
    {"linear(10) conv3d(3)", 1, 28, 28, {"layer 2 'conv3d(3)'", "unknown layer 'conv3d'"}},
    {"flatten conv(8,3)", 1, 28, 28, {"layer 2 'conv(8,3)'", "expects a (C,H,W) input", "784"}},
    {"linear(10) maxpool(2)", 1, 28, 28, {"layer 2 'maxpool(2)'", "flat vector"}},
    {"flatten avgpool(2)", 1, 28, 28, {"layer 2 'avgpool(2)'", "flat vector"}},
    {"conv(8,30)", 1, 28, 28, {"layer 1 'conv(8,30)'", "kernel 30 is larger than the padded input 28x28"}},
    {"conv(8,30,pad=1)", 1, 27, 28, {"layer 1", "kernel 30 is larger than the padded input 29x30"}},
    {"maxpool(2) maxpool(2) maxpool(2) maxpool(2) maxpool(2)", 1, 28, 28,
     {"layer 5 'maxpool(2)'", "larger than the input 1x1", "empty"}},
    {"avgpool(5)", 1, 4, 9, {"layer 1 'avgpool(5)'", "input 4x9"}},
    {"linear(10", 1, 28, 28, {"layer 1 'linear(10'", "missing ')'"}},
    {"linear(10(2))", 1, 28, 28, {"layer 1", "unexpected '('"}},
    {"relu linear", 1, 28, 28, {"layer 2 'linear'", "missing argument 'out'"}},
    {"conv(8)", 1, 28, 28, {"layer 1 'conv(8)'", "missing argument 'k'"}},
    {"linear(abc)", 1, 28, 28, {"layer 1 'linear(abc)'", "'out' must be an integer, got 'abc'"}},
    {"linear(1.5)", 1, 28, 28, {"must be an integer"}},
    {"linear(10,20)", 1, 28, 28, {"layer 1 'linear(10,20)'", "too many arguments"}},
    {"conv(8,3,3,1,1)", 1, 28, 28, {"too many arguments"}},
    {"conv(8,3,foo=1)", 1, 28, 28, {"unknown argument 'foo' for 'conv'"}},
    {"conv(8,3,pad=1,2)", 1, 28, 28, {"positional argument after key=value"}},
    {"conv(8,3,stride=1,stride=2)", 1, 28, 28, {"argument 'stride' given twice"}},
    {"conv(8,3,stride=0)", 1, 28, 28, {"layer 1 'conv(8,3,stride=0)': stride must be >= 1"}},
    {"conv(8,3,pad=-1)", 1, 28, 28, {"padding must be >= 0"}},
    {"conv(0,3)", 1, 28, 28, {"out channels must be >= 1"}},
    {"conv(8,0)", 1, 28, 28, {"kernel size must be >= 1"}},
    {"maxpool(2,stride=0)", 1, 28, 28, {"stride must be >= 1"}},
    {"maxpool(0)", 1, 28, 28, {"kernel size must be >= 1"}},
    {"dropout(1.0)", 1, 28, 28, {"layer 1 'dropout(1.0)': p must be in [0, 1)"}},
    {"dropout(-0.1)", 1, 28, 28, {"p must be in [0, 1)"}},
    {"dropout(nan)", 1, 28, 28, {"'p' must be a number, got 'nan'"}},
    {"dropout(inf)", 1, 28, 28, {"must be a number"}},
    {"dropout(0.5x)", 1, 28, 28, {"must be a number"}},
    {"relu(3)", 1, 28, 28, {"layer 1 'relu(3)'", "'relu' takes no arguments"}},
    {"flatten(x=1)", 1, 28, 28, {"takes no arguments"}},
    {"batchnorm(eps=0)", 1, 28, 28, {"eps must be > 0"}},
    {"batchnorm(momentum=2)", 1, 28, 28, {"momentum must be in [0, 1]"}},
    {"layernorm(eps=-1)", 1, 28, 28, {"eps must be > 0"}},
    {"relu embedding(10,4)", 1, 1, 2, {"layer 2", "an embedding must be the first layer"}},
    {"embedding(0,4)", 1, 1, 2, {"rows and dim must be >= 1"}},
    {"embedding(10,4,std=0)", 1, 1, 2, {"std must be > 0"}},
    {"embedding(10,3) dot", 1, 1, 3, {"layer 2 'dot'", "even number of input features"}},
    {"linear(10)x", 1, 28, 28, {"layer 1 'linear(10)x'", "unexpected text"}},
    {"relu,linear(2)", 1, 28, 28, {"layer 1 'relu,linear(2)'", "unexpected text"}},
    {"relu (3)", 1, 28, 28, {"takes no arguments"}},
    {"relu (3", 1, 28, 28, {"missing ')'"}},
    {"(3)", 1, 28, 28, {"layer 1 '(3)'", "expected a layer name"}},
    {"relu )", 1, 28, 28, {"layer 2 ')'", "expected a layer name"}},
    {"linear(99999999999)", 1, 28, 28, {"'out' = 99999999999 is out of range"}},
    {"linear(1,,)", 1, 28, 28, {"empty argument"}},
    {"linear()", 1, 28, 28, {"missing argument 'out'"}},
    {"linear(out=)", 1, 28, 28, {"empty value for 'out'"}},
    {"linear(100000) linear(100000)", 1, 28, 28, {"layer 2 'linear(100000)'", "weights are too many"}},
    {"conv(16777216,16,pad=16777216)", 1, 28, 28, {"layer 1", "too many"}},
    {"", 1, 28, 28, {"model spec is empty"}},
    {" \t\n ", 1, 28, 28, {"model spec is empty"}},
    {"relu", 0, 28, 28, {"input shape 0x28x28"}},
    {"relu", 1, -1, 28, {"input shape"}},
};

static void expect_bad(const char *spec, int c, int h, int w, int max_batch,
                       const char *const want[3]) {
  dt_model *m = (dt_model *)&m; /* must be reset to NULL */
  dt__clearerr();
  int rc = dt_model_create(&m, spec, c, h, w, max_batch);
  if (rc != DT_EINVAL) fail_msg("'%s': rc %d, want DT_EINVAL", spec ? spec : "(null)", rc);
  assert_null(m);
  for (int k = 0; k < 3 && want[k]; k++)
    if (!strstr(dt_errmsg(), want[k]))
      fail_msg("'%s': message \"%s\" lacks \"%s\"", spec ? spec : "(null)", dt_errmsg(), want[k]);
}

static void test_errors(void **st) {
  (void)st;
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++)
    expect_bad(BAD[i].spec, BAD[i].c, BAD[i].h, BAD[i].w, 4, BAD[i].want);
  const char *nul[3] = {"spec is NULL"};
  expect_bad(NULL, 1, 28, 28, 4, nul);
  const char *mb[3] = {"max_batch 0"};
  expect_bad("relu", 1, 28, 28, 0, mb);
}

static void test_long_and_binary_tokens(void **st) {
  (void)st;
  /* A token longer than the message buffer is cut with "...", and bytes
   * that are not printable are shown as '?'. */
  char spec[400] = "relu weird_";
  for (int i = 0; i < 300; i++) strcat(spec, "x");
  const char *w1[3] = {"layer 2 'weird_xxx", "...'", "unknown layer"};
  expect_bad(spec, 1, 28, 28, 4, w1);
  const char bin[] = {'r', 'e', (char)0x01, 'l', (char)0xff, 'u', 0};
  const char *w2[3] = {"layer 1 're?l?u'", "unexpected text"};
  expect_bad(bin, 1, 28, 28, 4, w2);
  /* Too many layers. */
  char *many = malloc(300 * 5 + 1);
  many[0] = 0;
  for (int i = 0; i < 300; i++) strcat(many, "relu ");
  const char *w3[3] = {"layer 257 'relu'", "too many layers"};
  expect_bad(many, 1, 2, 2, 4, w3);
  free(many);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cnn_shapes),
      cmocka_unit_test(test_mlp_and_implicit_flatten),
      cmocka_unit_test(test_args_aliases_spaces),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_long_and_binary_tokens),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

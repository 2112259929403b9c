/*
 * test_config.c — the INI config parser: defaults, every key type, every
 * error kind (message names file, line and key; return code), --set
 * overrides, cross-key validation and the canonical dump round trip.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cli/config.h"
#include "core/core.h"

static int parse(dt_config *c, const char *text) {
  dt_config_init(c);
  return dt_config_parse(c, text, strlen(text), "t.ini");
}

/* Parsing `text` fails with DT_EINVAL and a message containing each of the
 * NULL-terminated fragments. */
static void expect_error(const char *text, ...) {
  dt_config c;
  int rc = parse(&c, text);
  if (rc != DT_EINVAL) fail_msg("expected DT_EINVAL for:\n%s\ngot %d", text, rc);
  va_list ap;
  va_start(ap, text);
  for (const char *frag; (frag = va_arg(ap, const char *));)
    if (!strstr(dt_errmsg(), frag)) fail_msg("message '%s' lacks '%s'", dt_errmsg(), frag);
  va_end(ap);
  assert_null(strchr(dt_errmsg(), '\n'));
}

static void test_defaults(void **state) {
  (void)state;
  dt_config c;
  dt_config_init(&c);
  assert_string_equal(c.run.layers, DT_DEFAULT_LAYERS);
  assert_int_equal(c.run.format, DT_FMT_IDX);
  assert_int_equal(c.run.optim.kind, DT_OPT_SGD);
  assert_true(c.run.optim.lr > 0);
  assert_int_equal(c.run.epochs, 15);
  assert_int_equal(c.run.batch, 64);
  assert_int_equal(c.run.workers, 1);
  assert_int_equal(c.run.sched.kind, DT_SCHED_COSINE);
  assert_non_null(strstr(c.run.train_images, "fashion-mnist/train-images"));
  assert_int_equal(dt_config_validate(&c), DT_OK);
}

static void test_full_file(void **state) {
  (void)state;
  dt_config c;
  const char *text =
      "; a comment\n"
      "# another\n"
      "[model]\n"
      "layers = flatten linear(256) relu\n"
      "   linear(10)\n"
      "[data]\n"
      "format = npy\n"
      "train_images = /a/x.npy\n"
      "train_labels = /a/y.npy\n"
      "test_images = /b/x.npy\n"
      "test_labels = /b/y.npy\n"
      "normalize = false\n"
      "shuffle = no\n"
      "limit_train = 1000\n"
      "limit_test = 200\n"
      "shape = 1, 28, 28\n"
      "[optim]\n"
      "name = adamw\n"
      "lr = 1e-3 ; inline comment\n"
      "beta1 = 0.8\n"
      "beta2 = 0.99\n"
      "eps = 1e-7\n"
      "weight_decay = 0.01\n"
      "[train]\n"
      "epochs = 3\n"
      "batch = 32\n"
      "seed = 18446744073709551615\n"
      "eval_every = 2\n"
      "[schedule]\n"
      "kind = step\n"
      "warmup_steps = 10\n"
      "step_size = 100\n"
      "gamma = 0.5\n"
      "min_lr = 0\n"
      "[dist]\n"
      "workers = 1\n";
  assert_int_equal(parse(&c, text), DT_OK);
  assert_string_equal(c.run.layers, "flatten linear(256) relu linear(10)");
  assert_int_equal(c.run.format, DT_FMT_NPY);
  assert_string_equal(c.run.test_labels, "/b/y.npy");
  assert_int_equal(c.run.normalize, 0);
  assert_int_equal(c.run.shuffle, 0);
  assert_int_equal(c.run.limit_train, 1000);
  assert_int_equal(c.run.limit_test, 200);
  assert_int_equal(c.run.shape[0], 1);
  assert_int_equal(c.run.shape[2], 28);
  assert_int_equal(c.run.optim.kind, DT_OPT_ADAMW);
  assert_float_equal(c.run.optim.lr, 1e-3f, 1e-9);
  assert_float_equal(c.run.optim.beta1, 0.8f, 1e-7);
  assert_float_equal(c.run.optim.eps, 1e-7f, 1e-12);
  assert_int_equal(c.run.epochs, 3);
  assert_int_equal(c.run.batch, 32);
  assert_true(c.run.seed == UINT64_MAX);
  assert_int_equal(c.run.eval_every, 2);
  assert_int_equal(c.run.sched.kind, DT_SCHED_STEP);
  assert_int_equal(c.run.sched.warmup_steps, 10);
  assert_int_equal(c.run.sched.step_size, 100);
  assert_int_equal(c.where[3], 7); /* data.format (after model.layers, model.stages, model.init) */
  assert_int_equal(dt_config_validate(&c), DT_OK);
}

static void test_unknown_section_and_key(void **state) {
  (void)state;
  expect_error("[train]\nepochs = 2\n[bogus]\nx = 1\n", "t.ini:3:", "unknown section [bogus]", NULL);
  expect_error("[train]\n[empty]\n", "t.ini:2:", "unknown section [empty]", NULL);
  expect_error("[optim]\nlr = 0.1\nlearning_rate = 0.1\n", "t.ini:3:",
               "unknown key 'learning_rate' in [optim]", "momentum", NULL);
  expect_error("epochs = 2\n", "t.ini:1:", "'epochs' outside any [section]", NULL);
}

static void test_wrong_type(void **state) {
  (void)state;
  expect_error("[optim]\nlr = abc\n", "t.ini:2:", "optim.lr", "not a number", "'abc'", NULL);
  expect_error("[optim]\nlr = 0.1x\n", "t.ini:2:", "optim.lr", "not a number", NULL);
  expect_error("[optim]\nlr = nan\n", "optim.lr", "not a number", NULL);
  expect_error("[optim]\nlr =\n", "optim.lr", "not a number", NULL);
  expect_error("[train]\nbatch = 6.5\n", "t.ini:2:", "train.batch", "not an integer", NULL);
  expect_error("[train]\nseed = -1\n", "train.seed", "not an unsigned integer", NULL);
  expect_error("[train]\nepochs = 99999999999999999999\n", "train.epochs", "not an integer", NULL);
  expect_error("[data]\nshuffle = maybe\n", "t.ini:2:", "data.shuffle", "not a boolean", NULL);
  expect_error("[data]\nformat = hdf5\n", "data.format", "unknown value 'hdf5'", "idx", NULL);
  expect_error("[optim]\nname = rmsprop\n", "optim.name", "sgd", "adamw", NULL);
  expect_error("[schedule]\nkind = linear\n", "schedule.kind", "cosine", NULL);
  expect_error("[data]\nshape = 1,28\n", "data.shape", "C,H,W", NULL);
  expect_error("[data]\nshape = 1,28,0\n", "data.shape", NULL);
  expect_error("[model]\nlayers =\n", "t.ini:2:", "model.layers", "empty", NULL);
}

static void test_out_of_range(void **state) {
  (void)state;
  expect_error("[optim]\nlr = 0\n", "t.ini:2:", "optim.lr", "must be", "got 0", NULL);
  expect_error("[optim]\nlr = -0.5\n", "optim.lr", "must be", NULL);
  expect_error("\n\n[train]\nbatch = 0\n", "t.ini:4:", "train.batch", "must be", NULL);
  expect_error("[train]\nepochs = 0\n", "t.ini:2:", "train.epochs", "must be", NULL);
  expect_error("[train]\neval_every = 0\n", "train.eval_every", NULL);
  expect_error("[optim]\nmomentum = 1\n", "optim.momentum", "[0, 1)", NULL);
  expect_error("[optim]\nbeta2 = 1.5\n", "optim.beta2", NULL);
  expect_error("[optim]\neps = 0\n", "optim.eps", NULL);
  expect_error("[optim]\nweight_decay = -1\n", "optim.weight_decay", NULL);
  expect_error("[schedule]\nstep_size = 0\n", "schedule.step_size", NULL);
  expect_error("[schedule]\ngamma = 0\n", "schedule.gamma", NULL);
  expect_error("[schedule]\nwarmup_steps = -1\n", "schedule.warmup_steps", NULL);
  expect_error("[data]\nlimit_train = -5\n", "data.limit_train", NULL);
  expect_error("[dist]\nworkers = 0\n", "dist.workers", NULL);
}

static void test_malformed(void **state) {
  (void)state;
  expect_error("[train]\nepochs 5\n", "t.ini:2:", "malformed line", NULL);
  expect_error("[train\nepochs = 5\n", "t.ini:1:", "malformed", NULL);
  expect_error("[train]\nepochs = 5\nepochs = 6\n", "t.ini:3:", "train.epochs", "given twice",
               "line 2", NULL);
  expect_error("[train]\nepochs = 5\n  batch = 3\n", "t.ini:3:", "indented", NULL);
  /* an over-long line */
  char big[600];
  memset(big, 'a', sizeof big);
  memcpy(big, "[data]\ntrain_images = ", 22);
  big[sizeof big - 2] = '\n';
  big[sizeof big - 1] = '\0';
  expect_error(big, "t.ini:2:", "line too long", NULL);
  /* a NUL byte inside the text */
  dt_config c;
  dt_config_init(&c);
  static const char nul[] = "[train]\nepochs = 2\0\n";
  assert_int_equal(dt_config_parse(&c, nul, sizeof nul - 1, "n.ini"), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "n.ini:2: NUL byte"));
}

static void test_empty_and_crlf(void **state) {
  (void)state;
  dt_config c;
  assert_int_equal(parse(&c, ""), DT_OK);
  assert_int_equal(c.run.epochs, 15);
  assert_int_equal(parse(&c, "[train]\r\nepochs = 4\r\n[optim]\r\nlr = 0.2\r\n"), DT_OK);
  assert_int_equal(c.run.epochs, 4);
  assert_float_equal(c.run.optim.lr, 0.2f, 1e-7);
  /* a last line without a newline */
  assert_int_equal(parse(&c, "[train]\nbatch = 7"), DT_OK);
  assert_int_equal(c.run.batch, 7);
}

/* An indented line right after a section header is a key of its own (as
 * libinih reads it), not a continuation of the default spec (fuzzer find). */
static void test_indented_first_key(void **state) {
  (void)state;
  dt_config c;
  assert_int_equal(parse(&c, "[model]\n\t\tlayers = linear(10)\n"), DT_OK);
  assert_string_equal(c.run.layers, "linear(10)");
  assert_int_equal(parse(&c, "[model]\n\t\tlayers =; fa\n"), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "t.ini:2"));
  /* a real continuation still continues */
  assert_int_equal(parse(&c, "[model]\nlayers = flatten\n  linear(10)\n"), DT_OK);
  assert_string_equal(c.run.layers, "flatten linear(10)");
}

static void test_set(void **state) {
  (void)state;
  dt_config c;
  dt_config_init(&c);
  assert_int_equal(dt_config_set(&c, "optim.lr=0.5"), DT_OK);
  assert_float_equal(c.run.optim.lr, 0.5f, 1e-7);
  assert_int_equal(dt_config_set(&c, "model.layers= flatten linear(10) "), DT_OK);
  assert_string_equal(c.run.layers, "flatten linear(10)");
  assert_int_equal(dt_config_set(&c, "model.layers=conv(8,3,pad=1) relu"), DT_OK);
  assert_string_equal(c.run.layers, "conv(8,3,pad=1) relu");
  assert_int_equal(dt_config_set(&c, "optim.lr=abc"), DT_EINVAL);
  assert_string_equal(dt_errmsg(), "--set optim.lr: not a number: 'abc'");
  assert_int_equal(dt_config_set(&c, "train.batch=0"), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "--set train.batch: must be"));
  assert_int_equal(dt_config_set(&c, "optim.foo=1"), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "--set optim.foo: unknown key 'foo'"));
  assert_int_equal(dt_config_set(&c, "nope.lr=1"), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "unknown section [nope]"));
  assert_int_equal(dt_config_set(&c, "lr=1"), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "expected section.key=value"));
  assert_int_equal(dt_config_set(&c, "optim.lr"), DT_EINVAL);
  assert_int_equal(dt_config_set(&c, ".lr=1"), DT_EINVAL);
  assert_int_equal(dt_config_set(&c, "optim.=1"), DT_EINVAL);
}

static void test_validate(void **state) {
  (void)state;
  dt_config c;
  assert_int_equal(parse(&c, "[optim]\nmomentum = 0\nnesterov = true\n"), DT_OK);
  assert_int_equal(dt_config_validate(&c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "t.ini:3: optim.nesterov"));
  assert_int_equal(parse(&c, "[optim]\nlr = 0.01\n[schedule]\nmin_lr = 0.1\n"), DT_OK);
  assert_int_equal(dt_config_validate(&c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "t.ini:4: schedule.min_lr"));
  assert_int_equal(parse(&c, "[data]\ntest_labels =\n"), DT_OK);
  assert_int_equal(dt_config_validate(&c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "t.ini:2: data.test_labels: empty path"));
  /* csv needs no label files */
  assert_int_equal(parse(&c, "[data]\nformat = csv\ntrain_labels =\ntest_labels =\n"), DT_OK);
  assert_int_equal(dt_config_validate(&c), DT_OK);
  /* a --set is named as such */
  dt_config_init(&c);
  assert_int_equal(dt_config_set(&c, "data.train_images="), DT_OK);
  assert_int_equal(dt_config_validate(&c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "--set data.train_images"));
}

static void test_load_file(void **state) {
  (void)state;
  dt_config c;
  dt_config_init(&c);
  assert_int_equal(dt_config_load(&c, "/nonexistent/dir/x.ini"), DT_ENOENT);
  assert_non_null(strstr(dt_errmsg(), "/nonexistent/dir/x.ini"));
  char path[] = "/tmp/dt_test_config_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("[train]\nepochs = 3\n[optim]\nlr = zero\n", f);
  fclose(f);
  assert_int_equal(dt_config_load(&c, path), DT_EINVAL);
  char want[128];
  snprintf(want, sizeof want, "%s:4: optim.lr: not a number", path);
  assert_non_null(strstr(dt_errmsg(), want));
  remove(path);
  /* the examples parse and validate */
  const char *ex[] = {DT_SOURCE_DIR "/examples/fashion_mlp.ini", DT_SOURCE_DIR "/examples/fashion_cnn.ini"};
  for (int i = 0; i < 2; i++) {
    dt_config_init(&c);
    assert_int_equal(dt_config_load(&c, ex[i]), DT_OK);
    assert_int_equal(dt_config_validate(&c), DT_OK);
  }
}

static void test_dump_roundtrip(void **state) {
  (void)state;
  dt_config a, b;
  assert_int_equal(parse(&a, "[optim]\nlr = 0.1\nname = adamw\n[data]\nshape = 1,28,28\n"), DT_OK);
  size_t need = dt_config_dump(&a, NULL, 0);
  char *t1 = malloc(need + 1), *t2 = malloc(need + 1);
  assert_int_equal(dt_config_dump(&a, t1, need + 1), need);
  assert_int_equal(parse(&b, t1), DT_OK);
  assert_int_equal(dt_config_dump(&b, t2, need + 1), need);
  assert_string_equal(t1, t2);
  assert_non_null(strstr(t1, "[optim]\nname = adamw\nlr = 0.1\n"));
  assert_true(memcmp(&a.run, &b.run, sizeof a.run) == 0);
  free(t1);
  free(t2);
  /* a long spec is wrapped onto continuation lines and parses back */
  dt_config_init(&a);
  char spec[1200] = "flatten";
  while (strlen(spec) < 1000) strcat(spec, " linear(128) relu");
  char set[1300];
  snprintf(set, sizeof set, "model.layers=%s", spec);
  assert_int_equal(dt_config_set(&a, set), DT_OK);
  need = dt_config_dump(&a, NULL, 0);
  t1 = malloc(need + 1);
  dt_config_dump(&a, t1, need + 1);
  assert_int_equal(parse(&b, t1), DT_OK);
  assert_string_equal(b.run.layers, spec);
  free(t1);
  /* floats are range-checked as stored */
  expect_error("[optim]\nlr = 1e-50\n", "optim.lr", "must be", NULL);
  expect_error("[optim]\nlr = 1e39\n", "optim.lr", "out of float range", NULL);
  /* every key has a name and default */
  char kb[4096];
  int n = 0;
  while (dt_config_key_name(n, kb, sizeof kb)) n++;
  assert_true(n >= 30);
  assert_non_null(dt_config_key_name(0, kb, sizeof kb));
  assert_non_null(strstr(kb, "model.layers = conv(32,3,pad=1)"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),          cmocka_unit_test(test_full_file),
      cmocka_unit_test(test_unknown_section_and_key), cmocka_unit_test(test_wrong_type),
      cmocka_unit_test(test_out_of_range),      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_empty_and_crlf),    cmocka_unit_test(test_indented_first_key), cmocka_unit_test(test_set),
      cmocka_unit_test(test_validate),          cmocka_unit_test(test_load_file),
      cmocka_unit_test(test_dump_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

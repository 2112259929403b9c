/*
 * test_engine.c — the training loop on a small synthetic CSV data set
 * (three Gaussian-free, deterministic clusters in 6 dimensions): it learns
 * (accuracy far above chance), writes events.jsonl and an atomic
 * summary.json, is bitwise reproducible, reports bad input before writing
 * anything, and its helpers (SHA-256, mkdir -p, atomic writes) behave.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/core.h"
#include "engine/engine.h"
#include "csv_blobs.h"

static char tmpdir[256];

static void path(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmpdir, name); }

static int rm_rf(const char *p) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  return system(cmd);
}

/* n samples of 3 classes: class k sits at +2 on features 2k and 2k+1
 * (csv_blobs.h, jitter 1). */
static void write_csv(const char *file, int n, uint64_t seed) {
  assert_int_equal(write_csv_blobs(file, n, seed, 2.0f, 1.0f), 0);
}

static void base_cfg(dt_run_cfg *c) {
  dt_run_cfg_defaults(c);
  snprintf(c->layers, sizeof c->layers, "linear(16) relu linear(3)");
  c->format = DT_FMT_CSV;
  path(c->train_images, sizeof c->train_images, "train.csv");
  path(c->test_images, sizeof c->test_images, "test.csv");
  c->train_labels[0] = c->test_labels[0] = '\0';
  c->label_col = 0;
  c->epochs = 3;
  c->batch = 16;
  c->optim.lr = 0.05f;
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_engine_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  char p[512];
  path(p, sizeof p, "train.csv");
  write_csv(p, 600, 1);
  path(p, sizeof p, "test.csv");
  write_csv(p, 150, 2);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return rm_rf(tmpdir) ? -1 : 0;
}

static char *slurp(const char *file) {
  FILE *f = fopen(file, "rb");
  if (!f) return NULL;
  char *b = calloc(1, 1 << 16);
  size_t n = fread(b, 1, (1 << 16) - 1, f);
  b[n] = '\0';
  fclose(f);
  return b;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void test_trains_and_writes(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  c.eval_every = 2;
  dt_engine *e;
  assert_int_equal(dt_engine_create(&e, &c), DT_OK);
  assert_int_equal(dt_engine_train_samples(e), 600);
  assert_int_equal(dt_engine_test_samples(e), 150);
  char out[512], f[600];
  path(out, sizeof out, "run1/nested");
  dt_run_summary s;
  assert_int_equal(dt_engine_run(e, out, "[train]\nepochs = 3\n", NULL, &s), DT_OK);
  assert_true(s.test_accuracy > 0.9);
  assert_int_equal(s.epochs, 3);
  assert_int_equal(s.steps, 3 * 38); /* ceil(600/16) */
  assert_int_equal(s.train_samples, 1800);
  assert_true(s.train_seconds > 0);
  assert_true(s.samples_per_second > 0);
  assert_int_equal(s.workers, 1);
  assert_int_equal(s.params, 6 * 16 + 16 + 16 * 3 + 3);
  char h[65];
  dt_sha256_hex("[train]\nepochs = 3\n", strlen("[train]\nepochs = 3\n"), h);
  assert_string_equal(s.config_sha256, h);
  dt_sha256_hex(dt_model_params((dt_model *)dt_engine_model(e)), s.params * 4, h);
  assert_string_equal(s.params_sha256, h);
  dt_engine_destroy(e);

  snprintf(f, sizeof f, "%s/summary.json", out);
  char *sum = slurp(f);
  assert_non_null(sum);
  assert_non_null(strstr(sum, "\"params_sha256\":\t\""));
  assert_non_null(strstr(sum, s.params_sha256));
  assert_non_null(strstr(sum, "\"test_accuracy\":"));
  assert_non_null(strstr(sum, "\"samples_per_second\":"));
  free(sum);
  snprintf(f, sizeof f, "%s/summary.json.tmp", out);
  assert_int_not_equal(access(f, F_OK), 0);
  snprintf(f, sizeof f, "%s/events.jsonl", out);
  char *ev = slurp(f);
  assert_non_null(ev);
  assert_int_equal(count_lines(ev), 3);
  /* epoch 1 not evaluated (eval_every 2), epochs 2 and 3 are */
  assert_non_null(strstr(ev, "{\"epoch\":1,\"step\":38,"));
  char *l2 = strchr(ev, '\n') + 1;
  assert_true(strstr(ev, "\"test_accuracy\":null") < l2);
  assert_null(strstr(l2, "null"));
  free(ev);
  snprintf(f, sizeof f, "%s/config.ini", out);
  char *ci = slurp(f);
  assert_string_equal(ci, "[train]\nepochs = 3\n");
  free(ci);
}

static void hash_of_run(const dt_run_cfg *c, const char *name, char out[65]) {
  dt_engine *e;
  assert_int_equal(dt_engine_create(&e, c), DT_OK);
  char dir[512];
  path(dir, sizeof dir, name);
  dt_run_summary s;
  assert_int_equal(dt_engine_run(e, dir, NULL, NULL, &s), DT_OK);
  memcpy(out, s.params_sha256, 65);
  dt_engine_destroy(e);
}

static void test_deterministic(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  c.epochs = 2;
  char a[65], b[65], d[65];
  hash_of_run(&c, "det_a", a);
  hash_of_run(&c, "det_b", b);
  assert_string_equal(a, b);
  c.seed = 43;
  hash_of_run(&c, "det_c", d);
  assert_string_not_equal(a, d);
}

static int steps_seen, epochs_seen;
static void on_step(void *ud, const dt_progress *p) {
  (void)ud;
  steps_seen++;
  assert_int_equal(p->step_in_epoch, (p->step - 1) % p->steps_per_epoch + 1);
  assert_true(p->lr > 0);
}
static void on_epoch(void *ud, const dt_epoch_report *r) {
  (void)ud;
  epochs_seen++;
  assert_int_equal(r->epoch, epochs_seen);
  assert_true(r->evaluated);
}

static void test_hooks_and_adamw(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  c.optim.kind = DT_OPT_ADAMW;
  c.optim.lr = 0.01f;
  c.sched.kind = DT_SCHED_STEP;
  c.sched.step_size = 20;
  c.sched.warmup_steps = 5;
  dt_engine *e;
  assert_int_equal(dt_engine_create(&e, &c), DT_OK);
  dt_engine_hooks hk = {on_step, on_epoch, NULL};
  char dir[512];
  path(dir, sizeof dir, "hooks");
  dt_run_summary s;
  steps_seen = epochs_seen = 0;
  assert_int_equal(dt_engine_run(e, dir, NULL, &hk, &s), DT_OK);
  assert_int_equal(steps_seen, s.steps);
  assert_int_equal(epochs_seen, 3);
  assert_true(s.test_accuracy > 0.9);
  dt_engine_destroy(e);
}

static void test_bad_input(void **state) {
  (void)state;
  dt_run_cfg c;
  dt_engine *e = (dt_engine *)0x1;
  base_cfg(&c);
  path(c.train_images, sizeof c.train_images, "missing.csv");
  assert_int_equal(dt_engine_create(&e, &c), DT_ENOENT);
  assert_null(e);
  assert_non_null(strstr(dt_errmsg(), "data.train_images"));
  assert_non_null(strstr(dt_errmsg(), "missing.csv"));

  base_cfg(&c);
  snprintf(c.layers, sizeof c.layers, "linear(16) relu maxpool(2)");
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "model.layers: layer 3"));

  base_cfg(&c);
  snprintf(c.layers, sizeof c.layers, "linear(2)");
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "2 outputs but the data has 3 classes"));

  base_cfg(&c);
  c.shape[0] = 1, c.shape[1] = 2, c.shape[2] = 2;
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "data.shape 1,2,2"));

  base_cfg(&c);
  c.shape[0] = 1, c.shape[1] = 2, c.shape[2] = 3; /* 6 features as an image */
  snprintf(c.layers, sizeof c.layers, "conv(2,2) relu flatten linear(3)");
  assert_int_equal(dt_engine_create(&e, &c), DT_OK);
  dt_engine_destroy(e);

  base_cfg(&c);
  c.workers = 2; /* fine to create, but running needs a communicator */
  assert_int_equal(dt_engine_create(&e, &c), DT_OK);
  char odir[300];
  path(odir, sizeof odir, "no_comm");
  assert_int_equal(dt_engine_run(e, odir, NULL, NULL, NULL), DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "dist.workers = 2"));
  dt_engine_destroy(e);

  /* an output path that is a file fails at run time, naming it */
  base_cfg(&c);
  c.epochs = 1;
  assert_int_equal(dt_engine_create(&e, &c), DT_OK);
  char dir[512];
  path(dir, sizeof dir, "train.csv/sub");
  assert_int_equal(dt_engine_run(e, dir, NULL, NULL, NULL), DT_EIO);
  assert_non_null(strstr(dt_errmsg(), "train.csv"));
  dt_engine_destroy(e);
  dt_engine_destroy(NULL);
}

static void test_diverges(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  c.optim.lr = 1e5f;
  c.sched.kind = DT_SCHED_CONSTANT;
  dt_engine *e;
  assert_int_equal(dt_engine_create(&e, &c), DT_OK);
  char dir[512], f[600];
  path(dir, sizeof dir, "diverge");
  assert_int_equal(dt_engine_run(e, dir, NULL, NULL, NULL), DT_ERANGE);
  assert_non_null(strstr(dt_errmsg(), "diverged"));
  snprintf(f, sizeof f, "%s/summary.json", dir);
  assert_int_not_equal(access(f, F_OK), 0);
  dt_engine_destroy(e);
}

static void test_helpers(void **state) {
  (void)state;
  char h[65];
  dt_sha256_hex("abc", 3, h);
  assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  dt_sha256_hex("", 0, h);
  assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  char d[512], f[600];
  path(d, sizeof d, "a/b/c/");
  assert_int_equal(dt_mkdirs(d), DT_OK);
  assert_int_equal(dt_mkdirs(d), DT_OK);
  snprintf(f, sizeof f, "%sx.txt", d);
  assert_int_equal(dt_write_file_atomic(f, "hello", 5), DT_OK);
  assert_int_equal(dt_write_file_atomic(f, "bye", 3), DT_OK);
  char *t = slurp(f);
  assert_string_equal(t, "bye");
  free(t);
  path(f, sizeof f, "nodir/x.txt");
  assert_int_equal(dt_write_file_atomic(f, "x", 1), DT_EIO);
  assert_non_null(strstr(dt_errmsg(), "nodir/x.txt.tmp"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trains_and_writes), cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_hooks_and_adamw),   cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_diverges),          cmocka_unit_test(test_helpers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

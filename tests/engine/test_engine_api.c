/*
 * test_engine_api.c — the engine's public functions, each made to fail with
 * bad input (NULL arguments, settings out of range, caller data sets whose
 * shapes or labels do not fit the model, a second run, an output directory
 * that is a file or held by another run), each failure an error code with a
 * message naming the argument, never a crash. Also: an engine trained on
 * caller memory learns and with a NULL output directory writes nothing; a
 * run owns its directory (the previous summary removed at start, a failed
 * run leaves failure.json and no summary.json); AdamW at lr 1e6 stops as
 * diverged instead of "succeeding"; every strategy exports its state as
 * named blobs and imports it back (a missing or short blob is refused and
 * changes nothing); membership changes say "not supported".
 */
#include <fcntl.h>
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

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "engine/engine_int.h"

static char tmpdir[256];

static void path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir, name);
}

static int exists(const char *dir, const char *name) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

static char *slurp(const char *dir, const char *name) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "rb");
  if (!f) return NULL;
  char *b = calloc(1, 1 << 16);
  size_t n = fread(b, 1, (1 << 16) - 1, f);
  b[n] = '\0';
  fclose(f);
  return b;
}

#define HAS(s) assert_non_null(strstr(dt_errmsg(), s))

/* n samples of `classes` clusters in 6 dimensions, in caller memory. */
typedef struct mem {
  float x[600 * 6];
  int32_t y[600];
  dt_dataset ds;
} mem;

static void make_mem(mem *m, int n, int classes, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    int k = i % classes;
    float j[6];
    dt_rng_uniform(j, 6, -1.0f, 1.0f, seed, DT_RNG_USER, (uint64_t)i);
    for (int d = 0; d < 6; d++) m->x[i * 6 + d] = (d / 2 == k % 3 ? 2.0f : 0.0f) + j[d];
    m->y[i] = k;
  }
  memset(&m->ds, 0, sizeof m->ds);
  m->ds.n = n;
  m->ds.c = m->ds.h = 1;
  m->ds.w = 6;
  m->ds.dim = 6;
  m->ds.nclasses = classes;
  m->ds.x = m->x;
  m->ds.y = m->y;
}

static void base_cfg(dt_run_cfg *c) {
  dt_run_cfg_defaults(c);
  snprintf(c->layers, sizeof c->layers, "linear(16) relu linear(3)");
  c->epochs = 2;
  c->batch = 16;
  c->optim.lr = 0.05f;
}

static mem *train_set, *test_set;

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_engine_api_XXXXXX");
  if (!mkdtemp(tmpdir)) return -1;
  train_set = malloc(sizeof *train_set);
  test_set = malloc(sizeof *test_set);
  make_mem(train_set, 600, 3, 1);
  make_mem(test_set, 150, 3, 2);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  free(train_set);
  free(test_set);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) ? -1 : 0;
}

static dt_engine *new_engine(const dt_run_cfg *c) {
  dt_engine *e = NULL;
  int rc = dt_engine_create_with_data(&e, c, &train_set->ds, &test_set->ds);
  if (rc < 0) fail_msg("create: %s", dt_errmsg());
  return e;
}

static void test_create_fails(void **state) {
  (void)state;
  dt_run_cfg c;
  dt_engine *e = (dt_engine *)0x1;
  base_cfg(&c);
  assert_int_equal(dt_engine_create(NULL, &c), DT_EINVAL);
  HAS("out is NULL");
  assert_int_equal(dt_engine_create(&e, NULL), DT_EINVAL);
  HAS("cfg is NULL");
  assert_null(e);
  c.batch = 0;
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  HAS("train.batch = 0");
  base_cfg(&c);
  c.eval_every = 0;
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  HAS("train.eval_every = 0");
  base_cfg(&c);
  c.deterministic = 1;
  c.micro_batch = 0;
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  HAS("dist.micro_batch = 0");
  base_cfg(&c);
  c.optim.lr = -1.0f;
  assert_int_equal(dt_engine_create(&e, &c), DT_EINVAL);
  HAS("optim.lr");
  base_cfg(&c);
  snprintf(c.train_images, sizeof c.train_images, "%s/none.gz", tmpdir);
  assert_int_equal(dt_engine_create(&e, &c), DT_ENOENT);
  HAS("data.train_images");
  assert_null(e);
}

static void test_create_with_data_fails(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  dt_engine *e = (dt_engine *)0x1;
  assert_int_equal(dt_engine_create_with_data(&e, &c, NULL, &test_set->ds), DT_EINVAL);
  HAS("train is NULL");
  assert_null(e);
  assert_int_equal(dt_engine_create_with_data(&e, &c, &train_set->ds, NULL), DT_EINVAL);
  HAS("test is NULL");
  assert_int_equal(dt_engine_create_with_data(NULL, &c, &train_set->ds, &test_set->ds), DT_EINVAL);
  HAS("out is NULL");

  dt_dataset d = test_set->ds;
  d.n = 0;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &train_set->ds, &d), DT_EINVAL);
  HAS("test has no samples");
  d = test_set->ds;
  d.x = NULL;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &train_set->ds, &d), DT_EINVAL);
  HAS("x NULL");
  /* a shape that does not multiply to dim */
  d = train_set->ds;
  d.w = 5;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &d, &test_set->ds), DT_EINVAL);
  HAS("train: shape 1x1x5 does not give dim 6");
  /* feature dims that differ between train and test (6 vs 3: a valid
   * 1x1x3 view of the same memory) */
  d = test_set->ds;
  d.w = 3;
  d.dim = 3;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &train_set->ds, &d), DT_EINVAL);
  HAS("train samples are 1x1x6 but test samples are 1x1x3");
  /* more classes in the labels than the model has outputs */
  mem *m5 = malloc(sizeof *m5);
  make_mem(m5, 600, 5, 3);
  assert_int_equal(dt_engine_create_with_data(&e, &c, &m5->ds, &test_set->ds), DT_EINVAL);
  HAS("the last layer has 3 outputs but the data has 5 classes");
  /* nclasses understated by the caller: the labels decide */
  m5->ds.nclasses = 2;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &m5->ds, &test_set->ds), DT_EINVAL);
  HAS("5 classes");
  m5->y[7] = -2;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &m5->ds, &test_set->ds), DT_EINVAL);
  HAS("label -2 of sample 7");
  free(m5);
  /* a conv model that cannot take 1x1x6 samples */
  snprintf(c.layers, sizeof c.layers, "conv(4,3) relu flatten linear(3)");
  assert_int_equal(dt_engine_create_with_data(&e, &c, &train_set->ds, &test_set->ds), DT_EINVAL);
  HAS("model.layers");
  assert_null(e);
}

static void test_memory_run_null_out(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  dt_engine *e = new_engine(&c);
  assert_string_equal(dt_engine_strategy(e), "local");
  /* the caller's arrays are copied: normalising did not touch them */
  assert_true(train_set->x[0] == train_set->ds.x[0]);
  float x0 = train_set->x[0];
  char cwd_before[64];
  snprintf(cwd_before, sizeof cwd_before, "%s", "unused");
  dt_run_summary s;
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, &s), DT_OK);
  assert_true(train_set->x[0] == x0);
  assert_true(s.test_accuracy > 0.9);
  assert_int_equal(s.steps, 2 * 38);
  assert_int_equal(strlen(s.params_sha256), 64);
  double loss, acc;
  assert_int_equal(dt_engine_evaluate(e, &loss, &acc), DT_OK);
  assert_true(acc == s.test_accuracy);
  assert_true(loss == s.test_loss);
  /* a finished engine does not run again */
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, &s), DT_EINVAL);
  HAS("engine already ran");
  assert_int_equal(dt_engine_set_out_dir(e, tmpdir), DT_EINVAL);
  HAS("already ran");
  dt_engine_destroy(e);
}

static void test_run_and_evaluate_fail(void **state) {
  (void)state;
  assert_int_equal(dt_engine_run(NULL, NULL, NULL, NULL, NULL), DT_EINVAL);
  HAS("engine is NULL");
  double l, a;
  assert_int_equal(dt_engine_evaluate(NULL, &l, &a), DT_EINVAL);
  HAS("engine is NULL");
  dt_run_cfg c;
  base_cfg(&c);
  dt_engine *e = new_engine(&c);
  assert_int_equal(dt_engine_evaluate(e, NULL, &a), DT_EINVAL);
  HAS("loss is NULL");
  assert_int_equal(dt_engine_evaluate(e, &l, NULL), DT_EINVAL);
  HAS("accuracy is NULL");
  /* an output directory under a regular file */
  char f[400], dir[500];
  path(f, sizeof f, "plainfile");
  FILE *fp = fopen(f, "w");
  fclose(fp);
  snprintf(dir, sizeof dir, "%s/sub", f);
  assert_int_equal(dt_engine_run(e, dir, NULL, NULL, NULL), DT_EIO);
  HAS("plainfile");
  dt_engine_destroy(e);
  /* NULL-safe views */
  assert_null(dt_engine_model(NULL));
  assert_int_equal(dt_engine_train_samples(NULL), 0);
  assert_null(dt_engine_strategy(NULL));
  dt_engine_destroy(NULL);
}

static void test_set_comm_fails(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  c.workers = 2;
  dt_engine *e = new_engine(&c);
  assert_string_equal(dt_engine_strategy(e), "ddp");
  assert_int_equal(dt_engine_set_comm(NULL, NULL), DT_EINVAL);
  HAS("engine is NULL");
  assert_int_equal(dt_engine_set_comm(e, NULL), DT_EINVAL);
  HAS("communicator is NULL");
  /* a one-rank communicator for a two-worker configuration */
  char sdir[400];
  path(sdir, sizeof sdir, "store");
  assert_int_equal(mkdir(sdir, 0700), 0);
  dt_store *st = NULL;
  dt_comm *comm = NULL;
  assert_int_equal(dt_store_open_file(&st, sdir), DT_OK);
  struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
  cc.transport = "inproc";
  cc.rank = 0;
  cc.size = 1;
  cc.job = "api";
  cc.timeout_s = 10;
  assert_int_equal(dt_comm_create(&comm, st, &cc), DT_OK);
  assert_int_equal(dt_engine_set_comm(e, comm), DT_EINVAL);
  HAS("dist.workers = 2 but the communicator has 1 ranks");
  /* without one, running refuses instead of training alone */
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, NULL), DT_EINVAL);
  HAS("needs a communicator");
  dt_comm_destroy(comm);
  dt_store_destroy(st);
  dt_engine_destroy(e);
}

static void test_out_dir_owned(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  char dir[400];
  path(dir, sizeof dir, "owned");
  assert_int_equal(dt_engine_set_out_dir(NULL, dir), DT_EINVAL);
  HAS("engine is NULL");
  dt_engine *a = new_engine(&c), *b = new_engine(&c);
  assert_int_equal(dt_engine_set_out_dir(a, NULL), DT_EINVAL);
  HAS("dir is NULL");
  /* a stale success from an earlier run */
  assert_int_equal(dt_mkdirs(dir), DT_OK);
  char f[500];
  snprintf(f, sizeof f, "%s/summary.json", dir);
  FILE *fp = fopen(f, "w");
  fputs("{\"status\": \"succeeded\"}\n", fp);
  fclose(fp);
  assert_int_equal(dt_engine_set_out_dir(a, dir), DT_OK);
  assert_false(exists(dir, "summary.json"));
  /* a second engine (another open file description) is refused, naming us */
  assert_int_equal(dt_engine_set_out_dir(b, dir), DT_EAGAIN);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  HAS(pid);
  HAS("in use by another run");
  assert_int_equal(dt_engine_run(b, dir, NULL, NULL, NULL), DT_EAGAIN);
  dt_engine_destroy(b);
  /* a's run diverges: failure.json, no summary.json */
  dt_engine_destroy(a);
  c.optim.kind = DT_OPT_ADAMW;
  c.optim.lr = 1e6f;
  c.sched.kind = DT_SCHED_CONSTANT;
  a = new_engine(&c);
  assert_int_equal(dt_engine_run(a, dir, "[optim]\nlr = 1e6\n", NULL, NULL), DT_ERANGE);
  HAS("diverged");
  assert_false(exists(dir, "summary.json"));
  char *fr = slurp(dir, "failure.json");
  assert_non_null(fr);
  assert_non_null(strstr(fr, "\"status\":\t\"failed\""));
  assert_non_null(strstr(fr, "diverged"));
  free(fr);
  dt_engine_destroy(a);
  /* the next run in the same directory replaces the failure record */
  base_cfg(&c);
  a = new_engine(&c);
  assert_int_equal(dt_engine_run(a, dir, NULL, NULL, NULL), DT_OK);
  assert_false(exists(dir, "failure.json"));
  char *sum = slurp(dir, "summary.json");
  assert_non_null(sum);
  assert_non_null(strstr(sum, "\"status\":\t\"succeeded\""));
  assert_non_null(strstr(sum, "\"seed\":\t42,"));
  free(sum);
  dt_engine_destroy(a);
}

/* AdamW at lr 1e6 on an MLP "succeeded" at chance accuracy with loss 1e21:
 * now it stops as diverged, naming the epoch or step. */
static void test_adamw_huge_lr_diverges(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  snprintf(c.layers, sizeof c.layers, "linear(32) relu linear(16) relu linear(3)");
  c.optim.kind = DT_OPT_ADAMW;
  c.optim.lr = 1e6f;
  c.sched.kind = DT_SCHED_CONSTANT;
  dt_engine *e = new_engine(&c);
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, NULL), DT_ERANGE);
  HAS("training diverged");
  assert_true(strstr(dt_errmsg(), "epoch ") || strstr(dt_errmsg(), "step "));
  assert_null(strstr(dt_errmsg(), "-nan"));
  dt_engine_destroy(e);
}

/* Finite but enormous features (1e20, no normalisation) with a tiny rate:
 * the loss stays finite for a step but the gradient's norm overflows;
 * the run stops at step 1 naming it. */
static void test_gradient_norm_guard(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  c.normalize = 0;
  c.optim.lr = 1e-30f;
  c.optim.momentum = 0.0f;
  c.optim.weight_decay = 0.0f;
  c.sched.kind = DT_SCHED_CONSTANT;
  mem *big = malloc(sizeof *big);
  make_mem(big, 600, 3, 4);
  for (int i = 0; i < 600; i++) big->x[i * 6] = 1e20f;
  dt_engine *e = NULL;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &big->ds, &test_set->ds), DT_OK);
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, NULL), DT_ERANGE);
  printf("# %s\n", dt_errmsg());
  HAS("training diverged at epoch 1 step 1");
  assert_true(strstr(dt_errmsg(), "gradient norm is not finite") || strstr(dt_errmsg(), "(loss "));
  dt_engine_destroy(e);
  /* one layer, features near the float limit: the message names the layer
   * holding the largest (or first non-finite) gradient value */
  snprintf(c.layers, sizeof c.layers, "linear(3)");
  for (int i = 0; i < 600; i++) big->x[i * 6] = 3e37f;
  assert_int_equal(dt_engine_create_with_data(&e, &c, &big->ds, &test_set->ds), DT_OK);
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, NULL), DT_ERANGE);
  printf("# %s\n", dt_errmsg());
  HAS("gradient norm is not finite");
  HAS("in layer 1 'linear'");
  free(big);
  dt_engine_destroy(e);
}

/* ---- strategy state ------------------------------------------------------------ */

typedef struct blob {
  char name[32];
  unsigned char data[64 * 1024];
  size_t len;
} blob;
typedef struct blobs {
  blob b[8];
  int n;
} blobs;

static int put(void *ud, const char *name, const void *data, size_t len) {
  blobs *bs = ud;
  if (bs->n == 8 || len > sizeof bs->b[0].data) return dt__seterr(DT_ENOMEM, "blobs: full");
  blob *b = &bs->b[bs->n++];
  snprintf(b->name, sizeof b->name, "%s", name);
  memcpy(b->data, data, len);
  b->len = len;
  return DT_OK;
}

static int get(void *ud, const char *name, void *buf, size_t cap, size_t *len) {
  blobs *bs = ud;
  for (int i = 0; i < bs->n; i++)
    if (!strcmp(bs->b[i].name, name)) {
      *len = bs->b[i].len;
      memcpy(buf, bs->b[i].data, bs->b[i].len < cap ? bs->b[i].len : cap);
      return DT_OK;
    }
  return dt__seterr(DT_ENOENT, "blobs: no '%s'", name);
}

static blob *find(blobs *bs, const char *name) {
  for (int i = 0; i < bs->n; i++)
    if (!strcmp(bs->b[i].name, name)) return &bs->b[i];
  return NULL;
}

static void roundtrip(const char *want, int workers, int det) {
  dt_run_cfg c;
  base_cfg(&c);
  c.workers = workers;
  c.deterministic = det;
  c.epochs = 1;
  dt_engine *e = new_engine(&c);
  assert_string_equal(dt_engine_strategy(e), want);
  if (workers == 1) assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, NULL), DT_OK);
  dt_strategy *S = &e->strat;
  assert_string_equal(S->ops->name, want);
  /* some optimizer state to carry */
  size_t ns = dt_optim_state_floats(e->optim);
  float *st = dt_optim_state(e->optim);
  for (size_t i = 0; i < ns; i++) st[i] = (float)i * 0.25f;
  S->step = 1234;
  *dt_optim_step_count(e->optim) = 77;
  blobs *bs = calloc(1, sizeof *bs);
  dt_state_writer w = {put, bs, NULL, NULL, NULL};
  dt_state_reader r = {get, bs, NULL, NULL};
  assert_int_equal(S->ops->state_export(S, &w), DT_OK);
  assert_non_null(find(bs, "optim"));
  assert_int_equal(find(bs, "optim")->len, ns * sizeof(float));
  assert_non_null(find(bs, "step"));
  /* clobber, then import restores it */
  memset(st, 0, ns * sizeof(float));
  S->step = 0;
  *dt_optim_step_count(e->optim) = 0;
  assert_int_equal(S->ops->state_import(S, &r), DT_OK);
  assert_int_equal(S->step, 1234);
  assert_int_equal(*dt_optim_step_count(e->optim), 77);
  for (size_t i = 0; i < ns; i++) assert_true(st[i] == (float)i * 0.25f);
  /* a short blob is refused and leaves the state as it was */
  S->step = 5;
  find(bs, "step")->len = 4;
  assert_int_equal(S->ops->state_import(S, &r), DT_ECORRUPT);
  HAS("'step': 4 bytes, expected 8");
  assert_int_equal(S->step, 5);
  /* a missing blob */
  snprintf(find(bs, "optim_step")->name, 32, "renamed");
  assert_int_equal(S->ops->state_import(S, &r), DT_ENOENT);
  assert_int_equal(S->step, 5);
  /* elastic training: local cannot; the others need a communicator */
  dt_membership m = {NULL, 0, 1, 0, 0};
  if (!strcmp(want, "local")) {
    assert_int_equal(S->ops->membership_change(S, &m), DT_ENOTSUP);
    HAS("not supported");
  } else {
    assert_int_equal(S->ops->membership_change(S, &m), DT_EINVAL);
    HAS("needs a communicator");
  }
  free(bs);
  dt_engine_destroy(e);
}

static void test_strategy_state(void **state) {
  (void)state;
  roundtrip("local", 1, 0);
  roundtrip("ddp_det", 1, 1);
  roundtrip("ddp", 2, 0);
  assert_null(dt__strategy_find("no_such_strategy"));
  assert_non_null(dt__strategy_find("ddp"));
}

/* Checkpoints through the library: a run resumed from a mid-run checkpoint,
 * and one stopped by the flag, end with the uninterrupted run's hash; the
 * new calls refuse bad arguments. */
static void test_resume_api(void **state) {
  (void)state;
  dt_run_cfg c;
  base_cfg(&c);
  char ck[300], dir[400];
  snprintf(ck, sizeof ck, "%s/ck", tmpdir);
  snprintf(c.ckpt_dir, sizeof c.ckpt_dir, "%s", ck);
  c.ckpt_every_steps = 10;
  c.ckpt_keep = 0;
  dt_engine *e = new_engine(&c);
  assert_int_equal(dt_engine_resume(NULL, ck), DT_EINVAL);
  assert_int_equal(dt_engine_resume(e, NULL), DT_EINVAL);
  assert_int_equal(dt_engine_resume(e, ""), DT_EINVAL);
  assert_int_equal(dt_engine_resume(e, "/nonexistent/ckpt"), DT_ENOENT);
  assert_int_equal(dt_engine_set_stop_flag(NULL, NULL), DT_EINVAL);
  assert_null(dt_engine_resumed_from(NULL, NULL));
  assert_null(dt_engine_resumed_from(e, NULL));
  dt_run_summary ref, s;
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, &ref), DT_OK);
  dt_engine_destroy(e);

  e = new_engine(&c);
  snprintf(dir, sizeof dir, "%s/step-00000030", ck);
  assert_int_equal(dt_engine_resume(e, dir), DT_OK);
  int64_t step = 0;
  assert_string_equal(dt_engine_resumed_from(e, &step), dir);
  assert_int_equal(step, 30);
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, &s), DT_OK);
  assert_string_equal(s.params_sha256, ref.params_sha256);
  dt_engine_destroy(e);

  /* the stop flag: a checkpoint after the first step, DT_EABORTED naming it */
  char ck2[300];
  snprintf(ck2, sizeof ck2, "%s/ck2", tmpdir);
  snprintf(c.ckpt_dir, sizeof c.ckpt_dir, "%s", ck2);
  c.ckpt_every_steps = 0;
  static volatile sig_atomic_t flag = 1;
  e = new_engine(&c);
  assert_int_equal(dt_engine_set_stop_flag(e, &flag), DT_OK);
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, &s), DT_EABORTED);
  HAS("stopped by a signal after step 1");
  HAS("step-00000001");
  dt_engine_destroy(e);
  e = new_engine(&c);
  assert_int_equal(dt_engine_resume(e, ck2), DT_OK);
  assert_int_equal(dt_engine_run(e, NULL, NULL, NULL, &s), DT_OK);
  assert_string_equal(s.params_sha256, ref.params_sha256);
  dt_engine_destroy(e);

  /* another model: refused naming the key */
  snprintf(c.layers, sizeof c.layers, "linear(7) relu linear(3)");
  e = new_engine(&c);
  assert_int_equal(dt_engine_resume(e, ck2), DT_EMISMATCH);
  HAS("model.layers");
  dt_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_api),
      cmocka_unit_test(test_create_fails),
      cmocka_unit_test(test_create_with_data_fails),
      cmocka_unit_test(test_memory_run_null_out),
      cmocka_unit_test(test_run_and_evaluate_fail),
      cmocka_unit_test(test_set_comm_fails),
      cmocka_unit_test(test_out_dir_owned),
      cmocka_unit_test(test_adamw_huge_lr_diverges),
      cmocka_unit_test(test_gradient_norm_guard),
      cmocka_unit_test(test_strategy_state),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

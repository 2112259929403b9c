/*
 * test_standby.c — the standby copy of an elastic job's state
 * (src/engine/standby.c, docs/elastic.md "Standby copy"): nothing is read
 * before a complete write; a complete write is read back bit for bit with
 * its tag and step counts, in another process too (the mapping is shared
 * across fork); a copy left half-written (sequence counter odd, as by a
 * writer killed mid-write) is never read, and the next writer whose
 * predecessor is gone takes its lock over and completes a copy; a writer
 * lock held by a live process makes a write skip (-1), never wait; a copy
 * that is current already is not written again (0); a worker holding no
 * complete state writes nothing.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/core.h"
#include "engine/engine.h"
#include "engine/engine_int.h"

static float xs[64 * 6];
static int32_t ys[64];

static dt_engine *engine(void) {
  dt_run_cfg c;
  dt_run_cfg_defaults(&c);
  snprintf(c.layers, sizeof c.layers, "linear(16) relu linear(3)");
  c.batch = 16;
  dt_dataset ds;
  memset(&ds, 0, sizeof ds);
  for (int i = 0; i < 64 * 6; i++) xs[i] = (float)(i % 7) - 3.0f;
  for (int i = 0; i < 64; i++) ys[i] = i % 3;
  ds.n = 64, ds.c = ds.h = 1, ds.w = 6, ds.dim = 6, ds.nclasses = 3, ds.x = xs, ds.y = ys;
  dt_engine *e = NULL;
  if (dt_engine_create_with_data(&e, &c, &ds, &ds) < 0) fail_msg("create: %s", dt_errmsg());
  return e;
}

/* Parameters and optimizer state set to a pattern keyed by k. */
static void pattern(dt_engine *e, float k) {
  float *p = dt_model_params(e->model);
  for (size_t i = 0; i < dt_model_nparams(e->model); i++) p[i] = k + (float)i * 0.5f;
  float *o = dt_optim_state(e->optim);
  for (size_t i = 0; i < dt_optim_state_floats(e->optim); i++) o[i] = -k - (float)i;
}

static int has_pattern(dt_engine *e, float k) {
  const float *p = dt_model_params(e->model);
  for (size_t i = 0; i < dt_model_nparams(e->model); i++)
    if (p[i] != k + (float)i * 0.5f) return 0;
  const float *o = dt_optim_state(e->optim);
  for (size_t i = 0; i < dt_optim_state_floats(e->optim); i++)
    if (o[i] != -k - (float)i) return 0;
  return 1;
}

static void test_copy(void **state) {
  (void)state;
  dt_engine *e = engine();
  assert_true(dt_optim_state_floats(e->optim) > 0); /* SGD with momentum */
  assert_int_equal(dt__standby_map(e), DT_OK);
  assert_true(dt__standby_region(e) != 0);
  int64_t pos, gen;
  /* nothing written yet */
  assert_int_equal(dt__standby_load(e, &pos, &gen), 0);
  /* a member at step 30 (position 60) of generation 2 writes */
  pattern(e, 7.0f);
  e->strat.step = 30;
  *dt_optim_step_count(e->optim) = 30;
  e->ended_at = -1;
  e->state_gen = 2;
  assert_int_equal(dt__standby_write(e, 1), 1);
  assert_int_equal(dt__standby_write(e, 1), 0); /* current already */
  /* another process (a spare, forked) reads it back */
  pid_t p = fork();
  if (p == 0) {
    pattern(e, 0.0f);
    e->strat.step = 0;
    *dt_optim_step_count(e->optim) = 0;
    int ok = dt__standby_load(e, &pos, &gen) == 1 && pos == 60 && gen == 2 &&
             e->strat.step == 30 && *dt_optim_step_count(e->optim) == 30 && has_pattern(e, 7.0f);
    _exit(ok ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(p, &st, 0), p);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* a writer killed mid-write: its lock names a process that is gone and
   * the counter is odd; nobody reads the copy */
  p = fork();
  if (p == 0) _exit(0);
  assert_int_equal(waitpid(p, &st, 0), p);
  dt__standby_poke(e, (int)p, 1);
  pattern(e, 1.0f);
  assert_int_equal(dt__standby_load(e, &pos, &gen), 0);
  assert_true(has_pattern(e, 1.0f)); /* refused before anything was copied */
  assert_int_equal(e->el_partial, 0);
  /* the next writer takes the dead writer's lock over and completes a copy */
  pattern(e, 9.0f);
  e->strat.step = 31;
  assert_int_equal(dt__standby_write(e, 0), 1);
  pattern(e, 0.0f);
  assert_int_equal(dt__standby_load(e, &pos, &gen), 1);
  assert_int_equal(pos, 62);
  assert_true(has_pattern(e, 9.0f));
  assert_int_equal(e->el_partial, 1); /* a reader's state counts once the admission agrees */
  e->el_partial = 0;
  /* a live writer holds the lock: a write skips at once */
  p = fork();
  if (p == 0) {
    pause();
    _exit(0);
  }
  dt__standby_poke(e, (int)p, 0);
  e->strat.step = 32;
  assert_int_equal(dt__standby_write(e, 1), -1);
  kill(p, SIGKILL);
  assert_int_equal(waitpid(p, &st, 0), p);
  /* gone now: the lock is taken over */
  assert_int_equal(dt__standby_write(e, 1), 1);
  /* a worker without a complete state writes nothing */
  e->el_partial = 1;
  e->strat.step = 33;
  assert_int_equal(dt__standby_write(e, 1), -1);
  e->el_partial = 0;
  char d[192];
  dt__standby_describe(e, d, sizeof d);
  assert_non_null(strstr(d, "2 periodic refreshes"));
  assert_non_null(strstr(d, "1 catch-ups"));
  dt_engine_destroy(e); /* unmaps */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_copy)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

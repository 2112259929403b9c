/*
 * test_ps_direct_mt.c — direct asp's shared table (src/ps/direct.c), with
 * plain memory as the servers' slots and threads as workers:
 *   - one push is the optimizer's step (SGD with momentum): the same bits
 *     as dt_optim_step on a copy, and the worker gets the new parameters
 *     and version;
 *   - staleness: a push whose read is 3 versions old steps with a third of
 *     the rate (plain SGD: the parameters move by lr/3 x g exactly);
 *   - two workers pushing every key concurrently: no push is lost (every
 *     key's version is the number of pushes, every worker's clock its
 *     pushes, all_in says so, not one clock more), and with plain SGD and
 *     gradient 1 each parameter moved by the sum of the rates the pushes
 *     report having used; a try that finds the key held applies nothing;
 *   - the push's one pass with a share of the batch (scale, step, copy)
 *     gives dt_optim_step's bits on the scaled gradient, for plain SGD,
 *     momentum, weight decay, Nesterov, dampening and AdamW;
 *   - checkpoint records out and back in (parameters, momentum, step).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>

#include "ps/ps.h"

static const uint64_t LENS[] = {700, 50, 9};
#define NL 3
#define NP 759

typedef struct table {
  dt_ps_map map;
  dt_ps_opts o;
  void *slots[2];
  dt_ps_direct *d[2];
  float init[NP];
} table;

static void table_open_cfg(table *t, const dt_optim_cfg *cfg) {
  memset(t, 0, sizeof *t);
  assert_int_equal(dt_ps_map_build(&t->map, LENS, NL, 2), DT_OK);
  t->o.nworkers = 2;
  t->o.nservers = 2;
  t->o.colocate = 1;
  t->o.consistency = DT_PS_ASP;
  t->o.optim = *cfg;
  size_t b = dt_ps_direct_bytes(&t->map, &t->o);
  for (int s = 0; s < 2; s++) assert_non_null(t->slots[s] = calloc(1, b));
  for (int i = 0; i < NP; i++) t->init[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  for (int w = 0; w < 2; w++)
    assert_int_equal(dt_ps_direct_create(&t->d[w], &t->map, &t->o, w, t->slots, t->init, 5.0),
                     DT_OK);
}

static void table_open(table *t, int momentum) {
  dt_optim_cfg c;
  memset(&c, 0, sizeof c);
  c.kind = DT_OPT_SGD;
  c.lr = 0.1f;
  c.momentum = momentum ? 0.9f : 0.0f;
  table_open_cfg(t, &c);
}

static void table_close(table *t) {
  for (int w = 0; w < 2; w++) dt_ps_direct_destroy(t->d[w]);
  for (int s = 0; s < 2; s++) free(t->slots[s]);
  dt_ps_map_free(&t->map);
}

static void test_push_is_a_step(void **state) {
  (void)state;
  table t;
  table_open(&t, 1);
  dt_optim *ref = NULL;
  for (int k = 0; k < t.map.nkeys; k++) {
    const dt_ps_key *K = &t.map.keys[k];
    assert_int_equal(dt_optim_create(&ref, &t.o.optim, K->len), DT_OK);
    float p[NP], g[NP], out[NP];
    memcpy(p, t.init + K->off, K->len * sizeof(float));
    int64_t ver = 0;
    for (int step = 0; step < 3; step++) {
      for (size_t i = 0; i < K->len; i++) g[i] = (float)(i % 7) * 0.01f - 0.02f + 0.001f * step;
      /* worker 1 pushes into whichever server holds the key */
      assert_int_equal(dt_ps_direct_push(t.d[1], k, g, 1.0f, 0.1f, ver, out, &ver, 0), DT_OK);
      assert_int_equal(dt_optim_step(ref, p, g, 0.1f), DT_OK);
      assert_int_equal(ver, step + 1);
      assert_memory_equal(out, p, K->len * sizeof(float));
    }
    dt_optim_destroy(ref);
  }
  table_close(&t);
}

static void test_staleness(void **state) {
  (void)state;
  table t;
  table_open(&t, 0);
  const int k = 0;
  const size_t len = t.map.keys[k].len;
  float g[NP], out[NP], before[NP];
  for (size_t i = 0; i < len; i++) g[i] = 0.5f;
  int64_t v1 = 0, v0 = 0;
  for (int i = 0; i < 3; i++)
    assert_int_equal(dt_ps_direct_push(t.d[1], k, g, 1.0f, 0.3f, v1, out, &v1, 0), DT_OK);
  memcpy(before, out, len * sizeof(float));
  /* worker 0 read version 0: its push is 3 versions stale */
  assert_int_equal(dt_ps_direct_push(t.d[0], k, g, 1.0f, 0.3f, v0, out, &v0, 0), DT_OK);
  assert_int_equal(v0, 4);
  for (size_t i = 0; i < len; i++) assert_true(out[i] == before[i] - (0.3f / 3.0f) * 0.5f);
  table_close(&t);
}

typedef struct wk {
  table *t;
  int me, steps;
  double lrsum[8]; /* per key: the rates this worker's pushes used */
  int busy;        /* tries that found the key held */
} wk;

static void *worker(void *arg) {
  wk *w = arg;
  const dt_ps_map *m = &w->t->map;
  static _Thread_local float g[NP], out[NP];
  int64_t ver[8] = {0};
  for (size_t i = 0; i < NP; i++) g[i] = 1.0f;
  for (int s = 0; s < w->steps; s++)
    for (int k = m->nkeys - 1; k >= 0; k--) {
      /* the push reports the version it made: the staleness it saw is
       * that minus 1 minus the version this worker read */
      int64_t read = ver[k];
      /* odd steps try first (a busy key: nothing applied, then wait) */
      int rc = dt_ps_direct_push(w->t->d[w->me], k, g, 1.0f, 0.01f, read, out, &ver[k], s & 1);
      if (rc == 1) {
        w->busy++;
        assert_int_equal(ver[k], read);
        rc = dt_ps_direct_push(w->t->d[w->me], k, g, 1.0f, 0.01f, read, out, &ver[k], 0);
      }
      assert_int_equal(rc, DT_OK);
      int64_t stale = ver[k] - 1 - read;
      w->lrsum[k] += stale > 1 ? 0.01f / (float)stale : 0.01f;
    }
  return NULL;
}

static void test_concurrent(void **state) {
  (void)state;
  table t;
  table_open(&t, 0);
  enum { STEPS = 400 };
  wk w[2] = {{&t, 0, STEPS, {0}, 0}, {&t, 1, STEPS, {0}, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  assert_true(dt_ps_direct_all_in(t.d[0], STEPS));
  assert_false(dt_ps_direct_all_in(t.d[1], STEPS + 1));
  for (int k = 0; k < t.map.nkeys; k++) {
    const dt_ps_key *K = &t.map.keys[k];
    float p[NP];
    int64_t ver = -1;
    assert_int_equal(dt_ps_direct_read(t.d[1], k, p, &ver), DT_OK);
    assert_int_equal(ver, 2 * STEPS);
    /* plain SGD, gradient 1: each parameter moved by the rates used */
    double moved = w[0].lrsum[k] + w[1].lrsum[k];
    for (size_t i = 0; i < K->len; i++)
      assert_true(fabs((double)(t.init[K->off + i] - p[i]) - moved) < 1e-3);
  }
  table_close(&t);
}

/* The push's one pass (gradient scaled by the worker's share, optimizer
 * step, copy out) against scaling a copy and dt_optim_step, bit for bit,
 * for every optimizer the pass covers and the ones it leaves to the
 * general path (Nesterov, dampening): 4 steps (the first momentum step is
 * its own loop), weight decay on, shares 0.5 and 0.37. The gradient the
 * caller passes may be scaled in place (the general path), so each push
 * gets a fresh copy. */
static void test_weighted_push_is_a_step(void **state) {
  (void)state;
  dt_optim_cfg cfgs[6];
  memset(cfgs, 0, sizeof cfgs);
  for (int i = 0; i < 6; i++) cfgs[i].kind = DT_OPT_SGD, cfgs[i].lr = 0.1f;
  cfgs[1].momentum = 0.9f;
  cfgs[2].momentum = 0.9f, cfgs[2].weight_decay = 0.01f;
  cfgs[3].momentum = 0.9f, cfgs[3].nesterov = 1;
  cfgs[4].momentum = 0.8f, cfgs[4].dampening = 0.1f, cfgs[4].weight_decay = 0.001f;
  cfgs[5].kind = DT_OPT_ADAMW, cfgs[5].lr = 0.01f, cfgs[5].beta1 = 0.9f, cfgs[5].beta2 = 0.999f;
  cfgs[5].eps = 1e-8f, cfgs[5].weight_decay = 0.01f;
  const float shares[2] = {0.5f, 0.37f};
  for (int c = 0; c < 6; c++)
    for (int sh = 0; sh < 2; sh++) {
      table t;
      table_open_cfg(&t, &cfgs[c]);
      for (int k = 0; k < t.map.nkeys; k++) {
        const dt_ps_key *K = &t.map.keys[k];
        dt_optim *ref = NULL;
        assert_int_equal(dt_optim_create(&ref, &cfgs[c], K->len), DT_OK);
        float p[NP], g[NP], gs[NP], out[NP];
        memcpy(p, t.init + K->off, K->len * sizeof(float));
        int64_t ver = 0;
        for (int step = 0; step < 4; step++) {
          for (size_t i = 0; i < K->len; i++)
            g[i] = (float)((i * 13 + (size_t)step * 5) % 11) * 0.03f - 0.15f;
          for (size_t i = 0; i < K->len; i++) gs[i] = g[i] * shares[sh];
          assert_int_equal(dt_ps_direct_push(t.d[k & 1], k, g, shares[sh], 0.1f, ver, out, &ver, 0),
                           DT_OK);
          assert_int_equal(dt_optim_step(ref, p, gs, 0.1f), DT_OK);
          assert_int_equal(ver, step + 1);
          assert_memory_equal(out, p, K->len * sizeof(float));
        }
        dt_optim_destroy(ref);
      }
      table_close(&t);
    }
}

static void test_records(void **state) {
  (void)state;
  table t;
  table_open(&t, 1);
  const int k = t.map.nkeys - 1;
  const size_t len = t.map.keys[k].len;
  float g[NP], out[NP], rec[2 * NP], rec2[2 * NP];
  for (size_t i = 0; i < len; i++) g[i] = (float)i;
  int64_t v = 0, step = 0;
  assert_int_equal(dt_ps_direct_push(t.d[0], k, g, 1.0f, 0.1f, v, out, &v, 0), DT_OK);
  assert_int_equal(dt_ps_key_state_floats(&t.o, &t.map.keys[k]), 2 * len);
  assert_int_equal(dt_ps_direct_record(t.d[1], k, rec, &step), DT_OK);
  assert_int_equal(step, 1);
  assert_memory_equal(rec, out, len * sizeof(float));
  for (size_t i = 0; i < len; i++) assert_true(rec[len + i] == g[i]); /* momentum = g */
  for (size_t i = 0; i < 2 * len; i++) rec2[i] = rec[i] + 1.0f;
  assert_int_equal(dt_ps_direct_restore(t.d[0], k, rec2, 7), DT_OK);
  assert_int_equal(dt_ps_direct_record(t.d[1], k, rec, &step), DT_OK);
  assert_int_equal(step, 7);
  assert_memory_equal(rec, rec2, 2 * len * sizeof(float));
  table_close(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_push_is_a_step),
      cmocka_unit_test(test_staleness),
      cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_weighted_push_is_a_step),
      cmocka_unit_test(test_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

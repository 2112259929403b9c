/*
 * test_ps_join_mt.c — elastic workers at a parameter server (server.c's
 * loss handling, server_join.c), ranks as threads over tcp with a real
 * rendezvous store, one behaviour per case:
 *   - a worker leaves (its communicator closes mid-run): the server takes
 *     it out of the clocks and the other worker's bsp steps go on alone;
 *   - joiners: one asking for a slot the job does not have and one with
 *     another key-range map are refused with one line naming them (the job
 *     goes on); a good one takes the lost worker's slot, pulls exactly the
 *     parameters the member holds at that step, and both step on together
 *     to the same final parameters; the server counts one loss and one
 *     join;
 *   - ssp (s = 1) across the same changes: nobody waits for the lost
 *     worker, no read misses more than s clocks of the live workers, the
 *     joiner comes in at the members' clock;
 *   - bsp across the changes, bit for bit against a serial reference: each
 *     clock is the rank-order sum of the live workers' scaled pushes,
 *     divided by their total weight when a worker is missing (clocks 3-5:
 *     worker 0's alone stands for the whole batch), then one SGD step.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "ps/ps.h"

static const uint64_t LENS[] = {300, 40, 8};
#define NL 3
#define NP 348
#define JOB "psjointest"

typedef struct ctx {
  int consistency, staleness;
  int port;
  atomic_int left;      /* worker 1 has left */
  atomic_int admitted;  /* the good joiner is in: worker 0 may step on */
  int64_t join_clock;
  float at_join[NP];    /* worker 0's parameters when the joiner comes */
  float final0[NP], final_j[NP];
  dt_ps_server_stats st;
  int rc[3];
  char msg[3][512];
  int bad_slot_rc, bad_map_rc;
  char bad_slot_msg[512], bad_map_msg[512];
} ctx;

static void sleep_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

static void opts_of(const ctx *C, dt_ps_opts *o) {
  memset(o, 0, sizeof *o);
  o->nworkers = 2;
  o->nservers = 1;
  o->consistency = C->consistency;
  o->staleness = C->staleness;
  o->elastic = 1;
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.lr = 0.1f;
  oc.momentum = 0.9f;
  o->optim = oc;
}

static struct dt_comm_config cfg_of(int rank) {
  struct dt_comm_config cc = DT_COMM_CONFIG_INIT;
  cc.transport = "tcp";
  cc.rank = rank;
  cc.size = 3;
  cc.job = JOB;
  cc.timeout_s = 10;
  return cc;
}

static float grad_val(int w, int64_t t, size_t i) {
  return (float)((int)((i * 7 + (size_t)w * 3 + (size_t)t) % 9) - 4) / 8.0f;
}

static int step(dt_ps_client *cl, int w, int64_t t, float *grads) {
  dt_ps_client_begin(cl, 0.5f, 0.1f);
  for (size_t i = 0; i < NP; i++) grads[i] = grad_val(w, t, i);
  dt_ps_client_ready(cl, 0, NP);
  return dt_ps_client_finish(cl);
}

typedef struct rank_arg {
  ctx *C;
  int rank;
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *a = p;
  ctx *C = a->C;
  const int r = a->rank;
  char *fail = C->msg[r];
  dt_store *st = NULL;
  dt_comm *c = NULL;
  dt_ps_map map;
  memset(&map, 0, sizeof map);
  int rc = dt_store_connect(&st, "127.0.0.1", C->port, NULL, 10);
  struct dt_comm_config cc = cfg_of(r);
  if (rc == DT_OK) rc = dt_comm_create(&c, st, &cc);
  if (rc == DT_OK) rc = dt__comm_tolerate_loss(c);
  if (rc == DT_OK) rc = dt_ps_map_build(&map, LENS, NL, 1);
  dt_ps_opts o;
  opts_of(C, &o);
  float init[NP], params[NP], grads[NP];
  for (size_t i = 0; i < NP; i++) init[i] = (float)(i % 5) * 0.25f;
  memcpy(params, init, sizeof params);
  if (rc == DT_OK && r == 2) {
    dt_ps_server *srv = NULL;
    struct dt_comm_config jcc = cfg_of(2);
    rc = dt_ps_server_create(&srv, &map, &o, 0, c, init);
    if (rc == DT_OK) rc = dt_ps_server_set_joins(srv, "127.0.0.1", C->port, &jcc);
    if (rc == DT_OK) rc = dt_ps_server_run(srv);
    if (srv) dt_ps_server_stats_get(srv, &C->st);
    dt_ps_server_destroy(srv);
  } else if (rc == DT_OK) {
    dt_ps_client *cl = NULL;
    rc = dt_ps_client_create(&cl, &map, &o, r, c, params, grads, NULL);
    if (rc == DT_OK) rc = dt_ps_client_start(cl);
    for (int64_t t = 0; rc == DT_OK && t < 3; t++) rc = step(cl, r, t, grads);
    if (r == 1) {
      /* worker 1 leaves: its communicator closes under the server */
      dt_ps_client_destroy(cl);
      dt_comm_destroy(c);
      c = NULL;
      atomic_store(&C->left, 1);
      dt_ps_map_free(&map);
      dt_store_destroy(st);
      C->rc[r] = rc;
      return NULL;
    }
    /* worker 0 goes on alone for 3 clocks, then waits for the joiner */
    for (int64_t t = 3; rc == DT_OK && t < 6; t++) rc = step(cl, r, t, grads);
    if (rc == DT_OK) {
      memcpy(C->at_join, params, sizeof params);
      C->join_clock = dt_ps_client_clock(cl);
      atomic_store(&C->left, 2);
    }
    for (int i = 0; rc == DT_OK && !atomic_load(&C->admitted) && i < 2000; i++) sleep_ms(5);
    for (int64_t t = 6; rc == DT_OK && t < 9; t++) rc = step(cl, r, t, grads);
    if (rc == DT_OK) rc = dt_ps_client_sync(cl);
    if (rc == DT_OK) memcpy(C->final0, params, sizeof params);
    if (rc == DT_OK) rc = dt_ps_client_stop(cl);
    dt_ps_client_destroy(cl);
  }
  if (rc < 0) snprintf(fail, 512, "rank %d: %s", r, dt_errmsg());
  C->rc[r] = rc;
  dt_comm_destroy(c);
  dt_ps_map_free(&map);
  dt_store_destroy(st);
  return NULL;
}

/* The joiners, on the test's own thread once worker 0 waits for them. */
static void joiners(ctx *C) {
  for (int i = 0; atomic_load(&C->left) < 2 && i < 4000; i++) sleep_ms(5);
  assert_int_equal(atomic_load(&C->left), 2);
  struct dt_comm_config cc = cfg_of(0);
  dt_ps_map map, other;
  assert_int_equal(dt_ps_map_build(&map, LENS, NL, 1), DT_OK);
  const uint64_t olens[] = {300, 41, 8};
  assert_int_equal(dt_ps_map_build(&other, olens, NL, 1), DT_OK);
  dt_comm *jc = NULL;
  /* a slot the job does not have */
  C->bad_slot_rc = dt_ps_join("127.0.0.1", C->port, &cc, &map, 7, &jc);
  snprintf(C->bad_slot_msg, sizeof C->bad_slot_msg, "%s", dt_errmsg());
  assert_null(jc);
  /* another model */
  C->bad_map_rc = dt_ps_join("127.0.0.1", C->port, &cc, &other, 1, &jc);
  snprintf(C->bad_map_msg, sizeof C->bad_map_msg, "%s", dt_errmsg());
  assert_null(jc);
  /* the good one: worker 1's slot */
  assert_int_equal(dt_ps_join("127.0.0.1", C->port, &cc, &map, 1, &jc), DT_OK);
  dt_ps_opts o;
  opts_of(C, &o);
  o.joined = 1;
  float params[NP], grads[NP];
  memset(params, 0, sizeof params);
  dt_ps_client *cl = NULL;
  int rc = dt_ps_client_create(&cl, &map, &o, 1, jc, params, grads, NULL);
  if (rc == DT_OK) rc = dt_ps_client_start(cl);
  if (rc == DT_OK) {
    assert_memory_equal(params, C->at_join, sizeof params);
    dt_ps_client_set_clock(cl, C->join_clock);
    atomic_store(&C->admitted, 1);
  }
  for (int64_t t = 6; rc == DT_OK && t < 9; t++) rc = step(cl, 1, t, grads);
  if (rc == DT_OK) rc = dt_ps_client_sync(cl);
  if (rc == DT_OK) memcpy(C->final_j, params, sizeof params);
  if (rc == DT_OK) rc = dt_ps_client_stop(cl);
  if (rc < 0) fprintf(stderr, "joiner: %s\n", dt_errmsg());
  atomic_store(&C->admitted, 1);
  assert_int_equal(rc, DT_OK);
  dt_ps_client_destroy(cl);
  dt_comm_destroy(jc);
  dt_ps_map_free(&map);
  dt_ps_map_free(&other);
}

static ctx *run_case(int consistency, int staleness) {
  dt_store_server *srv = NULL;
  assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, NULL), DT_OK);
  ctx *C = calloc(1, sizeof *C);
  C->consistency = consistency;
  C->staleness = staleness;
  C->port = dt_store_server_port(srv);
  pthread_t th[3];
  rank_arg ra[3];
  for (int r = 0; r < 3; r++) {
    ra[r] = (rank_arg){C, r};
    pthread_create(&th[r], NULL, rank_main, &ra[r]);
  }
  joiners(C);
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
  dt_store_server_stop(srv);
  for (int r = 0; r < 3; r++)
    if (C->rc[r] < 0) fprintf(stderr, "%s\n", C->msg[r]);
  printf("# refused: %s\n# refused: %s\n", C->bad_slot_msg, C->bad_map_msg);
  for (int r = 0; r < 3; r++) assert_int_equal(C->rc[r], DT_OK);
  assert_int_equal(C->bad_slot_rc, DT_EINVAL);
  assert_non_null(strstr(C->bad_slot_msg, "asks for worker slot 7, but the job has 2 workers"));
  assert_int_equal(C->bad_map_rc, DT_EMISMATCH);
  assert_non_null(strstr(C->bad_map_msg, "(worker 1) has another key-range map"));
  assert_int_equal(C->join_clock, 6);
  assert_memory_equal(C->final0, C->final_j, sizeof C->final0);
  assert_int_equal(C->st.workers_lost, 1);
  assert_int_equal(C->st.workers_joined, 1);
  return C;
}

static void test_leave_and_join_ssp(void **state) {
  (void)state;
  ctx *C = run_case(DT_PS_SSP, 1);
  printf("# ssp s=1: %lld reads, max missing %lld, violations %lld\n", (long long)C->st.reads,
         (long long)C->st.max_missing, (long long)C->st.violations);
  assert_int_equal(C->st.violations, 0);
  assert_true(C->st.max_missing <= 1);
  free(C);
}

static void test_leave_and_join(void **state) {
  (void)state;
  ctx *C = run_case(DT_PS_BSP, 0);
  /* the serial reference */
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.lr = 0.1f;
  oc.momentum = 0.9f;
  dt_optim *opt = NULL;
  assert_int_equal(dt_optim_create(&opt, &oc, NP), DT_OK);
  float ref[NP], g[NP];
  for (size_t i = 0; i < NP; i++) ref[i] = (float)(i % 5) * 0.25f;
  for (int64_t t = 0; t < 9; t++) {
    const int alone = t >= 3 && t < 6;
    for (size_t i = 0; i < NP; i++) {
      const float a = grad_val(0, t, i) * 0.5f;
      g[i] = alone ? a * (1.0f / 0.5f) : a + grad_val(1, t, i) * 0.5f;
    }
    assert_int_equal(dt_optim_step(opt, ref, g, 0.1f), DT_OK);
  }
  dt_optim_destroy(opt);
  assert_memory_equal(C->final0, ref, sizeof ref);
  /* 9 clocks on every key */
  assert_int_equal(C->st.clocks, 9 * 3);
  free(C);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_leave_and_join),
      cmocka_unit_test(test_leave_and_join_ssp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

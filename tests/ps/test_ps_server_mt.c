/*
 * test_ps_server_mt.c — parameter servers and workers as threads over the
 * inproc transport (src/ps/server.c, client.c), one behaviour per case:
 *   - ssp bound: with ps.staleness s and worker 1 slowed down, worker 0
 *     never completes a step more than s clocks ahead of worker 1's pushes,
 *     and does get exactly s ahead (it blocks where the bound says, not
 *     earlier); the server's instrumented reads never missed more than s
 *     clocks; s = 0 keeps the workers in lockstep;
 *   - backup workers: 3 workers, b = 1, worker 2 slowed: every clock closes
 *     (with 2 pushes), worker 2's late pushes are dropped and counted, and
 *     every worker finishes;
 *   - bsp sums: the server's parameters after T steps equal a serial
 *     reference (rank-order sum of the scaled pushes, then SGD) bit for bit;
 *   - significance filter: updates below the threshold stay with the
 *     worker and go once their sum passes it (error feedback), as sparse
 *     pushes; the parameters move exactly then;
 *   - refusals: a push for an unknown key, one of the wrong size, a push
 *     through a shared-memory window the server does not have, and a
 *     worker with another key-range map are refused with messages naming
 *     them; the server ends and the worker learns why.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "../comm/comm_test_util.h"
#include "ps/ps.h"

static const uint64_t LENS[] = {600, 0, 40, 8};
#define NL 4

typedef struct scen {
  int nworkers, nservers, consistency, staleness, backup, steps;
  int slow;               /* this worker sleeps before each step's end (-1: none) */
  int slow_ms;
  int bad;                /* 1: worker 0 sends a push for an unknown key, 2: wrong size,
                           * 3: worker 0 has another map, 4: a push through a window
                           * the server does not have */
  atomic_llong pushed[4]; /* per worker: steps pushed */
  atomic_llong maxgap;    /* worker 0's clock minus the slow worker's pushes, largest seen */
  atomic_int gap_bad;
  dt_ps_server_stats st[2];
  int server_rc[2];
  char server_msg[2][512];
  float final[2][648];    /* the servers' ranges after the run (bsp sums) */
} scen;

static void opts_of(const scen *S, dt_ps_opts *o) {
  memset(o, 0, sizeof *o);
  o->nworkers = S->nworkers;
  o->nservers = S->nservers;
  o->consistency = S->consistency;
  o->staleness = S->staleness;
  o->backup_workers = S->backup;
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.lr = 0.1f;
  oc.momentum = 0.9f;
  o->optim = oc;
}

static void sleep_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* worker w's gradient for step t: small exact values */
static float grad_val(int w, int64_t t, size_t i) { return (float)((int)((i * 7 + (size_t)w * 3 + (size_t)t) % 9) - 4) / 8.0f; }

static int body(dt_comm *c, void *arg, char *fail, size_t cap) {
  scen *S = arg;
  int r = dt_comm_rank(c);
  dt_ps_opts o;
  opts_of(S, &o);
  dt_ps_map map;
  uint64_t other[] = {600, 0, 41, 8};
  int mine_bad = S->bad == 3 && r == 0;
  int rc = dt_ps_map_build(&map, mine_bad ? other : LENS, NL, S->nservers);
  if (rc < 0) return snprintf(fail, cap, "map: %s", dt_errmsg()), rc;
  float init[649];
  for (size_t i = 0; i < map.nparams; i++) init[i] = (float)(i % 5) * 0.25f;
  if (r >= S->nworkers) {
    int s = r - S->nworkers;
    dt_ps_server *srv = NULL;
    rc = dt_ps_server_create(&srv, &map, &o, s, c, init);
    if (rc == DT_OK) rc = dt_ps_server_run(srv);
    S->server_rc[s] = rc;
    snprintf(S->server_msg[s], sizeof S->server_msg[s], "%s", rc < 0 ? dt_errmsg() : "");
    if (srv) {
      dt_ps_server_stats_get(srv, &S->st[s]);
      /* the range after the run: pull it through a fresh look at the keys */
      memcpy(S->final[s], dt__ps_server_params(srv),
             (map.srv_lo[s + 1] - map.srv_lo[s]) * sizeof(float));
    }
    dt_ps_server_destroy(srv);
    dt_ps_map_free(&map);
    return S->bad ? DT_OK : rc; /* refusals: the server is meant to fail */
  }
  float params[649], grads[649];
  memcpy(params, init, sizeof params);
  dt_ps_client *cl = NULL;
  rc = dt_ps_client_create(&cl, &map, &o, r, c, params, grads, NULL);
  if (rc == DT_OK) rc = dt_ps_client_start(cl);
  if (rc == DT_OK && S->bad && S->bad != 3 && r == 0) {
    /* a forged push straight onto the wire */
    dt_ps_msg m = {.type = DT_PS_PUSH, .sender = 0, .key = S->bad == 1 ? map.nkeys : 0,
                   .flags = DT_PS_F_PULL | (S->bad == 4 ? DT_PS_F_WIN : 0), .clock = 0, .count = map.keys[0].len + (S->bad == 2),
                   .lr = 0.1f, .weight = 1};
    uint8_t h[DT_PS_HDR_BYTES];
    dt_ps_msg_encode(&m, h);
    rc = dt_comm_send(c, dt_ps_server_rank(&o, 0), DT_PS_TAG_REQ, h, sizeof h);
    float x;
    if (rc == DT_OK) rc = dt_comm_recv(c, dt_ps_server_rank(&o, 0), DT_PS_TAG_CTL, &x, sizeof x);
  }
  for (int64_t t = 0; rc == DT_OK && !S->bad && t < S->steps; t++) {
    dt_ps_client_begin(cl, 1.0f / (float)S->nworkers, 0.1f);
    for (size_t i = 0; i < map.nparams; i++) grads[i] = grad_val(r, t, i);
    /* counted before the push goes out: counted after it, the server could
     * release worker 0 before the count moved, and worker 0 would see a gap
     * one larger than the real one (TSan timing showed it once) */
    atomic_store(&S->pushed[r], t + 1);
    dt_ps_client_ready(cl, 0, map.nparams);
    if (r == S->slow) sleep_ms(S->slow_ms);
    rc = dt_ps_client_finish(cl);
    if (rc == DT_OK && r == 0 && S->slow > 0) {
      long long gap = (long long)dt_ps_client_clock(cl) - atomic_load(&S->pushed[S->slow]);
      long long m = atomic_load(&S->maxgap);
      while (gap > m && !atomic_compare_exchange_weak(&S->maxgap, &m, gap)) {}
      if (S->consistency != DT_PS_ASP && S->backup == 0 && gap > S->staleness)
        atomic_store(&S->gap_bad, 1);
    }
  }
  if (rc == DT_OK && !S->bad) rc = dt_ps_client_sync(cl);
  if (rc == DT_OK && !S->bad) rc = dt_ps_client_stop(cl);
  if (rc < 0) snprintf(fail, cap, "worker %d: %s", r, dt_errmsg());
  dt_ps_client_destroy(cl);
  dt_ps_map_free(&map);
  return rc;
}

static int run(scen *S, int *rcs, char (*msgs)[512]) {
  return run_ranks("inproc", S->nworkers + S->nservers, 20, body, S, rcs, msgs);
}

static void test_ssp_bound(void **state) {
  (void)state;
  for (int s = 0; s <= 3; s += 3) {
    scen S = {.nworkers = 2, .nservers = 1, .consistency = DT_PS_SSP, .staleness = s,
              .steps = 16, .slow = 1, .slow_ms = 30};
    assert_int_equal(run(&S, NULL, NULL), 0);
    printf("# ssp s=%d: worker 0 ran at most %lld clocks ahead; server: %lld reads, max missing "
           "%lld, violations %lld\n", s, (long long)S.maxgap, (long long)S.st[0].reads,
           (long long)S.st[0].max_missing, (long long)S.st[0].violations);
    assert_int_equal(atomic_load(&S.gap_bad), 0);
    assert_int_equal(S.maxgap, s);
    assert_int_equal(S.st[0].violations, 0);
    assert_true(S.st[0].max_missing <= s);
  }
}

static void test_backup_workers(void **state) {
  (void)state;
  scen S = {.nworkers = 3, .nservers = 1, .consistency = DT_PS_BSP, .backup = 1, .steps = 10,
            .slow = 2, .slow_ms = 25};
  assert_int_equal(run(&S, NULL, NULL), 0);
  int nk = 3; /* one server: keys of 600, 40 and 8 floats */
  printf("# backup: %lld clocks closed over %d keys, %lld pushes, %lld dropped\n",
         (long long)S.st[0].clocks, nk, (long long)S.st[0].pushes, (long long)S.st[0].dropped);
  assert_int_equal(S.st[0].clocks, 10 * nk);
  assert_int_equal(S.st[0].pushes, 3 * 10 * nk);
  assert_true(S.st[0].dropped >= nk);
  assert_true(S.maxgap >= 1); /* the fast workers did not wait for the slow one */
}

static void test_bsp_sum(void **state) {
  (void)state;
  scen S = {.nworkers = 3, .nservers = 2, .consistency = DT_PS_BSP, .steps = 5, .slow = -1};
  assert_int_equal(run(&S, NULL, NULL), 0);
  /* the serial reference: per step the rank-order sum of w x grad, then SGD */
  dt_ps_map map;
  assert_int_equal(dt_ps_map_build(&map, LENS, NL, 2), DT_OK);
  dt_ps_opts o;
  opts_of(&S, &o);
  for (int s = 0; s < 2; s++) {
    for (int k = map.srv_key0[s]; k < map.srv_key0[s + 1]; k++) {
      size_t off = map.keys[k].off, len = map.keys[k].len;
      float p[648], g[648];
      for (size_t i = 0; i < len; i++) p[i] = (float)((off + i) % 5) * 0.25f;
      dt_optim *opt;
      assert_int_equal(dt_optim_create(&opt, &o.optim, len), DT_OK);
      for (int t = 0; t < S.steps; t++) {
        for (size_t i = 0; i < len; i++) {
          /* each worker rounds its scaled gradient to float before the
           * server adds it (volatile: no fused multiply-add here) */
          volatile float x = grad_val(0, t, off + i) * (1.0f / 3.0f);
          float acc = x;
          for (int w = 1; w < 3; w++) {
            x = grad_val(w, t, off + i) * (1.0f / 3.0f);
            acc += x;
          }
          g[i] = acc;
        }
        assert_int_equal(dt_optim_step(opt, p, g, 0.1f), DT_OK);
      }
      dt_optim_destroy(opt);
      assert_memory_equal(S.final[s] + (off - map.srv_lo[s]), p, len * sizeof(float));
    }
  }
  dt_ps_map_free(&map);
}

static void refusal(int bad, const char *server_needle, const char *worker_needle) {
  scen S = {.nworkers = 1, .nservers = 1, .consistency = DT_PS_BSP, .steps = 1, .slow = -1,
            .bad = bad};
  int rcs[2];
  char msgs[2][512];
  run(&S, rcs, msgs);
  printf("# refusal %d: server: %s\n#   worker: %s\n", bad, S.server_msg[0], msgs[0]);
  assert_true(S.server_rc[0] < 0);
  if (!strstr(S.server_msg[0], server_needle))
    fail_msg("server message '%s' lacks '%s'", S.server_msg[0], server_needle);
  assert_true(rcs[0] < 0);
  if (!strstr(msgs[0], worker_needle)) fail_msg("worker message '%s' lacks '%s'", msgs[0], worker_needle);
}

static void test_refusals(void **state) {
  (void)state;
  refusal(1, "unknown key 3", "unknown key 3");
  refusal(2, "with 601 floats (the key has 600)", "with 601 floats");
  refusal(3, "another key-range map", "another key-range map");
  refusal(4, "shared-memory window, but this server has none", "has none");
}

/* significance: 1 worker, 1 server, SGD lr 1 without momentum, parameters
 * 1, gradients 0.2 everywhere, threshold 0.5: nothing moves for two steps,
 * the third pushes the accumulated 0.6 */
static float sig_after[3][648];
static dt_ps_client_stats sig_st;
static int sig_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  int r = dt_comm_rank(c);
  dt_ps_opts o;
  memset(&o, 0, sizeof o);
  o.nworkers = 1;
  o.nservers = 1;
  o.significance = 0.5f;
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.lr = 1;
  o.optim = oc;
  dt_ps_map map;
  int rc = dt_ps_map_build(&map, LENS, NL, 1);
  float init[648];
  for (int i = 0; i < 648; i++) init[i] = 1.0f;
  if (r == 1) {
    dt_ps_server *srv = NULL;
    rc = dt_ps_server_create(&srv, &map, &o, 0, c, init);
    if (rc == DT_OK) rc = dt_ps_server_run(srv);
    dt_ps_server_destroy(srv);
  } else {
    float params[648], grads[648];
    memcpy(params, init, sizeof params);
    dt_ps_client *cl = NULL;
    rc = dt_ps_client_create(&cl, &map, &o, 0, c, params, grads, NULL);
    if (rc == DT_OK) rc = dt_ps_client_start(cl);
    for (int t = 0; rc == DT_OK && t < 3; t++) {
      dt_ps_client_begin(cl, 1.0f, 1.0f);
      for (int i = 0; i < 648; i++) grads[i] = 0.2f;
      dt_ps_client_ready(cl, 0, 648);
      rc = dt_ps_client_finish(cl);
      memcpy(sig_after[t], params, sizeof params);
    }
    if (rc == DT_OK) rc = dt_ps_client_stop(cl);
    if (cl) dt_ps_client_stats_get(cl, &sig_st);
    dt_ps_client_destroy(cl);
  }
  if (rc < 0) snprintf(fail, cap, "rank %d: %s", r, dt_errmsg());
  dt_ps_map_free(&map);
  return rc;
}

static void test_significance(void **state) {
  (void)state;
  assert_int_equal(run_ranks("inproc", 2, 20, sig_body, NULL, NULL, NULL), 0);
  float acc = 0.2f;
  acc += 0.2f;
  acc += 0.2f;
  const float want = 1.0f - acc;
  for (int i = 0; i < 648; i++) {
    assert_true(sig_after[0][i] == 1.0f);
    assert_true(sig_after[1][i] == 1.0f);
    assert_true(sig_after[2][i] == want);
  }
  assert_int_equal(sig_st.pushed_floats, 648);
  assert_int_equal(sig_st.skipped_floats, 2 * 648);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ssp_bound),
      cmocka_unit_test(test_backup_workers),
      cmocka_unit_test(test_bsp_sum),
      cmocka_unit_test(test_significance),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

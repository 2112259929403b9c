/*
 * test_shm_comm.c — the communicator over the shm transport, ranks as
 * forked processes (shm is for processes): the conformance matrix over
 * world sizes {1, 2, 3, 4, 5, 8} and counts {0, 1, 7, 1023, 1M+3}, checking
 * every collective against a reference each rank computes locally; a rank
 * killed with SIGKILL while the others are inside an allreduce makes every
 * survivor fail with DT_EPEERLOST naming it within 5 s; the hierarchical
 * allreduce across two emulated hosts (host_id override: shm inside a host,
 * tcp between) gives the same results.
 * The body and its exactness argument are in shm_mpi_conf.h. Every child is reaped by the test, or killed by pid after 50 s.
 */
#define _GNU_SOURCE
#include "comm/comm.h"
#include "comm/transport.h"

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

/* A strong reference to the shm table (kept from when comm.c found it
 * through a weak symbol; harmless now). */
const void *const test_anchor[] = {&dt__transport_shm};

#include "shm_mpi_conf.h"

/* The last rank never enters the allreduce and is killed by the parent. */
static int body_kill(dt_comm *c, int r, int n) {
  dt_comm_set_timeout(c, 30);
  if (r == n - 1) {
    atomic_fetch_add(&B->ready, 1);
    for (;;) pause();
  }
  size_t cnt = 1 << 18;
  float *buf = calloc(cnt, sizeof *buf);
  atomic_fetch_add(&B->ready, 1);
  double t0 = dt_now();
  int rc = dt_comm_allreduce(c, buf, buf, cnt, DT_F32, DT_OP_SUM);
  B->seconds[r] = dt_now() - t0;
  snprintf(B->msg[r], sizeof B->msg[r], "%s", dt_comm_errmsg(c));
  free(buf);
  return rc;
}

/* Two emulated hosts; hierarchical allreduce forced. */
static int body_hier(dt_comm *c, int r, int n) {
  for (int p = 0; p < n; p++) {
    if (p == r) continue;
    bool same = dt_comm_host_of(c, p) == dt_comm_host_of(c, r);
    const char *tp = dt_comm_transport_name(c, p);
    if (same != !strcmp(tp, "shm"))
      return fail_rank(r, DT_EINVAL, "peer %d (%s host) uses %s", p, same ? "same" : "other", tp), DT_EINVAL;
  }
  size_t cnts[] = {0, 7, 1023, (1u << 18) + 3};
  float *buf = malloc(cnts[3] * sizeof *buf);
  for (int k = 0; k < 4; k++) {
    for (int a = 0; a < 2; a++) {
      dt_redop op = a ? DT_OP_AVG : DT_OP_SUM;
      fill(buf, DT_F32, cnts[k], r);
      int rc = dt_comm_allreduce_algo(c, buf, buf, cnts[k], DT_F32, op, DT_ALGO_HIER);
      if (rc) { free(buf); return fail_rank(r, rc, "hier count=%zu: %s", cnts[k], dt_comm_errmsg(c)), rc; }
      long bad = check_red(buf, DT_F32, op, n, cnts[k], 0);
      if (bad >= 0) { free(buf); return fail_rank(r, 0, "hier %s count=%zu: element %ld wrong", dt_redop_name(op), cnts[k], bad), DT_ECORRUPT; }
    }
  }
  free(buf);
  return DT_OK;
}

typedef int (*body_fn)(dt_comm *c, int r, int n);

static void run(int n, const char *transport, const char **hosts, body_fn body, bool kill_last) {
  memset(B, 0, sizeof *B);
  char dir[] = "/tmp/dt_shm_comm_XXXXXX";
  assert_non_null(mkdtemp(dir));
  pid_t pids[MAXR];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) {
      signal(SIGSEGV, SIG_DFL);
      signal(SIGBUS, SIG_DFL);
      signal(SIGABRT, SIG_DFL);
      dt_store *st = NULL;
      dt_comm *c = NULL;
      int rc = dt_store_open_file(&st, dir);
      if (rc) { fail_rank(r, rc, "store: %s", dt_errmsg()); _exit(0); }
      struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
      cfg.transport = transport;
      cfg.rank = r;
      cfg.size = n;
      cfg.job = "shmconf";
      cfg.host_id = hosts ? hosts[r] : "shmhost";
      cfg.timeout_s = 40;
      rc = dt_comm_create(&c, st, &cfg);
      if (rc) { fail_rank(r, rc, "create: %s", dt_errmsg()); _exit(0); }
      for (int p = 0; p < n && !hosts; p++)
        if (p != r && strcmp(dt_comm_transport_name(c, p), "shm")) {
          fail_rank(r, DT_EINVAL, "peer %d uses %s, not shm", p, dt_comm_transport_name(c, p));
          _exit(0);
        }
      rc = body(c, r, n);
      if (rc && !B->rc[r]) B->rc[r] = rc;
      dt_comm_destroy(c);
      dt_store_destroy(st);
      _exit(0);
    }
  }
  if (kill_last) {
    double until = dt_now() + 30;
    while (atomic_load(&B->ready) < n && dt_now() < until) usleep(1000);
    usleep(50000); /* the survivors are inside the allreduce by now */
    kill(pids[n - 1], SIGKILL);
  }
  double until = dt_now() + 50;
  int left = n;
  bool alive[MAXR];
  for (int r = 0; r < n; r++) alive[r] = true;
  while (left) {
    for (int r = 0; r < n; r++)
      if (alive[r] && waitpid(pids[r], NULL, WNOHANG) == pids[r]) { alive[r] = false; left--; }
    if (left && dt_now() > until) {
      for (int r = 0; r < n; r++)
        if (alive[r]) { kill(pids[r], SIGKILL); waitpid(pids[r], NULL, 0); }
      fail_msg("ranks still running after 50 s");
    }
    usleep(1000);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) { /* best effort */ }
}

static void conformance(void **state) {
  (void)state;
  const int worlds[] = {1, 2, 3, 4, 5, 8};
  for (int w = 0; w < 6; w++) {
    run(worlds[w], "shm", NULL, body_conformance, false);
    for (int r = 0; r < worlds[w]; r++)
      if (B->rc[r]) fail_msg("world %d rank %d: %s: %s", worlds[w], r, dt_strerror(B->rc[r]), B->msg[r]);
  }
}

static void killed_rank(void **state) {
  (void)state;
  for (int n = 2; n <= 4; n += 2) {
    run(n, "shm", NULL, body_kill, true);
    char name[32];
    snprintf(name, sizeof name, "rank %d", n - 1);
    for (int r = 0; r < n - 1; r++) {
      if (B->rc[r] != DT_EPEERLOST)
        fail_msg("n=%d rank %d: want DT_EPEERLOST, got %s: %s", n, r, dt_strerror(B->rc[r]), B->msg[r]);
      if (!strstr(B->msg[r], name)) fail_msg("rank %d: '%s' does not name %s", r, B->msg[r], name);
      if (B->seconds[r] > 5) fail_msg("rank %d took %.2f s to notice", r, B->seconds[r]);
    }
  }
}

static void hierarchical(void **state) {
  (void)state;
  const char *hosts[] = {"hostA", "hostA", "hostB", "hostB", "hostB"};
  run(5, "auto", hosts, body_hier, false);
  for (int r = 0; r < 5; r++)
    if (B->rc[r]) fail_msg("rank %d: %s: %s", r, dt_strerror(B->rc[r]), B->msg[r]);
}

int main(void) {
  B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (B == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(conformance),
      cmocka_unit_test(killed_rank),
      cmocka_unit_test(hierarchical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

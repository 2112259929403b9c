/*
 * test_tcp_flood.c — strangers cannot block the tcp transport's listener.
 * Rank 0 of a 2-rank tcp communicator runs in a forked process whose
 * descriptor limit is lowered to 64; as soon as it has published its
 * address, a second process opens 1,000 idle connections against its
 * listening port over about two seconds and holds them; rank 1 joins while
 * that goes on, then both run an allreduce and a barrier (rank 0 waits in
 * the barrier through the rest of the flood). The job must complete, and
 * rank 0 must not spin: its CPU time stays small (EMFILE used to leave the
 * level-triggered listener readable, so every epoll_wait returned at once).
 * Rank 0's cap on connections in their handshake is lowered to 16, below
 * what the descriptors hold, so strangers that have had a second are also
 * closed for the cap (its log, in a temporary file, must say so at least
 * once: the cap is checked on every pass of the transport's loop, not only
 * when a connection arrives). Every child is reaped, or killed by pid
 * after its deadline; the store directory and the log are removed.
 */
#define _GNU_SOURCE
#include "comm/comm.h"
#include "core/core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "flood.h"

#define NIDLE 1000
struct board {
  int rc[2];
  char msg[2][300];
  double cpu0;
  _Atomic int flood_done;
};
static struct board *B;

static int reap(pid_t pid, double secs) {
  double until = dt_now() + secs;
  int st = 0;
  for (;;) {
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    if (dt_now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(5000);
  }
}

static void rank_main(const char *dir, int r, const char *log) {
  if (r == 0) {
    int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* a thousand log lines */
    if (lf >= 0) dup2(lf, 2), close(lf);
    setenv("DTRAIN_AUTH_PENDING_MAX", "16", 1);
    dt__param_reload();
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(3);
  }
  dt_store *st = NULL;
  dt_comm *c = NULL;
  int rc = dt_store_open_file(&st, dir);
  if (rc) goto out;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "tcp";
  cfg.rank = r;
  cfg.size = 2;
  cfg.job = "tcpflood";
  cfg.token = "tcp-flood-token";
  cfg.timeout_s = 60;
  if ((rc = dt_comm_create(&c, st, &cfg))) goto out;
  float v[1024];
  for (int i = 0; i < 1024; i++) v[i] = (float)(i + r);
  if ((rc = dt_comm_allreduce(c, v, v, 1024, DT_F32, DT_OP_SUM))) goto out;
  if (v[5] != 11.0f) { rc = DT_ECORRUPT; goto out; }
  if (r == 1) { /* rank 0 waits in the barrier through the rest of the flood */
    while (!atomic_load(&B->flood_done)) usleep(10000);
    usleep(1500000);
  }
  rc = dt_comm_barrier(c);
out:
  if (rc) snprintf(B->msg[r], sizeof B->msg[r], "%s", c ? dt_comm_errmsg(c) : dt_errmsg());
  B->rc[r] = rc;
  dt_comm_destroy(c);
  dt_store_destroy(st);
  if (r == 0) {
    B->cpu0 = flood_cpu_seconds();
  }
  _exit(0);
}

static void flood_main(int port, int stop) {
  static int fds[NIDLE];
  int opened = flood_open(port, NIDLE, fds);
  atomic_store(&B->flood_done, opened);
  char b;
  while (read(stop, &b, 1) < 0 && errno == EINTR) {}
  for (int i = 0; i < opened; i++) close(fds[i]);
  _exit(0);
}

static void idle_flood(void **state) {
  (void)state;
  memset(B, 0, sizeof *B);
  char dir[] = "/tmp/dt_tcp_flood_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char log[] = "/tmp/dt_tcp_flood_log_XXXXXX";
  int lfd = mkstemp(log);
  assert_true(lfd >= 0);
  close(lfd);
  int fp[2];
  assert_int_equal(pipe2(fp, O_CLOEXEC), 0);
  double t0 = dt_now();
  pid_t r0 = fork();
  assert_true(r0 >= 0);
  if (r0 == 0) rank_main(dir, 0, log);
  /* Rank 0's listening port, from the address record it publishes. */
  dt_store *st = NULL;
  assert_int_equal(dt_store_open_file(&st, dir), DT_OK);
  char rec[512];
  size_t len = 0;
  int rc = dt_store_get(st, "tcpflood/addr/0", rec, sizeof rec - 1, &len, 30);
  dt_store_destroy(st);
  int port = 0;
  if (rc == DT_OK) {
    rec[len] = 0;
    char *t = strstr(rec, "tcp=");
    char *colon = t ? strchr(t, ':') : NULL;
    if (colon) port = atoi(colon + 1);
  }
  pid_t fl = -1, r1 = -1;
  if (port > 0) {
    fl = fork();
    assert_true(fl >= 0);
    if (fl == 0) flood_main(port, fp[0]);
    usleep(300000);
    r1 = fork();
    assert_true(r1 >= 0);
    if (r1 == 0) rank_main(dir, 1, log);
  }
  int s1 = r1 > 0 ? reap(r1, 90) : -1;
  int s0 = reap(r0, 30);
  double wall = dt_now() - t0;
  if (write(fp[1], "x", 1) != 1) {}
  if (fl > 0) reap(fl, 10);
  close(fp[0]);
  close(fp[1]);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) { /* best effort */ }
  FILE *f = fopen(log, "r");
  int capped = 0;
  char line[512];
  while (f && fgets(line, sizeof line, f))
    capped += strstr(line, "more than 16 connections in their handshake") != NULL;
  if (f) fclose(f);
  unlink(log);

  printf("tcp flood: %d idle connections against rank 0; rank 0 %s, rank 1 %s; rank 0 CPU %.3f s over %.1f s; "
         "%d closed for the cap of 16\n",
         atomic_load(&B->flood_done), B->rc[0] ? dt_strerror(B->rc[0]) : "ok",
         B->rc[1] ? dt_strerror(B->rc[1]) : "ok", B->cpu0, wall, capped);
  if (port <= 0) fail_msg("rank 0 did not publish a tcp address: %s", dt_strerror(rc));
  if (s0 != 0 || s1 != 0) fail_msg("a rank did not exit cleanly (status %d / %d)", s0, s1);
  for (int r = 0; r < 2; r++)
    if (B->rc[r]) fail_msg("rank %d: %s: %s", r, dt_strerror(B->rc[r]), B->msg[r]);
  assert_int_equal(atomic_load(&B->flood_done), NIDLE);
  if (B->cpu0 > 1.0 || B->cpu0 > 0.25 * wall) fail_msg("rank 0 used %.2f s of CPU in %.1f s: it spins", B->cpu0, wall);
  if (capped < 1) fail_msg("no connection was closed for the cap of 16 (DTRAIN_AUTH_PENDING_MAX)");
}

int main(void) {
  B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (B == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(idle_flood)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

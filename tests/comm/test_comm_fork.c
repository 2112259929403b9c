/*
 * test_comm_fork.c — the comm layer across real processes: forked ranks over
 * tcp run allreduce checks; ranks that know only the store address get their
 * rank and the world size from the store; a rank killed with SIGKILL in the
 * middle of a stream of collectives makes every survivor return
 * DT_EPEERLOST naming it within 5 s; the store operations (set, get, wait,
 * add, compare-and-set, delete) behave the same on the TCP and file stores.
 * Every child is killed and reaped by pid before a test returns, and every
 * child is forked before this process starts a thread (see fork_ranks).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm_test_util.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

struct report {
  int rank, rc;
  double t_fail;
  char msg[480];
};

static void reap_all(pid_t *pids, int n) {
  for (int i = 0; i < n; i++)
    if (pids[i] > 0) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], NULL, 0);
      pids[i] = -1;
    }
}

/* Waits for pid up to timeout seconds, then kills it; returns the status
 * (or -1 if it had to be killed). Every wait here has a deadline. */
static int wait_child(pid_t pid, double timeout) {
  double end = dt_now() + timeout;
  int st = 0;
  while (dt_now() < end) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) return st;
    if (w < 0) return -1;
    struct pollfd none;
    poll(&none, 0, 5); /* 5 ms between checks */
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* Forks n ranks while this process has no other thread (a child forked
 * beside a running thread can inherit a held allocator lock and hang). Each
 * child waits for the store port on a pipe, then runs fn and exits with its
 * return value. Returns the pipe's write end for send_port. */
static int fork_ranks(int n, pid_t *pids, int (*fn)(int rank, int port, void *arg), void *arg) {
  int pp[2];
  if (pipe(pp)) return -1;
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      close(pp[1]);
      int port = 0;
      struct pollfd p = {pp[0], POLLIN, 0};
      if (poll(&p, 1, 20000) <= 0 || read(pp[0], &port, sizeof port) != sizeof port) _exit(99);
      _exit(fn(r, port, arg));
    }
  }
  close(pp[0]);
  return pp[1];
}

static void send_port(int wfd, int n, int port) {
  for (int r = 0; r < n; r++) {
    ssize_t w = write(wfd, &port, sizeof port);
    (void)w;
  }
  close(wfd);
}

/* Reads one report from fd within timeout seconds. */
static bool read_report(int fd, struct report *r, double timeout) {
  size_t got = 0;
  double end = dt_now() + timeout;
  while (got < sizeof *r) {
    int ms = (int)((end - dt_now()) * 1000);
    if (ms <= 0) return false;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) continue;
    ssize_t n = read(fd, (char *)r + got, sizeof *r - got);
    if (n <= 0) return false;
    got += (size_t)n;
  }
  return true;
}

/* ---- SIGKILL in the middle of collectives ------------------------------ */

struct kill_arg {
  int n, wfd, ready_fd;
};

static void child_loop(int port, int rank, int n, int wfd, int ready_fd);
static int kill_child(int rank, int port, void *arg) {
  struct kill_arg *a = arg;
  child_loop(port, rank, a->n, a->wfd, a->ready_fd);
  return 0;
}

static void child_loop(int port, int rank, int n, int wfd, int ready_fd) {
  dt_store *s;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.rank = rank;
  cfg.size = n;
  cfg.job = "kill";
  cfg.timeout_s = 30; /* far longer than the 5 s the test allows */
  dt_comm *c;
  struct report rep = {rank, 0, 0, ""};
  if (dt_store_connect(&s, "127.0.0.1", port, NULL, 10) || dt_comm_create(&c, s, &cfg)) {
    rep.rc = -100;
    snprintf(rep.msg, sizeof rep.msg, "setup: %s", dt_errmsg());
    ssize_t w = write(wfd, &rep, sizeof rep);
    (void)w;
    _exit(1);
  }
  size_t cnt = 1 << 18;
  float *buf = malloc(cnt * 4);
  for (size_t i = 0; i < cnt; i++) buf[i] = 1.f;
  for (int it = 0;; it++) {
    int rc = dt_comm_allreduce(c, buf, buf, cnt, DT_F32, DT_OP_MAX);
    if (it == 2) { /* tell the parent we are in the thick of it */
      char b = 1;
      ssize_t w = write(ready_fd, &b, 1);
      (void)w;
    }
    if (rc) {
      rep.rc = rc;
      rep.t_fail = dt_now();
      snprintf(rep.msg, sizeof rep.msg, "%s", dt_errmsg());
      break;
    }
  }
  ssize_t w = write(wfd, &rep, sizeof rep);
  (void)w;
  _exit(0);
}

static void test_sigkill_peer(void **st) {
  for (int victim_case = 0; victim_case < 2; victim_case++) {
    int n = 4, victim = victim_case == 0 ? 2 : 0;
    int rp[2], readyp[2];
    assert_int_equal(pipe(rp), 0);
    assert_int_equal(pipe(readyp), 0);
    pid_t pids[4];
    struct kill_arg ka = {n, rp[1], readyp[1]};
    int portw = fork_ranks(n, pids, kill_child, &ka);
    close(rp[1]);
    close(readyp[1]);
    dt_store_server *srv;
    assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, NULL), DT_OK);
    send_port(portw, n, dt_store_server_port(srv));
    /* wait until every rank has done a few collectives */
    int ready = 0;
    double end = dt_now() + 20;
    while (ready < n && dt_now() < end) {
      struct pollfd p = {readyp[0], POLLIN, 0};
      if (poll(&p, 1, 200) > 0) {
        char b[8];
        ssize_t k = read(readyp[0], b, sizeof b);
        if (k <= 0) break;
        ready += (int)k;
      }
    }
    if (ready != n) { /* reap before failing: no child outlives the test */
      reap_all(pids, n);
      dt_store_server_stop(srv);
      fail_msg("only %d of %d ranks started", ready, n);
    }
    double t_kill = dt_now();
    kill(pids[victim], SIGKILL);
    waitpid(pids[victim], NULL, 0);
    pids[victim] = -1;
    int got = 0, good = 0;
    for (int k = 0; k < n - 1; k++) {
      struct report rep;
      if (!read_report(rp[0], &rep, 10.0)) break;
      got++;
      char want[32];
      snprintf(want, sizeof want, "rank %d", victim);
      if (rep.rc == DT_EPEERLOST && strstr(rep.msg, want) && rep.t_fail - t_kill < 5.0) good++;
      else fprintf(stderr, "survivor %d: rc %d after %.2f s: %s\n", rep.rank, rep.rc, rep.t_fail - t_kill, rep.msg);
    }
    reap_all(pids, n);
    close(rp[0]);
    close(readyp[0]);
    dt_store_server_stop(srv);
    assert_int_equal(got, n - 1);
    assert_int_equal(good, n - 1); /* each: DT_EPEERLOST naming the victim within 5 s */
  }
}

/* ---- forked conformance + assigned ranks -------------------------------- */

static int child_conformance(int rank, int port, void *arg) {
  bool assigned = *(bool *)arg;
  dt_store *s;
  if (dt_store_connect(&s, "127.0.0.1", port, NULL, 10)) return 10;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.job = assigned ? "assigned" : "forked";
  cfg.rank = -1; /* rank and size from the store */
  cfg.size = 0;
  cfg.timeout_s = 20;
  dt_comm *c;
  if (dt_comm_create(&c, s, &cfg)) {
    fprintf(stderr, "child: %s\n", dt_errmsg());
    return 11;
  }
  dt_store_destroy(s);
  int n = dt_comm_size(c), r = dt_comm_rank(c), bad = 0;
  static const dt_dtype ts[] = {DT_F32, DT_BF16, DT_I64};
  static const dt_algo as[] = {DT_ALGO_RING, DT_ALGO_RHD, DT_ALGO_TREE};
  size_t cnt = 1023;
  uint8_t *in = malloc(cnt * 8), *out = malloc(cnt * 8), *ref = malloc(cnt * 8);
  for (int a = 0; a < 3; a++)
    for (int t = 0; t < 3; t++)
      for (int op = 0; op < DT_OP_COUNT; op++) {
        int seed = a * 100 + t * 10 + op;
        fill_input(in, cnt, ts[t], r, seed);
        if (dt_comm_allreduce_algo(c, in, out, cnt, ts[t], (dt_redop)op, as[a])) return 12;
        reference(ref, cnt, ts[t], (dt_redop)op, n, seed);
        bad += memcmp(out, ref, cnt * dt_dtype_size(ts[t])) != 0;
      }
  dt_comm_destroy(c);
  return bad ? 13 : 0;
}

static void test_forked_conformance(void **st) {
  for (int mode = 0; mode < 2; mode++) {
    int n = 3;
    pid_t pids[3];
    bool assigned = mode == 1;
    int portw = fork_ranks(n, pids, child_conformance, &assigned);
    dt_store_server *srv;
    assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, NULL), DT_OK);
    int port = dt_store_server_port(srv);
    dt_store *s;
    assert_int_equal(dt_store_connect(&s, "127.0.0.1", port, NULL, 5), DT_OK);
    /* the launcher's part: the world size */
    assert_int_equal(dt_store_set(s, mode ? "assigned/size" : "forked/size", "3", 1, 5), DT_OK);
    send_port(portw, n, port);
    int ok = 0;
    for (int r = 0; r < n; r++) {
      int stt = wait_child(pids[r], 30.0); /* children have 20 s deadlines on every call */
      pids[r] = -1;
      if (stt != -1 && WIFEXITED(stt) && WEXITSTATUS(stt) == 0) ok++;
      else fprintf(stderr, "child %d exit %d\n", r, stt != -1 && WIFEXITED(stt) ? WEXITSTATUS(stt) : -1);
    }
    reap_all(pids, n);
    int64_t next = 0;
    assert_int_equal(dt_store_add(s, mode ? "assigned/rank_next" : "forked/rank_next", 0, &next, 5), DT_OK);
    assert_int_equal(next, 3);
    dt_store_destroy(s);
    dt_store_server_stop(srv);
    assert_int_equal(ok, n);
  }
}

/* ---- store semantics on both backends ---------------------------------- */

static int g_port;
static char g_dir[64];
static dt_store *reopen(void) {
  dt_store *s = NULL;
  if (g_port) dt_store_connect(&s, "127.0.0.1", g_port, NULL, 5);
  else dt_store_open_file(&s, g_dir);
  return s;
}

static void *late_setter(void *p) {
  dt_store *cs = reopen(); /* a connection of its own */
  *(int *)p = cs ? dt_store_set(cs, "late", "L", 1, 1) : -1;
  dt_store_destroy(cs);
  return NULL;
}

static void store_semantics(dt_store *s) {
  char v[64];
  size_t len;
  bool sw, ex;
  assert_int_equal(dt_store_set(s, "a", "hello", 5, 1), DT_OK);
  assert_int_equal(dt_store_get(s, "a", v, sizeof v, &len, 1), DT_OK);
  assert_int_equal(len, 5);
  assert_memory_equal(v, "hello", 5);
  assert_int_equal(dt_store_get(s, "a", v, 2, &len, 1), DT_ERANGE);
  assert_int_equal(len, 5);
  const char *keys[] = {"a", "nope"};
  double t0 = dt_now();
  assert_int_equal(dt_store_wait(s, keys, 1, 1), DT_OK);
  assert_int_equal(dt_store_wait(s, keys, 2, 0.2), DT_ETIMEDOUT);
  assert_true(dt_now() - t0 < 3.0);
  int64_t x;
  assert_int_equal(dt_store_add(s, "ctr", 5, &x, 1), DT_OK);
  assert_int_equal(x, 5);
  assert_int_equal(dt_store_add(s, "ctr", -7, &x, 1), DT_OK);
  assert_int_equal(x, -2);
  /* compare-and-set */
  assert_int_equal(dt_store_cas(s, "c", NULL, 0, "one", 3, &sw, v, sizeof v, &len, 1), DT_OK);
  assert_true(sw);
  assert_int_equal(dt_store_cas(s, "c", NULL, 0, "two", 3, &sw, v, sizeof v, &len, 1), DT_OK);
  assert_false(sw);
  assert_int_equal(len, 3);
  assert_memory_equal(v, "one", 3);
  assert_int_equal(dt_store_cas(s, "c", "one", 3, "three", 5, &sw, v, sizeof v, &len, 1), DT_OK);
  assert_true(sw);
  assert_int_equal(dt_store_cas(s, "c", "one", 3, "four", 4, &sw, v, sizeof v, &len, 1), DT_OK);
  assert_false(sw);
  assert_memory_equal(v, "three", 5);
  assert_int_equal(dt_store_delete(s, "c", &ex, 1), DT_OK);
  assert_true(ex);
  assert_int_equal(dt_store_delete(s, "c", &ex, 1), DT_OK);
  assert_false(ex);
  assert_int_equal(dt_store_get(s, "c", v, sizeof v, &len, 0.05), DT_ETIMEDOUT);
  assert_int_equal(dt_store_set(s, "", "x", 1, 1), DT_EINVAL);
  /* a value set by another client wakes a waiting get */
  pthread_t th;
  int late_rc = -1;
  pthread_create(&th, NULL, late_setter, &late_rc);
  assert_int_equal(dt_store_get(s, "late", v, sizeof v, &len, 5), DT_OK);
  pthread_join(th, NULL);
  assert_int_equal(late_rc, DT_OK);
}

static void test_store_tcp(void **st) {
  dt_store_server *srv;
  assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, NULL), DT_OK);
  dt_store *s, *s2;
  assert_int_equal(dt_store_connect(&s, "127.0.0.1", dt_store_server_port(srv), NULL, 5), DT_OK);
  g_port = dt_store_server_port(srv);
  store_semantics(s);
  g_port = 0;
  char hp[64];
  snprintf(hp, sizeof hp, "127.0.0.1:%d", dt_store_server_port(srv));
  assert_int_equal(dt_store_connect_addr(&s2, hp, NULL, 5), DT_OK);
  char v[8];
  size_t len;
  assert_int_equal(dt_store_get(s2, "a", v, sizeof v, &len, 1), DT_OK);
  assert_int_equal(dt_store_connect_addr(&s2, "nohostport", NULL, 1), DT_EINVAL);
  dt_store_destroy(s2);
  dt_store_destroy(s);
  dt_store_server_stop(srv);
  dt_store_server_stop(NULL);
  dt_store_destroy(NULL);
}

static void test_store_file(void **st) {
  char dir[] = "/tmp/dt_store_XXXXXX";
  assert_non_null(mkdtemp(dir));
  dt_store *s;
  assert_int_equal(dt_store_open_file(&s, dir), DT_OK);
  snprintf(g_dir, sizeof g_dir, "%s", dir);
  store_semantics(s);
  dt_store_destroy(s);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_store_tcp),
      cmocka_unit_test(test_store_file),
      cmocka_unit_test(test_forked_conformance),
      cmocka_unit_test(test_sigkill_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

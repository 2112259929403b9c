/*
 * test_comm_faults_mt.c — failure behaviour with ranks as threads: ranks
 * calling different collectives get DT_EMISMATCH naming both calls and both
 * ranks; an expired deadline gives DT_ETIMEDOUT naming the silent peer;
 * dt_comm_abort (from a rank or from another thread) wakes every waiter on
 * every rank; strangers on a rank's listening port (random bytes, truncated
 * and oversized frames, a wrong job token) are turned away while the job
 * carries on; the store rejects a wrong token and malformed requests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm_test_util.h"
#include "comm/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAIL(...) (snprintf(fail, cap, __VA_ARGS__), -1)

static const char *tps[] = {"inproc", "tcp"};

/* ---- mismatch ---------------------------------------------------------- */

static int mismatch_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int r = dt_comm_rank(c), kind = *(int *)arg;
  float buf[16] = {0};
  int rc;
  if (r != 1) rc = dt_comm_allreduce(c, buf, buf, 10, DT_F32, DT_OP_SUM);
  else if (kind == 0) rc = dt_comm_broadcast(c, buf, 10, DT_F32, 0);
  else rc = dt_comm_allreduce(c, buf, buf, 11, DT_F32, DT_OP_SUM);
  snprintf(fail, cap, "%s", dt_errmsg());
  return rc;
}

static void test_mismatch(void **s) {
  for (int t = 0; t < 2; t++)
    for (int kind = 0; kind < 2; kind++) {
      int rcs[3];
      char msgs[3][512];
      double t0 = dt_now();
      run_ranks(tps[t], 3, 20.0, mismatch_body, &kind, rcs, msgs);
      assert_true(dt_now() - t0 < 5.0); /* no waiting for the deadline */
      for (int r = 0; r < 3; r++) {
        if (rcs[r] != DT_EMISMATCH) fprintf(stderr, "%s kind %d rank %d: rc %d: %s\n", tps[t], kind, r, rcs[r], msgs[r]);
        assert_int_equal(rcs[r], DT_EMISMATCH);
        assert_non_null(strstr(msgs[r], "mismatch"));
        assert_non_null(strstr(msgs[r], kind == 0 ? "broadcast" : "count 11"));
        assert_non_null(strstr(msgs[r], "count 10"));
        assert_non_null(strstr(msgs[r], "rank 1"));
      }
    }
}

/* ---- deadline ---------------------------------------------------------- */

static int deadline_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int r = dt_comm_rank(c);
  if (r == 1) { /* silent: wait on a tag nobody sends, longer than rank 0 */
    dt_comm_set_timeout(c, 3.0);
    int x;
    double t0 = dt_now();
    int rc = dt_comm_recv(c, 0, 99, &x, sizeof x);
    /* rank 0 times out, aborts its world; we learn of it promptly */
    if (rc == DT_OK) return FAIL("silent rank received something");
    if (dt_now() - t0 > 2.5) return FAIL("rank 1 waited %.2f s", dt_now() - t0);
    return 0;
  }
  dt_comm_set_timeout(c, 0.3);
  double t0 = dt_now();
  int rc = dt_comm_barrier(c);
  double el = dt_now() - t0;
  snprintf(fail, cap, "%s", dt_errmsg());
  if (rc != DT_ETIMEDOUT) return FAIL("barrier rc %d (%s)", rc, dt_errmsg());
  if (el < 0.25 || el > 2.0) return FAIL("deadline after %.3f s", el);
  if (!strstr(dt_errmsg(), "rank 1")) return FAIL("message does not name rank 1: %s", dt_errmsg());
  fail[0] = '\0';
  return 0;
}

static void test_deadline(void **s) {
  for (int t = 0; t < 2; t++) assert_int_equal(run_ranks(tps[t], 2, 5.0, deadline_body, NULL, NULL, NULL), 0);
}

/* ---- abort ------------------------------------------------------------- */

struct abort_arg {
  dt_comm *_Atomic target;
  atomic_int waiting, fired;
};

static void *aborter(void *p) {
  struct abort_arg *a = p;
  /* Fire only when all 3 ranks have created their communicators and are in
   * their bodies: an abort while a peer is still connecting fails that
   * peer's dt_comm_create instead, which is not what this test is about. */
  while (!a->target || atomic_load(&a->waiting) < 3) sched_yield();
  dt_comm_abort(a->target, DT_EABORTED, "stopped by test thread");
  atomic_store(&a->fired, 1);
  return NULL;
}

static int abort_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  struct abort_arg *a = arg;
  int r = dt_comm_rank(c);
  float buf[4] = {0};
  double t0 = dt_now();
  int rc;
  if (r == 2) { /* never joins; its communicator is aborted by another thread */
    a->target = c;
    int x;
    atomic_fetch_add(&a->waiting, 1);
    rc = dt_comm_recv(c, 0, 5, &x, sizeof x);
    while (!atomic_load(&a->fired)) sched_yield(); /* c must outlive the aborter's call */
  } else {
    atomic_fetch_add(&a->waiting, 1);
    rc = dt_comm_allreduce(c, buf, buf, 4, DT_F32, DT_OP_SUM);
  }
  if (rc != DT_EABORTED) return FAIL("rc %d (%s)", rc, dt_errmsg());
  if (dt_now() - t0 > 5.0) return FAIL("abort took %.2f s", dt_now() - t0);
  if (!strstr(dt_errmsg(), "stopped by test thread")) return FAIL("message: %s", dt_errmsg());
  if (dt_comm_barrier(c) != DT_EABORTED) return FAIL("calls after abort must fail at once");
  return 0;
}

static void test_abort_wakes_all(void **s) {
  for (int t = 0; t < 2; t++) {
    struct abort_arg a = {NULL, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, aborter, &a);
    assert_int_equal(run_ranks(tps[t], 3, 30.0, abort_body, &a, NULL, NULL), 0);
    pthread_join(th, NULL);
  }
}

/* ---- strangers on the listening port ------------------------------------ */

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* True if the other side closes fd within 5 s (reading and dropping data). */
static bool closed_by_peer(int fd) {
  double end = dt_now() + 5.0;
  char b[512];
  while (dt_now() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, b, sizeof b, 0);
    if (n <= 0) return true;
  }
  return false;
}

static void frame(uint8_t *out, uint32_t magic, uint8_t type, uint64_t len) {
  struct dt_frame_hdr h = {magic, DT_FRAME_VERSION, type, 0, 0, len};
  dt__frame_encode(&h, out);
}

struct stranger_arg {
  dt_store_server *srv;
  const char *job;
  atomic_int bad_closed; /* count of strangers turned away */
  atomic_int done;
};

static int stranger_rank(dt_comm *c, void *arg, char *fail, size_t cap) {
  struct stranger_arg *a = arg;
  int r = dt_comm_rank(c);
  int x = 0;
  if (r == 0) { /* blocked in a receive while strangers knock */
    if (dt_comm_recv(c, 1, 7, &x, sizeof x)) return FAIL("recv: %s", dt_errmsg());
    if (x != 42) return FAIL("got %d", x);
  } else {
    while (!atomic_load(&a->done)) sched_yield();
    x = 42;
    if (dt_comm_send(c, 0, 7, &x, sizeof x)) return FAIL("send: %s", dt_errmsg());
  }
  int64_t v = r + 1, sum = 0;
  if (dt_comm_allreduce(c, &v, &sum, 1, DT_I64, DT_OP_SUM) || sum != 3) return FAIL("allreduce after strangers");
  return 0;
}

static void *stranger_main(void *p) {
  struct stranger_arg *a = p;
  dt_store *s;
  if (dt_store_connect(&s, "127.0.0.1", dt_store_server_port(a->srv), NULL, 5)) return NULL;
  char key[128], rec[1024];
  size_t len;
  snprintf(key, sizeof key, "%s/addr/0", a->job);
  if (dt_store_get(s, key, rec, sizeof rec - 1, &len, 10)) { dt_store_destroy(s); return NULL; }
  rec[len] = '\0';
  dt_store_destroy(s);
  char *t = strstr(rec, "tcp=127.0.0.1:");
  int port = t ? atoi(t + strlen("tcp=127.0.0.1:")) : 0;
  uint8_t buf[256];
  int fd;
  /* 1: random bytes */
  if ((fd = dial(port)) >= 0) {
    dt__auth_random(buf, 200);
    send(fd, buf, 200, MSG_NOSIGNAL);
    atomic_fetch_add(&a->bad_closed, closed_by_peer(fd));
    close(fd);
  }
  /* 2: truncated frame (a hello header promising its 52 bytes, 10 arrive,
   * then the stranger hangs up) */
  if ((fd = dial(port)) >= 0) {
    frame(buf, DT_FRAME_MAGIC, DT_FRAME_HELLO, 8 + 4 + 4 + 2 + 2 + DT_AUTH_NONCE_LEN);
    send(fd, buf, DT_FRAME_HDR_LEN + 10, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    atomic_fetch_add(&a->bad_closed, closed_by_peer(fd));
    close(fd);
  }
  /* 3: oversized control frame */
  if ((fd = dial(port)) >= 0) {
    frame(buf, DT_FRAME_MAGIC, DT_FRAME_HELLO, 1ull << 40);
    send(fd, buf, DT_FRAME_HDR_LEN, MSG_NOSIGNAL);
    atomic_fetch_add(&a->bad_closed, closed_by_peer(fd));
    close(fd);
  }
  /* 4: a data frame before any handshake */
  if ((fd = dial(port)) >= 0) {
    frame(buf, DT_FRAME_MAGIC, DT_FRAME_DATA, 8);
    send(fd, buf, DT_FRAME_HDR_LEN + 8, MSG_NOSIGNAL);
    atomic_fetch_add(&a->bad_closed, closed_by_peer(fd));
    close(fd);
  }
  /* 5: a well-formed handshake with the wrong job token */
  if ((fd = dial(port)) >= 0) {
    uint8_t *pl = buf + DT_FRAME_HDR_LEN;
    frame(buf, DT_FRAME_MAGIC, DT_FRAME_HELLO, 8 + 4 + 4 + 2 + 2 + DT_AUTH_NONCE_LEN);
    uint64_t jh = fnv(a->job);
    int32_t from = 1, to = 0;
    uint16_t lane = 0, nlanes = 1; /* connection 0 of 1 */
    memcpy(pl, &jh, 8);
    memcpy(pl + 8, &from, 4);
    memcpy(pl + 12, &to, 4);
    memcpy(pl + 16, &lane, 2);
    memcpy(pl + 18, &nlanes, 2);
    uint8_t nonce[DT_AUTH_NONCE_LEN];
    dt__auth_random(nonce, sizeof nonce);
    memcpy(pl + 20, nonce, sizeof nonce);
    send(fd, buf, DT_FRAME_HDR_LEN + 20 + DT_AUTH_NONCE_LEN, MSG_NOSIGNAL);
    uint8_t in[DT_FRAME_HDR_LEN + DT_AUTH_NONCE_LEN + DT_AUTH_MAC_LEN];
    size_t got = 0;
    while (got < sizeof in) {
      struct pollfd pf = {fd, POLLIN, 0};
      if (poll(&pf, 1, 5000) <= 0) break;
      ssize_t n = recv(fd, in + got, sizeof in - got, 0);
      if (n <= 0) break;
      got += (size_t)n;
    }
    if (got == sizeof in) {
      uint8_t mac[DT_AUTH_MAC_LEN];
      const char *wrong = "not-the-token";
      dt__auth_mac((const uint8_t *)wrong, strlen(wrong), "dt-tcp-dial", in + DT_FRAME_HDR_LEN, nonce, mac);
      frame(buf, DT_FRAME_MAGIC, DT_FRAME_AUTH, DT_AUTH_MAC_LEN);
      memcpy(buf + DT_FRAME_HDR_LEN, mac, sizeof mac);
      send(fd, buf, DT_FRAME_HDR_LEN + DT_AUTH_MAC_LEN, MSG_NOSIGNAL);
      atomic_fetch_add(&a->bad_closed, closed_by_peer(fd)); /* no AUTH_OK: closed */
    }
    close(fd);
  }
  atomic_store(&a->done, 1);
  return NULL;
}

static void test_strangers_rejected(void **s) {
  /* run_ranks owns its store; do the same by hand to know the job name */
  struct stranger_arg a = {0};
  setenv("DTRAIN_JOB_TOKEN", "the-token", 1); /* ranks and store read it */
  dt__param_reload(); /* the knob table caches the environment */
  assert_int_equal(dt_store_server_start(&a.srv, "127.0.0.1", 0, NULL), DT_OK);
  a.job = "strangers";
  struct rank_ctx r[2];
  pthread_t th[2], st;
  pthread_create(&st, NULL, stranger_main, &a);
  for (int i = 0; i < 2; i++) {
    r[i] = (struct rank_ctx){i, 2, "tcp", a.job, dt_store_server_port(a.srv), 20.0, stranger_rank, &a, 0, "", NULL, 0};
    pthread_create(&th[i], NULL, rank_main, &r[i]);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  pthread_join(st, NULL);
  unsetenv("DTRAIN_JOB_TOKEN");
  dt__param_reload(); /* the knob table caches the environment */
  dt_store_server_stop(a.srv);
  for (int i = 0; i < 2; i++) {
    if (r[i].rc || r[i].fail[0]) fprintf(stderr, "rank %d: %d %s\n", i, r[i].rc, r[i].fail);
    assert_int_equal(r[i].rc, 0);
  }
  assert_int_equal(atomic_load(&a.bad_closed), 5);
}

/* ---- rendezvous deadline ------------------------------------------------ */

static void *join_partial(void *p) {
  int *args = p; /* {port, rank, rc} */
  dt_store *s;
  if (dt_store_connect(&s, "127.0.0.1", args[0], NULL, 5)) return NULL;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.rank = args[1];
  cfg.size = 3;
  cfg.job = "partial";
  cfg.timeout_s = 0.5;
  dt_comm *c = NULL;
  args[2] = dt_comm_create(&c, s, &cfg);
  if (args[2] == DT_ETIMEDOUT && !strstr(dt_errmsg(), "rank 2")) args[2] = -1000; /* must name the missing rank */
  dt_comm_destroy(c);
  dt_store_destroy(s);
  return NULL;
}

static void test_rendezvous_deadline(void **s) {
  dt_store_server *srv;
  assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, NULL), DT_OK);
  int a[2][3] = {{dt_store_server_port(srv), 0, 0}, {dt_store_server_port(srv), 1, 0}};
  pthread_t th[2];
  double t0 = dt_now();
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, join_partial, a[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  assert_true(dt_now() - t0 < 5.0);
  dt_store_server_stop(srv);
  assert_int_equal(a[0][2], DT_ETIMEDOUT);
  assert_int_equal(a[1][2], DT_ETIMEDOUT);
}

/* ---- store ------------------------------------------------------------- */

static void test_store_auth_and_garbage(void **s) {
  dt_store_server *srv;
  assert_int_equal(dt_store_server_start(&srv, "127.0.0.1", 0, "tok"), DT_OK);
  int port = dt_store_server_port(srv);
  dt_store *good, *bad;
  assert_int_equal(dt_store_connect(&good, "127.0.0.1", port, "tok", 5), DT_OK);
  assert_int_equal(dt_store_connect(&bad, "127.0.0.1", port, "wrong", 5), DT_EAUTH);
  assert_int_equal(dt_store_set(good, "k", "v", 1, 1), DT_OK);
  /* garbage after a valid handshake is impossible without the token; raw
   * garbage and an oversized request header are dropped */
  int fd = dial(port);
  uint8_t junk[300];
  dt__auth_random(junk, sizeof junk);
  send(fd, junk, sizeof junk, MSG_NOSIGNAL);
  assert_true(closed_by_peer(fd));
  close(fd);
  char v[4];
  size_t len;
  assert_int_equal(dt_store_get(good, "k", v, sizeof v, &len, 1), DT_OK);
  assert_int_equal(len, 1);
  /* a missing key times out with the key named */
  double t0 = dt_now();
  assert_int_equal(dt_store_get(good, "missing/key", v, sizeof v, &len, 0.2), DT_ETIMEDOUT);
  assert_true(dt_now() - t0 < 2.0);
  assert_non_null(strstr(dt_errmsg(), "missing/key"));
  /* the connection still works after a timeout */
  assert_int_equal(dt_store_get(good, "k", v, sizeof v, &len, 1), DT_OK);
  dt_store_destroy(good);
  dt_store_server_stop(srv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_abort_wakes_all),
      cmocka_unit_test(test_strangers_rejected),
      cmocka_unit_test(test_store_auth_and_garbage),
      cmocka_unit_test(test_rendezvous_deadline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

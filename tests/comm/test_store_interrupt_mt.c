/*
 * test_store_interrupt_mt.c — dt_store_interrupt (comm.h), which the
 * elastic watcher uses to leave a GET parked on a change's bell when its
 * worker ends: a thread blocked in a GET of a missing key with a 30 s
 * timeout returns within 2 s of another thread's interrupt, with an error;
 * every later call on that client fails at once; another client of the
 * same server is untouched; an interrupt before any call makes the first
 * call fail; the file store ignores it. Also: a parked GET is answered
 * when another client sets the key (the bell itself). And the watcher's
 * one call per heartbeat (dt__store_beat): the counter bumped, the wait for
 * the bell, the change counter in the answer; interruptible while parked;
 * DT_ENOTSUP from the file store.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define TOKEN "interrupt-test-token"

struct getter {
  dt_store *st;
  const char *key;
  double tmo;
  int rc;
  double took;
};

static void *get_thread(void *arg) {
  struct getter *g = arg;
  char v[16];
  size_t len = 0;
  double t0 = dt_now();
  g->rc = dt_store_get(g->st, g->key, v, sizeof v, &len, g->tmo);
  g->took = dt_now() - t0;
  return NULL;
}

/* A store server and two clients of it; returns its port. */
static int serve2(dt_store_server **srv, dt_store **a, dt_store **b) {
  assert_int_equal(dt_store_server_start(srv, NULL, 0, TOKEN), DT_OK);
  int port = dt_store_server_port(*srv);
  assert_int_equal(dt_store_connect(a, "127.0.0.1", port, TOKEN, 10), DT_OK);
  assert_int_equal(dt_store_connect(b, "127.0.0.1", port, TOKEN, 10), DT_OK);
  return port;
}

static void test_interrupt_parked_get(void **state) {
  (void)state;
  dt_store_server *srv = NULL;
  dt_store *a = NULL, *b = NULL;
  int port = serve2(&srv, &a, &b);

  /* the bell: a GET parked on a missing key is answered when it is set */
  struct getter g = {a, "job/el/bell/1", 30, 1, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, get_thread, &g), 0);
  usleep(100000);
  assert_int_equal(dt_store_set(b, "job/el/bell/1", "1", 1, 10), DT_OK);
  pthread_join(th, NULL);
  assert_int_equal(g.rc, DT_OK);
  assert_true(g.took < 10);

  /* interrupted while parked: out at once, with an error */
  g = (struct getter){a, "job/el/bell/2", 30, 1, 0};
  assert_int_equal(pthread_create(&th, NULL, get_thread, &g), 0);
  usleep(200000);
  double t0 = dt_now();
  dt_store_interrupt(a);
  pthread_join(th, NULL);
  double after = dt_now() - t0;
  assert_true(g.rc < 0);
  assert_true(after < 2.0);
  /* every later call fails at once (no reconnect) */
  t0 = dt_now();
  assert_true(dt_store_set(a, "k", "v", 1, 10) < 0);
  assert_true(dt_store_add(a, "c", 1, NULL, 10) < 0);
  assert_true(dt_now() - t0 < 1.0);
  /* the other client is untouched */
  int64_t v = 0;
  assert_int_equal(dt_store_add(b, "c", 2, &v, 10), DT_OK);
  assert_int_equal(v, 2);
  dt_store_destroy(a);

  /* an interrupt before any call: the first call fails */
  dt_store *c = NULL;
  assert_int_equal(dt_store_connect(&c, "127.0.0.1", port, TOKEN, 10), DT_OK);
  dt_store_interrupt(c);
  assert_true(dt_store_add(c, "c", 1, NULL, 10) < 0);
  dt_store_destroy(c);
  dt_store_interrupt(NULL); /* a no-op */

  dt_store_destroy(b);
  dt_store_server_stop(srv);
}

struct beater {
  dt_store *st;
  int rc;
  bool found;
  int64_t value;
  double took;
};

static void *beat_thread(void *arg) {
  struct beater *b = arg;
  double t0 = dt_now();
  b->rc = dt__store_beat(b->st, "job/el/bell/3", "job/el/hb/0", "job/el/change", 30, &b->found,
                         &b->value);
  b->took = dt_now() - t0;
  return NULL;
}

static void test_beat(void **state) {
  (void)state;
  dt_store_server *srv = NULL;
  dt_store *a = NULL, *b = NULL;
  serve2(&srv, &a, &b);
  /* nothing rings: answered at its timeout, DT_OK, the beat counted */
  bool found = true;
  int64_t v = -1, hb = 0;
  double t0 = dt_now();
  assert_int_equal(dt__store_beat(a, "job/el/bell/1", "job/el/hb/0", "job/el/change", 0.1, &found,
                                  &v), DT_OK);
  assert_true(dt_now() - t0 >= 0.09);
  assert_false(found);
  assert_int_equal(v, 0); /* the change counter is missing */
  assert_int_equal(dt_store_add(b, "job/el/hb/0", 0, &hb, 10), DT_OK);
  assert_int_equal(hb, 1);
  /* a rung bell: at once, with the counter */
  assert_int_equal(dt_store_add(b, "job/el/change", 2, NULL, 10), DT_OK);
  assert_int_equal(dt_store_set(b, "job/el/bell/2", "1", 1, 10), DT_OK);
  t0 = dt_now();
  assert_int_equal(dt__store_beat(a, "job/el/bell/2", "job/el/hb/0", "job/el/change", 30, &found,
                                  &v), DT_OK);
  assert_true(dt_now() - t0 < 10);
  assert_true(found);
  assert_int_equal(v, 2);
  assert_int_equal(dt_store_add(b, "job/el/hb/0", 0, &hb, 10), DT_OK);
  assert_int_equal(hb, 2);
  /* parked: the bell set by another client answers it, the counter read then */
  struct beater bt = {a, 1, false, 0, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, beat_thread, &bt), 0);
  usleep(100000);
  assert_int_equal(dt_store_add(b, "job/el/change", 1, NULL, 10), DT_OK);
  assert_int_equal(dt_store_set(b, "job/el/bell/3", "1", 1, 10), DT_OK);
  pthread_join(th, NULL);
  assert_int_equal(bt.rc, DT_OK);
  assert_true(bt.found);
  assert_int_equal(bt.value, 3);
  assert_true(bt.took < 10);
  /* parked and interrupted: out at once, with an error */
  bt = (struct beater){a, 1, false, 0, 0};
  assert_int_equal(dt_store_delete(b, "job/el/bell/3", NULL, 10), DT_OK);
  assert_int_equal(pthread_create(&th, NULL, beat_thread, &bt), 0);
  usleep(200000);
  t0 = dt_now();
  dt_store_interrupt(a);
  pthread_join(th, NULL);
  assert_true(bt.rc < 0);
  assert_true(dt_now() - t0 < 2.0);
  dt_store_destroy(a);
  dt_store_destroy(b);
  dt_store_server_stop(srv);
}

static void test_interrupt_file_store(void **state) {
  (void)state;
  char dir[] = "/tmp/dt_store_intr_XXXXXX";
  assert_non_null(mkdtemp(dir));
  dt_store *s = NULL;
  assert_int_equal(dt_store_open_file(&s, dir), DT_OK);
  bool found;
  int64_t v;
  assert_int_equal(dt__store_beat(s, "b", "h", "c", 1, &found, &v), DT_ENOTSUP); /* tcp only */
  dt_store_interrupt(s); /* cannot: calls go on */
  assert_int_equal(dt_store_set(s, "k", "v", 1, 5), DT_OK);
  dt_store_destroy(s);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interrupt_parked_get),
      cmocka_unit_test(test_beat),
      cmocka_unit_test(test_interrupt_file_store),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

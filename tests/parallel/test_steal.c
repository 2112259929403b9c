/*
 * test_steal.c — the shared micro-shard queue (src/parallel/steal.c), two
 * ranks' views of one shared block in one thread:
 *   - tickets: every micro-shard of a step is handed out once, in order,
 *     whoever asks; then -1;
 *   - the tail rule (DTRAIN_STEAL_TAIL): a rank without backups (one under
 *     a CPU quota) whose own shards take longer than the tickets left
 *     would keep the other rank busy leaves them (-1, counted in `left`)
 *     while the other rank still takes them; it takes them with the rule
 *     off, and before both ranks have a shard time, and its first ticket
 *     of a step while as many tickets as ranks are left; a rank with
 *     backups never leaves one.
 * The times are made with sleeps on the slow side only (2 ms against
 * microseconds), so the verdicts hold on a loaded machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/core.h"
#include "parallel/steal.h"

static void *shared_block(void) {
  void *p = aligned_alloc(64, dt_steal_bytes(2));
  if (p) memset(p, 0, dt_steal_bytes(2));
  return p;
}

static void nap_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* One step of `shards` on both views: rank 0 (fast, backups on) and rank 1
 * (slow: 2 ms per shard, no backups) alternate takes, rank 1 first. Returns
 * how many rank 1 took. */
static int step(dt_steal *f, dt_steal *s, int shards) {
  /* (assert_* in a forked child would longjmp into the parent's copy of
   * cmocka's state: the child checks with plain conditions) */
  dt_steal_begin(f, shards);
  dt_steal_begin(s, shards);
  int taken1 = 0, b, done = 0;
  while (!done) {
    done = 1;
    if (dt_steal_take(s, 0, &b) >= 0) {
      nap_ms(2);
      if (dt_steal_commit(s) != 1) _exit(255);
      taken1++;
      done = 0;
    }
    if (dt_steal_take(f, 1, &b) >= 0) {
      if (b != 0 || dt_steal_commit(f) != 1) _exit(255);
      done = 0;
    }
  }
  return taken1;
}

static void test_tickets(void **state) {
  (void)state;
  void *mem = shared_block();
  assert_non_null(mem);
  dt_steal *a, *b;
  assert_int_equal(dt_steal_create(&a, mem, 0, 2), DT_OK);
  assert_int_equal(dt_steal_create(&b, mem, 1, 2), DT_OK);
  dt_steal_begin(a, 5);
  dt_steal_begin(b, 5);
  int bk;
  for (int64_t i = 0; i < 5; i++) {
    dt_steal *q = i % 2 ? b : a;
    assert_int_equal(dt_steal_take(q, 1, &bk), i);
    assert_int_equal(dt_steal_commit(q), 1);
  }
  assert_int_equal(dt_steal_left(a), 0);
  assert_int_equal(dt_steal_take(a, 1, &bk), -1);
  assert_int_equal(dt_steal_take(b, 1, &bk), -1);
  dt_steal_destroy(a);
  dt_steal_destroy(b);
  free(mem);
}

/* In a child (parameters are read once per process): two steps with
 * DTRAIN_STEAL_TAIL = tail; exit status first + 4 x later + 16 x (left > 0),
 * or 255 on a failed check. */
static void tail_child(int tail) {
  setenv("DTRAIN_STEAL_TAIL", tail ? "1" : "0", 1);
  int first, later;
  int64_t left;
  void *mem = shared_block();
  dt_steal *f, *s;
  if (!mem || dt_steal_create(&f, mem, 0, 2) != DT_OK || dt_steal_create(&s, mem, 1, 2) != DT_OK)
    _exit(255);
  first = step(f, s, 4); /* no shard times yet: nothing is left */
  later = step(f, s, 4);
  dt_steal_stats st;
  dt_steal_get_stats(s, &st);
  left = st.left;
  dt_steal_get_stats(f, &st);
  int ok = st.left == 0; /* a rank with backups never leaves one */
  dt_steal_destroy(f);
  dt_steal_destroy(s);
  free(mem);
  _exit(ok ? first + 4 * later + 16 * (left > 0) : 255);
}

static void run_tail(int tail, int *first, int *later, int64_t *left) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) tail_child(tail);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  int v = WEXITSTATUS(st);
  assert_int_not_equal(v, 255);
  *first = v % 4;
  *later = (v / 4) % 4;
  *left = v / 16;
}

static void test_tail(void **state) {
  (void)state;
  int first, later;
  int64_t left;
  run_tail(1, &first, &later, &left);
  /* the slow rank takes the first ticket (no shard times yet); once both
   * have one — the fast rank's microseconds, its own 2 ms — the tickets
   * left would keep the fast rank busy for less than one of its shards:
   * it leaves them; in the next step it takes its first ticket (so that
   * its shard time keeps being measured) and leaves the rest */
  assert_int_equal(first, 1);
  assert_int_equal(later, 1);
  assert_int_equal(left, 1); /* (left > 0) */
  run_tail(0, &first, &later, &left);
  assert_int_equal(first, 2); /* alternating: 2 of 4 */
  assert_int_equal(later, 2);
  assert_int_equal(left, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* first: the children read their parameters, which a process reads
       * once (the parent must not have read them yet) */
      cmocka_unit_test(test_tail),
      cmocka_unit_test(test_tickets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

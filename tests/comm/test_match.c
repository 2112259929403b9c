/*
 * test_match.c — the shared posted/unexpected matching module
 * (src/comm/transport/match.c) on its own, driven the way a transport
 * drives it: messages "arrive" (dt__match_posted, else dt__match_ux_add)
 * and receives are "posted" (dt__match_ux_take, else dt__match_post).
 *
 * Proves: FIFO order per (source, tag) whichever side comes first; other
 * tags and sources overtake; a wildcard-source receive takes the first
 * message from anyone and then FIFO per source still holds; interleaved
 * early and late receives keep order; a claimed (still-arriving) message
 * is skipped by the next receive; cancel forgets a posted or claiming
 * receive; abort (dt__match_fail) completes every posted and claiming
 * receive with the code; 0-byte messages match and count 0 bytes; the
 * unexpected queue's bound refuses with DT_ENOMEM naming the source and
 * keeps accounting exact through removes and drain.
 */
#include "comm/transport/match.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

struct msg {
  struct dt_match_msg m;
  int id;
};

static int nfreed;
static void free_msg(struct dt_match_msg *u) {
  nfreed++;
  free(u);
}

/* A message arrives: returns the receive that took it or queues it. */
static struct dt_tp_req *arrive(struct dt_match *m, int src, uint64_t tag, size_t len, int id) {
  struct dt_tp_req *r = dt__match_posted(m, src, tag);
  if (r) {
    r->done = (size_t)id; /* record which message it got */
    r->status = 1;
    return r;
  }
  struct msg *u = calloc(1, sizeof *u);
  assert_non_null(u);
  u->id = id;
  assert_int_equal(dt__match_ux_add(m, &u->m, src, tag, len), DT_OK);
  return NULL;
}

/* A receive is posted: returns the id of the early message it took, or -1
 * (then it is queued). */
static int post(struct dt_match *m, struct dt_tp_req *r, int src, uint64_t tag) {
  memset(r, 0, sizeof *r);
  r->peer = src;
  r->tag = tag;
  r->kind = DT_TP_RECV;
  struct dt_match_msg *u = dt__match_ux_take(m, src, tag);
  if (!u) {
    dt__match_post(m, r);
    return -1;
  }
  int id = ((struct msg *)u)->id;
  r->status = 1;
  r->done = (size_t)id;
  free(u);
  return id;
}

static void fifo_per_source_and_tag(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 0);
  /* early: tags 7 and 9 from rank 1 interleaved, tag 7 from rank 2 */
  arrive(&m, 1, 7, 10, 100);
  arrive(&m, 1, 9, 10, 101);
  arrive(&m, 2, 7, 10, 102);
  arrive(&m, 1, 7, 10, 103);
  assert_int_equal(m.ux_count, 4);
  assert_int_equal(m.ux_bytes, 40);
  struct dt_tp_req r[6];
  assert_int_equal(post(&m, &r[0], 2, 7), 102); /* another source overtakes */
  assert_int_equal(post(&m, &r[1], 1, 7), 100); /* first of (1,7) */
  assert_int_equal(post(&m, &r[2], 1, 9), 101);
  assert_int_equal(post(&m, &r[3], 1, 7), 103); /* second of (1,7) */
  assert_int_equal(m.ux_count, 0);
  assert_int_equal(m.ux_bytes, 0);
  /* late: receives first, messages after, in a different tag order */
  assert_int_equal(post(&m, &r[4], 1, 7), -1);
  assert_int_equal(post(&m, &r[5], 1, 7), -1);
  struct dt_tp_req r9;
  assert_int_equal(post(&m, &r9, 1, 9), -1);
  arrive(&m, 1, 9, 4, 200);
  assert_int_equal(r9.status, 1);
  assert_int_equal(r9.done, 200);
  assert_int_equal(r[4].status, 0);
  arrive(&m, 1, 7, 4, 201);
  arrive(&m, 1, 7, 4, 202);
  assert_int_equal(r[4].done, 201);
  assert_int_equal(r[5].done, 202);
  assert_false(dt__match_has_posted(&m));
  /* a message from a source nobody waits for is queued, not matched */
  struct dt_tp_req r3;
  assert_int_equal(post(&m, &r3, 3, 7), -1);
  arrive(&m, 4, 7, 4, 300);
  assert_int_equal(r3.status, 0);
  assert_int_equal(m.ux_count, 1);
  nfreed = 0;
  dt__match_drain(&m, free_msg);
  assert_int_equal(nfreed, 1);
  assert_int_equal(m.ux_bytes, 0);
  assert_true(dt__match_cancel(&m, &r3));
  assert_false(dt__match_has_posted(&m));
}

static void wildcard_source(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 0);
  arrive(&m, 3, 5, 1, 1);
  arrive(&m, 2, 5, 1, 2);
  arrive(&m, 3, 5, 1, 3);
  struct dt_tp_req a, b, c, d;
  assert_int_equal(post(&m, &a, DT_MATCH_ANY_SRC, 5), 1); /* first to arrive */
  assert_int_equal(post(&m, &b, DT_MATCH_ANY_SRC, 6), -1); /* other tag: none */
  assert_int_equal(post(&m, &c, 3, 5), 3);
  assert_int_equal(post(&m, &d, DT_MATCH_ANY_SRC, 5), 2);
  arrive(&m, 7, 6, 0, 4);
  assert_int_equal(b.status, 1);
  assert_int_equal(b.done, 4);
  /* a posted wildcard and a posted exact receive: the older one wins */
  struct dt_tp_req e, f;
  assert_int_equal(post(&m, &e, DT_MATCH_ANY_SRC, 8), -1);
  assert_int_equal(post(&m, &f, 1, 8), -1);
  arrive(&m, 1, 8, 0, 5);
  arrive(&m, 1, 8, 0, 6);
  assert_int_equal(e.done, 5);
  assert_int_equal(f.done, 6);
}

static void interleaved_early_and_late(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 0);
  enum { N = 200 };
  struct dt_tp_req r[N];
  int next_msg = 0, next_recv = 0;
  /* a fixed pseudo-random schedule of arrivals and posts on one tag */
  uint32_t s = 12345;
  while (next_recv < N || next_msg < N) {
    s = s * 1103515245u + 12345u;
    bool do_arrive = next_recv == N || (next_msg < N && (s >> 16) & 1);
    if (do_arrive) arrive(&m, 1, 42, (size_t)next_msg, next_msg), next_msg++;
    else post(&m, &r[next_recv], 1, 42), next_recv++;
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(r[i].status, 1);
    assert_int_equal(r[i].done, (size_t)i); /* the i-th receive got the i-th message */
  }
  assert_int_equal(m.ux_count, 0);
  assert_int_equal(m.ux_bytes, 0);
}

static void claimed_message_skipped(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 0);
  struct msg *u1 = calloc(1, sizeof *u1), *u2 = calloc(1, sizeof *u2);
  u1->id = 1, u2->id = 2;
  assert_int_equal(dt__match_ux_add(&m, &u1->m, 0, 3, 100), DT_OK);
  assert_int_equal(dt__match_ux_add(&m, &u2->m, 0, 3, 100), DT_OK);
  struct dt_tp_req a = {.peer = 0, .tag = 3}, b = {.peer = 0, .tag = 3};
  /* a claims u1 while its payload is still arriving (as tcp/shm/mpi do) */
  struct dt_match_msg *f = dt__match_ux_find(&m, 0, 3);
  assert_ptr_equal(f, &u1->m);
  f->req = &a;
  /* b must get u2, not u1 */
  assert_ptr_equal(dt__match_ux_find(&m, 0, 3), &u2->m);
  /* cancel of a unclaims u1: it is the next to match again */
  assert_true(dt__match_cancel(&m, &a));
  assert_null(u1->m.req);
  assert_ptr_equal(dt__match_ux_find(&m, 0, 3), &u1->m);
  /* abort fails a claiming receive and leaves the message queued */
  u1->m.req = &b;
  dt__match_fail(&m, DT_EPEERLOST);
  assert_int_equal(b.status, DT_EPEERLOST);
  assert_null(u1->m.req);
  assert_int_equal(m.ux_count, 2);
  dt__match_ux_remove(&m, &u1->m);
  assert_int_equal(m.ux_bytes, 100);
  dt__match_ux_remove(&m, &u1->m); /* absent: no-op, accounting intact */
  assert_int_equal(m.ux_bytes, 100);
  free(u1);
  nfreed = 0;
  dt__match_drain(&m, free_msg);
  assert_int_equal(nfreed, 1);
}

static void abort_fails_posted(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 0);
  struct dt_tp_req r[3];
  for (int i = 0; i < 3; i++) assert_int_equal(post(&m, &r[i], i, 1), -1);
  assert_true(dt__match_cancel(&m, &r[1]));
  assert_false(dt__match_cancel(&m, &r[1]));
  dt__match_fail(&m, DT_EABORTED);
  assert_int_equal(r[0].status, DT_EABORTED);
  assert_int_equal(r[1].status, 0); /* cancelled: untouched */
  assert_int_equal(r[2].status, DT_EABORTED);
  assert_false(dt__match_has_posted(&m));
  /* nothing left to match a late message */
  assert_null(dt__match_posted(&m, 0, 1));
  arrive(&m, 0, 1, 0, 9);
  assert_int_equal(m.ux_count, 1);
  dt__match_drain(&m, free_msg);
}

static void zero_byte_messages(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 1); /* a 1-byte bound: zero-byte messages never hit it */
  for (int i = 0; i < 1000; i++) arrive(&m, 0, 77, 0, i);
  assert_int_equal(m.ux_count, 1000);
  assert_int_equal(m.ux_bytes, 0);
  struct dt_tp_req r;
  for (int i = 0; i < 1000; i++) assert_int_equal(post(&m, &r, 0, 77), i);
  assert_int_equal(m.ux_count, 0);
}

static void bounded_unexpected_queue(void **state) {
  (void)state;
  struct dt_match m;
  dt__match_init(&m, 1000);
  struct msg a, b, c;
  assert_int_equal(dt__match_ux_add(&m, &a.m, 5, 1, 600), DT_OK);
  assert_int_equal(dt__match_ux_add(&m, &b.m, 5, 1, 401), DT_ENOMEM);
  assert_non_null(strstr(dt_errmsg(), "rank 5"));
  assert_non_null(strstr(dt_errmsg(), "DTRAIN_UNEXPECTED_MAX_MB"));
  assert_int_equal(m.ux_count, 1);
  assert_int_equal(dt__match_ux_add(&m, &b.m, 5, 1, 400), DT_OK); /* exactly at the bound */
  assert_int_equal(dt__match_ux_add(&m, &c.m, 5, 1, 1), DT_ENOMEM);
  assert_int_equal(dt__match_ux_add(&m, &c.m, 5, 1, SIZE_MAX), DT_ENOMEM); /* no overflow */
  assert_ptr_equal(dt__match_ux_take(&m, 5, 1), &a.m); /* frees room */
  assert_int_equal(dt__match_ux_add(&m, &c.m, 5, 1, 600), DT_OK);
  dt__match_drain(&m, NULL);
  assert_int_equal(m.ux_bytes, 0);
  assert_int_equal(m.ux_count, 0);
  /* the default bound comes from DTRAIN_UNEXPECTED_MAX_MB */
  dt__match_init(&m, 0);
  assert_true(m.ux_cap >= ((size_t)1 << 20));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fifo_per_source_and_tag), cmocka_unit_test(wildcard_source),
      cmocka_unit_test(interleaved_early_and_late), cmocka_unit_test(claimed_message_skipped),
      cmocka_unit_test(abort_fails_posted),     cmocka_unit_test(zero_byte_messages),
      cmocka_unit_test(bounded_unexpected_queue),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

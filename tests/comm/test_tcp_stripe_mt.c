/*
 * test_tcp_stripe_mt.c — the tcp transport with several connections per
 * peer (DTRAIN_TCP_NCONN=3, striping from 128 KiB): point-to-point messages
 * of odd sizes, striped and not, interleaved on one tag in both directions
 * arrive whole and in order whether the receive is posted before or after
 * the data arrives; allreduce over odd counts is exact on 2 and 3 ranks; a
 * striped message whose length differs from the receive's in only its last
 * part fails that receive with DT_EPROTO instead of hanging or corrupting.
 * Ranks are threads (comm_test_util.h); nothing here depends on timing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm_test_util.h"

#define FAIL(...) (snprintf(fail, cap, __VA_ARGS__), -1)

/* odd sizes around the striping thresholds (64 KiB parts, 128 KiB minimum) */
static const size_t sizes[] = {5, 131071, 131072 + 1, 200003, 17, (1u << 20) + 7, 3 * 262144 - 1, 0, 65536 * 3};
#define NMSG (sizeof sizes / sizeof sizes[0])

static uint8_t pat(int from, size_t msg, size_t i) { return (uint8_t)(from * 131 + msg * 31 + i * 7 + (i >> 9)); }

/* Both ranks send every size to each other on tag 5 and receive them;
 * arg: 0 = receives posted first, 1 = posted after a barrier (data early). */
static int p2p_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int late = *(int *)arg, r = dt_comm_rank(c), o = 1 - r;
  uint8_t *sb[NMSG], *rb[NMSG];
  dt_comm_req sq[NMSG], rq[NMSG];
  for (size_t m = 0; m < NMSG; m++) {
    sb[m] = malloc(sizes[m] + 1);
    rb[m] = malloc(sizes[m] + 1);
    for (size_t i = 0; i < sizes[m]; i++) sb[m][i] = pat(r, m, i);
    memset(rb[m], 0xEE, sizes[m] + 1);
  }
  int rc = 0;
  if (!late)
    for (size_t m = 0; m < NMSG && !rc; m++) rc = dt_comm_irecv(c, o, 5, rb[m], sizes[m], &rq[m]);
  for (size_t m = 0; m < NMSG && !rc; m++) rc = dt_comm_isend(c, o, 5, sb[m], sizes[m], &sq[m]);
  if (!rc && late) {
    rc = dt_comm_barrier(c);
    for (size_t m = 0; m < NMSG && !rc; m++) rc = dt_comm_irecv(c, o, 5, rb[m], sizes[m], &rq[m]);
  }
  if (!rc) rc = dt_comm_waitall(c, rq, NMSG);
  if (!rc) rc = dt_comm_waitall(c, sq, NMSG);
  int bad = rc ? FAIL("p2p: %s", dt_comm_errmsg(c)) : 0;
  for (size_t m = 0; m < NMSG && !bad; m++) {
    for (size_t i = 0; i < sizes[m] && !bad; i++)
      if (rb[m][i] != pat(o, m, i)) bad = FAIL("message %zu (%zu bytes): byte %zu wrong", m, sizes[m], i);
    if (!bad && rb[m][sizes[m]] != 0xEE) bad = FAIL("message %zu overran its buffer", m);
  }
  for (size_t m = 0; m < NMSG; m++) free(sb[m]), free(rb[m]);
  return bad;
}

static void test_p2p_order(void **s) {
  (void)s;
  for (int late = 0; late < 2; late++) assert_int_equal(run_ranks("tcp", 2, 30, p2p_body, &late, NULL, NULL), 0);
}

static int allreduce_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  static const size_t counts[] = {32768 + 1, 100003, (1u << 18) + 3, 1000001};
  static const dt_dtype types[] = {DT_F32, DT_I64, DT_F32, DT_F32};
  for (int k = 0; k < 4; k++) {
    size_t n = counts[k], es = dt_dtype_size(types[k]);
    uint8_t *in = malloc(n * es), *out = malloc(n * es), *ref = malloc(n * es);
    fill_input(in, n, types[k], dt_comm_rank(c), k);
    reference(ref, n, types[k], DT_OP_SUM, dt_comm_size(c), k);
    int rc = dt_comm_allreduce(c, in, out, n, types[k], DT_OP_SUM);
    int bad = rc ? FAIL("allreduce %zu: %s", n, dt_comm_errmsg(c))
                 : memcmp(out, ref, n * es) ? FAIL("allreduce of %zu elements: wrong result", n) : 0;
    free(in), free(out), free(ref);
    if (bad) return bad;
  }
  return 0;
}

static void test_allreduce_odd(void **s) {
  (void)s;
  for (int n = 2; n <= 3; n++) assert_int_equal(run_ranks("tcp", n, 60, allreduce_body, NULL, NULL, NULL), 0);
}

/* 300000 vs 300001 bytes: with 3 parts of 100032 bytes the first two parts
 * agree and only the last differs. */
static int mismatch_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  uint8_t *b = calloc(1, 300001);
  int rc;
  if (dt_comm_rank(c) == 1) {
    rc = dt_comm_send(c, 0, 9, b, 300000); /* any outcome: rank 0 leaves */
    free(b);
    return 0;
  }
  rc = dt_comm_recv(c, 1, 9, b, 300001);
  free(b);
  if (rc != DT_EPROTO) return FAIL("receive of a shorter striped message: rc %d (%s)", rc, dt_comm_errmsg(c));
  if (!strstr(dt_comm_errmsg(c), "rank 1")) return FAIL("error does not name the sender: %s", dt_comm_errmsg(c));
  return 0;
}

static void test_length_mismatch(void **s) {
  (void)s;
  int rcs[2];
  char msgs[2][512];
  run_ranks("tcp", 2, 30, mismatch_body, NULL, rcs, msgs);
  if (msgs[0][0]) fail_msg("%s", msgs[0]);
  assert_int_equal(rcs[0], 0);
}

int main(void) {
  setenv("DTRAIN_TCP_NCONN", "3", 1);
  setenv("DTRAIN_TCP_STRIPE_MIN", "131072", 1);
  setenv("DTRAIN_CHUNK_BYTES", "393216", 1); /* ring chunks of 3 x 128 KiB parts */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_p2p_order),
      cmocka_unit_test(test_allreduce_odd),
      cmocka_unit_test(test_length_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_tcp_lanes_mt.c — the tcp transport with several connections
 * ("lanes") per peer. The lane-handshake race that withdrew the first
 * striped version: under load an acceptor closes some connections in the
 * middle of their handshake (shedding strangers when out of descriptors,
 * over DTRAIN_AUTH_PENDING_MAX, or past DTRAIN_AUTH_TIMEOUT_MS when the
 * dialer was starved), and the dialer then took its lane for refused and
 * gave up, leaving the lower rank waiting for a lane that never came until
 * its deadline ("rank 2 did not connect"). DTRAIN_TEST_TCP_SHED makes
 * every acceptor close its first connections, half before its greeting
 * and half after the dialer's proof, deterministically: every rank must
 * still connect on every lane and move exact data, for 3 and 5 ranks with
 * 4 lanes. Then the data path: messages of odd sizes, striped and not,
 * interleaved on one tag in both directions arrive whole and in order
 * whether the receive is posted before or after the data arrives;
 * allreduce over odd counts is exact; a striped message whose length
 * differs from the receive's in only its last part fails that receive with
 * DT_EPROTO naming the sender. Ranks are threads (comm_test_util.h);
 * nothing depends on timing. DTRAIN_LONG=1 repeats the handshake case 200
 * times (default 2).
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

static uint8_t pat(int from, int to, size_t msg, size_t i) {
  return (uint8_t)(from * 131 + to * 17 + msg * 31 + i * 7 + (i >> 9));
}

/* Every rank sends every size to every other rank on tag 5 and receives
 * them; arg: 0 = receives posted first, 1 = posted after a barrier (data
 * early). */
static int p2p_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int late = *(int *)arg, r = dt_comm_rank(c), n = dt_comm_size(c);
  int np = n - 1;
  uint8_t **sb = calloc((size_t)np * NMSG, sizeof *sb), **rb = calloc((size_t)np * NMSG, sizeof *rb);
  dt_comm_req *sq = calloc((size_t)np * NMSG, sizeof *sq), *rq = calloc((size_t)np * NMSG, sizeof *rq);
  for (int k = 0; k < np; k++) {
    int o = (r + 1 + k) % n;
    for (size_t m = 0; m < NMSG; m++) {
      size_t j = (size_t)k * NMSG + m;
      sb[j] = malloc(sizes[m] + 1);
      rb[j] = malloc(sizes[m] + 1);
      for (size_t i = 0; i < sizes[m]; i++) sb[j][i] = pat(r, o, m, i);
      memset(rb[j], 0xEE, sizes[m] + 1);
    }
  }
  int rc = 0;
  for (int k = 0; k < np && !late && !rc; k++)
    for (size_t m = 0; m < NMSG && !rc; m++)
      rc = dt_comm_irecv(c, (r + 1 + k) % n, 5, rb[k * NMSG + m], sizes[m], &rq[k * NMSG + m]);
  for (int k = 0; k < np && !rc; k++)
    for (size_t m = 0; m < NMSG && !rc; m++)
      rc = dt_comm_isend(c, (r + 1 + k) % n, 5, sb[k * NMSG + m], sizes[m], &sq[k * NMSG + m]);
  if (!rc && late) {
    rc = dt_comm_barrier(c);
    for (int k = 0; k < np && !rc; k++)
      for (size_t m = 0; m < NMSG && !rc; m++)
        rc = dt_comm_irecv(c, (r + 1 + k) % n, 5, rb[k * NMSG + m], sizes[m], &rq[k * NMSG + m]);
  }
  if (!rc) rc = dt_comm_waitall(c, rq, (int)(np * NMSG));
  if (!rc) rc = dt_comm_waitall(c, sq, (int)(np * NMSG));
  int bad = rc ? FAIL("p2p: %s", dt_comm_errmsg(c)) : 0;
  for (int k = 0; k < np && !bad; k++) {
    int o = (r + 1 + k) % n;
    for (size_t m = 0; m < NMSG && !bad; m++) {
      const uint8_t *b = rb[k * NMSG + m];
      for (size_t i = 0; i < sizes[m] && !bad; i++)
        if (b[i] != pat(o, r, m, i)) bad = FAIL("from rank %d, message %zu (%zu bytes): byte %zu wrong", o, m, sizes[m], i);
      if (!bad && b[sizes[m]] != 0xEE) bad = FAIL("from rank %d, message %zu overran its buffer", o, m);
    }
  }
  for (size_t j = 0; j < (size_t)np * NMSG; j++) free(sb[j]), free(rb[j]);
  free(sb), free(rb), free(sq), free(rq);
  return bad;
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

/* Connecting is the test; then a little traffic on every lane of every pair. */
static int shed_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int late = 0;
  int bad = p2p_body(c, &late, fail, cap);
  return bad ? bad : allreduce_body(c, arg, fail, cap);
}

static void set_knob(const char *k, const char *v) {
  if (v) setenv(k, v, 1);
  else unsetenv(k);
  dt__param_reload(); /* the knob table caches the environment */
}

static void test_handshake_sheds(void **s) {
  (void)s;
  const char *lg = getenv("DTRAIN_LONG");
  int reps = lg && *lg && strcmp(lg, "0") ? 200 : 2;
  set_knob("DTRAIN_TEST_TCP_SHED", "4");
  int bad = 0, rep, n = 3;
  for (rep = 0; rep < reps && !bad; rep++) {
    n = rep % 2 ? 5 : 3;
    bad = run_ranks("tcp", n, 60, shed_body, NULL, NULL, NULL);
  }
  set_knob("DTRAIN_TEST_TCP_SHED", NULL);
  if (bad) fail_msg("repeat %d of %d, %d ranks x 4 lanes with 4 sheds each: %d ranks failed", rep, reps, n, bad);
}

static void test_p2p_order(void **s) {
  (void)s;
  for (int late = 0; late < 2; late++) assert_int_equal(run_ranks("tcp", 3, 60, p2p_body, &late, NULL, NULL), 0);
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
  setenv("DTRAIN_TCP_NCONN", "4", 1);
  setenv("DTRAIN_TCP_STRIPE_MIN", "131072", 1);
  setenv("DTRAIN_CHUNK_BYTES", "393216", 1); /* ring chunks cut into 128 KiB parts */
  dt__param_reload();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_handshake_sheds),
      cmocka_unit_test(test_p2p_order),
      cmocka_unit_test(test_allreduce_odd),
      cmocka_unit_test(test_length_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

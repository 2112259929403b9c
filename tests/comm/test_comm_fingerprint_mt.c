/*
 * test_comm_fingerprint_mt.c — the collective fingerprint rides in the first
 * message to each peer together with up to 256 data bytes (comm.c, FP_INL):
 * results stay exact on both sides of that boundary (counts that fit, that
 * just do not fit, and 0) for every allreduce algorithm and broadcast /
 * allgather; ranks whose calls differ only in which side of the boundary
 * they are on (256 vs 260 bytes), or by a lot (4 bytes vs 400 KB), still get
 * DT_EMISMATCH naming both calls and both ranks, never a length error or a
 * hang; and a small collective costs one message per peer (the bytes a
 * 2-rank 64-byte allreduce sends are exactly one fingerprint message).
 * Ranks are threads; transports inproc and tcp.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm_test_util.h"

#define FAIL(...) (snprintf(fail, cap, __VA_ARGS__), -1)

static const char *tps[] = {"inproc", "tcp"};
/* i32 counts around the 256-byte inline limit (64 elements), and beyond */
static const size_t counts[] = {0, 1, 63, 64, 65, 72, 129, 1000};

static int exact_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  int32_t in[1000], out[1000], want[1000], all[4 * 1000];
  const dt_algo algos[] = {DT_ALGO_TREE, DT_ALGO_RHD, DT_ALGO_RING};
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
    size_t cnt = counts[k];
    for (int a = 0; a < 3; a++) {
      fill_input(in, cnt, DT_I32, r, (int)k);
      memset(out, 0x7f, sizeof out);
      reference(want, cnt, DT_I32, DT_OP_SUM, n, (int)k);
      int rc = dt_comm_allreduce_algo(c, in, out, cnt, DT_I32, DT_OP_SUM, algos[a]);
      if (rc) return FAIL("allreduce %s count %zu: %s", dt_algo_name(algos[a]), cnt, dt_errmsg());
      if (cnt && memcmp(out, want, cnt * sizeof *out))
        return FAIL("allreduce %s count %zu: wrong result", dt_algo_name(algos[a]), cnt);
    }
    /* broadcast from the last rank, allgather */
    for (size_t i = 0; i < cnt; i++) out[i] = r == n - 1 ? (int32_t)(i * 3 + 1) : -1;
    if (dt_comm_broadcast(c, out, cnt, DT_I32, n - 1)) return FAIL("broadcast: %s", dt_errmsg());
    for (size_t i = 0; i < cnt; i++)
      if (out[i] != (int32_t)(i * 3 + 1)) return FAIL("broadcast count %zu: element %zu wrong", cnt, i);
    for (size_t i = 0; i < cnt; i++) in[i] = (int32_t)(r * 100000 + (int)i);
    if (dt_comm_allgather(c, in, all, cnt, DT_I32)) return FAIL("allgather: %s", dt_errmsg());
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < cnt; i++)
        if (all[(size_t)q * cnt + i] != (int32_t)(q * 100000 + (int)i))
          return FAIL("allgather count %zu: rank %d element %zu wrong", cnt, q, i);
  }
  return 0;
}

static void test_exact_around_inline_limit(void **s) {
  (void)s;
  const int sizes[] = {2, 3, 4};
  for (int t = 0; t < 2; t++)
    for (int k = 0; k < 3; k++) assert_int_equal(run_ranks(tps[t], sizes[k], 20.0, exact_body, NULL, NULL, NULL), 0);
}

/* rank 1 calls allreduce with count b, the others with count a */
struct pair {
  size_t a, b;
};

static int mismatch_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const struct pair *p = arg;
  static _Thread_local float buf[100000];
  size_t cnt = dt_comm_rank(c) == 1 ? p->b : p->a;
  int rc = dt_comm_allreduce(c, buf, buf, cnt, DT_F32, DT_OP_SUM);
  snprintf(fail, cap, "%s", dt_errmsg());
  return rc;
}

static void test_mismatch_across_inline_limit(void **s) {
  (void)s;
  const struct pair pairs[] = {{64, 65}, {65, 64}, {1, 100000}, {100000, 64}};
  for (int t = 0; t < 2; t++)
    for (int k = 0; k < 4; k++) {
      struct pair p = pairs[k];
      int rcs[3];
      char msgs[3][512], a[32], b[32];
      snprintf(a, sizeof a, "count %zu", p.a);
      snprintf(b, sizeof b, "count %zu", p.b);
      double t0 = dt_now();
      run_ranks(tps[t], 3, 20.0, mismatch_body, &p, rcs, msgs);
      if (dt_now() - t0 >= 5.0)
        for (int r = 0; r < 3; r++) fprintf(stderr, "%s %zu/%zu rank %d slow: rc %d: %s\n", tps[t], p.a, p.b, r, rcs[r], msgs[r]);
      assert_true(dt_now() - t0 < 5.0); /* no waiting for the deadline */
      for (int r = 0; r < 3; r++) {
        if (rcs[r] != DT_EMISMATCH || !strstr(msgs[r], a) || !strstr(msgs[r], b) || !strstr(msgs[r], "rank 1"))
          fprintf(stderr, "%s %zu/%zu rank %d: rc %d: %s\n", tps[t], p.a, p.b, r, rcs[r], msgs[r]);
        assert_int_equal(rcs[r], DT_EMISMATCH);
        assert_non_null(strstr(msgs[r], "mismatch"));
        assert_non_null(strstr(msgs[r], a));
        assert_non_null(strstr(msgs[r], b));
        assert_non_null(strstr(msgs[r], "rank 1"));
      }
    }
}

static int bytes_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  float buf[16] = {0};
  uint64_t s0, r0, s1, r1;
  if (dt_comm_barrier(c)) return FAIL("barrier: %s", dt_errmsg());
  dt_comm_bytes(c, &s0, &r0);
  for (int i = 0; i < 10; i++)
    if (dt_comm_allreduce_algo(c, buf, buf, 16, DT_F32, DT_OP_SUM, DT_ALGO_TREE))
      return FAIL("allreduce: %s", dt_errmsg());
  dt_comm_bytes(c, &s1, &r1);
  /* one 288-byte message (32-byte fingerprint + 256 inline bytes) per call;
   * a separate fingerprint would be 32 + 64 bytes in two messages */
  if (s1 - s0 != 10 * 288 || r1 - r0 != 10 * 288)
    return FAIL("10 small allreduces sent %llu and received %llu bytes, want %d each",
                (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0), 10 * 288);
  return 0;
}

static void test_one_message_per_peer(void **s) {
  (void)s;
  for (int t = 0; t < 2; t++) assert_int_equal(run_ranks(tps[t], 2, 20.0, bytes_body, NULL, NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_around_inline_limit),
      cmocka_unit_test(test_mismatch_across_inline_limit),
      cmocka_unit_test(test_one_message_per_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

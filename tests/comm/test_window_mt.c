/*
 * test_window_mt.c — shared-memory windows (src/comm/window.h) with ranks as
 * threads: the scaled one-pass allreduce against a reference summed in rank
 * order, for 1..5 and 8 ranks, counts 0, 1, 7, 1023 and 1M+3 at odd
 * offsets, every rank ending with the same bits; ranks naming different
 * spans get DT_EMISMATCH naming both; a rank that never calls gives its
 * peers DT_ETIMEDOUT naming it; a rank that aborts wakes its peers with its
 * reason; a window over ranks on two (pretend) hosts, or over ranks that
 * talk tcp, is DT_ENOTSUP on every rank; the int64 sum (deterministic
 * mode's fixed-point gradients) is exact for 1..5 ranks, near-overflow
 * values included, and a rank summing floats while another sums int64s over
 * the same bytes is DT_EMISMATCH; int64 sums turned back into floats in
 * the window (dt_comm_window_allreduce_i64_f32) have dt_fix_to_float's
 * bits on every rank for 1..5 ranks, the leading int64 elements summed in
 * place, nothing else written, and a rank converting while another does
 * not is DT_EMISMATCH; the reduce into a rank's own ranges
 * (ZeRO-1's reduce-scatter) has the allreduce's bits there and leaves the
 * rest alone; slices cut by shares (dt_comm_window_set_shares: a zero
 * weight, a tiny one, uneven ones) give the equal cut's bits on every rank,
 * and ranks that set different shares get DT_EMISMATCH. Peer death across processes is covered end to end by
 * tests/cli/test_cli_workers_kill.sh (data-parallel gradients use windows).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm_test_util.h"
#include "comm/window.h"

#define FAIL(...) (snprintf(fail, cap, __VA_ARGS__), -1)

/* Input of rank r at element i: a few bits of mantissa so sums round. */
static float win_val(int r, size_t i) { return (float)((int)((r * 131 + i * 17) % 1001) - 500) / 7.0f; }
static float win_scale(int r) { return 1.0f / (float)(r + 3); }

struct sizes_arg {
  size_t off_floats, count;
};

static int sizes_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const struct sizes_arg *a = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  size_t total = a->off_floats + a->count + 5;
  dt_comm_window *w;
  int rc = dt_comm_window_create(c, total * sizeof(float), &w);
  if (rc < 0) return FAIL("create: %s", dt_errmsg());
  float *x = dt_comm_window_base(w);
  for (size_t i = 0; i < total; i++) x[i] = win_val(r, i);
  /* twice: the second call reuses the other fingerprint slot */
  for (int rep = 0; rep < 2 && rc == DT_OK; rep++) {
    if (rep)
      for (size_t i = 0; i < total; i++) x[i] = win_val(r, i);
    rc = dt_comm_window_allreduce_f32(w, a->off_floats * 4, a->count, win_scale(r));
  }
  if (rc < 0) {
    snprintf(fail, cap, "allreduce: %s", dt_errmsg());
    dt_comm_window_destroy(w);
    return rc;
  }
  int bad = 0;
  for (size_t i = 0; i < total && !bad; i++) {
    float want;
    if (i < a->off_floats || i >= a->off_floats + a->count) {
      want = win_val(r, i); /* outside the span: untouched */
    } else {
      /* the library sums s_q * x_q in rank order; with n == 2 it may fuse
       * into one FMA, so allow the last bit of a few rounding steps */
      double ref = 0;
      for (int q = 0; q < n; q++) ref += (double)win_scale(q) * (double)win_val(q, i);
      want = (float)ref;
      if (fabsf(x[i] - want) <= 4e-6f * (1.0f + fabsf(want))) continue;
    }
    if (x[i] != want) bad = FAIL("n=%d count %zu: element %zu is %.9g, want %.9g", n, a->count, i,
                                 (double)x[i], (double)want);
  }
  /* the span holds the same bits on every rank: compare checksums */
  uint64_t h = 1469598103934665603ull;
  for (size_t i = a->off_floats; i < a->off_floats + a->count; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    h = (h ^ u) * 1099511628211ull;
  }
  uint64_t hmin = h, hmax = h;
  if (dt_comm_allreduce(c, &hmin, &hmin, 1, DT_I64, DT_OP_MIN) < 0 ||
      dt_comm_allreduce(c, &hmax, &hmax, 1, DT_I64, DT_OP_MAX) < 0)
    bad = FAIL("checksum allreduce: %s", dt_errmsg());
  else if (hmin != hmax)
    bad = FAIL("n=%d count %zu: ranks hold different bits", n, a->count);
  dt_comm_window_destroy(w);
  return bad;
}

static void test_sizes(void **s) {
  (void)s;
  static const int ns[] = {1, 2, 3, 4, 5, 8};
  static const size_t counts[] = {0, 1, 7, 1023, (1u << 20) + 3};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
    for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++) {
      struct sizes_arg a = {j % 2 ? 3 : 0, counts[j]};
      if (ns[k] == 8 && counts[j] > 2000) continue; /* 8 threads x 4 MiB: slow under TSan */
      assert_int_equal(run_ranks("inproc", ns[k], 20.0, sizes_body, &a, NULL, NULL), 0);
    }
}

/* ---- reduce into own ranges (ZeRO-1's reduce-scatter) ------------------- */

/* Two windows of count floats (and a line to spare): one to test, one for
 * the reference. */
static int two_windows(dt_comm *c, size_t count, dt_comm_window **w, dt_comm_window **ref) {
  if (dt_comm_window_create(c, count * sizeof(float) + 64, w) < 0) return -1;
  if (dt_comm_window_create(c, count * sizeof(float) + 64, ref) < 0) {
    dt_comm_window_destroy(*w);
    return -1;
  }
  return 0;
}

/* Rank r sums block r (blocks of count / n, the last rank also the tail)
 * into its own window: those elements get the allreduce's bits (computed
 * afterwards on a second window of the same inputs), everything else keeps
 * the rank's own input; a range past the span is DT_EINVAL. */
static int local_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const size_t count = *(const size_t *)arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  dt_comm_window *w, *ref;
  if (two_windows(c, count, &w, &ref) < 0) return FAIL("create: %s", dt_errmsg());
  float *x = dt_comm_window_base(w), *y = dt_comm_window_base(ref);
  for (size_t i = 0; i < count; i++) x[i] = y[i] = win_val(r, i);
  size_t blk = count / (size_t)n, rg[2] = {(size_t)r * blk, (size_t)(r + 1) * blk};
  if (r == n - 1) rg[1] = count;
  int bad = 0;
  size_t past[2] = {0, count + 1};
  if (dt_comm_window_reduce_local_f32(w, 0, count, 1.0f, past, 1) != DT_EINVAL)
    bad = FAIL("a range past the span was not DT_EINVAL");
  else if (dt_comm_window_reduce_local_f32(w, 0, count, win_scale(r), rg, 1) < 0 ||
           dt_comm_window_allreduce_f32(ref, 0, count, win_scale(r)) < 0)
    bad = FAIL("reduce: %s", dt_errmsg());
  for (size_t i = 0; i < count && !bad; i++) {
    int mine = i >= rg[0] && i < rg[1];
    float want = mine ? y[i] : win_val(r, i);
    if (memcmp(&x[i], &want, 4))
      bad = FAIL("n=%d count %zu: element %zu (%s) is %.9g, want %.9g", n, count, i,
                 mine ? "summed" : "untouched", (double)x[i], (double)want);
  }
  dt_comm_window_destroy(ref);
  dt_comm_window_destroy(w);
  return bad;
}

static void test_reduce_local(void **s) {
  (void)s;
  static const size_t counts[] = {7, 1023, 70001};
  for (int n = 1; n <= 5; n++)
    for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++)
      assert_int_equal(run_ranks("inproc", n, 20.0, local_body, (void *)&counts[j], NULL, NULL), 0);
}

/* ---- slices by shares (dist.balance = dynamic) ---------------------------- */

/* The same inputs reduced with equal slices and with slices cut by uneven
 * shares (rank 0 weight 0 with 3+ ranks: it sums nothing) have the same
 * bits; then shares that differ between ranks are DT_EMISMATCH. */
static int shares_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const size_t count = *(const size_t *)arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  dt_comm_window *w, *ref;
  if (two_windows(c, count, &w, &ref) < 0) return FAIL("create: %s", dt_errmsg());
  float *x = dt_comm_window_base(w), *y = dt_comm_window_base(ref);
  double wt[8];
  for (int q = 0; q < n; q++) wt[q] = q == 0 && n > 2 ? 0.0 : q == 1 ? 1e-3 : 1.0 + q;
  int bad = 0;
  for (int rep = 0; rep < 2 && !bad; rep++) { /* the second call: the other fingerprint slot */
    for (size_t i = 0; i < count; i++) x[i] = y[i] = win_val(r, i);
    if (dt_comm_window_set_shares(w, wt) < 0 ||
        dt_comm_window_allreduce_f32(w, 0, count, win_scale(r)) < 0 ||
        dt_comm_window_allreduce_f32(ref, 0, count, win_scale(r)) < 0)
      bad = FAIL("reduce: %s", dt_errmsg());
    for (size_t i = 0; i < count && !bad; i++)
      if (memcmp(&x[i], &y[i], 4))
        bad = FAIL("n=%d count %zu: element %zu is %.9g with shares, %.9g without", n, count, i,
                   (double)x[i], (double)y[i]);
  }
  if (!bad && n > 1) {
    wt[0] += r == 1; /* rank 1 alone cuts differently */
    dt_comm_window_set_shares(w, wt);
    int rc = dt_comm_window_allreduce_f32(w, 0, count, 1.0f);
    /* a rank may see a peer that already gave up on it instead */
    if (!(rc == DT_EMISMATCH && strstr(dt_errmsg(), "shares")) && rc != DT_EABORTED)
      bad = FAIL("n=%d: different shares gave %d (%s), want DT_EMISMATCH", n, rc, dt_errmsg());
  }
  dt_comm_window_destroy(ref);
  dt_comm_window_destroy(w);
  return bad;
}

static void test_shares(void **s) {
  (void)s;
  static const size_t counts[] = {7, 1023, 70001};
  for (int n = 1; n <= 4; n++)
    for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++)
      assert_int_equal(run_ranks("inproc", n, 20.0, shares_body, (void *)&counts[j], NULL, NULL), 0);
}

/* ---- int64 sums ---------------------------------------------------------- */

static int i64_shift; /* set before the ranks start: smaller sums */
static int64_t i64_val(int r, size_t i) {
  if (i64_shift) /* |sum| < 2^51 but for one value in 97 */
    return (int64_t)((r * 7919 + i * 104729) % 200003) * ((int64_t)1 << (i % 97 ? 20 : 40)) *
               (i % 2 ? -1 : 1) + r;
  return (int64_t)((r * 7919 + i * 104729) % 200003) * ((int64_t)1 << 40) * (i % 2 ? -1 : 1) + r;
}

static int i64_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const struct sizes_arg *a = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  size_t total = a->off_floats + a->count + 5;
  dt_comm_window *w;
  if (dt_comm_window_create(c, total * sizeof(int64_t), &w) < 0)
    return FAIL("create: %s", dt_errmsg());
  int64_t *x = dt_comm_window_base(w);
  for (size_t i = 0; i < total; i++) x[i] = i64_val(r, i);
  int rc = dt_comm_window_allreduce_i64(w, a->off_floats * 8, a->count);
  int bad = rc < 0 ? FAIL("allreduce: %s", dt_errmsg()) : 0;
  for (size_t i = 0; i < total && !bad; i++) {
    int64_t want = i64_val(r, i);
    if (i >= a->off_floats && i < a->off_floats + a->count) {
      want = 0;
      for (int q = 0; q < n; q++) want += i64_val(q, i);
    }
    if (x[i] != want) bad = FAIL("n=%d count %zu: int64 %zu is %lld, want %lld", n, a->count, i,
                                 (long long)x[i], (long long)want);
  }
  dt_comm_window_destroy(w);
  return bad;
}

static void test_i64(void **s) {
  (void)s;
  static const size_t counts[] = {0, 1, 7, 1023, 70001};
  for (int n = 1; n <= 5; n++)
    for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++) {
      struct sizes_arg a = {j % 2 ? 3 : 0, counts[j]};
      assert_int_equal(run_ranks("inproc", n, 20.0, i64_body, &a, NULL, NULL), 0);
    }
}

/* The sums back as floats: nint leading int64 sums in place, the rest as
 * (float)((double)sum * k) at the window's float area (after the int64s),
 * which is otherwise left alone, as are the other int64s. */
static int i64_f32_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const struct sizes_arg *a = arg;
  int r = dt_comm_rank(c), n = dt_comm_size(c);
  size_t total = a->off_floats + a->count + 5, nint = a->count < 3 ? a->count : 3;
  size_t foff = total * sizeof(int64_t) + 4 * sizeof(float); /* 4 floats of margin */
  size_t nf = a->count - nint + 8;
  dt_comm_window *w;
  if (dt_comm_window_create(c, foff + nf * sizeof(float), &w) < 0)
    return FAIL("create: %s", dt_errmsg());
  int64_t *x = dt_comm_window_base(w);
  float *f = (float *)((char *)x + foff) - 4; /* margin, span, margin */
  for (size_t i = 0; i < total; i++) x[i] = i64_val(r, i);
  for (size_t i = 0; i < nf; i++) f[i] = -1.5f;
  const double k = ldexp(1.0, -32) / 192.0;
  int rc = dt_comm_window_allreduce_i64_f32(w, a->off_floats * 8, a->count, nint, foff, k);
  int bad = rc < 0 ? FAIL("allreduce: %s", dt_errmsg()) : 0;
  for (size_t i = 0; i < total && !bad; i++) {
    int64_t want = i64_val(r, i), sum = 0;
    for (int q = 0; q < n; q++) sum += i64_val(q, i);
    size_t j = i - a->off_floats; /* index in the span */
    int in = i >= a->off_floats && j < a->count;
    if (in && j < nint) want = sum;
    if (x[i] != want) bad = FAIL("n=%d count %zu: int64 %zu is %lld, want %lld", n, a->count, i,
                                 (long long)x[i], (long long)want);
    if (in && j >= nint && !bad) {
      float fw = (float)((double)sum * k), got = f[4 + j - nint];
      if (memcmp(&got, &fw, sizeof got))
        bad = FAIL("n=%d count %zu: float %zu is %a, want %a", n, a->count, j, got, fw);
    }
  }
  for (size_t i = 0; i < 4 && !bad; i++)
    if (f[i] != -1.5f || f[nf - 1 - i] != -1.5f) bad = FAIL("n=%d: float margin written", n);
  dt_comm_window_destroy(w);
  return bad;
}

static void test_i64_f32(void **s) {
  (void)s;
  static const size_t counts[] = {0, 1, 7, 1023, 70001};
  for (int n = 1; n <= 5; n++)
    for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++) {
      struct sizes_arg a = {j % 2 ? 3 : 0, counts[j]};
      assert_int_equal(run_ranks("inproc", n, 20.0, i64_f32_body, &a, NULL, NULL), 0);
      /* sums the vector conversion takes (|sum| < 2^51), with a block in
       * three redone in scalar */
      i64_shift = 1;
      int rc = run_ranks("inproc", n, 20.0, i64_f32_body, &a, NULL, NULL);
      i64_shift = 0;
      assert_int_equal(rc, 0);
    }
}

/* ---- failures ----------------------------------------------------------- */

struct fault_arg {
  int kind; /* 0 mismatch, 1 silent rank, 2 abort, 3 int64 vs float, 4 int64 vs back as floats */
};

static int fault_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  const struct fault_arg *a = arg;
  int r = dt_comm_rank(c);
  dt_comm_window *w;
  if (dt_comm_window_create(c, 4096, &w) < 0) return FAIL("create: %s", dt_errmsg());
  dt_comm_set_timeout(c, 1.0);
  int rc;
  if (a->kind == 0) {
    rc = dt_comm_window_allreduce_f32(w, 0, r == 1 ? 11 : 10, 1.0f);
  } else if (a->kind == 3) {
    rc = r == 1 ? dt_comm_window_allreduce_i64(w, 0, 5) : dt_comm_window_allreduce_f32(w, 0, 10, 1.0f);
  } else if (a->kind == 4) {
    rc = r == 1 ? dt_comm_window_allreduce_i64(w, 0, 5)
                : dt_comm_window_allreduce_i64_f32(w, 0, 5, 0, 2048, 0x1p-40);
  } else if (a->kind == 1) {
    rc = r == 1 ? DT_OK : dt_comm_window_allreduce_f32(w, 0, 10, 1.0f);
  } else {
    if (r == 1) dt_comm_window_abort(w, "rank 1 stops here");
    rc = dt_comm_window_allreduce_f32(w, 0, 10, 1.0f);
  }
  snprintf(fail, cap, "%s", rc < 0 ? dt_errmsg() : "");
  /* every thread leaves the window protocol before anyone unmaps */
  dt_comm_set_timeout(c, 20.0);
  dt_comm_barrier(c);
  dt_comm_window_destroy(w);
  return rc;
}

static void test_faults(void **s) {
  (void)s;
  for (int kind = 0; kind < 5; kind++) {
    struct fault_arg a = {kind};
    int rcs[3];
    char msgs[3][512];
    double t0 = dt_now();
    run_ranks("inproc", 3, 20.0, fault_body, &a, rcs, msgs);
    double el = dt_now() - t0;
    for (int r = 0; r < 3; r++) {
      if (kind == 1 && r == 1) {
        assert_int_equal(rcs[r], DT_OK);
        continue;
      }
      fprintf(stderr, "# kind %d rank %d: rc %d: %s\n", kind, r, rcs[r], msgs[r]);
      if (kind == 0) {
        assert_int_equal(rcs[r], DT_EMISMATCH);
        assert_non_null(strstr(msgs[r], "+11"));
        assert_non_null(strstr(msgs[r], "+10"));
      } else if (kind == 3) {
        /* rank 1 sums int64s where the others sum floats */
        assert_int_equal(rcs[r], DT_EMISMATCH);
        assert_non_null(strstr(msgs[r], "int64s"));
        assert_non_null(strstr(msgs[r], "floats"));
      } else if (kind == 4) {
        assert_int_equal(rcs[r], DT_EMISMATCH);
        assert_non_null(strstr(msgs[r], "converts the int64 sums"));
      } else if (kind == 1) {
        assert_int_equal(rcs[r], DT_ETIMEDOUT);
        assert_non_null(strstr(msgs[r], "rank 1"));
      } else {
        assert_int_equal(rcs[r], DT_EABORTED);
        if (r != 1) assert_non_null(strstr(msgs[r], "rank 1 stops here"));
      }
    }
    assert_true(el < 10.0);
  }
}

static int hosts_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  (void)arg;
  dt_comm_window *w = NULL;
  int rc = dt_comm_window_create(c, 4096, &w);
  if (rc != DT_ENOTSUP) return FAIL("window: rc %d, want DT_ENOTSUP", rc);
  return w ? FAIL("window handle returned with DT_ENOTSUP") : 0;
}

static void test_two_hosts(void **s) {
  (void)s;
  g_host_mod = 2;
  int bad = run_ranks("inproc", 4, 20.0, hosts_body, NULL, NULL, NULL);
  g_host_mod = 0;
  assert_int_equal(bad, 0);
  /* one host, but the job talks tcp: windows stay out of the way */
  assert_int_equal(run_ranks("tcp", 2, 20.0, hosts_body, NULL, NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_i64),
      cmocka_unit_test(test_i64_f32),
      cmocka_unit_test(test_reduce_local),
      cmocka_unit_test(test_shares),
      cmocka_unit_test(test_faults),
      cmocka_unit_test(test_two_hosts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_comm_conformance_mt.c — the same collective bodies over transports
 * {inproc, tcp} x world sizes {1,2,3,4,5,8}: allreduce for every algorithm,
 * op and dtype at counts {0, 1, 7, 1023}, 1M+3 elements for a subset, and
 * broadcast, reduce, allgather, reduce-scatter, alltoall, barrier and split.
 * Ranks are threads of this process, each with its own store client and
 * communicator (for tcp that is real sockets over 127.0.0.1).
 *
 * Exactness: inputs are small integers (see small_val in comm_test_util.h),
 * so every sum is exact in every dtype and in any order; results must match
 * the locally computed reference bit for bit. One test uses random floats
 * instead and checks against a fixed-order double sum with a stated bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm_test_util.h"

#include <math.h>

static const dt_dtype dtypes[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
static const size_t counts[] = {0, 1, 7, 1023};
static const dt_algo algos[] = {DT_ALGO_RING, DT_ALGO_RHD, DT_ALGO_TREE};

#define FAIL(...) (snprintf(fail, cap, __VA_ARGS__), -1)

static int allreduce_matrix(dt_comm *c, void *arg, char *fail, size_t cap) {
  int n = dt_comm_size(c), r = dt_comm_rank(c), seed = 0;
  size_t maxb = 1023 * 8;
  uint8_t *in = malloc(maxb), *out = malloc(maxb), *ref = malloc(maxb);
  int rc = 0;
  for (size_t a = 0; a < 3 && !rc; a++)
    for (size_t d = 0; d < 6 && !rc; d++)
      for (int op = 0; op < DT_OP_COUNT && !rc; op++)
        for (size_t k = 0; k < 4 && !rc; k++, seed++) {
          dt_dtype t = dtypes[d];
          size_t cnt = counts[k], es = dt_dtype_size(t);
          fill_input(in, cnt, t, r, seed);
          bool inplace = seed % 2;
          if (inplace) memcpy(out, in, cnt * es);
          rc = dt_comm_allreduce_algo(c, inplace ? out : in, out, cnt, t, (dt_redop)op, algos[a]);
          if (rc) return FAIL("allreduce %s %s %s count %zu: %s", dt_algo_name(algos[a]),
                              dt_dtype_name(t), dt_redop_name((dt_redop)op), cnt, dt_errmsg());
          reference(ref, cnt, t, (dt_redop)op, n, seed);
          if (cnt && memcmp(out, ref, cnt * es))
            rc = FAIL("allreduce %s %s %s count %zu n %d: wrong result", dt_algo_name(algos[a]),
                      dt_dtype_name(t), dt_redop_name((dt_redop)op), cnt, n);
        }
  free(in), free(out), free(ref);
  return rc;
}

static int large_allreduce(dt_comm *c, void *arg, char *fail, size_t cap) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t cnt = (1u << 20) + 3;
  float *in = malloc(cnt * 4), *out = malloc(cnt * 4), *ref = malloc(cnt * 4);
  int rc = 0;
  for (int a = 0; a < 3 && !rc; a++) {
    fill_input(in, cnt, DT_F32, r, a);
    reference(ref, cnt, DT_F32, DT_OP_SUM, n, a);
    rc = dt_comm_allreduce_algo(c, in, out, cnt, DT_F32, DT_OP_SUM, algos[a]);
    if (rc) return FAIL("large allreduce %s: %s", dt_algo_name(algos[a]), dt_errmsg());
    if (memcmp(out, ref, cnt * 4)) rc = FAIL("large allreduce %s: wrong result", dt_algo_name(algos[a]));
  }
  /* i64 max through the automatic choice */
  int64_t *li = (int64_t *)in, *lo = (int64_t *)out;
  size_t lc = cnt / 2;
  fill_input(li, lc, DT_I64, r, 9);
  if (!rc && (rc = dt_comm_allreduce(c, li, lo, lc, DT_I64, DT_OP_MAX)))
    return FAIL("large i64 allreduce: %s", dt_errmsg());
  reference(ref, lc, DT_I64, DT_OP_MAX, n, 9);
  if (!rc && memcmp(lo, ref, lc * 8)) rc = FAIL("large i64 max: wrong result");
  /* large broadcast (chain) from the last rank */
  for (size_t i = 0; i < cnt; i++) in[i] = r == n - 1 ? (float)(i % 1000) : -1.f;
  if (!rc && (rc = dt_comm_broadcast(c, in, cnt, DT_F32, n - 1))) return FAIL("large bcast: %s", dt_errmsg());
  for (size_t i = 0; i < cnt && !rc; i++)
    if (in[i] != (float)(i % 1000)) rc = FAIL("large bcast: wrong value at %zu", i);
  free(in), free(out), free(ref);
  return rc;
}

static int other_collectives(dt_comm *c, void *arg, char *fail, size_t cap) {
  int n = dt_comm_size(c), r = dt_comm_rank(c), seed = 100;
  size_t maxc = 1023;
  uint8_t *in = malloc(maxc * 8 * (size_t)n), *out = malloc(maxc * 8 * (size_t)n),
          *ref = malloc(maxc * 8 * (size_t)n);
  int rc = 0;
  for (size_t d = 0; d < 6 && !rc; d++)
    for (size_t k = 0; k < 4 && !rc; k++, seed++) {
      dt_dtype t = dtypes[d];
      size_t cnt = counts[k], es = dt_dtype_size(t);
      int root = seed % n;
      /* broadcast */
      fill_input(in, cnt, t, r == root ? 0 : r + 1, seed);
      if ((rc = dt_comm_broadcast(c, in, cnt, t, root))) return FAIL("bcast: %s", dt_errmsg());
      fill_input(ref, cnt, t, 0, seed);
      if (cnt && memcmp(in, ref, cnt * es)) return FAIL("bcast %s count %zu root %d: wrong", dt_dtype_name(t), cnt, root);
      /* reduce */
      dt_redop op = (dt_redop)(seed % DT_OP_COUNT);
      fill_input(in, cnt, t, r, seed);
      memset(out, 0xee, cnt * es);
      if ((rc = dt_comm_reduce(c, in, out, cnt, t, op, root))) return FAIL("reduce: %s", dt_errmsg());
      reference(ref, cnt, t, op, n, seed);
      if (r == root && cnt && memcmp(out, ref, cnt * es))
        return FAIL("reduce %s %s count %zu root %d: wrong", dt_dtype_name(t), dt_redop_name(op), cnt, root);
      /* allgather */
      fill_input(in, cnt, t, r, seed);
      if ((rc = dt_comm_allgather(c, in, out, cnt, t))) return FAIL("allgather: %s", dt_errmsg());
      for (int q = 0; q < n; q++) fill_input(ref + (size_t)q * cnt * es, cnt, t, q, seed);
      if (cnt && memcmp(out, ref, (size_t)n * cnt * es)) return FAIL("allgather %s count %zu: wrong", dt_dtype_name(t), cnt);
      /* reduce-scatter: rank q's block b holds small_val(q, b*cnt + i) */
      fill_input(in, (size_t)n * cnt, t, r, seed);
      if ((rc = dt_comm_reduce_scatter(c, in, out, cnt, t, op))) return FAIL("reduce_scatter: %s", dt_errmsg());
      reference(ref, (size_t)n * cnt, t, op, n, seed);
      if (cnt && memcmp(out, ref + (size_t)r * cnt * es, cnt * es))
        return FAIL("reduce_scatter %s %s count %zu: wrong", dt_dtype_name(t), dt_redop_name(op), cnt);
      /* in place: the result in this rank's own block of the buffer */
      fill_input(in, (size_t)n * cnt, t, r, seed);
      if ((rc = dt_comm_reduce_scatter(c, in, in, cnt, t, op))) return FAIL("reduce_scatter in place: %s", dt_errmsg());
      if (cnt && memcmp(in + (size_t)r * cnt * es, ref + (size_t)r * cnt * es, cnt * es))
        return FAIL("reduce_scatter in place %s %s count %zu: wrong", dt_dtype_name(t), dt_redop_name(op), cnt);
      /* alltoall: rank q sends block j = value q*1000 + j*10 + i%10 */
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++) store_val(in, (size_t)j * cnt + i, t, (double)((r * 8 + j) % 50 + (int)(i % 7)));
      if ((rc = dt_comm_alltoall(c, in, out, cnt, t))) return FAIL("alltoall: %s", dt_errmsg());
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++) store_val(ref, (size_t)q * cnt + i, t, (double)((q * 8 + r) % 50 + (int)(i % 7)));
      if (cnt && memcmp(out, ref, (size_t)n * cnt * es)) return FAIL("alltoall %s count %zu: wrong", dt_dtype_name(t), cnt);
      if ((rc = dt_comm_barrier(c))) return FAIL("barrier: %s", dt_errmsg());
    }
  free(in), free(out), free(ref);
  return rc;
}

/* Random floats in [-1, 1): the result must be within the bound of the
 * fixed-order double reference. Each of the n-1 additions of a partial sum
 * rounds with relative error <= u = 2^-24, so |error| <= (n-1) u sum|x_i|
 * (first-order bound); we allow twice that, plus one ulp for the final
 * rounding of the reference to f32. All ranks must also agree bit for bit. */
static int random_float_tolerance(dt_comm *c, void *arg, char *fail, size_t cap) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t cnt = 4099;
  float *in = malloc(cnt * 4), *out = malloc(cnt * 4), *all = malloc(cnt * 4 * (size_t)n);
  int rc = 0;
  for (int a = 0; a < 3 && !rc; a++) {
    dt_rng_uniform(in, cnt, -1.f, 1.f, 1234, DT_RNG_USER, (uint64_t)r);
    if ((rc = dt_comm_allreduce_algo(c, in, out, cnt, DT_F32, DT_OP_SUM, algos[a])))
      return FAIL("allreduce: %s", dt_errmsg());
    if ((rc = dt_comm_allgather(c, out, all, cnt, DT_F32))) return FAIL("allgather: %s", dt_errmsg());
    for (int q = 1; q < n; q++)
      if (memcmp(all, all + (size_t)q * cnt, cnt * 4)) return FAIL("%s: ranks disagree", dt_algo_name(algos[a]));
    float *x = malloc(cnt * 4);
    for (size_t i = 0; i < cnt && !rc; i++) {
      double s = 0, sa = 0;
      for (int q = 0; q < n; q++) {
        dt_rng_uniform(x, i + 1, -1.f, 1.f, 1234, DT_RNG_USER, (uint64_t)q);
        s += x[i];
        sa += fabs(x[i]);
      }
      double bound = 2.0 * (n - 1) * ldexp(1.0, -24) * sa + ldexp(fabs(s), -23) + 1e-30;
      if (fabs((double)out[i] - s) > bound) rc = FAIL("%s: element %zu off by %g > %g", dt_algo_name(algos[a]), i, fabs(out[i] - s), bound);
      if (i > 64) break; /* the reference regenerates prefixes: keep it cheap */
    }
    free(x);
  }
  free(in), free(out), free(all);
  return rc;
}

static int split_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  dt_comm *s = NULL;
  if (dt_comm_split(c, r % 2, -r, &s)) return FAIL("split: %s", dt_errmsg());
  int expect = (n - (r % 2) + 1) / 2;
  if (dt_comm_size(s) != expect) return FAIL("split size %d != %d", dt_comm_size(s), expect);
  /* key -r reverses the order */
  int64_t v = r, sum = 0;
  if (dt_comm_allreduce(s, &v, &sum, 1, DT_I64, DT_OP_SUM)) return FAIL("sub allreduce: %s", dt_errmsg());
  int64_t ref = 0;
  for (int q = r % 2; q < n; q += 2) ref += q;
  if (sum != ref) return FAIL("sub allreduce %lld != %lld", (long long)sum, (long long)ref);
  if (dt_comm_world_rank(s, 0) != (r % 2) + 2 * ((n - (r % 2) - 1) / 2))
    return FAIL("split order: member 0 is world rank %d", dt_comm_world_rank(s, 0));
  /* parent still works, interleaved with the child */
  int64_t one = 1, tot = 0;
  if (dt_comm_allreduce(c, &one, &tot, 1, DT_I64, DT_OP_SUM) || tot != n) return FAIL("parent after split");
  dt_comm *none = NULL;
  if (dt_comm_split(c, r == 0 ? 0 : -1, 0, &none)) return FAIL("split2: %s", dt_errmsg());
  if ((r == 0) != (none != NULL)) return FAIL("color -1 must give NULL");
  dt_comm_destroy(none);
  dt_comm_destroy(s);
  struct dt_comm_topo t;
  dt_comm_topology(c, &t);
  if (t.nhosts != 1 || t.local_size != n || t.local_rank != r) return FAIL("topology");
  return 0;
}

/* Point-to-point: per-tag FIFO order, a large message that arrives before
 * its receive while a receive for another tag is posted first, non-blocking
 * requests, and a length mismatch reported as DT_EPROTO naming the peer. */
static int p2p_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int r = dt_comm_rank(c);
  size_t big = 300 * 1000 + 1;
  uint8_t *b = malloc(big);
  int rc = 0;
  if (r == 0) {
    for (size_t i = 0; i < big; i++) b[i] = (uint8_t)(i * 13);
    uint32_t small[3] = {1, 2, 3};
    if (dt_comm_send(c, 1, 1, b, big) || dt_comm_send(c, 1, 2, small, sizeof small)) rc = FAIL("send: %s", dt_errmsg());
    for (uint32_t k = 0; k < 5 && !rc; k++)
      if (dt_comm_send(c, 1, 4, &k, sizeof k)) rc = FAIL("send k: %s", dt_errmsg());
    uint64_t eight = 8;
    if (!rc && dt_comm_send(c, 1, 3, &eight, sizeof eight)) rc = FAIL("send 3: %s", dt_errmsg());
  } else if (r == 1) {
    uint32_t small[3];
    if (dt_comm_recv(c, 0, 2, small, sizeof small) || small[2] != 3) rc = FAIL("recv 2: %s", dt_errmsg());
    memset(b, 0, big);
    if (!rc && dt_comm_recv(c, 0, 1, b, big)) rc = FAIL("recv 1: %s", dt_errmsg());
    for (size_t i = 0; i < big && !rc; i++)
      if (b[i] != (uint8_t)(i * 13)) rc = FAIL("big message corrupt at %zu", i);
    dt_comm_req q[5];
    uint32_t ks[5];
    for (int k = 0; k < 5 && !rc; k++)
      if (dt_comm_irecv(c, 0, 4, &ks[k], sizeof ks[k], &q[k])) rc = FAIL("irecv: %s", dt_errmsg());
    if (!rc && dt_comm_waitall(c, q, 5)) rc = FAIL("waitall: %s", dt_errmsg());
    for (uint32_t k = 0; k < 5 && !rc; k++)
      if (ks[k] != k) rc = FAIL("tag order: slot %u got %u", k, ks[k]);
    uint8_t sixteen[16];
    int e = rc ? 0 : dt_comm_recv(c, 0, 3, sixteen, sizeof sixteen);
    if (!rc && (e != DT_EPROTO || !strstr(dt_errmsg(), "rank 0"))) rc = FAIL("length mismatch gave %d: %s", e, dt_errmsg());
  }
  if (!rc && (dt_comm_send(c, r, 1, b, 1) != DT_EINVAL || dt_comm_send(c, 0, -1, b, 1) != DT_EINVAL))
    rc = FAIL("bad peer/tag accepted");
  free(b);
  return rc;
}

/* Hierarchical allreduce over pretend hosts (host_id override): every op
 * and dtype at a few counts, exact against the reference, plus the
 * topology the communicator reports. */
static int hier_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  int n = dt_comm_size(c), r = dt_comm_rank(c), seed = 500, hm = *(int *)arg;
  struct dt_comm_topo t;
  dt_comm_topology(c, &t);
  if (t.nhosts != (n + hm - 1) / hm || t.host != r / hm || t.local_rank != r % hm)
    return FAIL("topology: nhosts %d host %d local %d", t.nhosts, t.host, t.local_rank);
  dt_comm_set_algo(c, DT_ALGO_HIER);
  size_t maxb = 1023 * 8;
  uint8_t *in = malloc(maxb), *out = malloc(maxb), *ref = malloc(maxb);
  int rc = 0;
  static const size_t hc[] = {1, 7, 1023};
  for (size_t d = 0; d < 6 && !rc; d++)
    for (int op = 0; op < DT_OP_COUNT && !rc; op++)
      for (size_t k = 0; k < 3 && !rc; k++, seed++) {
        dt_dtype ty = dtypes[d];
        fill_input(in, hc[k], ty, r, seed);
        if (dt_comm_allreduce_algo(c, in, out, hc[k], ty, (dt_redop)op, DT_ALGO_HIER))
          return FAIL("hier %s %s: %s", dt_dtype_name(ty), dt_redop_name((dt_redop)op), dt_errmsg());
        reference(ref, hc[k], ty, (dt_redop)op, n, seed);
        if (memcmp(out, ref, hc[k] * dt_dtype_size(ty)))
          rc = FAIL("hier %s %s count %zu: wrong", dt_dtype_name(ty), dt_redop_name((dt_redop)op), hc[k]);
      }
  /* forced for the whole communicator (set first, so the sub-communicators
   * hier creates inherit it), also with one rank per host, where hier
   * cannot serve and tuning falls back */
  for (size_t k = 0; k < 3 && !rc; k++, seed++) {
    fill_input(in, hc[k], DT_F32, r, seed);
    if (dt_comm_allreduce(c, in, out, hc[k], DT_F32, DT_OP_SUM))
      rc = FAIL("comm-wide hier: %s", dt_errmsg());
    reference(ref, hc[k], DT_F32, DT_OP_SUM, n, seed);
    if (!rc && memcmp(out, ref, hc[k] * 4)) rc = FAIL("comm-wide hier count %zu: wrong", hc[k]);
  }
  free(in), free(out), free(ref);
  return rc;
}

/* Forcing: DTRAIN_ALGO sets the communicator's algorithm at creation. */
static int algo_env_body(dt_comm *c, void *arg, char *fail, size_t cap) {
  if (dt_comm_algo(c) != DT_ALGO_RHD) return FAIL("DTRAIN_ALGO=rhd not applied (%s)", dt_algo_name(dt_comm_algo(c)));
  int64_t v = dt_comm_rank(c), sum = 0;
  if (dt_comm_allreduce(c, &v, &sum, 1, DT_I64, DT_OP_SUM)) return FAIL("allreduce: %s", dt_errmsg());
  dt_comm_set_algo(c, DT_ALGO_AUTO);
  return sum == (int64_t)dt_comm_size(c) * (dt_comm_size(c) - 1) / 2 ? 0 : FAIL("sum");
}

static const int sizes[] = {1, 2, 3, 4, 5, 8};

static void run_matrix(const char *tp, rank_body body, const int *ns, int nn) {
  for (int i = 0; i < nn; i++) {
    int bad = run_ranks(tp, ns[i], 20.0, body, NULL, NULL, NULL);
    if (bad) fprintf(stderr, "transport %s size %d: %d ranks failed\n", tp, ns[i], bad);
    assert_int_equal(bad, 0);
  }
}

static void test_allreduce_inproc(void **s) { run_matrix("inproc", allreduce_matrix, sizes, 6); }
static void test_allreduce_tcp(void **s) { run_matrix("tcp", allreduce_matrix, sizes, 6); }
static void test_others_inproc(void **s) { run_matrix("inproc", other_collectives, sizes, 6); }
static void test_others_tcp(void **s) { run_matrix("tcp", other_collectives, sizes, 6); }
static void test_large_inproc(void **s) {
  static const int ns[] = {4, 5};
  run_matrix("inproc", large_allreduce, ns, 2);
}
static void test_large_tcp(void **s) {
  static const int ns[] = {2, 3};
  run_matrix("tcp", large_allreduce, ns, 2);
}
static void test_random_float(void **s) {
  static const int ns[] = {3, 8};
  run_matrix("inproc", random_float_tolerance, ns, 2);
  run_matrix("tcp", random_float_tolerance, ns, 1);
}
static void test_split(void **s) {
  run_matrix("inproc", split_body, sizes, 6);
  static const int ns[] = {5};
  run_matrix("tcp", split_body, ns, 1);
}

static void test_p2p(void **s) {
  static const int ns[] = {2, 3};
  run_matrix("inproc", p2p_body, ns, 2);
  run_matrix("tcp", p2p_body, ns, 2);
}

static void test_hier(void **s) {
  static const int cases[][2] = {{4, 2}, {5, 2}, {8, 3}, {3, 1}};
  for (int i = 0; i < 4; i++) {
    int hm = cases[i][1];
    g_host_mod = hm;
    int bad = run_ranks(i == 1 ? "tcp" : "inproc", cases[i][0], 20.0, hier_body, &hm, NULL, NULL);
    g_host_mod = 0;
    assert_int_equal(bad, 0);
  }
}

static void test_algo_env(void **s) {
  setenv("DTRAIN_ALGO", "rhd", 1);
  dt__param_reload(); /* the knob table caches the environment */
  int bad = run_ranks("inproc", 3, 10.0, algo_env_body, NULL, NULL, NULL);
  unsetenv("DTRAIN_ALGO");
  dt__param_reload(); /* the knob table caches the environment */
  assert_int_equal(bad, 0);
}

static void test_reduce_ops(void **s) {
  /* half conversions round to nearest even and keep small integers exact */
  for (int i = -2048; i <= 2048; i++) {
    assert_true(dt_f16_to_f32(dt_f32_to_f16((float)i)) == (float)i);
    if (i >= -256 && i <= 256) assert_true(dt_bf16_to_f32(dt_f32_to_bf16((float)i)) == (float)i);
  }
  assert_int_equal(dt_f32_to_f16(65504.f), 0x7bff);
  assert_int_equal(dt_f32_to_f16(1e6f), 0x7c00);
  assert_int_equal(dt_f32_to_f16(5.9604645e-08f), 0x0001); /* smallest subnormal */
  assert_true(dt_f16_to_f32(0x0001) == 5.9604645e-08f);
  assert_int_equal(dt_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even */
  int32_t a[3] = {INT32_MAX, -5, 7}, b[3] = {1, 5, -9};
  assert_int_equal(dt__reduce(a, b, 3, DT_I32, DT_OP_SUM), DT_OK);
  assert_int_equal(a[0], INT32_MIN); /* wraps, defined */
  assert_int_equal(dt__reduce(a, b, 3, DT_U8, DT_OP_SUM), DT_EINVAL);
  dt_dtype t;
  assert_int_equal(dt_dtype_parse("bfloat16", &t), DT_OK);
  assert_int_equal(t, DT_BF16);
  assert_int_equal(dt_dtype_parse("f8", &t), DT_EINVAL);
  dt_algo al;
  assert_int_equal(dt_algo_parse("rhd", &al), DT_OK);
  assert_int_equal(al, DT_ALGO_RHD);
}

int main(void) {
  /* Small pipeline chunks so the 1M+3 cases run the multi-chunk path (set
   * before any rank thread starts). */
  setenv("DTRAIN_CHUNK_BYTES", "65536", 1);
  dt__param_reload(); /* the knob table caches the environment */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_ops),     cmocka_unit_test(test_allreduce_inproc),
      cmocka_unit_test(test_allreduce_tcp),  cmocka_unit_test(test_others_inproc),
      cmocka_unit_test(test_others_tcp),     cmocka_unit_test(test_large_inproc),
      cmocka_unit_test(test_large_tcp),      cmocka_unit_test(test_random_float),
      cmocka_unit_test(test_split),         cmocka_unit_test(test_p2p),
      cmocka_unit_test(test_hier),          cmocka_unit_test(test_algo_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_fixsum.c — the fixed-point sums of deterministic mode
 * (src/parallel/fixsum.c), checked against exact integer arithmetic:
 *   - associativity: the same terms summed in any order and any grouping
 *     (per-"worker" partial sums combined sequentially or as a tree) give
 *     the same int64 bits and the same floats back, where float sums of
 *     the same data do not;
 *   - rounding: a term becomes round(x * w * 2^32), ties to even, so the
 *     step is exactly 2^-32; back to float is acc * 2^-32 / divisor;
 *   - the range: dt_fix_bound(T) = 2^62 / T; a term exactly at the bound
 *     is taken, the next float above it, NaN and +-inf are counted, add 0
 *     and name the first bad index; through dt_ddp (one worker, no
 *     communicator) such a value makes the step fail with DT_ERANGE;
 *   - empty spans and zeros leave everything as it was (or store zeros);
 *   - T = 2^20 terms each at the bound sum to exactly 2^62 in any grouping;
 *   - dt_fix_sub undoes dt_fix_add exactly (ties, weights, values past the
 *     bound and NaN included): a backup copy's terms removed leave the bits.
 * It does not test the allreduce of the int64 sums (tests/engine
 * test_ddp_det*) — only the arithmetic every rank does on its own.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/core.h"
#include "nn/nn.h"
#include "parallel/ddp.h"
#include "parallel/fixsum.h"
#include "tensor/tensor.h"
#include "../dt_skip.h"

#define TWO32 4294967296.0 /* 2^32 */

/* Deterministic test data: n floats spread over many magnitudes and both
 * signs (1e-12 .. 1e3), so float sums in different orders round apart. */
static void make_terms(float *x, size_t n, uint64_t seed) {
  float u[2];
  for (size_t i = 0; i < n; i++) {
    dt_rng_uniform(u, 2, 0.0f, 1.0f, seed, DT_RNG_USER, (uint64_t)i);
    double mag = pow(10.0, -12.0 + 15.0 * u[0]);
    x[i] = (float)(u[1] < 0.5f ? -mag : mag);
  }
}

/* A permutation of 0..n-1, a pure function of seed. */
static void permute(size_t *p, size_t n, uint64_t seed) {
  int64_t q[128];
  assert_true(n <= 128);
  dt_rng_permutation(q, (int64_t)n, seed, DT_RNG_USER, 0);
  for (size_t i = 0; i < n; i++) p[i] = (size_t)q[i];
}

/* Tree sum of v[lo, hi) (pairwise halves), the way a halving-doubling
 * allreduce groups partial sums. */
static int64_t tree_sum(const int64_t *v, size_t lo, size_t hi) {
  if (hi - lo == 1) return v[lo];
  size_t mid = lo + (hi - lo) / 2;
  return tree_sum(v, lo, mid) + tree_sum(v, mid, hi);
}

/* VEC values per term, NT terms: term t is the vector x + t*VEC. Every
 * grouping below must reproduce `ref` (terms added in order into one
 * accumulator) bit for bit. */
enum { VEC = 64, NT = 97 };

static void test_any_order_any_grouping(void **state) {
  (void)state;
  static float x[NT * VEC];
  static int64_t ref[VEC], acc[VEC], part[8][VEC], per_term[NT][VEC];
  make_terms(x, NT * VEC, 11);
  const double w = 3.0; /* a micro-shard of 3 samples: its mean times 3 */
  const double bound = dt_fix_bound(NT);

  /* the reference: in order, the first term stored, the rest added */
  for (int t = 0; t < NT; t++)
    assert_int_equal(dt_fix_add(ref, x + t * VEC, VEC, w, bound, t == 0, NULL), 0);

  /* each term on its own: the conversion does not depend on the accumulator */
  for (int t = 0; t < NT; t++) dt_fix_add(per_term[t], x + t * VEC, VEC, w, bound, 1, NULL);
  for (int i = 0; i < VEC; i++) {
    int64_t s = 0;
    for (int t = 0; t < NT; t++) s += per_term[t][i];
    assert_true(s == ref[i]);
  }

  /* reversed and shuffled orders into one accumulator */
  size_t order[NT];
  for (int trial = 0; trial < 6; trial++) {
    if (trial == 0)
      for (int t = 0; t < NT; t++) order[t] = (size_t)(NT - 1 - t);
    else
      permute(order, NT, 100 + (uint64_t)trial);
    for (int t = 0; t < NT; t++)
      dt_fix_add(acc, x + order[t] * VEC, VEC, w, bound, t == 0, NULL);
    assert_memory_equal(acc, ref, sizeof ref);
  }

  /* k "workers", each summing a contiguous share of a shuffled order, then
   * the partial sums combined in order, in reverse and as a tree */
  for (int k = 1; k <= 8; k++) {
    permute(order, NT, 200 + (uint64_t)k);
    for (int r = 0; r < k; r++) {
      size_t lo = (size_t)NT * r / k, hi = (size_t)NT * (r + 1) / k;
      memset(part[r], 0, sizeof part[r]);
      for (size_t t = lo; t < hi; t++)
        dt_fix_add(part[r], x + order[t] * VEC, VEC, w, bound, t == lo, NULL);
    }
    for (int i = 0; i < VEC; i++) {
      int64_t fwd = 0, back = 0, col[8];
      for (int r = 0; r < k; r++) fwd += part[r][i];
      for (int r = k - 1; r >= 0; r--) back += part[r][i];
      for (int r = 0; r < k; r++) col[r] = part[r][i];
      assert_true(fwd == ref[i]);
      assert_true(back == ref[i]);
      assert_true(tree_sum(col, 0, (size_t)k) == ref[i]);
    }
  }

  /* back to float: the same bits from any of them, and close to the exact mean */
  float g_ref[VEC], g[VEC];
  dt_fix_to_float(g_ref, ref, VEC, NT * w);
  dt_fix_to_float(g, acc, VEC, NT * w);
  assert_memory_equal(g, g_ref, sizeof g);
  for (int i = 0; i < VEC; i++) {
    double exact = 0;
    for (int t = 0; t < NT; t++) exact += (double)x[t * VEC + i] * w;
    exact /= NT * w;
    /* each of NT terms rounds by <= 2^-33, then the float rounding */
    double tol = NT * ldexp(1.0, -33) / (NT * w) + fabs(exact) * 6e-8;
    assert_true(fabs((double)g_ref[i] - exact) <= tol);
  }

  /* the same data summed as floats does depend on the order (so the
   * checks above are not vacuous) */
  int differs = 0;
  for (int i = 0; i < VEC; i++) {
    float f = 0, b = 0;
    for (int t = 0; t < NT; t++) f += x[t * VEC + i];
    for (int t = NT - 1; t >= 0; t--) b += x[t * VEC + i];
    differs += f != b;
  }
  assert_true(differs > 0);
}

/* One value in, the integer out (store mode). */
static int64_t fix1(float x, double w) {
  int64_t a = 12345;
  assert_int_equal(dt_fix_add(&a, &x, 1, w, dt_fix_bound(1), 1, NULL), 0);
  return a;
}

static void test_rounding_step(void **state) {
  (void)state;
  const float u = ldexpf(1.0f, -32); /* one unit */
  /* multiples of the unit go through exactly */
  assert_true(fix1(u, 1) == 1);
  assert_true(fix1(-7 * u, 1) == -7);
  assert_true(fix1(1.0f, 1) == (int64_t)1 << 32);
  assert_true(fix1(0.1f, 1) == (int64_t)llrint((double)0.1f * TWO32));
  /* below one unit: to nearest */
  assert_true(fix1(0.25f * u, 1) == 0);
  assert_true(fix1(0.75f * u, 1) == 1);
  assert_true(fix1(-0.75f * u, 1) == -1);
  assert_true(fix1(ldexpf(1.0f, -40), 1) == 0);
  /* ties to even */
  assert_true(fix1(0.5f * u, 1) == 0);
  assert_true(fix1(1.5f * u, 1) == 2);
  assert_true(fix1(2.5f * u, 1) == 2);
  assert_true(fix1(3.5f * u, 1) == 4);
  assert_true(fix1(-2.5f * u, 1) == -2);
  assert_true(fix1(-0.5f * u, 1) == 0);
  /* the weight multiplies before the rounding: 0.5 unit x 3 = 1.5 -> 2,
   * 0.5 unit x 5 = 2.5 -> 2 (ties to even again) */
  assert_true(fix1(0.5f * u, 3) == 2);
  assert_true(fix1(0.5f * u, 5) == 2);
  assert_true(fix1(1.0f, 64) == (int64_t)64 << 32);
  /* the error of one term is at most half a unit: across a range of values */
  for (int i = 0; i < 2000; i++) {
    float x = (float)((i - 1000) * 1.37e-7);
    double err = (double)fix1(x, 1) - (double)x * TWO32;
    assert_true(fabs(err) <= 0.5);
  }
  /* back to float: acc * 2^-32 / divisor */
  int64_t a[4] = {1, (int64_t)3 << 32, -((int64_t)6 << 32), (int64_t)1 << 62};
  float f[4];
  dt_fix_to_float(f, a, 4, 1.0);
  assert_true(f[0] == u);
  assert_true(f[1] == 3.0f);
  assert_true(f[2] == -6.0f);
  assert_true(f[3] == ldexpf(1.0f, 30));
  dt_fix_to_float(f, a, 4, 3.0);
  assert_true(f[1] == 1.0f);
  assert_true(f[2] == -2.0f);
  /* a round trip of a representable value is exact */
  float g;
  int64_t q = fix1(-123.375f, 8);
  dt_fix_to_float(&g, &q, 1, 8.0);
  assert_true(g == -123.375f);
}

static void test_store_and_add(void **state) {
  (void)state;
  const float u = ldexpf(1.0f, -32);
  int64_t a[3] = {100, -100, 7};
  float x[3] = {2 * u, 3 * u, 0};
  /* add: on top of what is there */
  assert_int_equal(dt_fix_add(a, x, 3, 1.0, dt_fix_bound(2), 0, NULL), 0);
  assert_true(a[0] == 102 && a[1] == -97 && a[2] == 7);
  /* store: overwrites, zeros included */
  assert_int_equal(dt_fix_add(a, x, 3, 1.0, dt_fix_bound(2), 1, NULL), 0);
  assert_true(a[0] == 2 && a[1] == 3 && a[2] == 0);
  /* -0 is 0 */
  float nz = -0.0f;
  assert_true(fix1(nz, 1) == 0);
}

/* Work stealing's dropped micro-shards: subtracting what was added gives
 * back the exact bits, whatever was there before. */
static void test_sub_undoes_add(void **state) {
  (void)state;
  enum { N = 4096 };
  static int64_t a[N], keep[N];
  static float x[N];
  for (int i = 0; i < N; i++) {
    a[i] = keep[i] = (int64_t)(i * 2654435761u) - (1LL << 31);
    x[i] = ldexpf((float)((i * 7919) % 2001 - 1000), -(i % 40)) * 0.37f;
  }
  x[1] = NAN;
  x[2] = INFINITY;
  x[3] = 1e30f;                   /* past the bound: added as 0 */
  x[4] = 2.5f * ldexpf(1.0f, -32); /* a tie at weight 1 */
  const double bound = dt_fix_bound(64);
  for (int k = 0; k < 3; k++) {
    double w = k == 0 ? 1.0 : k == 1 ? 8.0 : 3.0;
    size_t bad = dt_fix_add(a, x, N, w, bound, 0, NULL);
    assert_int_equal(bad, 3);
    dt_fix_sub(a, x, N, w, bound);
    assert_memory_equal(a, keep, sizeof a);
  }
}

static void test_empty_and_zero_spans(void **state) {
  (void)state;
  int64_t a[4] = {1, 2, 3, 4};
  float x[4] = {NAN, 1, 2, 3};
  size_t first = 999;
  /* n = 0: nothing read, nothing written, nothing counted */
  assert_int_equal(dt_fix_add(a, x, 0, 1.0, dt_fix_bound(1), 0, &first), 0);
  assert_int_equal(dt_fix_add(a, x, 0, 1.0, dt_fix_bound(1), 1, &first), 0);
  assert_true(a[0] == 1 && a[1] == 2 && a[2] == 3 && a[3] == 4);
  assert_int_equal(first, 999);
  float f[2] = {-1.0f, -1.0f};
  dt_fix_to_float(f, a, 0, 1.0);
  assert_true(f[0] == -1.0f && f[1] == -1.0f);
  /* an all-zero span adds nothing; a zero weight (reduce = sum of an idle
   * worker) neither */
  float z[4] = {0};
  assert_int_equal(dt_fix_add(a, z, 4, 1.0, dt_fix_bound(1), 0, &first), 0);
  assert_true(a[0] == 1 && a[3] == 4);
  float y[3] = {1, -2, 3};
  assert_int_equal(dt_fix_add(a, y, 3, 0.0, dt_fix_bound(1), 0, &first), 0);
  assert_true(a[0] == 1 && a[1] == 2 && a[2] == 3);
  assert_int_equal(first, 999);
  /* zeros back to float are +0 */
  int64_t zz[2] = {0, 0};
  dt_fix_to_float(f, zz, 2, 7.0);
  assert_true(f[0] == 0.0f && !signbit(f[0]) && f[1] == 0.0f);
}

static void test_bound(void **state) {
  (void)state;
  assert_true(dt_fix_bound(1) == ldexp(1.0, 62));
  assert_true(dt_fix_bound(0) == ldexp(1.0, 62)); /* no terms: as one */
  assert_true(dt_fix_bound(-5) == ldexp(1.0, 62));
  assert_true(dt_fix_bound(4) == ldexp(1.0, 60));
  assert_true(dt_fix_bound(3) == ldexp(1.0, 62) / 3);
  /* in units of the value: 2^30 / T (docs/ddp.md: 3.6e8 for T = 3) */
  assert_true(fabs(ldexp(dt_fix_bound(3), -32) - 357913941.33) < 0.01);
  assert_true(ldexp(dt_fix_bound(2048), -32) == 524288.0);
}

static void test_out_of_range(void **state) {
  (void)state;
  const double bound = dt_fix_bound(4); /* |x * w| <= 2^28 */
  const float top = ldexpf(1.0f, 28);
  const float above = nextafterf(top, INFINITY);
  int64_t a[8];
  size_t first = 999;
  /* exactly at the bound: taken, both signs */
  float ok[2] = {top, -top};
  assert_int_equal(dt_fix_add(a, ok, 2, 1.0, bound, 1, &first), 0);
  assert_true(a[0] == (int64_t)1 << 60 && a[1] == -((int64_t)1 << 60));
  assert_int_equal(first, 999);
  /* the weight counts: top / 2 with weight 2 is at the bound, above / 2 not */
  float half[2] = {top / 2, above / 2};
  assert_int_equal(dt_fix_add(a, half, 2, 2.0, bound, 1, &first), 1);
  assert_int_equal(first, 1);
  assert_true(a[0] == (int64_t)1 << 60 && a[1] == 0);

  /* past the bound, NaN, +-inf: counted, add 0, the first index named */
  for (int i = 0; i < 8; i++) a[i] = 1000 + i;
  float x[8] = {1.0f, 2.0f, -above, NAN, 3.0f, INFINITY, -INFINITY, above};
  first = 999;
  assert_int_equal(dt_fix_add(a, x, 8, 1.0, bound, 0, &first), 5);
  assert_int_equal(first, 2);
  assert_true(a[0] == 1000 + ((int64_t)1 << 32));
  assert_true(a[1] == 1001 + ((int64_t)2 << 32));
  assert_true(a[2] == 1002 && a[3] == 1003 && a[5] == 1005 && a[6] == 1006 && a[7] == 1007);
  assert_true(a[4] == 1004 + ((int64_t)3 << 32));
  /* store mode: bad values become 0, first_bad may be NULL */
  assert_int_equal(dt_fix_add(a, x, 8, 1.0, bound, 1, NULL), 5);
  assert_true(a[2] == 0 && a[3] == 0 && a[5] == 0 && a[6] == 0 && a[7] == 0);
  assert_true(a[0] == (int64_t)1 << 32);
  /* the largest float is out of any bound, never wrapped into range */
  float big = 3.4e38f;
  a[0] = 5;
  assert_int_equal(dt_fix_add(a, &big, 1, 1.0, dt_fix_bound(1), 0, NULL), 1);
  assert_true(a[0] == 5);
}

/* T terms, each at the bound for T terms: the sum is exactly 2^62 in any
 * grouping (no partial sum can pass it), and one more would not fit. */
static void test_many_terms_at_the_bound(void **state) {
  (void)state;
  enum { T = 1 << 20 };
  const double bound = dt_fix_bound(T); /* 2^42 units: x = 1024 */
  float *x = malloc(T * sizeof *x);
  int64_t *q = malloc(T * sizeof *q);
  assert_non_null(x);
  assert_non_null(q);
  for (size_t i = 0; i < T; i++) x[i] = (i & 1) ? 1024.0f : 512.0f; /* w 1 and 2 below */
  /* odd terms at weight 1 and even terms at weight 2 are all 2^42 units */
  for (size_t i = 0; i < T; i++)
    assert_int_equal(dt_fix_add(q + i, x + i, 1, (i & 1) ? 1.0 : 2.0, bound, 1, NULL), 0);
  assert_true(q[0] == (int64_t)1 << 42 && q[1] == (int64_t)1 << 42);
  int64_t seq = 0, rev = 0;
  for (size_t i = 0; i < T; i++) seq += q[i];
  for (size_t i = T; i > 0; i--) rev += q[i - 1];
  assert_true(seq == (int64_t)1 << 62);
  assert_true(rev == seq);
  assert_true(tree_sum(q, 0, T) == seq);
  /* accumulated in place, one term at a time, like a worker's micro-shards */
  int64_t acc = 0;
  for (size_t i = 0; i < T; i++) dt_fix_add(&acc, x + i, 1, (i & 1) ? 1.0 : 2.0, bound, i == 0, NULL);
  assert_true(acc == seq);
  float g;
  dt_fix_to_float(&g, &acc, 1, (double)T);
  assert_true(g == 1024.0f); /* the mean */
  /* a term just past the bound for T terms is refused, never wrapped */
  float over = nextafterf(1024.0f, INFINITY);
  int64_t a = 0;
  assert_int_equal(dt_fix_add(&a, &over, 1, 1.0, bound, 1, NULL), 1);
  /* and all-negative terms reach -2^62 the same way */
  for (size_t i = 0; i < T; i++) q[i] = -q[i];
  assert_true(tree_sum(q, 0, T) == -((int64_t)1 << 62));
  free(x);
  free(q);
}

/* A value past the range inside a deterministic step (one worker, no
 * communicator) ends the step with DT_ERANGE naming the parameter. */
static void test_ddp_step_erange(void **state) {
  (void)state;
  dt_model *m = NULL;
  assert_int_equal(dt_model_create(&m, "linear(2)", 3, 1, 1, 4), DT_OK);
  dt_model_init(m, 1);
  size_t np = dt_model_nparams(m);
  dt_ddp *d = NULL;
  assert_int_equal(dt_ddp_create_det(&d, m, NULL, 0), DT_OK);
  dt__ddp_det_nofuse(d); /* the gradients are written here, not by backward */
  float *g = dt_model_grads(m);

  /* a good step first: finite gradients, the mean comes back */
  dt_ddp_begin_step_det(d, 4, 1, 0);
  dt_ddp_det_shard(d, 4, 1);
  for (size_t i = 0; i < np; i++) g[i] = 0.25f * (float)i;
  dt_ddp_grad_ready(d, 0, np);
  assert_int_equal(dt_ddp_finish_step(d), DT_OK);
  for (size_t i = 0; i < np; i++) assert_true(g[i] == 0.25f * (float)i);

  /* then NaN in parameter 3 */
  dt_ddp_begin_step_det(d, 4, 1, 0);
  dt_ddp_det_shard(d, 4, 1);
  for (size_t i = 0; i < np; i++) g[i] = 1.0f;
  g[3] = NAN;
  dt_ddp_grad_ready(d, 0, np);
  assert_int_equal(dt_ddp_finish_step(d), DT_ERANGE);
  assert_non_null(strstr(dt_errmsg(), "fixed-point range"));
  assert_non_null(strstr(dt_errmsg(), "parameter 3"));

  /* and a finite value past 2^30 / shards (here 2 micro-shards: 2^29, with
   * the weight of 4 samples: x > 2^27) */
  dt_ddp_begin_step_det(d, 8, 2, 0);
  dt_ddp_det_shard(d, 4, 1);
  for (size_t i = 0; i < np; i++) g[i] = 0;
  g[np - 1] = ldexpf(1.0f, 27) * 1.5f;
  dt_ddp_grad_ready(d, 0, np);
  assert_int_equal(dt_ddp_finish_step(d), DT_ERANGE);
  char want[64];
  snprintf(want, sizeof want, "parameter %zu", np - 1);
  assert_non_null(strstr(dt_errmsg(), want));
  dt_ddp_destroy(d);
  dt_model_destroy(m);
}

/* dt_fix_add_slots (the AVX-512 form where the CPU has it) gives exactly
 * the sums of dt_fix_add slot by slot: weights that make the scale a power
 * of two (the float path) and others (the double path), ties, values at
 * and past the bound, NaN and infinities, store and add, lengths with a
 * tail, and the same count and first bad value. */
static void test_slots_match_one_by_one(void **state) {
  (void)state;
  enum { N = 1000 + 13, K = 5 };
  static float x[K][N];
  const double wsets[3][K] = {{8, 8, 8, 8, 8}, {8, 5, 1, 16, 3}, {1, 1, 1, 1, 1}};
  const double bound = dt_fix_bound(8);
  for (int j = 0; j < K; j++) make_terms(x[j], N, 100 + (uint64_t)j);
  /* ties at 2^-33 and 2^-36, the bound and its neighbours, specials */
  x[0][3] = (float)ldexp(1.0, -33);
  x[0][4] = (float)ldexp(3.0, -36);
  x[1][5] = (float)(bound / 8 / TWO32);
  x[2][6] = nextafterf((float)(bound / 8 / TWO32), INFINITY);
  x[3][7] = NAN;
  x[4][8] = -INFINITY;
  x[1][N - 1] = 1e30f;
  const float *xs[K];
  for (int j = 0; j < K; j++) xs[j] = x[j];
  for (int w = 0; w < 3; w++)
    for (int store = 0; store < 2; store++)
      for (size_t n = N - 3; n <= N; n++) {
        static int64_t a[N], b[N];
        for (size_t i = 0; i < N; i++) a[i] = b[i] = (int64_t)(i * 7919) - 4000;
        size_t bad_ref = 0, first_ref = 0, first = 0, fb = 0;
        float v_ref = 0, v = 0;
        for (int j = 0; j < K; j++) {
          size_t c = dt_fix_add(b, x[j], n, wsets[w][j], bound, store && j == 0, &fb);
          if (c && !bad_ref) first_ref = fb;
          bad_ref += c;
        }
        size_t bad = dt_fix_add_slots(a, xs, wsets[w], K, n, bound, store, &first, &v);
        assert_int_equal(bad, bad_ref);
        assert_memory_equal(a, b, sizeof a);
        (void)v_ref;
        (void)first_ref;
        if (bad) { /* the first bad value met is one of some slot at that index */
          int found = 0;
          assert_true(first < n);
          for (int j = 0; j < K; j++)
            found |= !(fabs((double)x[j][first] * wsets[w][j] * TWO32) <= bound) &&
                     (isnan(v) ? isnan(x[j][first]) : x[j][first] == v);
          assert_true(found);
        }
      }
  /* no slots: store zeroes, add leaves */
  int64_t z[4] = {1, 2, 3, 4};
  assert_int_equal(dt_fix_add_slots(z, xs, wsets[0], 0, 4, bound, 0, NULL, NULL), 0);
  assert_int_equal(z[3], 4);
  dt_fix_add_slots(z, xs, wsets[0], 0, 4, bound, 1, NULL, NULL);
  assert_int_equal(z[0], 0);
  assert_int_equal(z[3], 0);
}

/* The vector forms (AVX-512, or AVX2's add-1.5*2^52 rounding on a CPU
 * without it) against the definition written out here, one value at a
 * time: rint of the exact product, 0 past the bound. Ties (+-0.5, 2.5,
 * -3.5 after scaling), -0, values in range but at or above 2^51 after
 * scaling (the AVX2 form redoes such a block in scalar), the bound itself,
 * NaN and infinities, store and add, a tail of every length. */
static int64_t ref_term(float x, double w, double bound) {
  double y = (double)x * (w * TWO32);
  return fabs(y) <= bound ? (int64_t)rint(y) : 0;
}

static void test_add_matches_definition(void **state) {
  (void)state;
  enum { N = 67, K = 3 };
  static float x[K][N];
  const double ws[K] = {1, 3, 8};
  const double bound = dt_fix_bound(4); /* 2^60 */
  for (int j = 0; j < K; j++) make_terms(x[j], N, 300 + (uint64_t)j);
  x[0][0] = (float)ldexp(1.0, -33);   /* 0.5 */
  x[0][1] = (float)ldexp(-1.0, -33);  /* -0.5 */
  x[0][2] = (float)ldexp(5.0, -33);   /* 2.5 */
  x[0][3] = (float)ldexp(-7.0, -33);  /* -3.5 */
  x[0][4] = -0.0f;
  x[0][9] = 1e6f;                     /* ~2^51.9 after scaling: in range */
  x[1][10] = -3e6f;
  x[2][11] = (float)ldexp(1.0, 19);   /* 2^54 */
  x[0][12] = (float)ldexp(1.0, 28);   /* 2^60: the bound itself */
  x[0][13] = (float)ldexp(1.0, 29);   /* past it */
  x[1][20] = NAN;
  x[2][21] = INFINITY;
  x[0][N - 1] = ldexpf(3.0f, -33);    /* 1.5: a tie in the tail */
  const float *xs[K];
  for (int j = 0; j < K; j++) xs[j] = x[j];
  for (int store = 0; store < 2; store++)
    for (size_t n = 1; n <= N; n++) {
      static int64_t a[N], b[N], c[N];
      size_t bad_ref = 0;
      for (size_t i = 0; i < N; i++) a[i] = b[i] = c[i] = (int64_t)(i * 104729) - 7000;
      for (size_t i = 0; i < n; i++) {
        int64_t v = store ? 0 : b[i];
        for (int j = 0; j < K; j++) {
          v += ref_term(x[j][i], ws[j], bound);
          bad_ref += !(fabs((double)x[j][i] * ws[j] * TWO32) <= bound);
        }
        b[i] = v;
      }
      size_t bad = dt_fix_add_slots(a, xs, ws, K, n, bound, store, NULL, NULL);
      assert_int_equal(bad, bad_ref);
      assert_memory_equal(a, b, sizeof a);
      /* dt_fix_add alone, slot 0 */
      size_t bad0 = dt_fix_add(c, x[0], n, ws[0], bound, store, NULL), bad0_ref = 0;
      for (size_t i = 0; i < n; i++) {
        int64_t want = (store ? 0 : (int64_t)(i * 104729) - 7000) + ref_term(x[0][i], ws[0], bound);
        bad0_ref += !(fabs((double)x[0][i] * ws[0] * TWO32) <= bound);
        assert_true(c[i] == want);
      }
      assert_int_equal(bad0, bad0_ref);
    }
}

/* dt_fix_add_wgrad gives exactly the sums of the deterministic GEMM's
 * weight gradient (dy^T x per segment) converted by dt_fix_add segment by
 * segment, on whichever kernels run here (AVX-512 or AVX2): shapes with
 * odd row and column counts and tails (every row tile: 6, 4, 2, 1 rows on
 * AVX2, 8 and 1 on AVX-512; past one 128-column block), segment lengths
 * 1, 7, 8, 33, 255 and 256 (DT_FIX_WGRAD_MAXN: one K block), power-of-two,
 * fractional and other weights, store and add, values past the bound or
 * not finite counted alike, and in-range terms of 2^51 or more (the AVX2
 * rounding's limit; the kernels' fast paths check a tile's range once and
 * redo an out-of-range tile lane by lane). */
/* Whole tiles whose every term is below 2^31 but whose sum over the
 * segments is not: the int32 sums of the fast form must not take them
 * (they would wrap); the int64 sums are those of dt_fix_add. */
static void test_wgrad_int32_sums_do_not_wrap(void **state) {
  (void)state;
  if (!dt_fix_wgrad_ok())
    DT_SKIP("dt_fix_add_wgrad needs the AVX-512 or AVX2 + FMA GEMM; the portable one runs here");
  enum { OC = 6, C = 32, K = 4 };
  static float dy[K][OC], x[K][C], g[OC * C];
  static int64_t a[OC * C], b[OC * C];
  for (int j = 0; j < K; j++) {
    for (int o = 0; o < OC; o++) dy[j][o] = 0.5f - 0.001f * (float)o;
    for (int c = 0; c < C; c++) x[j][c] = (c % 2 ? -0.44f : 0.44f) + 0.0005f * (float)(c + j);
  }
  /* terms 0.8-0.95 x 2^30 each (all of a tile below 2^30), 3 or 4 of them
   * past 2^31 */
  const double bound = dt_fix_bound(16);
  for (int k = 1; k <= K; k++)
    for (int store = 0; store < 2; store++) {
      dt_fix_wseg sg[K];
      for (size_t i = 0; i < OC * C; i++) a[i] = b[i] = (int64_t)i * 31 - 100;
      for (int j = 0; j < k; j++) {
        sg[j] = (dt_fix_wseg){dy[j], x[j], 1, 1.0};
        dt_sgemm_f(DT_GEMM_FIXED, 1, 0, OC, C, 1, 1.0f, dy[j], OC, x[j], C, 0.0f, g, C);
        assert_int_equal(dt_fix_add(b, g, OC * C, 1.0, bound, store && j == 0, NULL), 0);
      }
      assert_int_equal(dt_fix_add_wgrad(a, sg, k, OC, C, bound, store, NULL, NULL), 0);
      assert_memory_equal(a, b, sizeof a);
    }
}

/* dt_fix_to_float's vector form (int64 -> double by the 1.5 * 2^52 bias,
 * |v| < 2^51) against the scalar expression, bit for bit: blocks of small
 * sums, sums at and past +-2^51 (the block redone in scalar), the largest
 * magnitudes, and lengths that leave a scalar tail. */
static void test_to_float_matches_scalar(void **state) {
  (void)state;
  enum { N = 64 * 9 + 13 };
  static int64_t a[N];
  static float f[N];
  uint64_t s = 12345;
  for (size_t i = 0; i < N; i++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    int64_t v = (int64_t)(s >> 11) - ((int64_t)1 << 52); /* |v| <= 2^52 */
    size_t blk = i / 64;
    if (blk < 3) v >>= 20;                                  /* small sums */
    else if (blk == 3 && i % 64 == 17) v = (int64_t)1 << 51; /* just past */
    else if (blk == 4 && i % 64 == 5) v = -((int64_t)1 << 51) - 1;
    else if (blk == 5) v = (i % 3 == 0 ? INT64_MAX : i % 3 == 1 ? INT64_MIN + 1 : v);
    else if (blk == 6 && i % 64 == 63) v = ((int64_t)1 << 51) - 1; /* just inside */
    else if (blk == 7 && i % 64 == 0) v = -((int64_t)1 << 51);     /* just inside */
    else if (blk >= 6) v >>= 1 + (int)(i % 30);
    a[i] = v;
  }
  const double divs[] = {1.0, 64.0, 3.0, 192.0};
  for (size_t d = 0; d < sizeof divs / sizeof divs[0]; d++)
    for (size_t n = N - 2; n <= N; n++) {
      memset(f, 0, sizeof f);
      dt_fix_to_float(f, a, n, divs[d]);
      const double k = dt_fix_scale(divs[d]);
      for (size_t i = 0; i < n; i++) {
        float want = (float)((double)a[i] * k);
        if (memcmp(&f[i], &want, sizeof want)) {
          print_error("divisor %g n %zu: value %zu (%lld) is %a, want %a\n", divs[d], n, i,
                      (long long)a[i], f[i], want);
          fail();
        }
      }
    }
}

static void test_wgrad_matches_gemm(void **state) {
  (void)state;
  if (!dt_fix_wgrad_ok())
    DT_SKIP("dt_fix_add_wgrad needs the AVX-512 or AVX2 + FMA GEMM; the portable one runs here");
  const int shapes[][2] = {{1, 1}, {3, 17}, {4, 16}, {10, 128}, {9, 150},
                           {13, 300}, {17, 33}, {7, 131}, {23, 1}};
  const int lens[] = {8, 1, 7, 255, 256, 33};
  const double wsets[4][6] = {{8, 8, 8, 8, 8, 8},
                              {8, 5, 1, 16, 3, 7},
                              {1, 1, 1, 1, 1, 1},
                              {0.125, 1.0 / 3, 0.7, 2, 0.0625, 1.0 / 64}};
  enum { MAXO = 23, MAXC = 300, MAXN = DT_FIX_WGRAD_MAXN, K = 6 };
  static float dy[K][MAXN * MAXO], x[K][MAXN * MAXC], g[MAXO * MAXC];
  static int64_t a[MAXO * MAXC], b[MAXO * MAXC];
  for (int j = 0; j < K; j++) {
    make_terms(dy[j], MAXN * MAXO, 300 + (uint64_t)j);
    make_terms(x[j], MAXN * MAXC, 400 + (uint64_t)j);
    /* magnitudes a gradient has: 1e-6 .. 1e1, so sums stay in range */
    for (int i = 0; i < MAXN * MAXO; i++) dy[j][i] = (float)fmod((double)dy[j][i], 3.0) * 1e-3f;
    for (int i = 0; i < MAXN * MAXC; i++) x[j][i] = (float)fmod((double)x[j][i], 5.0);
  }
  x[2][5] = 1e30f;  /* one product past the bound in segment 2 */
  x[3][7] = NAN;    /* and a column of NaN products in segment 3 */
  x[4][20] = 3e8f;  /* in range, but some terms of 2^51 or more */
  x[5][(size_t)40 * 300 + 77] = -2e8f; /* row 40: inside a full tile at C = 300 */
  const double bound = dt_fix_bound(16);
  long checked = 0, with_bad = 0;
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
    for (int k = 1; k <= K; k++)
      for (int w = 0; w < 4; w++)
        for (int store = 0; store < 2; store++) {
          const int OC = shapes[sh][0], C = shapes[sh][1];
          const size_t n = (size_t)OC * C;
          dt_fix_wseg sg[K];
          size_t bad_ref = 0;
          for (size_t i = 0; i < n; i++) a[i] = b[i] = (int64_t)(i * 7919) - 4000;
          for (int j = 0; j < k; j++) {
            sg[j] = (dt_fix_wseg){dy[j], x[j], lens[j], wsets[w][j]};
            dt_sgemm_f(DT_GEMM_FIXED, 1, 0, OC, C, lens[j], 1.0f, dy[j], OC, x[j], C, 0.0f, g, C);
            bad_ref += dt_fix_add(b, g, n, wsets[w][j], bound, store && j == 0, NULL);
          }
          size_t first = 0;
          float v = 0;
          size_t bad = dt_fix_add_wgrad(a, sg, k, OC, C, bound, store, &first, &v);
          assert_int_equal(bad, bad_ref);
          for (size_t i = 0; i < n; i++)
            if (a[i] != b[i]) { /* where, for the message */
              print_error("shape %zu k %d weights %d store %d: sum %zu is %lld, not %lld\n", sh, k,
                          w, store, i, (long long)a[i], (long long)b[i]);
              break;
            }
          assert_memory_equal(a, b, n * sizeof *a);
          if (bad) assert_true(first < n && !(fabs((double)v) < 1e20));
          checked++;
          with_bad += bad != 0;
        }
  assert_true(with_bad > 0 && with_bad < checked); /* both kinds met */
}

/* A deterministic step through the model's backward: weight gradients made
 * in fixed point from the stash (the default) end with the same bits as
 * written to slots and converted (dt__ddp_det_nofuse), with micro-shards
 * of 3, 8, 8 and 8 samples (a short one, more than the 4 slots); also with
 * the stash cut to 8 rows per slot (dt__ddp_det_rows), and to 3, where the
 * second micro-shard no longer fits and the rest of the step goes through
 * the slots. */
static void test_ddp_fused_step_same_bits(void **state) {
  (void)state;
  enum { IN = 37, B = 27 };
  static float xin[B * IN];
  int32_t y[B];
  make_terms(xin, B * IN, 77);
  for (int i = 0; i < B * IN; i++) xin[i] = (float)fmod((double)xin[i], 2.0);
  for (int i = 0; i < B; i++) y[i] = (i * 7) % 5;
  const int shard[] = {3, 8, 8, 8};
  float *res[4];
  for (int v = 0; v < 4; v++) {
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&m, "linear(20) relu linear(17) relu linear(5)", IN, 1, 1, B), DT_OK);
    dt_model_init(m, 3);
    dt_model_set_gemm_flags(m, DT_GEMM_FIXED);
    dt_ddp *d = NULL;
    assert_int_equal(dt_ddp_create_det(&d, m, NULL, 0), DT_OK);
    if (v == 1) dt__ddp_det_nofuse(d);
    if (v >= 2) assert_int_equal(dt__ddp_det_rows(d, v == 2 ? 8 : 3), DT_OK);
    for (int step = 0; step < 2; step++) {
      dt_ddp_begin_step_det(d, B, 4, 0);
      int r0 = 0;
      for (int q = 0; q < 4; q++) {
        dt_step_ctx ctx = {1, 1, (uint64_t)step, (uint64_t)r0};
        assert_int_equal(dt_model_forward(m, xin + (size_t)r0 * IN, shard[q], &ctx), DT_OK);
        dt_ddp_det_shard(d, shard[q], q == 3);
        float l;
        int c;
        assert_int_equal(dt_model_backward(m, y + r0, shard[q], &l, &c, dt_ddp_grad_ready, d), DT_OK);
        r0 += shard[q];
      }
      int rc = dt_ddp_finish_step(d);
      if (rc) fprintf(stderr, "variant %d step %d: %s\n", v, step, dt_errmsg());
      assert_int_equal(rc, DT_OK);
    }
    size_t np = dt_model_nparams(m);
    res[v] = malloc(np * sizeof(float));
    memcpy(res[v], dt_model_grads(m), np * sizeof(float));
    if (v) assert_memory_equal(res[0], res[v], np * sizeof(float));
    dt_ddp_destroy(d);
    dt_model_destroy(m);
  }
  for (int v = 0; v < 4; v++) free(res[v]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_any_order_any_grouping),
      cmocka_unit_test(test_rounding_step),
      cmocka_unit_test(test_store_and_add),
      cmocka_unit_test(test_empty_and_zero_spans),
      cmocka_unit_test(test_bound),
      cmocka_unit_test(test_out_of_range),
      cmocka_unit_test(test_many_terms_at_the_bound),
      cmocka_unit_test(test_sub_undoes_add),
      cmocka_unit_test(test_ddp_step_erange),
      cmocka_unit_test(test_slots_match_one_by_one),
      cmocka_unit_test(test_add_matches_definition),
      cmocka_unit_test(test_wgrad_matches_gemm),
      cmocka_unit_test(test_to_float_matches_scalar),
      cmocka_unit_test(test_wgrad_int32_sums_do_not_wrap),
      cmocka_unit_test(test_ddp_fused_step_same_bits),
  };
  return dt_skip_status(cmocka_run_group_tests(tests, NULL, NULL));
}

/*
 * test_dataset.c — statistics and normalisation against a direct
 * computation, and the epoch order: a valid permutation, a pure function of
 * (seed, epoch), different across epochs and seeds, the identity without
 * shuffling.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "core/core.h"
#include "data/data.h"

static void test_stats_normalize(void **state) {
  (void)state;
  dt_dataset ds = {0};
  ds.n = 1000;
  ds.dim = 7;
  ds.c = ds.h = 1;
  ds.w = 7;
  ds.x = dt_alloc(7000 * sizeof(float));
  ds.y = dt_calloc(1000 * sizeof(int32_t));
  double s = 0, s2 = 0;
  for (int i = 0; i < 7000; i++) {
    ds.x[i] = 100.f + (float)((i * 37) % 101) / 10.f; /* large offset: tests the two-pass std */
    s += ds.x[i];
  }
  double m = s / 7000;
  for (int i = 0; i < 7000; i++) s2 += (ds.x[i] - m) * (ds.x[i] - m);
  double sd = sqrt(s2 / 7000);
  float mean, std;
  dt_dataset_stats(&ds, &mean, &std);
  assert_true(fabs(mean - m) < 1e-4);
  assert_true(fabs(std - sd) < 1e-5 * sd + 1e-6);
  dt_dataset_normalize(&ds, mean, std);
  float m2, sd2;
  dt_dataset_stats(&ds, &m2, &sd2);
  assert_true(fabsf(m2) < 1e-5f);
  assert_true(fabsf(sd2 - 1.f) < 1e-5f);
  /* Exactly (x - mean) / std. */
  assert_true(ds.x[5] == (100.f + (float)((5 * 37) % 101) / 10.f - mean) / std);
  /* A constant dataset: std 0, normalize only centres (no inf/nan). */
  for (int i = 0; i < 7000; i++) ds.x[i] = 3.f;
  dt_dataset_stats(&ds, &mean, &std);
  assert_true(mean == 3.f && std == 0.f);
  dt_dataset_normalize(&ds, mean, std);
  for (int i = 0; i < 7000; i++) assert_true(ds.x[i] == 0.f);
  dt_dataset_free(&ds);
  assert_null(ds.x);
  dt_dataset_stats(&ds, &mean, &std); /* empty: zeros, no crash */
  assert_true(mean == 0.f && std == 0.f);
}

static int is_perm(const int64_t *p, int64_t n) {
  char *seen = calloc((size_t)n, 1);
  int ok = 1;
  for (int64_t i = 0; i < n && ok; i++) {
    if (p[i] < 0 || p[i] >= n || seen[p[i]]) ok = 0;
    else seen[p[i]] = 1;
  }
  free(seen);
  return ok;
}

static void test_epoch_order(void **state) {
  (void)state;
  enum { N = 1001 };
  static int64_t a[N], b[N], c[N];
  dt_epoch_order(a, N, 42, 3, 1);
  assert_true(is_perm(a, N));
  dt_epoch_order(b, N, 42, 3, 1);
  assert_memory_equal(a, b, sizeof a); /* pure function */
  dt_epoch_order(c, N, 42, 4, 1);
  assert_true(is_perm(c, N));
  assert_true(memcmp(a, c, sizeof a) != 0); /* reshuffled every epoch */
  dt_epoch_order(c, N, 43, 3, 1);
  assert_true(memcmp(a, c, sizeof a) != 0); /* depends on the seed */
  int64_t fixed = 0;
  for (int i = 0; i < N; i++) fixed += a[i] == i;
  assert_true(fixed < 20); /* really shuffled (expected ~1 fixed point) */
  dt_epoch_order(c, N, 42, 3, 0);
  for (int i = 0; i < N; i++) assert_int_equal(c[i], i);
  /* Same as the core permutation on the shuffle stream (the documented source). */
  dt_rng_permutation(b, N, 42, DT_RNG_SHUFFLE, 3);
  assert_memory_equal(a, b, sizeof a);
  dt_epoch_order(a, 0, 1, 1, 1); /* n = 0: nothing to do */
  dt_epoch_order(a, 1, 1, 1, 1);
  assert_int_equal(a[0], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_stats_normalize), cmocka_unit_test(test_epoch_order)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_core.c — error names, the counter-based RNG (known answers,
 * determinism, permutation validity) and crc32c known answers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/core.h"

static void test_strerror(void **state) {
  (void)state;
  assert_string_equal(dt_strerror(DT_OK), "success");
  assert_string_equal(dt_strerror(DT_ETIMEDOUT), "deadline expired");
  assert_string_equal(dt_strerror(12345), "unknown error");
  assert_int_equal(dt__seterr(DT_EINVAL, "file.ini:%d: bad", 3), DT_EINVAL);
  assert_string_equal(dt_errmsg(), "file.ini:3: bad");
  dt__preerr(DT_EINVAL, "loading");
  assert_string_equal(dt_errmsg(), "loading: file.ini:3: bad");
}

static void test_philox_known_answer(void **state) {
  (void)state;
  /* Known-answer vectors from the Random123 distribution (kat_vectors). */
  uint32_t out[4];
  uint32_t k0[2] = {0, 0}, c0[4] = {0, 0, 0, 0};
  dt_philox4x32(k0, c0, out);
  assert_int_equal(out[0], 0x6627e8d5u);
  assert_int_equal(out[1], 0xe169c58du);
  assert_int_equal(out[2], 0xbc57ac4cu);
  assert_int_equal(out[3], 0x9b00dbd8u);
  uint32_t k1[2] = {0xffffffffu, 0xffffffffu}, c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  dt_philox4x32(k1, c1, out);
  assert_int_equal(out[0], 0x408f276du);
  assert_int_equal(out[1], 0x41c83b0eu);
  assert_int_equal(out[2], 0xa20bc7c6u);
  assert_int_equal(out[3], 0x6d5451fdu);
}

static void test_uniform_deterministic(void **state) {
  (void)state;
  float a[1001], b[1001];
  dt_rng_uniform(a, 1001, -1.f, 1.f, 42, DT_RNG_INIT, 7);
  dt_rng_uniform(b, 1001, -1.f, 1.f, 42, DT_RNG_INIT, 7);
  assert_memory_equal(a, b, sizeof a);
  double mean = 0;
  for (int i = 0; i < 1001; i++) {
    assert_true(a[i] >= -1.f && a[i] < 1.f);
    mean += a[i];
  }
  mean /= 1001;
  assert_true(mean > -0.1 && mean < 0.1);
  dt_rng_uniform(b, 1001, -1.f, 1.f, 43, DT_RNG_INIT, 7);
  assert_true(memcmp(a, b, sizeof a) != 0);
}

static void test_permutation(void **state) {
  (void)state;
  for (int64_t n = 0; n < 50; n++) {
    int64_t perm[64], perm2[64];
    char seen[64] = {0};
    dt_rng_permutation(perm, n, 1, DT_RNG_SHUFFLE, 3);
    dt_rng_permutation(perm2, n, 1, DT_RNG_SHUFFLE, 3);
    for (int64_t i = 0; i < n; i++) {
      assert_true(perm[i] >= 0 && perm[i] < n);
      assert_false(seen[perm[i]]);
      seen[perm[i]] = 1;
      assert_int_equal(perm[i], perm2[i]);
    }
  }
  /* Different epochs give different orders. */
  int64_t p1[100], p2[100];
  dt_rng_permutation(p1, 100, 1, DT_RNG_SHUFFLE, 0);
  dt_rng_permutation(p2, 100, 1, DT_RNG_SHUFFLE, 1);
  assert_true(memcmp(p1, p2, sizeof p1) != 0);
}

static void test_crc32c(void **state) {
  (void)state;
  assert_int_equal(dt_crc32c(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(dt_crc32c(0, "", 0), 0);
  /* Incremental equals one-shot. */
  uint32_t c = dt_crc32c(0, "1234", 4);
  assert_int_equal(dt_crc32c(c, "56789", 5), 0xE3069283u);
}

static void test_enum_names(void **state) {
  (void)state;
  static const char *const names[] = {"auto", "shm", "tcp", NULL};
  assert_int_equal(dt__enum_parse(names, "auto"), 0);
  assert_int_equal(dt__enum_parse(names, "tcp"), 2);
  assert_int_equal(dt__enum_parse(names, "TCP"), -1);
  assert_int_equal(dt__enum_parse(names, ""), -1);
  assert_int_equal(dt__enum_parse(names, NULL), -1);
  assert_int_equal(dt__enum_parse(NULL, "tcp"), -1);
  assert_string_equal(dt__enum_name(names, 1), "shm");
  assert_string_equal(dt__enum_name(names, 3), "?");
  assert_string_equal(dt__enum_name(names, -1), "?");
  assert_string_equal(dt__enum_name(NULL, 0), "?");
}

static void test_alloc_aligned(void **state) {
  (void)state;
  for (size_t n = 0; n < 200; n += 37) {
    void *p = dt_calloc(n);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    dt_free(p);
  }
  dt_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_strerror),          cmocka_unit_test(test_philox_known_answer),
      cmocka_unit_test(test_uniform_deterministic), cmocka_unit_test(test_permutation),
      cmocka_unit_test(test_crc32c),            cmocka_unit_test(test_alloc_aligned), cmocka_unit_test(test_enum_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

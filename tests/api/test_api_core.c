/*
 * test_api_core.c — dtrain/core.h: the version the library reports is the
 * header's, every error code has its own name, unknown codes are named as
 * such, and dt_errmsg is per thread (a failure on one thread does not
 * overwrite another's message).
 */
#include <pthread.h>

#include "api_test.h"

static void test_version(void **st) {
  (void)st;
  assert_string_equal(dt_version(), DT_VERSION_STRING);
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", DT_VERSION_MAJOR, DT_VERSION_MINOR, DT_VERSION_PATCH);
  assert_string_equal(v, DT_VERSION_STRING);
}

static void test_strerror(void **st) {
  (void)st;
  assert_string_equal(dt_strerror(DT_OK), "success");
  assert_string_equal(dt_strerror(DT_EINVAL), "invalid argument");
  assert_string_equal(dt_strerror(12345), "unknown error");
  assert_string_equal(dt_strerror(-12345), "unknown error");
  /* distinct names for distinct codes */
  for (int a = DT_ERANGE; a <= 0; a++)
    for (int b = a + 1; b <= 0; b++) assert_string_not_equal(dt_strerror(a), dt_strerror(b));
}

static void *other_thread(void *arg) {
  (void)arg;
  dt_model *m = NULL;
  int rc = dt_model_create(&m, "warp(3)", 1, 1, 1, 1);
  return rc == DT_EINVAL && strstr(dt_errmsg(), "warp") ? (void *)1 : NULL;
}

static void test_errmsg_per_thread(void **st) {
  (void)st;
  EXPECT_ERR(dt_model_create(NULL, "relu", 1, 1, 1, 1), DT_EINVAL, "out");
  pthread_t t;
  void *ok = NULL;
  assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
  assert_int_equal(pthread_join(t, &ok), 0);
  assert_non_null(ok);
  /* this thread's message is still its own */
  assert_non_null(strstr(dt_errmsg(), "out is NULL"));
  assert_null(strstr(dt_errmsg(), "warp"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_strerror),
      cmocka_unit_test(test_errmsg_per_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_param.c — the DTRAIN_* knob table (src/core/param.c): defaults when
 * unset, a set value read once and cached until dt__param_reload, malformed
 * and out-of-range values fall back to the default, dt_param_or's
 * caller default, STR knobs, the by-name accessors (known and unknown
 * names), dt_param_info for every id, and first use from many threads at
 * once (pthread_once: every thread sees the same value).
 */
#include "core/core.h"

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void defaults_and_cache(void **st) {
  (void)st;
  unsetenv("DTRAIN_CHUNK_BYTES");
  dt__param_reload();
  assert_int_equal(dt_param(DT_PARAM_CHUNK_BYTES), 2 << 20);
  assert_false(dt_param_isset(DT_PARAM_CHUNK_BYTES));
  setenv("DTRAIN_CHUNK_BYTES", "65536", 1);
  assert_int_equal(dt_param(DT_PARAM_CHUNK_BYTES), 2 << 20); /* cached: not re-read */
  dt__param_reload();
  assert_int_equal(dt_param(DT_PARAM_CHUNK_BYTES), 65536);
  assert_true(dt_param_isset(DT_PARAM_CHUNK_BYTES));
  setenv("DTRAIN_CHUNK_BYTES", "0x10000", 1); /* C syntax */
  dt__param_reload();
  assert_int_equal(dt_param(DT_PARAM_CHUNK_BYTES), 65536);
  unsetenv("DTRAIN_CHUNK_BYTES");
  dt__param_reload();
}

static void bad_values_fall_back(void **st) {
  (void)st;
  const char *bad[] = {"abc", "12x", "", "-5", "99999999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("DTRAIN_TIMEOUT", bad[i], 1);
    dt__param_reload();
    assert_int_equal(dt_param(DT_PARAM_TIMEOUT), 60);
    assert_false(dt_param_isset(DT_PARAM_TIMEOUT));
  }
  setenv("DTRAIN_SHM_BIND", "2", 1); /* range [0, 1] */
  dt__param_reload();
  assert_int_equal(dt_param(DT_PARAM_SHM_BIND), 1);
  setenv("DTRAIN_SHM_BIND", "0", 1);
  dt__param_reload();
  assert_int_equal(dt_param(DT_PARAM_SHM_BIND), 0);
  unsetenv("DTRAIN_TIMEOUT");
  unsetenv("DTRAIN_SHM_BIND");
  dt__param_reload();
}

static void caller_default_and_strings(void **st) {
  (void)st;
  unsetenv("DTRAIN_SHM_SPIN_US");
  unsetenv("DTRAIN_ALGO");
  dt__param_reload();
  assert_int_equal(dt_param_or(DT_PARAM_SHM_SPIN_US, 2000), 2000);
  assert_null(dt_param_s(DT_PARAM_ALGO));
  assert_string_equal(dt_param_s(DT_PARAM_LOG_LEVEL) ? dt_param_s(DT_PARAM_LOG_LEVEL) : "", getenv("DTRAIN_LOG_LEVEL") ? getenv("DTRAIN_LOG_LEVEL") : "info");
  setenv("DTRAIN_SHM_SPIN_US", "7", 1);
  setenv("DTRAIN_ALGO", "ring", 1);
  dt__param_reload();
  assert_int_equal(dt_param_or(DT_PARAM_SHM_SPIN_US, 2000), 7);
  assert_string_equal(dt_param_s(DT_PARAM_ALGO), "ring");
  /* by name: the same cache */
  assert_string_equal(dt_param_str("DTRAIN_ALGO", "x"), "ring");
  assert_int_equal(dt_param_int("DTRAIN_SHM_SPIN_US", 1), 7);
  assert_int_equal(dt_param_int("DTRAIN_TCP_BUFFER", 123), 123); /* unset: the caller's default */
  setenv("DTRAIN_NOT_A_KNOB", "5", 1);
  assert_int_equal(dt_param_int("DTRAIN_NOT_A_KNOB", 9), 9); /* unknown names are not read */
  unsetenv("DTRAIN_NOT_A_KNOB");
  unsetenv("DTRAIN_SHM_SPIN_US");
  unsetenv("DTRAIN_ALGO");
  dt__param_reload();
}

static void info_for_every_knob(void **st) {
  (void)st;
  struct dt_param_info k;
  int n = 0;
  for (; dt_param_info(n, &k); n++) {
    assert_true(strncmp(k.name, "DTRAIN_", 7) == 0);
    assert_true(strlen(k.meaning) > 10);
    assert_non_null(k.def);
    assert_non_null(k.value);
    if (k.is_int) assert_true(k.min <= k.max);
  }
  assert_int_equal(n, DT_PARAM_COUNT);
  assert_false(dt_param_info(-1, &k));
  assert_false(dt_param_info(DT_PARAM_COUNT, &k));
}

static void *reader(void *arg) {
  *(int64_t *)arg = dt_param(DT_PARAM_TREE_MAX_BYTES);
  return NULL;
}

/* Runs first, in a child process, so the table has never been read there:
 * eight threads race to the first read and all see the environment. */
static void first_use_from_threads(void **st) {
  (void)st;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("DTRAIN_TREE_MAX_BYTES", "777", 1);
    pthread_t th[8];
    int64_t v[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, reader, &v[i]);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++)
      if (v[i] != 777) _exit(1);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(first_use_from_threads), /* first: nothing has read the table yet */
      cmocka_unit_test(defaults_and_cache),       cmocka_unit_test(bad_values_fall_back),
      cmocka_unit_test(caller_default_and_strings), cmocka_unit_test(info_for_every_knob),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_data_hostile.c — inputs a hostile user gives the readers: CSV values
 * that are finite as double but overflow float32 (1e300 used to become inf
 * and ruin training silently), and a FIFO or a directory given as a data
 * path (open() on a FIFO used to block forever). Every reader must refuse
 * each with a message naming the file (and file:line:column for CSV). An
 * alarm turns a hang into a failure instead of a stuck test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "data/data_int.h"

static void assert_msg_has(const char *needle) {
  if (!strstr(dt_errmsg(), needle)) fail_msg("error message '%s' lacks '%s'", dt_errmsg(), needle);
}

static void expect_csv(const char *text, int label_col, const char *needle) {
  dt_dataset ds;
  memset(&ds, 0x5a, sizeof ds);
  int rc = dt__csv_parse_mem(&ds, text, strlen(text), "t.csv", label_col);
  if (rc != DT_ECORRUPT) fail_msg("'%s': rc %d (%s), want DT_ECORRUPT", text, rc, dt_errmsg());
  assert_msg_has(needle);
  assert_null(ds.x);
  assert_null(ds.y);
}

static void test_csv_float32_range(void **state) {
  (void)state;
  expect_csv("1,2,3\n4,5,1e300\n", 0, "t.csv:2:5: field 3 '1e300' is beyond the float32 range");
  expect_csv("1,-3.5e38,3\n", 0, "t.csv:1:3: field 2 '-3.5e38' is beyond the float32 range");
  expect_csv("1e39,2,0\n", -1, "t.csv:1:1: field 1 '1e39' is beyond the float32 range");
  /* The first field of the first row out of range is an error, not a header. */
  expect_csv("2,1e300\n1,2\n", 0, "t.csv:1:3");
  /* The largest float32 and tiny values that flush to 0 are fine. */
  dt_dataset ds;
  const char *ok = "1,3.4028234e38,1e-300\n";
  assert_int_equal(dt__csv_parse_mem(&ds, ok, strlen(ok), "t.csv", 0), DT_OK);
  assert_true(ds.x[0] == 3.4028234e38f);
  assert_true(ds.x[1] == 0.0f);
  dt_dataset_free(&ds);
}

static char dir[] = "/tmp/dt_test_hostile_XXXXXX";
static char fifo[64];

/* A reader blocked in open() fails the test instead of hanging it, and the
 * FIFO is removed either way. */
static void on_alarm(int sig) {
  (void)sig;
  static const char m[] = "a reader blocked on a FIFO for 20 s\n";
  if (write(2, m, sizeof m - 1) < 0) {}
  unlink(fifo);
  rmdir(dir);
  _exit(1);
}

static void test_non_regular_paths(void **state) {
  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  signal(SIGALRM, on_alarm);
  alarm(20);
  dt_dataset ds;
  assert_int_equal(dt_csv_load(&ds, fifo, 0), DT_EIO);
  assert_msg_has(fifo);
  assert_msg_has("not a regular file (a FIFO)");
  assert_int_equal(dt_idx_load(&ds, fifo, fifo), DT_EIO);
  assert_msg_has("not a regular file (a FIFO)");
  assert_int_equal(dt_npy_load(&ds, fifo, fifo), DT_EIO);
  assert_msg_has("not a regular file (a FIFO)");
  assert_int_equal(dt_csv_load(&ds, dir, 0), DT_EIO);
  assert_msg_has("not a regular file (a directory)");
  alarm(0);
  unlink(fifo);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_csv_float32_range),
                                     cmocka_unit_test(test_non_regular_paths)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_csv.c — the CSV reader: with and without a header, label first or
 * last, CRLF and blank lines, and bad input (ragged rows, non-numbers,
 * non-integer or negative labels, label column out of range, empty and
 * missing files), each naming file:line:column.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "data/data_int.h"

static void assert_msg_has(const char *needle) {
  if (!strstr(dt_errmsg(), needle)) fail_msg("error message '%s' lacks '%s'", dt_errmsg(), needle);
}

static int parse(dt_dataset *ds, const char *text, int label_col) {
  return dt__csv_parse_mem(ds, text, strlen(text), "t.csv", label_col);
}

static void test_good(void **state) {
  (void)state;
  dt_dataset ds;
  assert_int_equal(parse(&ds, "label,a,b\n1,0.5,2\n0, -1.25 ,3e2\n\n3,7,8\n", 0), DT_OK);
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.dim, 2);
  assert_int_equal(ds.w, 2);
  assert_int_equal(ds.nclasses, 4);
  const float want[] = {0.5f, 2, -1.25f, 300, 7, 8};
  assert_memory_equal(ds.x, want, sizeof want);
  assert_int_equal(ds.y[0], 1);
  assert_int_equal(ds.y[1], 0);
  assert_int_equal(ds.y[2], 3);
  dt_dataset_free(&ds);
  /* No header, label last, CRLF, no final newline. */
  assert_int_equal(parse(&ds, "0.5,2,1\r\n-1.25,300,0\r\n7,8,2", -1), DT_OK);
  assert_int_equal(ds.n, 3);
  assert_memory_equal(ds.x, want, sizeof want);
  assert_int_equal(ds.y[2], 2);
  assert_int_equal(ds.nclasses, 3);
  dt_dataset_free(&ds);
  /* Label in the middle. */
  assert_int_equal(parse(&ds, "0.5,1,2\n", 1), DT_OK);
  assert_int_equal(ds.y[0], 1);
  assert_true(ds.x[0] == 0.5f && ds.x[1] == 2.f);
  dt_dataset_free(&ds);
  /* Through a real file. */
  char path[] = "/tmp/dt_test_csv_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *t = "y,x\n1,0.25\n";
  assert_int_equal(write(fd, t, strlen(t)), (ssize_t)strlen(t));
  close(fd);
  assert_int_equal(dt_csv_load(&ds, path, 0), DT_OK);
  assert_int_equal(ds.n, 1);
  assert_true(ds.x[0] == 0.25f);
  dt_dataset_free(&ds);
  unlink(path);
}

static void expect(const char *text, int label_col, int want, const char *needle) {
  dt_dataset ds;
  memset(&ds, 0x5a, sizeof ds);
  int rc = parse(&ds, text, label_col);
  if (rc != want) fail_msg("'%s': rc %d (%s), want %d", text, rc, dt_errmsg(), want);
  assert_msg_has(needle);
  assert_null(ds.x);
  assert_null(ds.y);
}

static void test_bad(void **state) {
  (void)state;
  expect("1,2,3\n4,5\n", 0, DT_ECORRUPT, "t.csv:2:1: expected 3 fields like the first row, found 2");
  expect("h1,h2\n1,2\n\n1,2,3\n", 0, DT_ECORRUPT, "t.csv:4:1: expected 2 fields");
  expect("1,2,3\n4,abc,6\n", 0, DT_ECORRUPT, "t.csv:2:3: field 2 'abc' is not a finite number");
  expect("1,2,3\n4,5,\n", 0, DT_ECORRUPT, "t.csv:2:5: field 3 '' is not a finite number");
  expect("1,2,3\n4,5,nan\n", 0, DT_ECORRUPT, "t.csv:2:5: field 3 'nan'");
  expect("1,2,3\n4,5,1e999\n", 0, DT_ECORRUPT, "t.csv:2:5");
  expect("1.5,2,3\n", 0, DT_ECORRUPT, "t.csv:1:1: label '1.5' is not an integer");
  expect("1,2,3\n0,2,-3\n", -1, DT_ECORRUPT, "t.csv:2:5: label '-3' is not an integer");
  expect("1,2,3\n", 3, DT_EINVAL, "t.csv: label column 3 out of range (rows have 3 fields)");
  expect("1,2,3\n", -4, DT_EINVAL, "label column -4");
  expect("1\n2\n", 0, DT_ECORRUPT, "t.csv:1:1: a row needs a label and at least one feature");
  expect("", 0, DT_ECORRUPT, "t.csv: no data rows");
  expect("a,b,c\n\n", 0, DT_ECORRUPT, "t.csv: no data rows");
  expect("1,2,\0003\n", 0, DT_ECORRUPT, "t.csv:1:5"); /* strlen stops at NUL: empty last field */
  dt_dataset ds;
  const char nul[] = "1,2\n3,4\0x\n";
  assert_int_equal(dt__csv_parse_mem(&ds, nul, sizeof nul - 1, "n.csv", 0), DT_ECORRUPT);
  assert_msg_has("n.csv:2:3: field 2 '4?x'");
  assert_int_equal(dt_csv_load(&ds, "/nonexistent/d.csv", 0), DT_EIO);
  assert_msg_has("/nonexistent/d.csv: cannot open");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_good), cmocka_unit_test(test_bad)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

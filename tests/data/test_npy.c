/*
 * test_npy.c — the .npy reader against files written by NumPy itself
 * (tests/data/fixtures/, made by make_npy.py): float32 (n,h,w), float64
 * (n,d), uint8 (n,c,h,w), int64/int32/uint8 labels, format 2.0; and bad
 * input built by editing those bytes: wrong magic, truncated, trailing
 * bytes, Fortran order, big-endian, bad dtype, bad header, count mismatch,
 * non-finite values, out-of-range labels, huge shapes, missing files.
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "data/data_int.h"

#define FIX DT_SOURCE_DIR "/tests/data/fixtures/"

static void assert_msg_has(const char *needle) {
  if (!strstr(dt_errmsg(), needle)) fail_msg("error message '%s' lacks '%s'", dt_errmsg(), needle);
}

static void check(const dt_dataset *ds, int c, int h, int w, int u8) {
  assert_int_equal(ds->n, 4);
  assert_int_equal(ds->c, c);
  assert_int_equal(ds->h, h);
  assert_int_equal(ds->w, w);
  assert_int_equal(ds->dim, 6);
  assert_int_equal(ds->nclasses, 3);
  for (int i = 0; i < 4; i++) assert_int_equal(ds->y[i], i % 3);
  for (int i = 0; i < 24; i++) {
    float want = u8 ? (float)(i * 10 % 256) / 255.0f : (float)i / 8.0f - 1.0f;
    if (ds->x[i] != want) fail_msg("x[%d] = %g, want %g", i, ds->x[i], want);
  }
}

static void test_good(void **state) {
  (void)state;
  dt_dataset ds;
  int rc = dt_npy_load(&ds, FIX "x_f4.npy", FIX "y_i8.npy");
  if (rc) fail_msg("%s", dt_errmsg());
  check(&ds, 1, 2, 3, 0);
  dt_dataset_free(&ds);
  assert_int_equal(dt_npy_load(&ds, FIX "x_f8.npy", FIX "y_u1.npy"), DT_OK);
  check(&ds, 1, 1, 6, 0);
  dt_dataset_free(&ds);
  assert_int_equal(dt_npy_load(&ds, FIX "x_u1.npy", FIX "y_i4.npy"), DT_OK);
  check(&ds, 1, 2, 3, 1);
  dt_dataset_free(&ds);
  assert_int_equal(dt_npy_load(&ds, FIX "x_f4_v2.npy", FIX "y_i8.npy"), DT_OK);
  check(&ds, 1, 2, 3, 0);
  dt_dataset_free(&ds);
}

/* Reads a fixture into a static buffer with slack for edits. */
static size_t slurp(const char *name, uint8_t *buf, size_t cap) {
  char p[512];
  snprintf(p, sizeof p, FIX "%s", name);
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

static uint8_t X[1024], Y[1024];
static size_t xl, yl;

static int setup(void **state) {
  (void)state;
  xl = slurp("x_f4.npy", X, sizeof X);
  yl = slurp("y_i8.npy", Y, sizeof Y);
  return 0;
}

static void expect_mem(const uint8_t *x, size_t xn, const uint8_t *y, size_t yn, int want, const char *needle) {
  dt_dataset ds;
  memset(&ds, 0x5a, sizeof ds);
  int rc = dt__npy_load_mem(&ds, x, xn, "x.npy", y, yn, "y.npy");
  if (rc != want) fail_msg("rc %d (%s), want %d (%s)", rc, dt_errmsg(), want, needle);
  assert_msg_has(needle);
  assert_null(ds.x);
  assert_null(ds.y);
}

/* A copy of X with its header text edited: `from` replaced by `to` (same
 * length, so the header length stays right). */
static size_t edited(uint8_t *out, const char *from, const char *to) {
  memcpy(out, X, xl);
  char *h = memmem(out, xl, from, strlen(from));
  assert_non_null(h);
  assert_int_equal(strlen(from), strlen(to));
  memcpy(h, to, strlen(to));
  return xl;
}

static void test_bad(void **state) {
  (void)state;
  static uint8_t b[2048];
  dt_dataset ds;
  assert_int_equal(dt_npy_load(&ds, FIX "nope.npy", FIX "y_i8.npy"), DT_EIO);
  assert_msg_has("nope.npy: cannot open");
  assert_int_equal(dt_npy_load(&ds, FIX "x_f4.npy", FIX "nope_y.npy"), DT_EIO);
  assert_msg_has("nope_y.npy");
  assert_int_equal(dt_npy_load(&ds, FIX "x_fortran.npy", FIX "y_i8.npy"), DT_ENOTSUP);
  assert_msg_has("x_fortran.npy: Fortran-order");
  assert_int_equal(dt_npy_load(&ds, FIX "x_be.npy", FIX "y_i8.npy"), DT_ENOTSUP);
  assert_msg_has("x_be.npy: big-endian dtype '>f4'");

  memcpy(b, X, xl);
  b[1] = 'M';
  expect_mem(b, xl, Y, yl, DT_ECORRUPT, "x.npy: not a .npy file (bad magic)");
  expect_mem(X, 9, Y, yl, DT_ECORRUPT, "x.npy: not a .npy file");
  expect_mem(X, xl - 1, Y, yl, DT_ECORRUPT, "x.npy: truncated: header says 96 data bytes, found 95");
  expect_mem(X, 40, Y, yl, DT_ECORRUPT, "x.npy: truncated: header length 118");
  memcpy(b, X, xl);
  memcpy(b + xl, "xx", 2);
  expect_mem(b, xl + 2, Y, yl, DT_ECORRUPT, "x.npy: trailing bytes: header says 96 data bytes, found 98");
  expect_mem(X, xl, Y, yl - 8, DT_ECORRUPT, "y.npy: truncated");
  memcpy(b, X, xl);
  b[6] = 9;
  expect_mem(b, xl, Y, yl, DT_ENOTSUP, "x.npy: .npy format version 9.0 not supported");

  expect_mem(b, edited(b, "'<f4'", "'<c8'"), Y, yl, DT_ENOTSUP, "x.npy: dtype '<c8' is not supported");
  expect_mem(b, edited(b, "'<f4'", "'<f2'"), Y, yl, DT_ENOTSUP, "dtype '<f2'");
  expect_mem(b, edited(b, "'<f4'", "'<i4'"), Y, yl, DT_ENOTSUP, "x.npy: features must be float32, float64 or uint8");
  expect_mem(b, edited(b, "'descr'", "'dascr'"), Y, yl, DT_ECORRUPT, "unexpected or repeated key 'dascr'");
  expect_mem(b, edited(b, "(4, 2, 3)", "(4, 2, x)"), Y, yl, DT_ECORRUPT, "x.npy: .npy header: bad 'shape' entry");
  expect_mem(b, edited(b, "(4, 2, 3)", "(4, 0, 3)"), Y, yl, DT_ECORRUPT, "x.npy: trailing bytes: header says 0 data bytes, found 96");
  expect_mem(b, edited(b, "(4, 2, 3)", "(4, 0, 3)") - 96, Y, yl, DT_ECORRUPT, "x.npy: empty array (a dimension is 0)");
  expect_mem(b, edited(b, "(4, 2, 3)", "(5, 2, 3)"), Y, yl, DT_ECORRUPT, "x.npy: truncated");
  expect_mem(b, edited(b, "{'descr'", "['descr'"), Y, yl, DT_ECORRUPT, "header is not a dict");
  expect_mem(b, edited(b, "False", "Flase"), Y, yl, DT_ECORRUPT, "'fortran_order' is not True or False");
  expect_mem(b, edited(b, "3), }", "3)} }"), Y, yl, DT_ECORRUPT, "garbage after the dict");
  /* Forged huge shape: refused from the header, before allocating. */
  expect_mem(b, edited(b, "(4, 2, 3), } ", "(9999999999)}"), Y, yl, DT_ERANGE, "x.npy: .npy shape claims more than");
  /* Labels: wrong count, float dtype, out of range. */
  memcpy(b, Y, yl);
  char *s = memmem(b, yl, "(4,)", 4);
  memcpy(s, "(3,)", 4);
  expect_mem(X, xl, b, yl - 8, DT_ECORRUPT, "x.npy has 4 samples but y.npy has 3 labels");
  memcpy(b, Y, yl);
  s = memmem(b, yl, "'<i8'", 5);
  memcpy(s, "'<f8'", 5);
  expect_mem(X, xl, b, yl, DT_ENOTSUP, "y.npy: labels must have an integer dtype");
  memcpy(b, Y, yl);
  int64_t neg = -1;
  memcpy(b + yl - 8, &neg, 8);
  expect_mem(X, xl, b, yl, DT_ECORRUPT, "y.npy: label -1 at index 3 is outside");
  /* Non-finite features. */
  memcpy(b, X, xl);
  uint32_t nan = 0x7fc00000u;
  memcpy(b + xl - 4 * 7, &nan, 4);
  expect_mem(b, xl, Y, yl, DT_ECORRUPT, "x.npy: element 17 (sample 2) is not a finite float32");
  /* Features given where labels belong: 3-D labels. */
  expect_mem(X, xl, X, xl, DT_ENOTSUP, "y.npy: labels must have an integer dtype");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_good), cmocka_unit_test(test_bad)};
  return cmocka_run_group_tests(tests, setup, NULL);
}

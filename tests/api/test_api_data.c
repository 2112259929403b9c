/*
 * test_api_data.c — dtrain/data.h through the public API: a dataset from
 * caller memory copies or borrows as asked (a copy survives the caller's
 * arrays changing; a borrow is the caller's memory, is never written — so
 * normalising it is refused — and never freed); reshape, stats and
 * normalise; and every reader and constructor fails on bad input with the
 * documented code, a message naming the argument, file or line, and an
 * empty dataset.
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "api_test.h"

static int is_empty(const dt_dataset *ds) {
  return ds->n == 0 && ds->x == NULL && ds->y == NULL && ds->dim == 0;
}

static void test_from_memory(void **st) {
  (void)st;
  float x[6] = {1, 2, 3, 4, 5, 6};
  int32_t y[3] = {0, 2, 1};
  dt_dataset c, b;
  EXPECT_OK(dt_dataset_from_memory(&c, x, y, 3, 1, 1, 2, DT_DATA_COPY));
  EXPECT_OK(dt_dataset_from_memory(&b, x, y, 3, 2, 1, 1, DT_DATA_BORROW));
  assert_int_equal(c.n, 3);
  assert_int_equal(c.dim, 2);
  assert_int_equal(c.nclasses, 3);
  assert_int_equal(b.c, 2);
  assert_ptr_not_equal(c.x, x);
  assert_ptr_equal(b.x, x);
  assert_ptr_equal(b.y, y);
  x[0] = 100.0f; /* the copy does not see it, the borrow does */
  assert_true(c.x[0] == 1.0f);
  assert_true(b.x[0] == 100.0f);
  x[0] = 1.0f;
  float mean = -1, sd = -1;
  EXPECT_OK(dt_dataset_stats(&c, &mean, &sd));
  assert_float_equal(mean, 3.5f, 1e-6f);
  assert_float_equal(sd, sqrtf(35.0f / 12.0f), 1e-6f);
  EXPECT_OK(dt_dataset_stats(&c, NULL, NULL));
  EXPECT_OK(dt_dataset_normalize(&c, mean, sd));
  EXPECT_OK(dt_dataset_stats(&c, &mean, &sd));
  assert_float_equal(mean, 0.0f, 1e-6f);
  assert_float_equal(sd, 1.0f, 1e-5f);
  /* a borrowed dataset is read-only */
  EXPECT_ERR(dt_dataset_normalize(&b, 1.0f, 2.0f), DT_EINVAL, "borrows");
  assert_true(x[1] == 2.0f);
  EXPECT_OK(dt_dataset_reshape(&c, 2, 1, 1));
  assert_int_equal(c.c, 2);
  EXPECT_ERR(dt_dataset_reshape(&c, 3, 1, 1), DT_EINVAL, "3x1x1");
  EXPECT_ERR(dt_dataset_reshape(NULL, 2, 1, 1), DT_EINVAL, "ds is NULL");
  dt_dataset_free(&c);
  dt_dataset_free(&b); /* does not free the caller's arrays (ASan would see it) */
  assert_true(is_empty(&b));
  assert_true(x[5] == 6.0f && y[2] == 1);
  dt_dataset_free(NULL);
  /* an empty dataset has zero statistics */
  dt_dataset e = {0};
  EXPECT_OK(dt_dataset_stats(&e, &mean, &sd));
  assert_true(mean == 0.0f && sd == 0.0f);
}

static void test_from_memory_errors(void **st) {
  (void)st;
  float x[4] = {0};
  int32_t y[2] = {0, 1};
  dt_dataset ds;
  EXPECT_ERR(dt_dataset_from_memory(NULL, x, y, 2, 1, 1, 2, DT_DATA_COPY), DT_EINVAL, "ds is NULL");
  EXPECT_ERR(dt_dataset_from_memory(&ds, NULL, y, 2, 1, 1, 2, DT_DATA_COPY), DT_EINVAL, "x is NULL");
  assert_true(is_empty(&ds));
  EXPECT_ERR(dt_dataset_from_memory(&ds, x, NULL, 2, 1, 1, 2, DT_DATA_COPY), DT_EINVAL, "y is NULL");
  EXPECT_ERR(dt_dataset_from_memory(&ds, x, y, 0, 1, 1, 2, DT_DATA_COPY), DT_EINVAL, "n 0");
  EXPECT_ERR(dt_dataset_from_memory(&ds, x, y, 2, 1, 0, 2, DT_DATA_COPY), DT_EINVAL, "shape");
  EXPECT_ERR(dt_dataset_from_memory(&ds, x, y, 2, 1, 1, 2, 5), DT_EINVAL, "own 5");
  EXPECT_ERR(dt_dataset_from_memory(&ds, x, y, (int64_t)1 << 62, 1024, 1024, 1024, DT_DATA_BORROW),
             DT_EINVAL, "too large");
  int32_t neg[2] = {0, -3};
  EXPECT_ERR(dt_dataset_from_memory(&ds, x, neg, 2, 1, 1, 2, DT_DATA_COPY), DT_EINVAL, "y[1] = -3");
  assert_true(is_empty(&ds));
  EXPECT_ERR(dt_dataset_stats(NULL, NULL, NULL), DT_EINVAL, "ds is NULL");
  EXPECT_ERR(dt_dataset_normalize(NULL, 0, 1), DT_EINVAL, "ds is NULL");
  EXPECT_OK(dt_dataset_from_memory(&ds, x, y, 2, 1, 1, 2, DT_DATA_COPY));
  EXPECT_ERR(dt_dataset_normalize(&ds, NAN, 1), DT_EINVAL, "mean");
  dt_dataset_free(&ds);
}

static char dir[64];

static void put(const char *name, const void *buf, size_t len, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  fclose(f);
}

static void test_readers_fail(void **st) {
  (void)st;
  snprintf(dir, sizeof dir, "/tmp/dt_api_data_XXXXXX");
  assert_non_null(mkdtemp(dir));
  char img[128], lab[128], csv[128], npx[128], missing[128];
  snprintf(missing, sizeof missing, "%s/no-such-file", dir);
  put("junk.idx", "this is not an idx file at all", 30, img, sizeof img);
  put("junk-labels.idx", "\0\0\x08\x01\0\0\0\2\1\2", 10, lab, sizeof lab);
  put("bad.csv", "1,2,0\n3,x,1\n", 12, csv, sizeof csv);
  put("junk.npy", "\x93NUMPX garbage", 14, npx, sizeof npx);
  dt_dataset ds;
  EXPECT_ERR(dt_idx_load(NULL, img, lab), DT_EINVAL, "ds is NULL");
  EXPECT_ERR(dt_idx_load(&ds, missing, lab), DT_EIO, "no-such-file");
  assert_true(is_empty(&ds));
  EXPECT_ERR(dt_idx_load(&ds, NULL, lab), DT_EINVAL, "no file name");
  EXPECT_ERR(dt_idx_load(&ds, img, lab), DT_ECORRUPT, "junk.idx");
  assert_true(is_empty(&ds));
  EXPECT_ERR(dt_csv_load(NULL, csv, -1), DT_EINVAL, "ds is NULL");
  EXPECT_ERR(dt_csv_load(&ds, missing, -1), DT_EIO, "no-such-file");
  int rc = dt_csv_load(&ds, csv, -1);
  assert_true(rc == DT_ECORRUPT || rc == DT_EINVAL);
  assert_non_null(strstr(dt_errmsg(), "bad.csv"));
  assert_non_null(strstr(dt_errmsg(), "2")); /* the line */
  assert_true(is_empty(&ds));
  EXPECT_ERR(dt_npy_load(NULL, npx, npx), DT_EINVAL, "ds is NULL");
  EXPECT_ERR(dt_npy_load(&ds, missing, npx), DT_EIO, "no-such-file");
  EXPECT_ERR(dt_npy_load(&ds, npx, npx), DT_ECORRUPT, "junk.npy");
  assert_true(is_empty(&ds));
  unlink(img), unlink(lab), unlink(csv), unlink(npx);
  assert_int_equal(rmdir(dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_from_memory),
      cmocka_unit_test(test_from_memory_errors),
      cmocka_unit_test(test_readers_fail),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_idx.c — the IDX reader: the real Fashion-MNIST files (skipped when
 * the dataset package is absent), tiny generated files raw and gzipped
 * (including multi-member gzip), and every bad input: missing file, wrong
 * magic, truncated, trailing bytes, count mismatch, zero and huge
 * dimensions, corrupt gzip. Errors must be DT_E* codes whose message names
 * the file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>

#include "core/core.h"
#include "data/data.h"
#include "../dt_skip.h"

#define FM "/usr/share/datasets/fashion-mnist/"

static char dir[256];

static void path_of(char *out, const char *name) { snprintf(out, 512, "%s/%s", dir, name); }

static void write_file(const char *name, const void *buf, size_t len) {
  char p[512];
  path_of(p, name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  fclose(f);
}

/* mode "wb" writes one gzip member; "ab" appends another. */
static void write_gz(const char *name, const void *buf, size_t len, const char *mode) {
  char p[512];
  path_of(p, name);
  gzFile g = gzopen(p, mode);
  assert_non_null(g);
  if (len) assert_int_equal(gzwrite(g, buf, (unsigned)len), (int)len);
  assert_int_equal(gzclose(g), Z_OK);
}

static size_t put_be32(uint8_t *b, uint32_t v) {
  b[0] = v >> 24, b[1] = v >> 16, b[2] = v >> 8, b[3] = (uint8_t)v;
  return 4;
}

/* n images of r x c with pixel (i, k) = (7*i + k) & 255, and labels i % 4
 * (so nclasses = 4 when n >= 4). Returns the byte counts. */
static size_t make_images(uint8_t *b, uint32_t n, uint32_t r, uint32_t c) {
  size_t o = put_be32(b, 0x803);
  o += put_be32(b + o, n);
  o += put_be32(b + o, r);
  o += put_be32(b + o, c);
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t k = 0; k < r * c; k++) b[o++] = (uint8_t)((7 * i + k) & 255);
  return o;
}
static size_t make_labels(uint8_t *b, uint32_t n) {
  size_t o = put_be32(b, 0x801);
  o += put_be32(b + o, n);
  for (uint32_t i = 0; i < n; i++) b[o++] = (uint8_t)(i % 4);
  return o;
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/dt_test_idx_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int load(dt_dataset *ds, const char *img, const char *lab) {
  char a[512], b[512];
  path_of(a, img);
  path_of(b, lab);
  return dt_idx_load(ds, a, b);
}

/* Asserts that the last error mentions `needle`. */
static void assert_msg_has(const char *needle) {
  if (!strstr(dt_errmsg(), needle)) fail_msg("error message '%s' lacks '%s'", dt_errmsg(), needle);
}

static void check_tiny(const dt_dataset *ds, uint32_t n, uint32_t r, uint32_t c) {
  assert_int_equal(ds->n, n);
  assert_int_equal(ds->c, 1);
  assert_int_equal(ds->h, r);
  assert_int_equal(ds->w, c);
  assert_int_equal(ds->dim, r * c);
  assert_int_equal(ds->nclasses, n >= 4 ? 4 : n);
  for (uint32_t i = 0; i < n; i++) {
    assert_int_equal(ds->y[i], i % 4);
    for (uint32_t k = 0; k < r * c; k++)
      assert_true(ds->x[i * r * c + k] == (float)((7 * i + k) & 255) / 255.0f);
  }
}

static void test_real_fashion_mnist(void **state) {
  (void)state;
  if (access(FM "train-images-idx3-ubyte.gz", R_OK) != 0) {
    DT_SKIP(FM " not installed (Debian package dataset-fashion-mnist)");
  }
  dt_dataset tr, te;
  double t0 = dt_now();
  int rc = dt_idx_load(&tr, FM "train-images-idx3-ubyte.gz", FM "train-labels-idx1-ubyte.gz");
  double t1 = dt_now();
  if (rc) fail_msg("%s", dt_errmsg());
  assert_int_equal(dt_idx_load(&te, FM "t10k-images-idx3-ubyte.gz", FM "t10k-labels-idx1-ubyte.gz"), DT_OK);
  print_message("fashion-mnist train (60000 x 784) loaded in %.3f s\n", t1 - t0);
  assert_int_equal(tr.n, 60000);
  assert_int_equal(te.n, 10000);
  assert_int_equal(tr.h, 28);
  assert_int_equal(tr.w, 28);
  assert_int_equal(tr.dim, 784);
  assert_int_equal(tr.nclasses, 10);
  assert_int_equal(te.nclasses, 10);
  /* Known first labels: train[0] = 9 (ankle boot), test[0] = 9, test[1] = 2. */
  assert_int_equal(tr.y[0], 9);
  assert_int_equal(te.y[0], 9);
  assert_int_equal(te.y[1], 2);
  int64_t counts[10] = {0};
  for (int64_t i = 0; i < tr.n; i++) counts[tr.y[i]]++;
  for (int k = 0; k < 10; k++) assert_int_equal(counts[k], 6000); /* balanced classes */
  float mean, std;
  dt_dataset_stats(&tr, &mean, &std);
  print_message("fashion-mnist train mean %.4f std %.4f\n", mean, std);
  assert_true(mean > 0.28f && mean < 0.29f); /* 0.2860 */
  assert_true(std > 0.35f && std < 0.36f);   /* 0.3530 */
  dt_dataset_free(&tr);
  dt_dataset_free(&te);
  assert_null(tr.x);
  dt_dataset_free(NULL);
}

static void test_tiny_raw_and_gz(void **state) {
  (void)state;
  static uint8_t img[16 + 6 * 3 * 5], lab[8 + 6];
  size_t il = make_images(img, 6, 3, 5), ll = make_labels(lab, 6);
  write_file("i.raw", img, il);
  write_file("l.raw", lab, ll);
  write_gz("i.gz", img, il, "wb");
  write_gz("l.gz", lab, ll, "wb");
  /* Two gzip members decode as one stream (what `cat a.gz b.gz` gives). */
  write_gz("i2.gz", img, 20, "wb");
  write_gz("i2.gz", img + 20, il - 20, "ab");
  const char *imgs[] = {"i.raw", "i.gz", "i2.gz"}, *labs[] = {"l.raw", "l.gz"};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 2; b++) {
      dt_dataset ds;
      int rc = load(&ds, imgs[a], labs[b]);
      if (rc) fail_msg("%s + %s: %s", imgs[a], labs[b], dt_errmsg());
      check_tiny(&ds, 6, 3, 5);
      dt_dataset_free(&ds);
    }
}

static void expect_fail(const char *img, const char *lab, int want, const char *needle) {
  dt_dataset ds;
  memset(&ds, 0x5a, sizeof ds);
  dt__clearerr();
  int rc = load(&ds, img, lab);
  if (rc != want) fail_msg("%s + %s: rc %d (%s), want %d", img, lab, rc, dt_errmsg(), want);
  assert_msg_has(needle);
  assert_null(ds.x); /* nothing half-built is left behind */
  assert_null(ds.y);
  assert_int_equal(ds.n, 0);
}

static void test_missing_file(void **state) {
  (void)state;
  static uint8_t lab[16];
  write_file("ok.lab", lab, make_labels(lab, 2));
  expect_fail("nope.idx", "ok.lab", DT_EIO, "nope.idx");
  expect_fail("nope.idx", "ok.lab", DT_EIO, "No such file");
  expect_fail(".", "ok.lab", DT_EIO, "not a regular file");
}

static void test_wrong_magic(void **state) {
  (void)state;
  static uint8_t img[16 + 2 * 4], lab[8 + 2];
  size_t il = make_images(img, 2, 2, 2), ll = make_labels(lab, 2);
  write_file("m.img", img, il);
  write_file("m.lab", lab, ll);
  /* Swapped files: each has the other's magic. */
  expect_fail("m.lab", "m.img", DT_ECORRUPT, "wrong magic 0x00000801, expected 0x00000803");
  expect_fail("m.img", "m.img", DT_ECORRUPT, "m.img: wrong magic 0x00000803, expected 0x00000801");
  img[2] = 0x0d; /* float elements */
  write_file("f.img", img, il);
  expect_fail("f.img", "m.lab", DT_ECORRUPT, "f.img: wrong magic 0x00000d03");
  write_gz("f.img.gz", img, il, "wb");
  expect_fail("f.img.gz", "m.lab", DT_ECORRUPT, "f.img.gz: wrong magic");
  write_file("text.img", "hello world, not idx", 20);
  expect_fail("text.img", "m.lab", DT_ECORRUPT, "wrong magic");
  write_file("short.img", "\0\0", 2);
  expect_fail("short.img", "m.lab", DT_ECORRUPT, "shorter than the 4-byte IDX magic");
  write_file("empty.img", "", 0);
  expect_fail("empty.img", "m.lab", DT_ECORRUPT, "empty.img: truncated");
}

static void test_truncated(void **state) {
  (void)state;
  static uint8_t img[16 + 4 * 3 * 3], lab[8 + 4];
  size_t il = make_images(img, 4, 3, 3), ll = make_labels(lab, 4);
  write_file("t.lab", lab, ll);
  write_file("t1.img", img, il - 1);
  expect_fail("t1.img", "t.lab", DT_ECORRUPT, "t1.img: truncated: header says 36 data bytes after the 16-byte header, found 35");
  write_file("t2.img", img, 10);
  expect_fail("t2.img", "t.lab", DT_ECORRUPT, "t2.img: truncated header: expected 16 bytes, found 10");
  write_gz("t3.img.gz", img, il - 5, "wb");
  expect_fail("t3.img.gz", "t.lab", DT_ECORRUPT, "t3.img.gz: truncated: header says 36 data bytes after the 16-byte header, found 31");
  /* A gzip file cut short (its end marker and trailer missing). */
  write_gz("t4.img.gz", img, il, "wb");
  char p[512];
  path_of(p, "t4.img.gz");
  FILE *f = fopen(p, "rb");
  static uint8_t gz[4096];
  size_t gl = fread(gz, 1, sizeof gz, f);
  fclose(f);
  write_file("t5.img.gz", gz, gl - 10);
  expect_fail("t5.img.gz", "t.lab", DT_ECORRUPT, "t5.img.gz: gzip stream is truncated");
  write_file("t6.lab", lab, ll - 1);
  expect_fail("t4.img.gz", "t6.lab", DT_ECORRUPT, "t6.lab: truncated");
  /* Corrupt deflate data. */
  for (size_t i = 12; i < gl - 8; i++) gz[i] ^= 0xa5;
  write_file("t7.img.gz", gz, gl);
  expect_fail("t7.img.gz", "t.lab", DT_ECORRUPT, "t7.img.gz: corrupt gzip data");
}

static void test_trailing(void **state) {
  (void)state;
  static uint8_t img[16 + 4 * 9 + 8], lab[8 + 4 + 3];
  size_t il = make_images(img, 4, 3, 3), ll = make_labels(lab, 4);
  write_file("r.lab", lab, ll);
  write_file("r1.img", img, il + 8);
  expect_fail("r1.img", "r.lab", DT_ECORRUPT, "r1.img: trailing bytes: header says 36 data bytes after the 16-byte header, found 44");
  write_gz("r2.img.gz", img, il + 3, "wb");
  expect_fail("r2.img.gz", "r.lab", DT_ECORRUPT, "r2.img.gz: trailing bytes: header says 36 data bytes after the 16-byte header, found 39");
  write_file("r3.lab", lab, ll + 3);
  expect_fail("r2.img.gz", "r3.lab", DT_ECORRUPT, "r2.img.gz"); /* images are checked first */
  write_gz("r4.img.gz", img, il, "wb");
  expect_fail("r4.img.gz", "r3.lab", DT_ECORRUPT, "r3.lab: trailing bytes");
  /* Garbage after the gzip stream itself. */
  char p[512];
  path_of(p, "r4.img.gz");
  FILE *f = fopen(p, "ab");
  fwrite("JUNK", 1, 4, f);
  fclose(f);
  expect_fail("r4.img.gz", "r.lab", DT_ECORRUPT, "r4.img.gz: 4 trailing bytes after the end of the gzip stream");
}

static void test_count_mismatch(void **state) {
  (void)state;
  static uint8_t img[16 + 5 * 4], lab[8 + 6];
  write_file("c.img", img, make_images(img, 5, 2, 2));
  write_file("c.lab", lab, make_labels(lab, 6));
  expect_fail("c.img", "c.lab", DT_ECORRUPT, "has 5 images but");
  expect_fail("c.img", "c.lab", DT_ECORRUPT, "c.lab has 6 labels");
}

static void test_zero_and_huge_dims(void **state) {
  (void)state;
  static uint8_t img[64], lab[16];
  write_file("z.lab", lab, make_labels(lab, 2));
  size_t il = make_images(img, 2, 2, 2);
  put_be32(img + 8, 0); /* rows = 0 */
  write_file("z.img", img, il);
  expect_fail("z.img", "z.lab", DT_ECORRUPT, "z.img: dimension 1 of the IDX header is 0");
  make_labels(lab, 0);
  write_file("z0.lab", lab, 8);
  make_images(img, 2, 2, 2);
  write_file("z1.img", img, il);
  expect_fail("z1.img", "z0.lab", DT_ECORRUPT, "z0.lab: dimension 0 of the IDX header is 0");
  /* Forged sizes: rejected from the header, before any allocation. */
  put_be32(img + 4, 0xffffffffu);
  put_be32(img + 8, 0xffffffffu);
  put_be32(img + 12, 0xffffffffu);
  write_file("h.img", img, il);
  expect_fail("h.img", "z.lab", DT_ERANGE, "h.img: IDX header claims more than");
  write_gz("h.img.gz", img, il, "wb");
  expect_fail("h.img.gz", "z.lab", DT_ERANGE, "h.img.gz");
  /* Within the limit (100 MB claimed) but the gzip holds 24 bytes: truncated. */
  put_be32(img + 4, 100000);
  put_be32(img + 8, 1000);
  put_be32(img + 12, 1);
  write_gz("h2.img.gz", img, il, "wb");
  expect_fail("h2.img.gz", "z.lab", DT_ECORRUPT, "h2.img.gz: truncated: header says 100000000 data bytes");
  /* The limit is a parameter. */
  make_images(img, 2, 2, 2);
  write_file("ok.img", img, il);
  setenv("DTRAIN_DATA_MAX_BYTES", "7", 1);
  dt__param_reload(); /* the knob table caches the environment */
  expect_fail("ok.img", "z.lab", DT_ERANGE, "ok.img");
  unsetenv("DTRAIN_DATA_MAX_BYTES");
  dt__param_reload(); /* the knob table caches the environment */
  dt_dataset ds;
  assert_int_equal(load(&ds, "ok.img", "z.lab"), DT_OK);
  dt_dataset_free(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_fashion_mnist), cmocka_unit_test(test_tiny_raw_and_gz),
      cmocka_unit_test(test_missing_file),       cmocka_unit_test(test_wrong_magic),
      cmocka_unit_test(test_truncated),          cmocka_unit_test(test_trailing),
      cmocka_unit_test(test_count_mismatch),     cmocka_unit_test(test_zero_and_huge_dims),
  };
  return dt_skip_status(cmocka_run_group_tests(tests, setup, teardown));
}

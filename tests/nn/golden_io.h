/*
 * golden_io.h — test-only reader for the PyTorch golden fixtures in
 * tests/nn/golden/<stem>.bin ("DTGF" v1, written by tools/golden.py and
 * tools/golden_step.py), and the error measure the golden tests share.
 *
 * Layout, all little-endian u32 unless noted: "DTGF", version 1, tensor
 * count; per tensor: name length, name bytes, dtype (0 float32, 1 int32),
 * ndim, dims, then prod(dims) 4-byte elements.
 *
 * Error measure, per tensor: max_i |a_i - b_i| / max(max_i |b_i|, 1e-6),
 * required <= GOLDEN_TOL (see test_kernels_golden.c for why it is normalised
 * by the tensor's largest magnitude).
 *
 * Included by test files only, after <cmocka.h>'s prerequisites; every
 * function is static inline so a test that does not use one gets no warning.
 * A malformed fixture, a missing tensor or a wrong dtype fails the running
 * test (cmocka fail_msg / assert_*); nothing here returns an error code. It
 * does not handle big-endian hosts (the fixtures are read in place).
 */
#ifndef DT_TESTS_NN_GOLDEN_IO_H
#define DT_TESTS_NN_GOLDEN_IO_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define GOLDEN_TOL 1e-4
#define GOLDEN_MAXT 24

typedef struct {
  char name[64];
  int dtype, ndim, dims[8];
  size_t n;
  void *data; /* (n) float32 or int32, plus 4 spare bytes so n == 0 mallocs */
} gtensor;

typedef struct {
  char path[512];
  int count;
  gtensor t[GOLDEN_MAXT];
} gfile;

static inline uint32_t rd32(FILE *f) {
  unsigned char b[4];
  if (fread(b, 1, 4, f) != 4) fail_msg("short read");
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Loads tests/nn/golden/<stem>.bin. Returns 0 if the file does not exist (the
 * caller must then check it saw every fixture it expects) and 1 if loaded; a
 * malformed file fails the test. */
static inline int gtry(gfile *g, const char *stem) {
  snprintf(g->path, sizeof g->path, "%s/tests/nn/golden/%s.bin", DT_SOURCE_DIR, stem);
  FILE *f = fopen(g->path, "rb");
  if (!f) return 0;
  char magic[4];
  assert_int_equal(fread(magic, 1, 4, f), 4);
  assert_memory_equal(magic, "DTGF", 4);
  assert_int_equal(rd32(f), 1);
  g->count = (int)rd32(f);
  assert_true(g->count > 0 && g->count <= GOLDEN_MAXT);
  for (int i = 0; i < g->count; i++) {
    gtensor *t = &g->t[i];
    uint32_t nl = rd32(f);
    assert_true(nl < sizeof t->name);
    assert_int_equal(fread(t->name, 1, nl, f), nl);
    t->name[nl] = 0;
    t->dtype = (int)rd32(f);
    t->ndim = (int)rd32(f);
    assert_true(t->ndim >= 0 && t->ndim <= 8);
    t->n = 1;
    for (int d = 0; d < t->ndim; d++) {
      t->dims[d] = (int)rd32(f);
      t->n *= (size_t)t->dims[d];
    }
    t->data = malloc(t->n * 4 + 4);
    assert_non_null(t->data);
    assert_int_equal(fread(t->data, 4, t->n, f), t->n); /* host is little-endian (x86-64) */
  }
  fclose(f);
  return 1;
}

/* As gtry, but a missing file fails the test too. */
static inline void gload(gfile *g, const char *stem) {
  if (!gtry(g, stem))
    fail_msg("cannot open %s (run /usr/bin/python3 tools/golden_step.py)", g->path);
}

static inline void gfree(gfile *g) {
  for (int i = 0; i < g->count; i++) free(g->t[i].data);
  g->count = 0;
}

/* The tensor called name; fails the test if there is none, or if dtype >= 0
 * and the tensor's dtype differs. Never returns NULL. */
static inline gtensor *gfind(gfile *g, const char *name, int dtype) {
  for (int i = 0; i < g->count; i++)
    if (strcmp(g->t[i].name, name) == 0) {
      if (dtype >= 0) assert_int_equal(g->t[i].dtype, dtype);
      return &g->t[i];
    }
  fail_msg("%s: no tensor '%s'", g->path, name);
  return NULL;
}
static inline float *F32(gfile *g, const char *name) { return gfind(g, name, 0)->data; }
static inline int32_t *I32(gfile *g, const char *name) { return gfind(g, name, 1)->data; }
static inline size_t NUM(gfile *g, const char *name) { return gfind(g, name, -1)->n; }

static inline double relerr(const float *a, const float *b, size_t n) {
  double md = 0.0, mb = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= md)) md = d; /* NaN-propagating max */
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return md / (mb > 1e-6 ? mb : 1e-6);
}

/* Fails the test if got (n) is further than GOLDEN_TOL from want at this step. */
static inline void check_step(const char *path, const char *what, int step, const float *got,
                              const float *want, size_t n) {
  double e = relerr(got, want, n);
  if (!(e <= GOLDEN_TOL))
    fail_msg("%s: step %d: %s rel err %.3g > %g", path, step, what, e, GOLDEN_TOL);
}

#endif

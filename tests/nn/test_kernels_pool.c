/*
 * test_kernels_pool.c — the 2x2 stride-2 max pool route and the fused
 * ReLU + max pool kernels against plain reference loops written here
 * (PyTorch's scan-order rule, memset + scatter backward, ReLU as x > 0 ? x
 * : 0), bitwise: values, argmax and every input gradient. Inputs are drawn
 * from a few values (ties everywhere), with -0, +0, NaN and random floats,
 * over shapes with odd heights and widths (floor mode) and rows longer and
 * shorter than one 16-lane vector. Gradient buffers start as garbage, so a
 * kernel that skips an element fails. test_kernels_pool_portable runs the
 * same checks on the plain C route.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/core.h"
#include "nn/kernels.h"

/* ---- references -------------------------------------------------------- */

static void ref_maxpool(float *out, int32_t *am, const float *inp, int B, int C, int H, int W) {
  int OH = H / 2, OW = W / 2;
  for (int p = 0; p < B * C; p++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const float *x = inp + (size_t)p * H * W;
        int32_t mi = 2 * oh * W + 2 * ow;
        float m = x[mi];
        for (int i = 0; i < 2; i++)
          for (int j = 0; j < 2; j++) {
            int32_t idx = (2 * oh + i) * W + 2 * ow + j;
            if (x[idx] > m || isnan(x[idx])) m = x[idx], mi = idx;
          }
        out[((size_t)p * OH + oh) * OW + ow] = m;
        am[((size_t)p * OH + oh) * OW + ow] = mi;
      }
}

static void ref_maxpool_back(float *dinp, const float *dout, const int32_t *am, int B, int C,
                             int H, int W) {
  int OS = (H / 2) * (W / 2);
  memset(dinp, 0, sizeof(float) * (size_t)B * C * H * W);
  for (int p = 0; p < B * C; p++)
    for (int i = 0; i < OS; i++) dinp[(size_t)p * H * W + am[(size_t)p * OS + i]] += dout[(size_t)p * OS + i];
}

static void ref_relu(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

/* ---- data -------------------------------------------------------------- */

/* Mostly values from a small set, so ties are common, plus signed zeros,
 * NaN (when nan) and some random floats. */
static void fill(float *x, size_t n, uint64_t key, int nan) {
  dt_rng_uniform(x, n, 0.0f, 1.0f, 5, DT_RNG_USER, key);
  static const float set[] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  for (size_t i = 0; i < n; i++) {
    float u = x[i];
    int k = (int)(u * 64.0f);
    if (k < 36)
      x[i] = set[k % 6];
    else if (nan && k < 38)
      x[i] = NAN;
    else
      x[i] = (u - 0.6f) * 7.0f;
  }
}

static void garbage(void *p, size_t bytes) { memset(p, 0x7f, bytes); }

static void assert_same(const char *what, const void *a, const void *b, size_t bytes, int B,
                        int C, int H, int W) {
  if (memcmp(a, b, bytes) != 0) {
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    fail_msg("%s differs at byte %zu (shape %d,%d,%d,%d)", what, i, B, C, H, W);
  }
}

static const int shapes[][4] = {
    {1, 1, 2, 2},  {2, 3, 5, 7},  {1, 2, 3, 2},  {3, 2, 28, 28}, {2, 2, 14, 14}, {1, 1, 4, 33},
    {1, 2, 6, 34}, {1, 1, 9, 64}, {2, 1, 7, 65}, {1, 1, 2, 3},  {64, 2, 2, 4},
    /* every masked tail of the AVX2 route: 1..7 outputs after 0 or 8 */
    {1, 2, 4, 13}, {2, 1, 4, 10}, {1, 1, 3, 9},  {1, 1, 2, 11}, {1, 2, 2, 6},  {1, 1, 4, 30},
    {1, 1, 2, 31}, {2, 1, 3, 27}, {1, 1, 2, 17},
};

static void run(int nan) {
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    int B = shapes[si][0], C = shapes[si][1], H = shapes[si][2], W = shapes[si][3];
    size_t ni = (size_t)B * C * H * W, no = (size_t)B * C * (H / 2) * (W / 2);
    float *x = malloc(ni * 4), *r = malloc(ni * 4), *dx = malloc(ni * 4), *dr = malloc(ni * 4);
    float *dref = malloc(ni * 4), *o = malloc(no * 4), *oref = malloc(no * 4), *g = malloc(no * 4);
    int32_t *am = malloc(no * 4), *amref = malloc(no * 4);
    uint8_t *code = malloc(no);
    fill(x, ni, si * 2 + (uint64_t)nan, nan);
    fill(g, no, 1000 + si, 0);

    /* plain 2x2 max pool, forward and backward */
    ref_maxpool(oref, amref, x, B, C, H, W);
    garbage(o, no * 4), garbage(am, no * 4);
    dt_maxpool2d_forward(o, am, x, B, C, H, W, 2, 2);
    assert_same("maxpool out", o, oref, no * 4, B, C, H, W);
    assert_same("maxpool argmax", am, amref, no * 4, B, C, H, W);
    ref_maxpool_back(dref, g, amref, B, C, H, W);
    garbage(dx, ni * 4);
    dt_maxpool2d_backward(dx, g, am, B, C, H, W, 2, 2);
    assert_same("maxpool dinp", dx, dref, ni * 4, B, C, H, W);

    /* fused relu + max pool against relu then pool, and the backward
     * composition maxpool backward then relu backward */
    ref_relu(r, x, ni);
    ref_maxpool(oref, amref, r, B, C, H, W);
    garbage(o, no * 4), garbage(code, no);
    dt_relu_maxpool2x2_forward(o, code, x, B, C, H, W);
    assert_same("relu+maxpool out", o, oref, no * 4, B, C, H, W);
    for (size_t i = 0; i < no; i++) {
      if (oref[i] > 0.0f) {
        /* code -> plane index of the same window */
        size_t q = i / (size_t)(W / 2) % (size_t)(H / 2), c = i % (size_t)(W / 2);
        assert_true(code[i] < 4);
        int32_t idx = (int32_t)((2 * q + code[i] / 2) * W + 2 * c + code[i] % 2);
        assert_int_equal(idx, amref[i]);
      } else {
        assert_int_equal(code[i], 4);
      }
    }
    ref_maxpool_back(dr, g, amref, B, C, H, W);
    for (size_t i = 0; i < ni; i++) dref[i] = r[i] > 0.0f ? dr[i] : 0.0f;
    garbage(dx, ni * 4);
    dt_relu_maxpool2x2_backward(dx, g, code, B, C, H, W);
    assert_same("relu+maxpool dinp", dx, dref, ni * 4, B, C, H, W);

    /* and against the library's own unfused kernels, as the model runs them */
    memcpy(r, x, ni * 4);
    dt_relu_forward(r, r, ni);
    dt_maxpool2d_forward(oref, amref, r, B, C, H, W, 2, 2);
    dt_maxpool2d_backward(dr, g, amref, B, C, H, W, 2, 2);
    dt_relu_backward(dref, dr, r, ni);
    assert_same("fused vs library out", o, oref, no * 4, B, C, H, W);
    assert_same("fused vs library dinp", dx, dref, ni * 4, B, C, H, W);

    /* NULL dinp is allowed and writes nothing */
    dt_relu_maxpool2x2_backward(NULL, g, code, B, C, H, W);
    dt_maxpool2d_backward(NULL, g, am, B, C, H, W, 2, 2);
    free(x), free(r), free(dx), free(dr), free(dref), free(o), free(oref), free(g), free(am),
        free(amref), free(code);
  }
}

static void test_finite(void **st) { (void)st; run(0); }
static void test_nan(void **st) { (void)st; run(1); }

/* A -0 gradient routed through the pool becomes +0, as memset + add does. */
static void test_signed_zero_grad(void **st) {
  (void)st;
  float x[4] = {1.0f, 2.0f, 3.0f, 4.0f}, o, g = -0.0f, dx[4], dref[4];
  int32_t am, amref;
  uint8_t code;
  dt_maxpool2d_forward(&o, &am, x, 1, 1, 2, 2, 2, 2);
  assert_int_equal(am, 3);
  dt_maxpool2d_backward(dx, &g, &am, 1, 1, 2, 2, 2, 2);
  ref_maxpool(&o, &amref, x, 1, 1, 2, 2);
  ref_maxpool_back(dref, &g, &amref, 1, 1, 2, 2);
  assert_memory_equal(dx, dref, sizeof dx);
  assert_false(signbit(dx[3]));
  dt_relu_maxpool2x2_forward(&o, &code, x, 1, 1, 2, 2);
  assert_int_equal(code, 3);
  dt_relu_maxpool2x2_backward(dx, &g, &code, 1, 1, 2, 2);
  assert_memory_equal(dx, dref, sizeof dx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_finite),
      cmocka_unit_test(test_nan),
      cmocka_unit_test(test_signed_zero_grad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

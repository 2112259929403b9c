/*
 * test_compress_codec.c — the codecs of src/comm/compress/ one bucket at a
 * time: round trips of known vectors (exact where the codec is exact,
 * bounded otherwise), the residual each encode returns (x = decoded +
 * residual), unbiased stochastic rounding of int8 and qsgd over many
 * draws, top-k keeping exactly the k largest (small buckets, and large ones
 * where the threshold comes from a sample), sign packing at odd lengths,
 * PowerSGD's orthonormalisation of ill-conditioned input, and malformed
 * frames rejected with a message and the output untouched.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/compress/compress.h"
#include "core/core.h"

static const dt_cz_rng RNG0 = {42, 0, 0};

static void *frame_for(int codec, size_t n, size_t k) {
  size_t b = dt_cz_frame_bytes(codec, n, k);
  assert_true(b >= DT_CZ_HDR_LEN);
  void *f = aligned_alloc(8, b);
  assert_non_null(f);
  memset(f, 0, b);
  return f;
}

static void fill(float *x, size_t n, uint64_t seed) {
  dt_rng_uniform(x, n, -1.0f, 1.0f, seed, DT_RNG_USER, 0);
}

/* decode(encode(x)) + resid == x, and the decode error is within tol(x). */
static void round_trip(int codec, size_t n, size_t k, double abs_tol, double rel_tol) {
  float *x = malloc(n * sizeof *x), *dec = calloc(n, sizeof *dec), *res = malloc(n * sizeof *res);
  fill(x, n, 7 + n);
  void *f = frame_for(codec, n, k);
  assert_int_equal(dt_cz_encode(codec, x, n, k, 15, RNG0, f, res), DT_OK);
  assert_int_equal(dt_cz_decode_add(codec, f, dt_cz_frame_bytes(codec, n, k), n, dec), DT_OK);
  for (size_t i = 0; i < n; i++) {
    assert_float_equal(dec[i] + res[i], x[i], 1e-6);
    if (codec != DT_CODEC_TOPK && codec != DT_CODEC_SIGN)
      assert_true(fabs(dec[i] - x[i]) <= abs_tol + rel_tol * fabs(x[i]));
  }
  free(x);
  free(dec);
  free(res);
  free(f);
}

static void test_round_trips(void **st) {
  (void)st;
  size_t ns[] = {1, 7, 16, 33, 1000, 4099};
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    round_trip(DT_CODEC_FP16, ns[i], ns[i], 1e-7, 1.0 / 2048);
    round_trip(DT_CODEC_BF16, ns[i], ns[i], 1e-38, 1.0 / 256);
    round_trip(DT_CODEC_INT8, ns[i], ns[i], 1.0 / 127 + 1e-6, 0);
    round_trip(DT_CODEC_QSGD, ns[i], ns[i], sqrt((double)(ns[i] < 512 ? ns[i] : 512)) / 15 + 1e-6, 0);
    round_trip(DT_CODEC_SIGN, ns[i], ns[i], 0, 0);
    round_trip(DT_CODEC_TOPK, ns[i], (ns[i] + 9) / 10, 0, 0);
  }
}

/* Values every codec represents exactly come back exactly. */
static void test_exact_values(void **st) {
  (void)st;
  float x[12] = {0, 1, -1, 0.5f, -0.25f, 2, 3, -4, 0.125f, 1024, -0.0f, 7};
  float dec[12];
  for (int c = DT_CODEC_FP16; c <= DT_CODEC_BF16; c++) {
    void *f = frame_for(c, 12, 12);
    memset(dec, 0, sizeof dec);
    assert_int_equal(dt_cz_encode(c, x, 12, 12, 0, RNG0, f, NULL), DT_OK);
    assert_int_equal(dt_cz_decode_add(c, f, dt_cz_frame_bytes(c, 12, 12), 12, dec), DT_OK);
    static const float want[12] = {0, 1, -1, 0.5f, -0.25f, 2, 3, -4, 0.125f, 1024, 0, 7};
    assert_memory_equal(dec, want, sizeof dec);
    free(f);
  }
  /* int8: multiples of max/127 are exact whatever the random draw */
  float q[5] = {127, -127, 0, 63, -1};
  void *f = frame_for(DT_CODEC_INT8, 5, 5);
  memset(dec, 0, sizeof dec);
  assert_int_equal(dt_cz_encode(DT_CODEC_INT8, q, 5, 5, 0, RNG0, f, NULL), DT_OK);
  assert_int_equal(dt_cz_decode_add(DT_CODEC_INT8, f, dt_cz_frame_bytes(DT_CODEC_INT8, 5, 5), 5, dec), DT_OK);
  for (int i = 0; i < 5; i++) assert_float_equal(dec[i], q[i], 1e-5);
  free(f);
  /* sign: +-mean|x|, 0 counts as positive */
  float s[9] = {1, -2, 3, -4, 0, 5, -6, 7, -8};
  f = frame_for(DT_CODEC_SIGN, 9, 9);
  memset(dec, 0, sizeof dec);
  assert_int_equal(dt_cz_encode(DT_CODEC_SIGN, s, 9, 9, 0, RNG0, f, NULL), DT_OK);
  assert_int_equal(dt_cz_decode_add(DT_CODEC_SIGN, f, dt_cz_frame_bytes(DT_CODEC_SIGN, 9, 9), 9, dec), DT_OK);
  for (int i = 0; i < 9; i++) assert_float_equal(dec[i], s[i] >= 0 ? 4.0f : -4.0f, 1e-6);
  free(f);
  /* sign: one scale per block of DT_CZ_SIGN_BLOCK values: a quiet block
   * (|x| = 0.001) next to a loud one (|x| = 10) keeps its own magnitude
   * instead of moving by the bucket's mean */
  enum { NB = 2 * DT_CZ_SIGN_BLOCK + 3 };
  float *v = malloc(NB * sizeof *v), *d2 = calloc(NB, sizeof *d2);
  for (int i = 0; i < NB; i++) v[i] = (i % 3 ? 1.0f : -1.0f) * (i < DT_CZ_SIGN_BLOCK ? 0.001f : 10.0f);
  f = frame_for(DT_CODEC_SIGN, NB, NB);
  assert_int_equal(dt_cz_encode(DT_CODEC_SIGN, v, NB, NB, 0, RNG0, f, NULL), DT_OK);
  assert_int_equal(dt_cz_decode_add(DT_CODEC_SIGN, f, dt_cz_frame_bytes(DT_CODEC_SIGN, NB, NB), NB, d2), DT_OK);
  for (int i = 0; i < NB; i++) assert_float_equal(d2[i], v[i], 1e-6 * fabs(v[i]));
  free(v);
  free(d2);
  free(f);
}

/* sign over a block plan (dt__cz_sign_encode with end[]): each block keeps
 * its own scale wherever it starts (not on a byte, not on 256), the
 * residual is x - decoded, two scales give each sign group its own mean;
 * the frame says it used a plan, and a receiver with another plan, no
 * plan, or a frame cut short rejects it before touching out. */
static void expect_sign_corrupt(const void *f, size_t bytes, size_t n, const uint32_t *end,
                                size_t nb, int two, const char *word) {
  float out[64];
  for (int i = 0; i < 64; i++) out[i] = (float)i;
  int rc = end ? dt__cz_sign_decode_add(f, bytes, n, end, nb, two, out)
               : dt_cz_decode_add(DT_CODEC_SIGN, f, bytes, n, out);
  assert_int_equal(rc, DT_ECORRUPT);
  if (!strstr(dt_errmsg(), word)) fail_msg("message '%s' lacks '%s'", dt_errmsg(), word);
  for (int i = 0; i < 64; i++) assert_float_equal(out[i], (float)i, 0);
}

static void test_sign_plan(void **st) {
  (void)st;
  enum { N = 21 };
  /* blocks [0,3) [3,10) [10,11) [11,21) */
  const uint32_t end[] = {3, 10, 11, 21};
  const float x[N] = {1, -2, 3,                      /* |x| mean 2; pos 2, neg 2 */
                      10, 20, -30, 40, -50, 60, 0,   /* mean 30; pos 26, neg 40 */
                      -7,                            /* mean 7; pos 0 (none), neg 7 */
                      0.5f, 0.5f, 0.5f, 0.5f, 0.5f, -1, -1, -1, -1, -1};
  const float want1[4] = {2, 30, 7, 0.75f};
  const float wantp[4] = {2, 26, 0, 0.5f}, wantn[4] = {2, 40, 7, 1};
  for (int two = 0; two < 2; two++) {
    size_t fb = dt__cz_sign_bytes(N, 4, two);
    assert_int_equal(fb, (DT_CZ_HDR_LEN + 4 * 4 * (two ? 2 : 1) + 3 + 7) & ~(size_t)7);
    uint8_t *f = aligned_alloc(8, fb);
    memset(f, 0, fb);
    float resid[N], dec[N] = {0};
    assert_int_equal(dt__cz_sign_encode(x, N, end, 4, two, f, resid, 0), DT_OK);
    dt_cz_hdr h;
    memcpy(&h, f, sizeof h);
    assert_int_equal(h.k, 4);
    assert_int_equal(h.flags, DT_CZ_FLAG_BLOCKS | (two ? DT_CZ_FLAG_TWO : 0));
    assert_int_equal(dt__cz_sign_decode_add(f, fb, N, end, 4, two, dec), DT_OK);
    for (int b = 0, lo = 0; b < 4; lo = (int)end[b++])
      for (int i = lo; i < (int)end[b]; i++) {
        float w = x[i] >= 0 ? (two ? wantp[b] : want1[b]) : -(two ? wantn[b] : want1[b]);
        if (dec[i] != w) fail_msg("two %d value %d: decoded %g, want %g", two, i, dec[i], w);
        if (resid[i] != x[i] - w) fail_msg("two %d value %d: residual %g", two, i, resid[i]);
      }
    /* a receiver with another plan, or with none, or the other scale count */
    const uint32_t other[] = {3, 10, 21};
    expect_sign_corrupt(f, fb, N, other, 3, two, "plan has 3 blocks");
    expect_sign_corrupt(f, fb, N, end, 4, !two, "scale");
    expect_sign_corrupt(f, fb, N, NULL, 0, 0, "layout plan");
    expect_sign_corrupt(f, fb - 8, N, end, 4, two, "truncated");
    uint8_t *g = aligned_alloc(8, fb);
    memcpy(g, f, fb);
    ((dt_cz_hdr *)g)->k = N + 1;
    expect_sign_corrupt(g, fb, N, end, 4, two, "sign blocks");
    memcpy(g, f, fb);
    float neg = -1;
    memcpy(g + DT_CZ_HDR_LEN + 4 * (two ? 7 : 3), &neg, 4); /* the last block's (negative) scale */
    expect_sign_corrupt(g, fb, N, end, 4, two, "sign block 3 has scale");
    memcpy(g, f, fb);
    ((dt_cz_hdr *)g)->flags |= 0x40;
    expect_sign_corrupt(g, fb, N, end, 4, two, "flags");
    free(g);
    free(f);
  }
  /* a plan-less frame is no plan frame either */
  uint8_t *f = frame_for(DT_CODEC_SIGN, N, N);
  assert_int_equal(dt_cz_encode(DT_CODEC_SIGN, x, N, N, 0, RNG0, f, NULL), DT_OK);
  expect_sign_corrupt(f, dt_cz_frame_bytes(DT_CODEC_SIGN, N, N), N, end, 4, 0, "blocks of 256");
  free(f);
  /* bad plans are the caller's error */
  uint8_t buf[256];
  const uint32_t bad1[] = {3, 3, 21}, bad2[] = {3, 10, 20};
  assert_int_equal(dt__cz_sign_encode(x, N, bad1, 3, 0, buf, NULL, 0), DT_EINVAL);
  assert_int_equal(dt__cz_sign_encode(x, N, bad2, 3, 0, buf, NULL, 0), DT_EINVAL);
  assert_int_equal(dt__cz_sign_encode(x, N, NULL, 0, 1, buf, NULL, 0), DT_EINVAL);
}

/* sign with dense blocks (dt__cz_sign_encode_d, DTRAIN_CZ_SIGN_DENSE):
 * the dense blocks' values come through bit for bit (odd values no sign
 * or scale could give, at block starts off a byte), with a zero residual,
 * beside signed blocks decoded as without dense blocks; the frame says
 * it has a dense section and its count; a receiver whose plan has no
 * dense blocks, other dense blocks or another count, a frame cut inside
 * its dense values or one with a NaN there is rejected before out is
 * touched. */
static void dense_corrupt(const void *f, size_t bytes, size_t n, const uint32_t *end, size_t nb,
                          int two, const uint8_t *dense, const char *word) {
  float out[64];
  for (int i = 0; i < 64; i++) out[i] = (float)i;
  assert_int_equal(dt__cz_sign_decode_add_d(f, bytes, n, end, nb, two, dense, out), DT_ECORRUPT);
  if (!strstr(dt_errmsg(), word)) fail_msg("message '%s' lacks '%s'", dt_errmsg(), word);
  for (int i = 0; i < 64; i++) assert_float_equal(out[i], (float)i, 0);
}

static void test_sign_dense(void **st) {
  (void)st;
  enum { N = 21 };
  const uint32_t end[] = {3, 10, 11, 21};
  const uint8_t dense[] = {0, 1, 0, 1}; /* [3,10) and [11,21): 17 values */
  const float x[N] = {1, -2, 3, 1.2345678f, -3e-7f, 12345.5f, -0.0f, 7e-39f, -1.0f / 3, 42,
                      -7, 0.1f, -0.2f, 0.3f, 1e30f, -1e-30f, 5, 6, 7, -8, 0.999f};
  for (int two = 0; two < 2; two++) {
    size_t fb = dt__cz_sign_bytes_d(N, 4, two, 17);
    assert_int_equal(fb, ((((DT_CZ_HDR_LEN + 4 * 4 * (two ? 2 : 1) + 3) + 3) & ~(size_t)3) +
                          4 + 4 * 17 + 7) & ~(size_t)7);
    assert_int_equal(dt__cz_sign_bytes_d(N, 4, two, 0), dt__cz_sign_bytes(N, 4, two));
    uint8_t *f = aligned_alloc(8, fb);
    memset(f, 0, fb);
    float resid[N], dec[N] = {0}, ref[N] = {0}, rres[N];
    assert_int_equal(dt__cz_sign_encode_d(x, N, end, 4, two, dense, f, resid, 2 /* the note */),
                     DT_OK);
    dt_cz_hdr h;
    memcpy(&h, f, sizeof h);
    assert_int_equal(h.k, 4);
    assert_int_equal(h.flags, DT_CZ_FLAG_BLOCKS | DT_CZ_FLAG_DENSE | 2 |
                                  (two ? DT_CZ_FLAG_TWO : 0));
    assert_int_equal(dt__cz_sign_decode_add_d(f, fb, N, end, 4, two, dense, dec), DT_OK);
    /* the signed blocks: as a plan without dense blocks decodes them */
    uint8_t *r = aligned_alloc(8, dt__cz_sign_bytes(N, 4, two));
    assert_int_equal(dt__cz_sign_encode(x, N, end, 4, two, r, rres, 0), DT_OK);
    assert_int_equal(dt__cz_sign_decode_add(r, dt__cz_sign_bytes(N, 4, two), N, end, 4, two, ref),
                     DT_OK);
    for (int b = 0, lo = 0; b < 4; lo = (int)end[b++])
      for (int i = lo; i < (int)end[b]; i++) {
        float w = dense[b] ? x[i] : ref[i], wr = dense[b] ? 0.0f : rres[i];
        if (memcmp(&dec[i], &w, 4) && !(dense[b] && dec[i] == w && x[i] == 0))
          fail_msg("two %d value %d: decoded %a, want %a", two, i, dec[i], w);
        if (resid[i] != wr) fail_msg("two %d value %d: residual %g, want %g", two, i, resid[i], wr);
      }
    free(r);
    /* receivers with another plan */
    const uint8_t none[] = {0, 0, 0, 0}, other[] = {1, 0, 0, 1}, fewer[] = {0, 0, 0, 1};
    dense_corrupt(f, fb, N, end, 4, two, NULL, "with a dense section");
    dense_corrupt(f, fb, N, end, 4, two, none, "with a dense section");
    dense_corrupt(f, fb, N, end, 4, two, other, "17 dense values; this rank's plan has 13");
    dense_corrupt(f, fb, N, end, 4, two, fewer, "17 dense values; this rank's plan has 10");
    expect_sign_corrupt(f, fb, N, NULL, 0, 0, "layout plan");
    /* cut inside the dense values; cut inside their count */
    dense_corrupt(f, fb - 8, N, end, 4, two, dense, "truncated");
    size_t at = (DT_CZ_HDR_LEN + 4 * 4 * (two ? 2 : 1) + 3 + 3) & ~(size_t)3;
    dense_corrupt(f, at + 2, N, end, 4, two, dense, "truncated");
    uint8_t *g = aligned_alloc(8, fb);
    /* a dense value not finite in a frame not flagged so */
    memcpy(g, f, fb);
    float nan = NAN;
    memcpy(g + at + 4 + 4 * 16, &nan, 4);
    dense_corrupt(g, fb, N, end, 4, two, dense, "dense value 16");
    /* a count that lies */
    memcpy(g, f, fb);
    uint32_t c = 18;
    memcpy(g + at, &c, 4);
    dense_corrupt(g, fb, N, end, 4, two, dense, "18 dense values");
    /* a frame without its flag, for a plan with dense blocks */
    memcpy(g, f, fb);
    ((dt_cz_hdr *)g)->flags &= (uint8_t)~DT_CZ_FLAG_DENSE;
    dense_corrupt(g, fb, N, end, 4, two, dense, "without a dense section");
    /* a plan frame without dense blocks, for a receiver with them */
    memcpy(g, f, fb);
    assert_int_equal(dt__cz_sign_encode(x, N, end, 4, two, g, NULL, 0), DT_OK);
    dense_corrupt(g, fb, N, end, 4, two, dense, "without a dense section");
    free(g);
    free(f);
  }
  /* Inf in the input: flagged, every value decodes to NaN */
  float y[N];
  memcpy(y, x, sizeof y);
  y[4] = INFINITY;
  size_t fb = dt__cz_sign_bytes_d(N, 4, 1, 17);
  uint8_t *f = aligned_alloc(8, fb);
  float dec[N] = {0};
  assert_int_equal(dt__cz_sign_encode_d(y, N, end, 4, 1, dense, f, NULL, 0), DT_OK);
  assert_int_equal(dt__cz_sign_decode_add_d(f, fb, N, end, 4, 1, dense, dec), DT_OK);
  for (int i = 0; i < N; i++) assert_true(isnan(dec[i]));
  free(f);
  /* dense blocks need a plan */
  uint8_t buf[256];
  assert_int_equal(dt__cz_sign_encode_d(x, N, NULL, 0, 0, dense, buf, NULL, 0), DT_EINVAL);
}

/* Mean over many independent draws approaches x (int8, qsgd). */
static void unbiased(int codec, int levels) {
  enum { N = 64, DRAWS = 4000 };
  float x[N], dec[N];
  double mean[N] = {0};
  for (int i = 0; i < N; i++) x[i] = (float)((i * 37 % 64) - 31) / 32.0f * 0.77f;
  void *f = frame_for(codec, N, N);
  for (int d = 0; d < DRAWS; d++) {
    dt_cz_rng rng = {9, (uint64_t)d, 3};
    memset(dec, 0, sizeof dec);
    assert_int_equal(dt_cz_encode(codec, x, N, N, levels, rng, f, NULL), DT_OK);
    assert_int_equal(dt_cz_decode_add(codec, f, dt_cz_frame_bytes(codec, N, N), N, dec), DT_OK);
    for (int i = 0; i < N; i++) mean[i] += dec[i];
  }
  dt_cz_hdr h;
  memcpy(&h, f, sizeof h);
  double step = h.scale; /* one quantum (qsgd: its one chunk's) */
  if (codec == DT_CODEC_QSGD) {
    float st;
    memcpy(&st, (const char *)f + DT_CZ_HDR_LEN, 4);
    step = st;
  }
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double e = fabs(mean[i] / DRAWS - x[i]) / step;
    worst = e > worst ? e : worst;
  }
  /* a draw's error is at most one quantum, so the mean of 4000 has a
   * standard deviation below 0.5/sqrt(4000) ~ 0.008 quanta; a rounding
   * that were biased (e.g. to nearest) would be off by up to 0.5 */
  assert_true(worst < 0.05);
  free(f);
}

static void test_unbiased_int8(void **st) {
  (void)st;
  unbiased(DT_CODEC_INT8, 0);
}
static void test_unbiased_qsgd(void **st) {
  (void)st;
  unbiased(DT_CODEC_QSGD, 4);
  unbiased(DT_CODEC_QSGD, 127);
}

static void test_uniform_counter_based(void **st) {
  (void)st;
  float a[300], b[300], c[100];
  dt_cz_rng r = {5, 11, 2};
  dt__cz_uniform(r, 0, a, 300);
  dt__cz_uniform(r, 0, b, 300);
  assert_memory_equal(a, b, sizeof a);
  dt__cz_uniform(r, 150, c, 100); /* element i is element i wherever the call starts */
  assert_memory_equal(c, a + 150, sizeof c);
  r.step = 12;
  dt__cz_uniform(r, 0, b, 300);
  assert_memory_not_equal(a, b, sizeof a);
  double m = 0;
  for (int i = 0; i < 300; i++) {
    assert_true(a[i] > 0 && a[i] < 1);
    m += a[i];
  }
  assert_true(fabs(m / 300 - 0.5) < 0.06);
}

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Exactly k values sent, and they are the k largest by magnitude. */
static void topk_case(size_t n, size_t k) {
  float *x = malloc(n * sizeof *x), *dec = calloc(n, sizeof *dec), *mag = malloc(n * sizeof *mag);
  fill(x, n, 100 + n);
  for (size_t i = 0; i < n; i++) mag[i] = fabsf(x[i]);
  qsort(mag, n, sizeof *mag, cmp_desc);
  void *f = frame_for(DT_CODEC_TOPK, n, k);
  assert_int_equal(dt_cz_encode(DT_CODEC_TOPK, x, n, k, 0, RNG0, f, NULL), DT_OK);
  assert_int_equal(dt_cz_decode_add(DT_CODEC_TOPK, f, dt_cz_frame_bytes(DT_CODEC_TOPK, n, k), n, dec), DT_OK);
  size_t sent = 0;
  for (size_t i = 0; i < n; i++) {
    if (dec[i] != 0) {
      sent++;
      assert_float_equal(dec[i], x[i], 0);
      assert_true(fabsf(x[i]) >= mag[k - 1]);
    } else {
      assert_true(fabsf(x[i]) <= mag[k - 1]);
    }
  }
  assert_int_equal(sent, k);
  free(x);
  free(dec);
  free(mag);
  free(f);
}

static void test_topk(void **st) {
  (void)st;
  topk_case(10, 1);
  topk_case(10, 10);
  topk_case(1000, 10);
  topk_case(100000, 1000); /* sampled threshold */
  topk_case(262144, 26);   /* sampled, very sparse */
  topk_case(50000, 12500); /* dense: exact selection */
}

/* Magnitudes packed into one 1/16-octave bin of the threshold's histogram
 * (kth_largest's radix step finds one bin holding them all), with zeros
 * and ties among them: still exactly the k largest, ties by lowest index. */
static void test_topk_one_bin(void **st) {
  (void)st;
  enum { N = 100000, K = 1000 };
  float *x = malloc(N * sizeof *x), *dec = calloc(N, sizeof *dec), *mag = malloc(N * sizeof *mag);
  for (int i = 0; i < N; i++)
    x[i] = i % 7 == 0 ? 0.0f : (i % 2 ? 1.0f : -1.0f) * (1.0f + (float)((i * 7919) % 4001) * 1e-6f);
  for (int i = 0; i < N; i++) mag[i] = fabsf(x[i]);
  qsort(mag, N, sizeof *mag, cmp_desc);
  void *f = frame_for(DT_CODEC_TOPK, N, K);
  assert_int_equal(dt_cz_encode(DT_CODEC_TOPK, x, N, K, 0, RNG0, f, NULL), DT_OK);
  assert_int_equal(dt_cz_decode_add(DT_CODEC_TOPK, f, dt_cz_frame_bytes(DT_CODEC_TOPK, N, K), N, dec), DT_OK);
  int sent = 0, eq_skipped = 0;
  for (int i = 0; i < N; i++) {
    if (dec[i] != 0) {
      sent++;
      assert_true(fabsf(x[i]) >= mag[K - 1]);
      assert_false(eq_skipped && fabsf(x[i]) == mag[K - 1]); /* ties: lowest indices first */
    } else {
      assert_true(fabsf(x[i]) <= mag[K - 1]);
      eq_skipped |= fabsf(x[i]) == mag[K - 1];
    }
  }
  assert_int_equal(sent, K);
  free(x);
  free(dec);
  free(mag);
  free(f);
}

/* Ties: a bucket of equal values still sends exactly k. */
static void test_topk_ties(void **st) {
  (void)st;
  enum { N = 20000 };
  float *x = malloc(N * sizeof *x), *dec = calloc(N, sizeof *dec);
  for (int i = 0; i < N; i++) x[i] = i % 2 ? 0.5f : -0.5f;
  void *f = frame_for(DT_CODEC_TOPK, N, 200);
  assert_int_equal(dt_cz_encode(DT_CODEC_TOPK, x, N, 200, 0, RNG0, f, NULL), DT_OK);
  assert_int_equal(dt_cz_decode_add(DT_CODEC_TOPK, f, dt_cz_frame_bytes(DT_CODEC_TOPK, N, 200), N, dec), DT_OK);
  int sent = 0;
  for (int i = 0; i < N; i++) sent += dec[i] != 0;
  assert_int_equal(sent, 200);
  free(x);
  free(dec);
  free(f);
}

/* PowerSGD's products (dt__cz_psgd_*) against their definition as chains
 * of fused multiply-adds, bit for bit: shapes with and without a multiple
 * of 16 columns, 1..4 rows past a multiple of 4, ranks 1..9 and 17 (one
 * and more blocks of 8). */
static void test_powersgd_products(void **st) {
  (void)st;
  static const int shapes[][2] = {{1, 1}, {7, 37}, {13, 50}, {4, 16}, {10, 128}, {33, 17},
                                  {6, 255}, {3, 784}};
  static const int ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17};
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
    for (size_t ri = 0; ri < sizeof ranks / sizeof *ranks; ri++) {
      const int R = shapes[si][0], C = shapes[si][1], r = ranks[ri];
      float *M = malloc((size_t)R * C * sizeof *M), *P = malloc((size_t)R * r * sizeof *P);
      float *Q = malloc((size_t)r * C * sizeof *Q), *got = malloc((size_t)R * C * sizeof *got);
      float *want = malloc((size_t)R * C * sizeof *want), *Pw = malloc((size_t)R * r * sizeof *Pw);
      float *Qw = malloc((size_t)r * C * sizeof *Qw);
      fill(M, (size_t)R * C, 11 + (int)si);
      fill(Q, (size_t)r * C, 23 + (int)ri);
      /* P = M Q: 16 lane sums, added in lane order, then the tail */
      dt__cz_psgd_pmq(M, R, C, Q, r, P);
      for (int a = 0; a < R; a++)
        for (int j = 0; j < r; j++) {
          float acc[16] = {0}, s = 0;
          int i = 0;
          for (; i + 16 <= C; i += 16)
            for (int l = 0; l < 16; l++) acc[l] = fmaf(M[a * C + i + l], Q[j * C + i + l], acc[l]);
          for (int l = 0; l < 16; l++) s += acc[l];
          for (; i < C; i++) s = fmaf(M[a * C + i], Q[j * C + i], s);
          Pw[a * r + j] = s;
        }
      assert_memory_equal(P, Pw, (size_t)R * r * sizeof *P);
      /* Q = M^T P: over rows in order */
      dt__cz_psgd_qmtp(M, R, C, P, r, Q);
      for (int j = 0; j < r; j++)
        for (int i = 0; i < C; i++) {
          float s = 0;
          for (int a = 0; a < R; a++) s = fmaf(P[a * r + j], M[a * C + i], s);
          Qw[j * C + i] = s;
        }
      assert_memory_equal(Q, Qw, (size_t)r * C * sizeof *Q);
      /* the residual M - P Q^T and the sum P Q^T: over j in order */
      for (int sgn = -1; sgn <= 1; sgn += 2) {
        dt__cz_psgd_pq(sgn < 0 ? M : NULL, R, C, P, r, Q, (float)sgn, got);
        for (int a = 0; a < R; a++)
          for (int i = 0; i < C; i++) {
            float e = sgn < 0 ? M[a * C + i] : 0.0f;
            for (int j = 0; j < r; j++) e = fmaf((float)sgn * P[a * r + j], Q[j * C + i], e);
            want[a * C + i] = e;
          }
        assert_memory_equal(got, want, (size_t)R * C * sizeof *got);
      }
      free(M);
      free(P);
      free(Q);
      free(got);
      free(want);
      free(Pw);
      free(Qw);
    }
}

static void check_orthonormal(const float *p, int m, int r, double tol) {
  for (int a = 0; a < r; a++)
    for (int b = 0; b < r; b++) {
      double d = 0;
      for (int i = 0; i < m; i++) d += (double)p[i * r + a] * p[i * r + b];
      assert_true(fabs(d - (a == b)) < tol);
    }
}

static void test_orthonormalize(void **st) {
  (void)st;
  enum { M = 300, R = 4 };
  float p[M * R], noise[M * R];
  fill(noise, M * R, 3);
  /* columns nearly parallel: v, v + 1e-3 w1, v + 1e-3 w2, ... (condition
   * number ~1e3 in float; one Gram-Schmidt pass loses ~1e-4 of it) */
  for (int i = 0; i < M; i++)
    for (int j = 0; j < R; j++)
      p[i * R + j] = noise[i * R] * 100 + (j ? 1e-1f * noise[i * R + j] : 0);
  dt__cz_orthonormalize(p, M, R);
  check_orthonormal(p, M, R, 1e-5);
  /* a zero column stays zero, the others orthonormal */
  float q[M * 2];
  for (int i = 0; i < M; i++) {
    q[i * 2] = noise[i];
    q[i * 2 + 1] = 0;
  }
  dt__cz_orthonormalize(q, M, 2);
  for (int i = 0; i < M; i++) assert_float_equal(q[i * 2 + 1], 0, 0);
  double s = 0;
  for (int i = 0; i < M; i++) s += (double)q[i * 2] * q[i * 2];
  assert_float_equal(s, 1.0, 1e-5);
}

/* A malformed frame: DT_ECORRUPT, a message naming what is wrong, out
 * untouched. */
static void expect_corrupt(int codec, const void *f, size_t bytes, size_t n, const char *word) {
  float out[64];
  for (int i = 0; i < 64; i++) out[i] = (float)i;
  int rc = dt_cz_decode_add(codec, f, bytes, n, out);
  assert_int_equal(rc, DT_ECORRUPT);
  if (!strstr(dt_errmsg(), word)) fail_msg("message '%s' lacks '%s'", dt_errmsg(), word);
  for (int i = 0; i < 64; i++) assert_float_equal(out[i], (float)i, 0);
}

static void test_malformed(void **st) {
  (void)st;
  enum { N = 64, K = 4 };
  float x[N];
  fill(x, N, 1);
  size_t fb = dt_cz_frame_bytes(DT_CODEC_TOPK, N, K);
  uint8_t *good = frame_for(DT_CODEC_TOPK, N, K), *f = frame_for(DT_CODEC_TOPK, N, K);
  assert_int_equal(dt_cz_encode(DT_CODEC_TOPK, x, N, K, 0, RNG0, good, NULL), DT_OK);
  uint32_t *idx = (uint32_t *)(f + DT_CZ_HDR_LEN);
  dt_cz_hdr *h = (dt_cz_hdr *)f;
  /* bad index */
  memcpy(f, good, fb);
  idx[K - 1] = N;
  expect_corrupt(DT_CODEC_TOPK, f, fb, N, "beyond the bucket");
  /* out of order (a repeated index would add twice) */
  memcpy(f, good, fb);
  idx[2] = idx[1];
  expect_corrupt(DT_CODEC_TOPK, f, fb, N, "must increase");
  /* count beyond the bucket */
  memcpy(f, good, fb);
  h->k = N + 1;
  expect_corrupt(DT_CODEC_TOPK, f, fb, N, "beyond the bucket");
  /* more entries than the bytes hold */
  memcpy(f, good, fb);
  h->k = K + 8;
  expect_corrupt(DT_CODEC_TOPK, f, fb, N, "truncated");
  /* the bucket size differs */
  memcpy(f, good, fb);
  expect_corrupt(DT_CODEC_TOPK, f, fb, N - 1, "bucket holds");
  /* header fields */
  memcpy(f, good, fb);
  h->magic ^= 1;
  expect_corrupt(DT_CODEC_TOPK, f, fb, N, "magic");
  memcpy(f, good, fb);
  h->version = 9;
  expect_corrupt(DT_CODEC_TOPK, f, fb, N, "version");
  memcpy(f, good, fb);
  expect_corrupt(DT_CODEC_SIGN, f, fb, N, "codec");
  expect_corrupt(DT_CODEC_TOPK, f, DT_CZ_HDR_LEN - 1, N, "shorter");
  expect_corrupt(DT_CODEC_TOPK, f, fb - 8, N, "truncated");
  /* dense codecs: entry count must be n, scale not negative, qsgd levels */
  uint8_t *q = frame_for(DT_CODEC_QSGD, N, N);
  size_t qb = dt_cz_frame_bytes(DT_CODEC_QSGD, N, N);
  assert_int_equal(dt_cz_encode(DT_CODEC_QSGD, x, N, N, 7, RNG0, q, NULL), DT_OK);
  ((dt_cz_hdr *)q)->k = N - 1;
  expect_corrupt(DT_CODEC_QSGD, q, qb, N, "entries");
  ((dt_cz_hdr *)q)->k = N;
  ((dt_cz_hdr *)q)->levels = 0;
  expect_corrupt(DT_CODEC_QSGD, q, qb, N, "levels");
  ((dt_cz_hdr *)q)->levels = 7;
  ((dt_cz_hdr *)q)->scale = -1;
  expect_corrupt(DT_CODEC_QSGD, q, qb, N, "negative scale");
  ((dt_cz_hdr *)q)->scale = 1;
  float neg = -2;
  memcpy(q + DT_CZ_HDR_LEN, &neg, 4);
  expect_corrupt(DT_CODEC_QSGD, q, qb, N, "chunk 0 has negative scale");
  /* a step of Inf or NaN: no encoder writes one (it would decode 0 x Inf) */
  float inf_nan[2] = {INFINITY, NAN};
  for (int t = 0; t < 2; t++) {
    memcpy(q + DT_CZ_HDR_LEN, &inf_nan[t], 4);
    expect_corrupt(DT_CODEC_QSGD, q, qb, N, "chunk 0 has scale");
    memcpy(q + DT_CZ_HDR_LEN, &neg, 4);
    ((dt_cz_hdr *)q)->scale = inf_nan[t];
    expect_corrupt(DT_CODEC_QSGD, q, qb, N, "not finite");
    ((dt_cz_hdr *)q)->scale = 1;
  }
  free(q);
  /* sign: a block scale that is negative or not finite */
  uint8_t *sg = frame_for(DT_CODEC_SIGN, N, N);
  size_t sb = dt_cz_frame_bytes(DT_CODEC_SIGN, N, N);
  assert_int_equal(dt_cz_encode(DT_CODEC_SIGN, x, N, N, 0, RNG0, sg, NULL), DT_OK);
  memcpy(sg + DT_CZ_HDR_LEN, &neg, 4);
  expect_corrupt(DT_CODEC_SIGN, sg, sb, N, "sign block 0 has scale");
  float inf = INFINITY;
  memcpy(sg + DT_CZ_HDR_LEN, &inf, 4);
  expect_corrupt(DT_CODEC_SIGN, sg, sb, N, "sign block 0 has scale");
  free(sg);
  free(good);
  free(f);
}

/* A non-finite gradient is not hidden by compression: the sum is NaN. */
static void test_nonfinite(void **st) {
  (void)st;
  float x[32], dec[32] = {0};
  fill(x, 32, 4);
  x[5] = INFINITY;
  int codecs[] = {DT_CODEC_INT8, DT_CODEC_QSGD, DT_CODEC_SIGN, DT_CODEC_TOPK};
  for (int c = 0; c < 4; c++) {
    void *f = frame_for(codecs[c], 32, 3);
    size_t k = codecs[c] == DT_CODEC_TOPK ? 3 : 32;
    assert_int_equal(dt_cz_encode(codecs[c], x, 32, k, 7, RNG0, f, NULL), DT_OK);
    assert_int_equal(dt_cz_decode_add(codecs[c], f, dt_cz_frame_bytes(codecs[c], 32, k), 32, dec), DT_OK);
    assert_true(isnan(dec[0]));
    free(f);
  }
}

/* Huge and tiny finite values: a codec's scale (qsgd's chunk norm, sign's
 * block mean, int8's step) must neither overflow nor underflow in its own
 * arithmetic. Each codec's frame decodes to finite values within its error
 * bound, x = decoded + residual, and the non-finite flag stays clear; a
 * real Inf or NaN among the same values still raises it. Before the fix,
 * qsgd summed squares in float (|x| > ~1.8e19 in a chunk of >= 16 values:
 * the norm was Inf and the chunk decoded to NaN with no flag; |x| ~ 1e-22:
 * the squares underflowed, the norm came out too small and values were
 * clipped) and sign summed |x| in float (a block of |x| ~ 1e37: an Inf
 * scale the receiver rejected as a corrupt frame). */
static uint8_t hdr_flags(const void *f) {
  dt_cz_hdr h;
  memcpy(&h, f, sizeof h);
  return h.flags;
}

static void huge_one(int codec, int levels, const float *x, size_t n) {
  size_t k = codec == DT_CODEC_TOPK ? (n + 9) / 10 : n;
  float *dec = calloc(n, sizeof *dec), *res = malloc(n * sizeof *res);
  void *f = frame_for(codec, n, k);
  size_t fb = dt_cz_frame_bytes(codec, n, k);
  assert_int_equal(dt_cz_encode(codec, x, n, k, levels, RNG0, f, res), DT_OK);
  if (hdr_flags(f) & 1) fail_msg("codec %d levels %d: finite input flagged non-finite", codec, levels);
  if (dt_cz_decode_add(codec, f, fb, n, dec) != DT_OK)
    fail_msg("codec %d levels %d: own frame rejected: %s", codec, levels, dt_errmsg());
  const uint8_t *p = (const uint8_t *)f + DT_CZ_HDR_LEN;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(dec[i]) || !isfinite(res[i]))
      fail_msg("codec %d levels %d: value %zu = %g decodes to %g, residual %g", codec, levels, i,
               (double)x[i], (double)dec[i], (double)res[i]);
    /* decoded + residual = x, to the rounding of the subtraction */
    if (fabs((double)dec[i] + res[i] - x[i]) > 1e-6 * (fabs((double)x[i]) + fabs((double)dec[i])) + 1e-45)
      fail_msg("codec %d levels %d: value %zu = %g: decoded %g + residual %g", codec, levels, i,
               (double)x[i], (double)dec[i], (double)res[i]);
    double bound = -1; /* the codec's per-value error bound, where it has one */
    if (codec == DT_CODEC_QSGD) {
      float st;
      memcpy(&st, p + 4 * (i / DT_CZ_QSGD_CHUNK), 4);
      bound = (double)st * (1 + 1e-6);
    } else if (codec == DT_CODEC_INT8) {
      bound = (double)((const dt_cz_hdr *)f)->scale * (1 + 1e-6);
    }
    if (bound >= 0 && fabs((double)dec[i] - x[i]) > bound)
      fail_msg("codec %d levels %d: value %zu = %g decodes to %g, beyond one step %g", codec,
               levels, i, (double)x[i], (double)dec[i], bound);
  }
  if (codec == DT_CODEC_QSGD) { /* each chunk's step is its norm / levels */
    for (size_t lo = 0; lo < n; lo += DT_CZ_QSGD_CHUNK) {
      double s = 0;
      for (size_t i = lo; i < n && i < lo + DT_CZ_QSGD_CHUNK; i++) s += (double)x[i] * x[i];
      float st;
      memcpy(&st, p + 4 * (lo / DT_CZ_QSGD_CHUNK), 4);
      double want = sqrt(s) / levels;
      if (want > 3.4028234663852886e38 / levels) want = 3.4028234663852886e38 / levels;
      if (fabs(st - want) > 1e-5 * want)
        fail_msg("qsgd levels %d: chunk at %zu has step %g, norm/levels is %g", levels, lo,
                 (double)st, want);
    }
  }
  /* a real Inf, then a NaN, among the same values raises the flag */
  float *y = malloc(n * sizeof *y);
  for (int bad = 0; bad < 2; bad++) {
    memcpy(y, x, n * sizeof *y);
    y[n / 2] = bad ? NAN : -INFINITY;
    assert_int_equal(dt_cz_encode(codec, y, n, k, levels, RNG0, f, NULL), DT_OK);
    assert_true(hdr_flags(f) & 1);
    memset(dec, 0, n * sizeof *dec);
    assert_int_equal(dt_cz_decode_add(codec, f, fb, n, dec), DT_OK);
    assert_true(isnan(dec[0]) && isnan(dec[n - 1]));
  }
  free(y);
  free(dec);
  free(res);
  free(f);
}

static void test_huge_finite(void **st) {
  (void)st;
  const size_t n = 1100; /* qsgd: chunks of 512, 512, 76; sign: 4 blocks and a tail */
  float *x = malloc(n * sizeof *x);
  /* magnitudes: past float's squares (1e20, 1e30), near float's top
   * (3e38: int8's step x 127 and qsgd's norm of many such values exceed
   * FLT_MAX), and below float's squares (1e-22, 1e-30) */
  const double mags[] = {1e20, 1e30, 3e38, 1e-22, 1e-30};
  const int codecs[] = {DT_CODEC_INT8, DT_CODEC_QSGD, DT_CODEC_SIGN, DT_CODEC_TOPK};
  for (size_t m = 0; m < sizeof mags / sizeof *mags; m++) {
    fill(x, n, 11 + m);
    for (size_t i = 0; i < n; i++) x[i] = (float)(x[i] * mags[m]);
    x[3] = (float)mags[m]; /* int8: a value at the block's maximum */
    for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
      if (codecs[c] == DT_CODEC_QSGD) {
        const int lv[] = {1, 7, 15, 127};
        for (int l = 0; l < 4; l++) huge_one(DT_CODEC_QSGD, lv[l], x, n);
      } else {
        huge_one(codecs[c], 0, x, n);
      }
    }
  }
  /* the largest finite float everywhere */
  for (size_t i = 0; i < n; i++) x[i] = i % 3 ? 3.4028235e38f : -3.4028235e38f;
  for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) huge_one(codecs[c], 15, x, n);
  huge_one(DT_CODEC_QSGD, 1, x, n);
  free(x);
}

/* The per-worker state of checkpoints (state.c): a powersgd compressor
 * with error feedback and worker momentum round-trips its residual,
 * velocity and Q; another codec, rank, worker count or set of parts is
 * DT_EMISMATCH naming it and leaves the state untouched; a bad length or
 * magic is DT_ECORRUPT. */
static void test_state(void **st) {
  (void)st;
  const size_t np = 64 * 8 + 8;
  dt_cz_matrix m = {0, 64, 8};
  dt_compress_cfg c = DT_COMPRESS_CFG_INIT;
  c.codec = DT_CODEC_POWERSGD;
  c.momentum = 0.5f;
  dt_compress *a = NULL, *b = NULL, *other = NULL;
  assert_int_equal(dt_compress_create(&a, &c, np, &m, 1, 1, 3), DT_OK);
  assert_int_equal(dt_compress_create(&b, &c, np, &m, 1, 1, 3), DT_OK);
  float *ra = (float *)dt_compress_residual(a);
  for (size_t i = 0; i < np; i++) ra[i] = (float)i * 0.25f - 3.0f;
  const size_t len = dt_compress_state_bytes(a);
  /* header + residual + momentum + Q (8 x rank 2) */
  assert_int_equal(len, 48 + 2 * np * 4 + 8 * 2 * 4);
  uint8_t *buf = malloc(len), *buf2 = malloc(len);
  assert_non_null(buf);
  assert_non_null(buf2);
  assert_int_equal(dt_compress_state_save(a, buf, len), DT_OK);
  assert_int_equal(dt_compress_state_load(b, buf, len), DT_OK);
  assert_memory_equal(dt_compress_residual(b), ra, np * sizeof(float));
  assert_int_equal(dt_compress_state_save(b, buf2, len), DT_OK);
  assert_memory_equal(buf, buf2, len); /* momentum and Q too */
  /* mismatches leave the target as it was */
  dt_compress_cfg c2 = c;
  c2.codec = DT_CODEC_TOPK;
  assert_int_equal(dt_compress_create(&other, &c2, np, NULL, 0, 1, 3), DT_OK);
  assert_int_equal(dt_compress_state_load(other, buf, len), DT_EMISMATCH);
  assert_non_null(strstr(dt_errmsg(), "powersgd, this run uses topk"));
  assert_int_equal(dt_compress_residual(other)[5], 0.0f);
  dt_compress_destroy(other);
  assert_int_equal(dt_compress_create(&other, &c, np, &m, 1, 0, 3), DT_OK);
  assert_int_equal(dt_compress_state_load(other, buf, len), DT_EMISMATCH);
  assert_non_null(strstr(dt_errmsg(), "rank 1 of 3 workers, this is rank 0 of 3"));
  dt_compress_destroy(other);
  c2 = c;
  c2.momentum = 0;
  assert_int_equal(dt_compress_create(&other, &c2, np, &m, 1, 1, 3), DT_OK);
  assert_int_equal(dt_compress_state_load(other, buf, len), DT_EMISMATCH);
  assert_non_null(strstr(dt_errmsg(), "worker momentum"));
  dt_compress_destroy(other);
  assert_int_equal(dt_compress_state_load(b, buf, len - 4), DT_ECORRUPT);
  assert_int_equal(dt_compress_state_load(b, buf, 10), DT_ECORRUPT);
  buf[0] ^= 1;
  assert_int_equal(dt_compress_state_load(b, buf, len), DT_ECORRUPT);
  /* nothing to keep: fp16 without error feedback */
  c2 = (dt_compress_cfg)DT_COMPRESS_CFG_INIT;
  c2.codec = DT_CODEC_FP16;
  c2.error_feedback = 0;
  assert_int_equal(dt_compress_create(&other, &c2, np, NULL, 0, 0, 2), DT_OK);
  assert_int_equal(dt_compress_state_bytes(other), 0);
  dt_compress_destroy(other);
  free(buf);
  free(buf2);
  dt_compress_destroy(a);
  dt_compress_destroy(b);
}

/* The int8 ring's frames (a step per block of DT_CZ_I8_BLOCK): decoded +
 * residual = x, each value within its own block's step (a quiet block next
 * to a loud one keeps its precision), n = 0 is a bare header, Inf/NaN
 * decodes to NaN, stochastic rounding is unbiased, and malformed frames
 * are DT_ECORRUPT with the output untouched. */
static void test_int8_blocks(void **st) {
  (void)st;
  size_t ns[] = {0, 1, 7, 255, 256, 257, 1000, 4099};
  for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
    size_t n = ns[t], fb = dt__cz_i8b_bytes(n);
    assert_true(fb % 8 == 0 && fb >= DT_CZ_HDR_LEN + n);
    float *x = malloc((n + 1) * sizeof *x), *dec = calloc(n + 1, sizeof *dec),
          *res = malloc((n + 1) * sizeof *res);
    fill(x, n, 11 + n);
    for (size_t i = 0; i < n; i++)
      if ((i / DT_CZ_I8_BLOCK) % 2) x[i] *= 1e-4f;
    uint8_t *f = aligned_alloc(8, fb);
    dt__cz_i8b_encode(x, n, RNG0, f, res, 0);
    int fl = -1;
    assert_int_equal(dt__cz_i8b_decode_add(f, fb, n, dec, &fl), DT_OK);
    assert_int_equal(fl, DT_CZ_FLAG_BLOCKS);
    for (size_t i = 0; i < n; i++) {
      assert_float_equal(dec[i] + res[i], x[i], 1e-9);
      float scale = (i / DT_CZ_I8_BLOCK) % 2 ? 1e-4f : 1.0f;
      assert_true(fabs(dec[i] - x[i]) <= scale / 127 * 1.0001);
    }
    free(x);
    free(dec);
    free(res);
    free(f);
  }
  /* unbiased: the mean of many draws of one value is that value */
  {
    enum { M = 300, D = 2000 };
    float x[M], acc[M] = {0}, one[M];
    for (int i = 0; i < M; i++) x[i] = (float)(i % 17) / 17.0f - 0.4f;
    x[0] = 1.0f; /* the step: 1/127 */
    uint8_t *f = aligned_alloc(8, dt__cz_i8b_bytes(M));
    for (int d = 0; d < D; d++) {
      dt_cz_rng rng = {5, (uint64_t)d, 0};
      memset(one, 0, sizeof one);
      dt__cz_i8b_encode(x, M, rng, f, NULL, 0);
      assert_int_equal(dt__cz_i8b_decode_add(f, dt__cz_i8b_bytes(M), M, one, NULL), DT_OK);
      for (int i = 0; i < M; i++) acc[i] += one[i];
    }
    for (int i = 0; i < M; i++) assert_true(fabs(acc[i] / D - x[i]) < 4.0 / 127 / sqrt(D) + 1e-6);
    free(f);
  }
  /* non-finite input: the sum becomes NaN */
  {
    float x[5] = {1, 2, INFINITY, 4, 5}, out[5] = {0};
    uint8_t f[64];
    dt__cz_i8b_encode(x, 5, RNG0, f, NULL, 0);
    assert_int_equal(dt__cz_i8b_decode_add(f, dt__cz_i8b_bytes(5), 5, out, NULL), DT_OK);
    assert_true(isnan(out[0]));
  }
  /* malformed */
  enum { N = 600 };
  float x[N], out[N];
  fill(x, N, 3);
  size_t fb = dt__cz_i8b_bytes(N);
  uint8_t *good = aligned_alloc(8, fb), *f = aligned_alloc(8, fb);
  dt__cz_i8b_encode(x, N, RNG0, good, NULL, 2 /* DT_CZ_FLAG_NOTE */);
  memset(out, 0, sizeof out);
  int fl = 0;
  assert_int_equal(dt__cz_i8b_decode_add(good, fb, N, out, &fl), DT_OK);
  assert_true(fl & 2);
  struct { size_t at; uint8_t v; size_t len; size_t n; const char *why; } bad[] = {
      {0, 0x00, 0, N, "bad magic"},
      {5, 9, 0, N, "version"},
      {4, DT_CODEC_QSGD, 0, N, "expected int8"},
      {7, 0, 0, N, "flags"},     /* the blocks flag missing */
      {7, 0x84, 0, N, "flags"},  /* an unknown flag */
      {6, 3, 0, N, "levels"},
      {0, 0x4c, 0, N - 1, "the chunk holds"}, /* (magic byte unchanged) another chunk size */
      {0, 0x4c, fb - 8, N, "truncated"},
      {DT_CZ_HDR_LEN + 7, 0xff, 0, N, "block 1"}, /* a NaN step */
      {DT_CZ_HDR_LEN + 3, 0x80, 0, N, "block 0"}, /* a negative step (sign bit) */
  };
  for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
    memcpy(f, good, fb);
    f[bad[t].at] = bad[t].v;
    if (bad[t].at == DT_CZ_HDR_LEN + 7) f[DT_CZ_HDR_LEN + 6] = 0xc0;
    memset(out, 0, sizeof out);
    int rc = dt__cz_i8b_decode_add(f, bad[t].len ? bad[t].len : fb, bad[t].n, out, NULL);
    if (rc != DT_ECORRUPT || !strstr(dt_errmsg(), bad[t].why))
      fail_msg("malformed int8 ring frame %zu: rc %d, '%s' (want '%s')", t, rc, dt_errmsg(),
               bad[t].why);
    for (int i = 0; i < N; i++) assert_true(out[i] == 0);
  }
  free(good);
  free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips),       cmocka_unit_test(test_exact_values),
      cmocka_unit_test(test_unbiased_int8),     cmocka_unit_test(test_unbiased_qsgd),
      cmocka_unit_test(test_uniform_counter_based), cmocka_unit_test(test_topk),
      cmocka_unit_test(test_topk_ties),         cmocka_unit_test(test_topk_one_bin),
      cmocka_unit_test(test_orthonormalize),
      cmocka_unit_test(test_powersgd_products),
      cmocka_unit_test(test_malformed),         cmocka_unit_test(test_nonfinite),
      cmocka_unit_test(test_huge_finite),
      cmocka_unit_test(test_state),             cmocka_unit_test(test_int8_blocks),
      cmocka_unit_test(test_sign_plan),
      cmocka_unit_test(test_sign_dense),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

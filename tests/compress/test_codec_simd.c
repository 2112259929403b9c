/*
 * test_codec_simd.c — the vector paths of the codec kernels (AVX-512 or
 * AVX2 in src/comm/compress/codec_simd.c and topk.c) give the same bits as the
 * portable paths. This file compiles codec.c and topk.c a second time with
 * the target macros (__AVX512F__, __AVX2__, __F16C__, __FMA__) undefined
 * and every external name renamed to ref_*, so the reference is the very
 * scalar code the library uses on a machine without the extension, built
 * with the same flags (gnu11 contracts multiply-adds the same way); the
 * library linked in is the vector build.
 *
 * Compared on sizes 0, 1, 7, 15, 17, 255, 257, 1000003 (the last with two
 * of the five data sets) and on data with
 * denormals, -0, huge values, Inf and NaN: fp16/bf16 conversions (and
 * their residuals), every framed codec's frame, residual and decode, the
 * int8 ring's frames, and the counter-based uniforms. Every result must be
 * bitwise equal, except that a NaN only has to be a NaN: NaN payloads are
 * not part of the format (a frame whose input held Inf/NaN is flagged and
 * decodes to NaN whatever its bits; F16C keeps a NaN's payload bits where
 * dt_f32_to_f16 gives 0x7e00).
 *
 * Skipped (77) when the build has no vector path (DT_NATIVE=OFF on a
 * machine without AVX2): the two copies would be the same code.
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

#include "../dt_skip.h"
#include "comm/compress/compress_int.h"
#include "core/core.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__) && defined(__FMA__))
#define HAVE_VECTOR 1
#else
#define HAVE_VECTOR 0
#endif

/* ---- the portable path, under other names -------------------------------- */
#define dt__codec_names ref__codec_names
#define dt_codec_is_linear ref_codec_is_linear
#define dt__cz_uniform ref__cz_uniform
#define dt_cz_frame_bytes ref_cz_frame_bytes
#define dt__cz_put_hdr ref__cz_put_hdr
#define dt__cz_check_hdr ref__cz_check_hdr
#define dt__cz_to_f16 ref__cz_to_f16
#define dt__cz_from_f16 ref__cz_from_f16
#define dt__cz_to_bf16 ref__cz_to_bf16
#define dt__cz_from_bf16 ref__cz_from_bf16
#define dt__cz_i8b_bytes ref__cz_i8b_bytes
#define dt__cz_i8b_encode ref__cz_i8b_encode
#define dt__cz_i8b_decode_add ref__cz_i8b_decode_add
#define dt_cz_encode ref_cz_encode
#define dt_cz_decode_add ref_cz_decode_add
#define dt__cz_topk_k ref__cz_topk_k
#define dt__cz_topk_encode ref__cz_topk_encode
#define dt__cz_topk_decode_add ref__cz_topk_decode_add
#define dt__cz_sign_bytes ref__cz_sign_bytes
#define dt__cz_sign_encode ref__cz_sign_encode
#define dt__cz_sign_decode_add ref__cz_sign_decode_add
#define dt__cz_sign_bytes_d ref__cz_sign_bytes_d
#define dt__cz_sign_encode_d ref__cz_sign_encode_d
#define dt__cz_sign_decode_add_d ref__cz_sign_decode_add_d
#pragma push_macro("__AVX512F__")
#pragma push_macro("__AVX2__")
#pragma push_macro("__F16C__")
#pragma push_macro("__FMA__")
#undef __AVX512F__
#undef __AVX2__
#undef __F16C__
#undef __FMA__
/* the prototypes of compress.h / compress_int.h under the ref_ names */
void dt__cz_put_hdr(void *frame, int codec, int levels, int flags, size_t n, size_t k, float scale);
int dt__cz_check_hdr(int codec, const void *frame, size_t bytes, size_t n, dt_cz_hdr *h);
void dt__cz_to_f16(const float *x, uint16_t *h, float *resid, size_t n);
void dt__cz_from_f16(const uint16_t *h, float *out, size_t n, int add);
void dt__cz_to_bf16(const float *x, uint16_t *h, float *resid, size_t n);
void dt__cz_from_bf16(const uint16_t *h, float *out, size_t n, int add);
int dt__cz_topk_encode(const float *x, size_t n, size_t k, dt_cz_rng rng, void *frame, float *resid,
                       int flags);
int dt__cz_topk_decode_add(const dt_cz_hdr *h, const uint8_t *payload, float *out);
size_t dt__cz_topk_k(size_t n, double density);
void dt__cz_uniform(dt_cz_rng rng, size_t first, float *u, size_t n);
size_t dt_cz_frame_bytes(int codec, size_t n, size_t k);
size_t dt__cz_i8b_bytes(size_t n);
void dt__cz_i8b_encode(const float *x, size_t n, dt_cz_rng rng, void *frame, float *resid,
                       int flags);
int dt__cz_i8b_decode_add(const void *frame, size_t bytes, size_t n, float *out, int *flags);
int dt_cz_encode(int codec, const float *x, size_t n, size_t k, int levels, dt_cz_rng rng,
                 void *frame, float *resid);
int dt_cz_decode_add(int codec, const void *frame, size_t bytes, size_t n, float *out);
extern const char *const dt__codec_names[];
int dt_codec_is_linear(int codec);
size_t dt__cz_sign_bytes(size_t n, size_t nb, int two);
int dt__cz_sign_encode(const float *x, size_t n, const uint32_t *end, size_t nb, int two,
                       void *frame, float *resid, int flags);
int dt__cz_sign_decode_add(const void *frame, size_t bytes, size_t n, const uint32_t *end,
                           size_t nb, int two, float *out);
size_t dt__cz_sign_bytes_d(size_t n, size_t nb, int two, size_t nd);
int dt__cz_sign_encode_d(const float *x, size_t n, const uint32_t *end, size_t nb, int two,
                         const uint8_t *dense, void *frame, float *resid, int flags);
int dt__cz_sign_decode_add_d(const void *frame, size_t bytes, size_t n, const uint32_t *end,
                             size_t nb, int two, const uint8_t *dense, float *out);
#include "comm/compress/codec.c"
#include "comm/compress/topk.c"
#pragma pop_macro("__AVX512F__")
#pragma pop_macro("__AVX2__")
#pragma pop_macro("__F16C__")
#pragma pop_macro("__FMA__")
#undef dt__codec_names
#undef dt_codec_is_linear
#undef dt__cz_uniform
#undef dt_cz_frame_bytes
#undef dt__cz_put_hdr
#undef dt__cz_check_hdr
#undef dt__cz_to_f16
#undef dt__cz_from_f16
#undef dt__cz_to_bf16
#undef dt__cz_from_bf16
#undef dt__cz_i8b_bytes
#undef dt__cz_i8b_encode
#undef dt__cz_i8b_decode_add
#undef dt_cz_encode
#undef dt_cz_decode_add
#undef dt__cz_topk_k
#undef dt__cz_topk_encode
#undef dt__cz_topk_decode_add
#undef dt__cz_sign_bytes
#undef dt__cz_sign_encode
#undef dt__cz_sign_decode_add
#undef dt__cz_sign_bytes_d
#undef dt__cz_sign_encode_d
#undef dt__cz_sign_decode_add_d

/* ---- data ---------------------------------------------------------------- */

static const size_t SIZES[] = {0, 1, 7, 15, 17, 255, 257, 1000003};
#define NSIZES (sizeof SIZES / sizeof *SIZES)
/* the big size with fewer data sets (the sanitizer build runs -O0) */
#define BIG_SKIPS(n, d) ((n) > 100000 && (d) != D_GRAD && (d) != D_NONFINITE)

static uint64_t sm_state;
static uint64_t next64(void) { /* splitmix64 */
  uint64_t z = (sm_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float f_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

enum { D_GRAD, D_EDGES, D_HUGE, D_NONFINITE, D_BITS, D_COUNT };
static const char *const DNAME[] = {"gradient", "edges", "huge", "nonfinite", "bits"};

/* D_GRAD: u^3 for u in [-1, 1] (mostly small, a few large), with -0 and
 * exact zeros; D_EDGES: f16/bf16 rounding edges, f16 subnormals and f32
 * denormals; D_HUGE: finite values up to FLT_MAX; D_NONFINITE: D_GRAD
 * with a few Inf/NaN; D_BITS: every bit pattern (NaNs of every payload). */
static void fill(float *x, size_t n, int kind, uint64_t seed) {
  static const float edges[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 5.9604645e-8f,
                                2.9802322e-8f, 2.9802326e-8f, 6.1035156e-5f, 6.0975552e-5f,
                                1e-40f, -1e-45f, 1.17549435e-38f, -0.0f, 0.0f, 1.0009766f,
                                1.00048828f, 1.00048829f, 3.0e38f, 0.5f, -2.0f};
  sm_state = seed * 0x2545F4914F6CDD1Dull + 1;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = next64();
    float u = (float)((int64_t)(r >> 11) - (1ll << 52)) / 4503599627370496.0f;
    switch (kind) {
    case D_GRAD: x[i] = r % 97 == 0 ? (r & 1 ? -0.0f : 0.0f) : u * u * u; break;
    case D_EDGES:
      x[i] = r % 3 ? edges[(r >> 20) % (sizeof edges / sizeof *edges)] * (r & 8 ? 1 : -1)
                   : f_of((uint32_t)(r >> 32) & 0x807fffffu); /* f32 denormals */
      break;
    case D_HUGE: x[i] = u * (r % 5 ? 3.4e38f : 1e20f); break;
    case D_NONFINITE:
      x[i] = r % 1001 == 0 ? (r & 2 ? INFINITY : -INFINITY) : r % 1003 == 0 ? NAN : u * u * u;
      break;
    default: x[i] = f_of((uint32_t)(r >> 32)); break;
    }
  }
  if (kind == D_NONFINITE && n) x[n / 2] = NAN;
}

/* a[i] and b[i] the same bits, or both NaN */
static void same_f32(const float *a, const float *b, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (bits_of(a[i]) == bits_of(b[i]) || (a[i] != a[i] && b[i] != b[i])) continue;
    fail_msg("%s: element %zu of %zu: vector 0x%08x (%g), scalar 0x%08x (%g)", what, i, n,
             bits_of(a[i]), (double)a[i], bits_of(b[i]), (double)b[i]);
  }
}

static int f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static void same_f16(const uint16_t *a, const uint16_t *b, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (a[i] == b[i] || (f16_nan(a[i]) && f16_nan(b[i]))) continue;
    fail_msg("%s: element %zu of %zu: vector 0x%04x, scalar 0x%04x", what, i, n, a[i], b[i]);
  }
}
static int bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }
static void same_bf16(const uint16_t *a, const uint16_t *b, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (a[i] == b[i] || (bf16_nan(a[i]) && bf16_nan(b[i]))) continue;
    fail_msg("%s: element %zu of %zu: vector 0x%04x, scalar 0x%04x", what, i, n, a[i], b[i]);
  }
}

static void *xalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

#define NEED_VECTOR()                                                                     \
  do {                                                                                    \
    if (!HAVE_VECTOR) {                                                                   \
      DT_SKIP("this build has no vector path of the codec kernels (no AVX-512 or AVX2+F16C+FMA)"); \
      return;                                                                             \
    }                                                                                     \
  } while (0)

/* ---- fp16 / bf16 ------------------------------------------------------------ */

static void test_half(void **st) {
  (void)st;
  NEED_VECTOR();
  for (size_t s = 0; s < NSIZES; s++) {
    size_t n = SIZES[s];
    float *x = xalloc(n * 4), *ra = xalloc(n * 4), *rb = xalloc(n * 4);
    float *oa = xalloc(n * 4), *ob = xalloc(n * 4);
    uint16_t *ha = xalloc(n * 2), *hb = xalloc(n * 2);
    for (int d = 0; d < D_COUNT; d++) {
      char what[96];
      if (BIG_SKIPS(n, d) && d != D_BITS) continue;
      fill(x, n, d, 100 + 10 * s + d);
      snprintf(what, sizeof what, "to_f16 n=%zu %s", n, DNAME[d]);
      dt__cz_to_f16(x, ha, ra, n);
      ref__cz_to_f16(x, hb, rb, n);
      same_f16(ha, hb, n, what);
      same_f32(ra, rb, n, what);
      dt__cz_to_f16(x, ha, NULL, n);
      same_f16(ha, hb, n, what);
      /* in place: resid == x */
      memcpy(ra, x, n * 4);
      memcpy(rb, x, n * 4);
      dt__cz_to_f16(ra, ha, ra, n);
      ref__cz_to_f16(rb, hb, rb, n);
      same_f32(ra, rb, n, what);
      snprintf(what, sizeof what, "to_bf16 n=%zu %s", n, DNAME[d]);
      dt__cz_to_bf16(x, ha, ra, n);
      ref__cz_to_bf16(x, hb, rb, n);
      same_bf16(ha, hb, n, what);
      same_f32(ra, rb, n, what);
      /* decode every 16-bit pattern found in x's bits, add and overwrite */
      for (size_t i = 0; i < n; i++) ha[i] = (uint16_t)(bits_of(x[i]) >> (i & 1 ? 16 : 3));
      for (int add = 0; add < 2; add++) {
        fill(oa, n, D_GRAD, 7 + s);
        memcpy(ob, oa, n * 4);
        snprintf(what, sizeof what, "from_f16 n=%zu %s add=%d", n, DNAME[d], add);
        dt__cz_from_f16(ha, oa, n, add);
        ref__cz_from_f16(ha, ob, n, add);
        same_f32(oa, ob, n, what);
        fill(oa, n, D_GRAD, 7 + s);
        memcpy(ob, oa, n * 4);
        snprintf(what, sizeof what, "from_bf16 n=%zu %s add=%d", n, DNAME[d], add);
        dt__cz_from_bf16(ha, oa, n, add);
        ref__cz_from_bf16(ha, ob, n, add);
        same_f32(oa, ob, n, what);
      }
    }
    free(x), free(ra), free(rb), free(oa), free(ob), free(ha), free(hb);
  }
}

/* ---- framed codecs ------------------------------------------------------- */

static void compare_frames(int codec, const uint8_t *fa, const uint8_t *fb, size_t bytes,
                           size_t n, const char *what) {
  /* header: every bit */
  if (memcmp(fa, fb, DT_CZ_HDR_LEN))
    fail_msg("%s: headers differ", what);
  const uint8_t *pa = fa + DT_CZ_HDR_LEN, *pb = fb + DT_CZ_HDR_LEN;
  if (codec == DT_CODEC_FP16 || codec == DT_CODEC_BF16) {
    uint16_t *a = xalloc(n * 2), *b = xalloc(n * 2);
    memcpy(a, pa, n * 2);
    memcpy(b, pb, n * 2);
    if (codec == DT_CODEC_FP16) same_f16(a, b, n, what);
    else same_bf16(a, b, n, what);
    free(a), free(b);
    return;
  }
  for (size_t i = DT_CZ_HDR_LEN; i < bytes; i++)
    if (fa[i] != fb[i])
      fail_msg("%s: frame byte %zu of %zu: vector 0x%02x, scalar 0x%02x", what, i, bytes, fa[i],
               fb[i]);
}

static void one_codec(int codec, int levels, size_t n, int d, uint64_t seed) {
  size_t k = codec == DT_CODEC_TOPK ? ref__cz_topk_k(n, 0.01) : n;
  size_t fbytes = ref_cz_frame_bytes(codec, n, k);
  assert_int_equal(fbytes, dt_cz_frame_bytes(codec, n, k));
  float *x = xalloc(n * 4), *ra = xalloc(n * 4), *rb = xalloc(n * 4);
  float *oa = xalloc(n * 4), *ob = xalloc(n * 4);
  uint8_t *fa = xalloc(fbytes), *fb = xalloc(fbytes);
  char what[96];
  snprintf(what, sizeof what, "%s levels=%d n=%zu %s", dt__codec_names[codec], levels, n,
           DNAME[d]);
  fill(x, n, d, seed);
  dt_cz_rng rng = {seed, 3 + seed % 7, seed % 5};
  for (int inplace = 0; inplace < 2; inplace++) {
    memset(fa, 0xa5, fbytes);
    memset(fb, 0xa5, fbytes);
    memcpy(ra, x, n * 4);
    memcpy(rb, x, n * 4);
    int ea = dt_cz_encode(codec, inplace ? ra : x, n, k, levels, rng, fa, ra);
    int eb = ref_cz_encode(codec, inplace ? rb : x, n, k, levels, rng, fb, rb);
    assert_int_equal(ea, eb);
    if (ea != DT_OK) break; /* n = 0: both refuse */
    compare_frames(codec, fa, fb, fbytes, n, what);
    same_f32(ra, rb, n, what);
  }
  if (n) {
    /* decode the same (vector-made) frame both ways into the same sum */
    fill(oa, n, D_GRAD, seed + 1);
    memcpy(ob, oa, n * 4);
    assert_int_equal(dt_cz_decode_add(codec, fa, fbytes, n, oa),
                     ref_cz_decode_add(codec, fa, fbytes, n, ob));
    same_f32(oa, ob, n, what);
  }
  free(x), free(ra), free(rb), free(oa), free(ob), free(fa), free(fb);
}

static void test_codecs(void **st) {
  (void)st;
  NEED_VECTOR();
  const int codecs[] = {DT_CODEC_FP16, DT_CODEC_BF16, DT_CODEC_INT8, DT_CODEC_QSGD,
                        DT_CODEC_SIGN, DT_CODEC_TOPK};
  for (size_t s = 0; s < NSIZES; s++)
    for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++)
      for (int d = 0; d < D_COUNT; d++) {
        if (BIG_SKIPS(SIZES[s], d)) continue;
        uint64_t seed = 1000 + 97 * s + 13 * c + d;
        if (codecs[c] == DT_CODEC_QSGD && SIZES[s] > 100000) {
          one_codec(DT_CODEC_QSGD, 15, SIZES[s], d, seed);
        } else if (codecs[c] == DT_CODEC_QSGD) {
          one_codec(DT_CODEC_QSGD, 1, SIZES[s], d, seed);
          one_codec(DT_CODEC_QSGD, 15, SIZES[s], d, seed);
          one_codec(DT_CODEC_QSGD, 127, SIZES[s], d, seed);
        } else {
          one_codec(codecs[c], 0, SIZES[s], d, seed);
        }
      }
}

/* ---- the int8 ring's frames (a step per 256 values) -------------------------- */

static void test_int8_ring(void **st) {
  (void)st;
  NEED_VECTOR();
  for (size_t s = 0; s < NSIZES; s++)
    for (int d = 0; d < D_COUNT; d++) {
      if (BIG_SKIPS(SIZES[s], d)) continue;
      size_t n = SIZES[s], fbytes = dt__cz_i8b_bytes(n);
      float *x = xalloc(n * 4), *ra = xalloc(n * 4), *rb = xalloc(n * 4);
      float *oa = xalloc(n * 4), *ob = xalloc(n * 4);
      uint8_t *fa = xalloc(fbytes), *fb = xalloc(fbytes);
      char what[96];
      snprintf(what, sizeof what, "int8 ring n=%zu %s", n, DNAME[d]);
      uint64_t seed = 5000 + 31 * s + d;
      fill(x, n, d, seed);
      /* a block of one loud value among quiet ones, and an all-zero block */
      if (n > 600) {
        for (size_t i = 256; i < 512; i++) x[i] = 0;
        x[520] = 1e30f;
      }
      dt_cz_rng rng = {seed, seed % 11, 2};
      dt__cz_i8b_encode(x, n, rng, fa, ra, 0);
      ref__cz_i8b_encode(x, n, rng, fb, rb, 0);
      compare_frames(DT_CODEC_INT8, fa, fb, fbytes, n, what);
      same_f32(ra, rb, n, what);
      memcpy(ra, x, n * 4);
      memcpy(rb, x, n * 4);
      dt__cz_i8b_encode(ra, n, rng, fa, ra, 0); /* in place */
      ref__cz_i8b_encode(rb, n, rng, fb, rb, 0);
      compare_frames(DT_CODEC_INT8, fa, fb, fbytes, n, what);
      same_f32(ra, rb, n, what);
      fill(oa, n, D_GRAD, seed + 1);
      memcpy(ob, oa, n * 4);
      int ga = -1, gb = -1;
      assert_int_equal(dt__cz_i8b_decode_add(fa, fbytes, n, oa, &ga),
                       ref__cz_i8b_decode_add(fa, fbytes, n, ob, &gb));
      assert_int_equal(ga, gb);
      same_f32(oa, ob, n, what);
      free(x), free(ra), free(rb), free(oa), free(ob), free(fa), free(fb);
    }
}

/* ---- the counter-based uniforms -------------------------------------------- */

/* sign over a block plan: blocks of odd lengths that start anywhere in a
 * byte (1, 9, 3, then 241s and the rest), one scale and two: the same
 * frame, residual and decode as the portable path. */
static void test_sign_plan(void **st) {
  (void)st;
  NEED_VECTOR();
  const size_t ns[] = {1, 13, 300, 4099};
  for (size_t si = 0; si < sizeof ns / sizeof *ns; si++)
    for (int d = 0; d < D_COUNT; d++)
      for (int two = 0; two < 2; two++) {
        size_t n = ns[si], nb = 0;
        uint32_t *end = xalloc(n * sizeof *end);
        const size_t first[] = {1, 9, 3};
        for (size_t at = 0; at < n;) {
          size_t len = nb < 3 ? first[nb] : 241;
          at = at + len < n ? at + len : n;
          end[nb++] = (uint32_t)at;
        }
        float *x = xalloc(n * 4), *ra = xalloc(n * 4), *rb = xalloc(n * 4);
        float *da = xalloc(n * 4), *db = xalloc(n * 4);
        fill(x, n, d, 77 + n);
        size_t fb = dt__cz_sign_bytes(n, nb, two);
        uint8_t *fa = xalloc(fb), *fr = xalloc(fb);
        memset(fa, 0, fb);
        memset(fr, 0, fb);
        assert_int_equal(dt__cz_sign_encode(x, n, end, nb, two, fa, ra, 0), DT_OK);
        assert_int_equal(ref__cz_sign_encode(x, n, end, nb, two, fr, rb, 0), DT_OK);
        char what[96];
        snprintf(what, sizeof what, "sign plan two=%d n=%zu %s", two, n, DNAME[d]);
        compare_frames(DT_CODEC_SIGN, fa, fr, fb, n, what);
        same_f32(ra, rb, n, what);
        memset(da, 0, n * 4);
        memset(db, 0, n * 4);
        assert_int_equal(dt__cz_sign_decode_add(fa, fb, n, end, nb, two, da), DT_OK);
        assert_int_equal(ref__cz_sign_decode_add(fr, fb, n, end, nb, two, db), DT_OK);
        same_f32(da, db, n, what);
        free(end), free(x), free(ra), free(rb), free(da), free(db), free(fa), free(fr);
      }
}

static void test_uniform(void **st) {
  (void)st;
  NEED_VECTOR();
  enum { M = 1000 };
  float a[M], b[M];
  sm_state = 77;
  for (int t = 0; t < 300; t++) {
    uint64_t r = next64();
    /* seeds and steps with high words set, blocks beyond 2^28 (c1) */
    dt_cz_rng rng = {next64(), next64() >> (r % 64), next64() >> (r % 61)};
    size_t first = (size_t)(r % 3 == 0 ? (next64() >> 20) : r % 4096), n = (size_t)(r >> 40) % M;
    dt__cz_uniform(rng, first, a, n);
    ref__cz_uniform(rng, first, b, n);
    char what[96];
    snprintf(what, sizeof what, "uniform first=%zu n=%zu", first, n);
    same_f32(a, b, n, what);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half),
      cmocka_unit_test(test_codecs),
      cmocka_unit_test(test_int8_ring),
      cmocka_unit_test(test_uniform),
      cmocka_unit_test(test_sign_plan),
  };
  return dt_skip_status(cmocka_run_group_tests(tests, NULL, NULL));
}

/*
 * codec.c — the element-wise codecs of one bucket (fp16, bf16, int8, qsgd,
 * sign) and the frame header every framed codec shares: encode with the
 * error-feedback residual fused into the same pass, validate-then-decode
 * (a frame is checked completely before out is touched), and the
 * counter-based uniforms of stochastic rounding (Philox4x32-10 over 16
 * lanes at once, 16 bits per draw).
 *
 * Kernels are plain loops the compiler vectorises (the build uses
 * -march=native); where a loop does not vectorise by itself (Philox, the
 * f32<->f16 conversions, int8 narrowing, the max |x| pass, the sign bit
 * packing) its AVX-512 or AVX2 path is in codec_simd.c: a kernel here
 * hands the vector path what it can take (whole vectors or blocks) and
 * finishes the tail with the portable loop, which is also the whole
 * kernel on a machine without them (DT_CZ_V_* in codec_simd.h, chosen at
 * compile time).
 *
 * Not here: top-k (topk.c), PowerSGD (powersgd.c), collectives and error
 * feedback state (reduce.c).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/compress/codec_simd.h"
#include "comm/compress/compress_int.h"
#include "core/core.h"

const char *const dt__codec_names[] = {"none", "fp16", "bf16", "int8", "qsgd",
                                       "sign", "topk", "powersgd", NULL};

int dt_codec_is_linear(int codec) {
  return codec == DT_CODEC_FP16 || codec == DT_CODEC_BF16 || codec == DT_CODEC_POWERSGD;
}

/* a * b + c rounded once where the target has FMA, as the vector kernels
 * compute it (vfmadd): explicit, because gcc contracts a * b + c on its
 * own only when optimising, and a Debug build's portable loops then gave
 * other bits than the vector ones (test_codec_simd under the sanitizers).
 * __FP_FAST_FMAF, not __FMA__: test_codec_simd builds this file with
 * __FMA__ undefined and must get the same arithmetic. */
#if defined(__FP_FAST_FMAF)
#define MADD(a, b, c) fmaf(a, b, c)
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

/* ---- counter-based uniforms ------------------------------------------------ */

#define LANES DT_CZ_LANES
/* Philox4x32-10 of 16 counters at once (c0 varies, c1..c3 shared); plain
 * lane loops so the 32x32->64 multiplies vectorise. */
#if DT_CZ_V_PHILOX
#define philox16 dt__cz_philox16_v
#else
static void philox16(uint32_t k0, uint32_t k1, uint32_t c0base, uint32_t c1, uint32_t c2,
                     uint32_t c3, uint32_t out[4][LANES]) {
  uint32_t x0[LANES], x1[LANES], x2[LANES], x3[LANES];
  for (int l = 0; l < LANES; l++) {
    x0[l] = c0base + (uint32_t)l;
    x1[l] = c1;
    x2[l] = c2;
    x3[l] = c3;
  }
  for (int r = 0; r < 10; r++) {
    for (int l = 0; l < LANES; l++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * x0[l];
      uint64_t p1 = (uint64_t)0xCD9E8D57u * x2[l];
      uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1[l] ^ k0;
      uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3[l] ^ k1;
      x1[l] = (uint32_t)p1;
      x3[l] = (uint32_t)p0;
      x0[l] = y0;
      x2[l] = y2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int l = 0; l < LANES; l++) {
    out[0][l] = x0[l];
    out[1][l] = x1[l];
    out[2][l] = x2[l];
    out[3][l] = x3[l];
  }
}
#endif

/* One block = 128 uniforms (16 lanes x 4 words x 2 halves): uniform u of
 * block b, word w, lane l is (low 16 bits + 0.5) / 65536 at index
 * w*32 + l and (high 16 bits + 0.5) / 65536 at w*32 + 16 + l. */
#define UBLOCK DT_CZ_UBLOCK
typedef dt__cz_phx phx_args;
#define block_args dt__cz_block_args

static void uniform_block(dt_cz_rng rng, uint64_t block, float u[UBLOCK]) {
  uint32_t o[4][LANES];
  phx_args a = block_args(rng, block);
  philox16(a.k0, a.k1, a.c0, a.c1, a.c2, a.c3, o);
  const float s = 1.0f / 65536.0f;
  for (int w = 0; w < 4; w++)
    for (int l = 0; l < LANES; l++) {
      u[w * 32 + l] = MADD((float)(o[w][l] & 0xffffu), s, 0.5f * s);
      u[w * 32 + LANES + l] = MADD((float)(o[w][l] >> 16), s, 0.5f * s);
    }
}

void dt__cz_uniform(dt_cz_rng rng, size_t first, float *u, size_t n) {
  float blk[UBLOCK];
  size_t i = 0;
  while (i < n) {
    size_t e = first + i;
    uint64_t b = e / UBLOCK;
    size_t at = e % UBLOCK, m = UBLOCK - at;
    if (m > n - i) m = n - i;
    uniform_block(rng, b, blk);
    memcpy(u + i, blk + at, m * sizeof *u);
    i += m;
  }
}

/* ---- headers ------------------------------------------------------------- */

size_t dt_cz_frame_bytes(int codec, size_t n, size_t k) {
  size_t p = 0;
  switch (codec) {
  case DT_CODEC_FP16:
  case DT_CODEC_BF16: p = 2 * n; break;
  case DT_CODEC_INT8: p = n; break;
  case DT_CODEC_QSGD: p = 4 * ((n + DT_CZ_QSGD_CHUNK - 1) / DT_CZ_QSGD_CHUNK) + n; break;
  case DT_CODEC_SIGN: p = 4 * ((n + DT_CZ_SIGN_BLOCK - 1) / DT_CZ_SIGN_BLOCK) + (n + 7) / 8; break;
  case DT_CODEC_TOPK: p = 8 * k; break;
  default: return 0;
  }
  return (DT_CZ_HDR_LEN + p + 7) & ~(size_t)7;
}

void dt__cz_put_hdr(void *frame, int codec, int levels, int flags, size_t n, size_t k, float scale) {
  dt_cz_hdr h = {DT_CZ_MAGIC, (uint8_t)codec, DT_CZ_VERSION, (uint8_t)levels, (uint8_t)flags,
                 (uint32_t)n, (uint32_t)k, scale, 0};
  memcpy(frame, &h, sizeof h);
}

static size_t sign_dense_at(size_t n, size_t nb, int two);

int dt__cz_check_hdr(int codec, const void *frame, size_t bytes, size_t n, dt_cz_hdr *h) {
  if (!frame || bytes < DT_CZ_HDR_LEN)
    return dt__seterr(DT_ECORRUPT, "compressed frame: %zu bytes, shorter than its %d-byte header",
                      bytes, DT_CZ_HDR_LEN);
  memcpy(h, frame, sizeof *h);
  if (h->magic != DT_CZ_MAGIC)
    return dt__seterr(DT_ECORRUPT, "compressed frame: bad magic 0x%08x", h->magic);
  if (h->version != DT_CZ_VERSION)
    return dt__seterr(DT_ECORRUPT, "compressed frame: version %u, expected %d", h->version,
                      DT_CZ_VERSION);
  if (h->codec != codec)
    return dt__seterr(DT_ECORRUPT, "compressed frame: codec %u ('%s'), expected '%s'", h->codec,
                      h->codec < DT_CODEC_COUNT ? dt__codec_names[h->codec] : "?",
                      codec >= 0 && codec < DT_CODEC_COUNT ? dt__codec_names[codec] : "?");
  /* sign frames cut by a layout plan (dt__cz_sign_encode) say so, and may
   * carry two scales per block */
  unsigned known = DT_CZ_FLAG_NONFINITE | DT_CZ_FLAG_NOTE;
  int plan = codec == DT_CODEC_SIGN && (h->flags & DT_CZ_FLAG_BLOCKS);
  if (plan) known |= DT_CZ_FLAG_BLOCKS | DT_CZ_FLAG_TWO | DT_CZ_FLAG_DENSE;
  if ((h->flags & ~known) || h->reserved)
    return dt__seterr(DT_ECORRUPT, "compressed frame: unknown flags 0x%02x / reserved 0x%x",
                      h->flags, h->reserved);
  if (h->n != n)
    return dt__seterr(DT_ECORRUPT, "compressed frame: %u values, the bucket holds %zu", h->n, n);
  if (plan) {
    if (h->k < 1 || h->k > n) /* entries: the plan's blocks */
      return dt__seterr(DT_ECORRUPT, "compressed frame: %u sign blocks for %zu values", h->k, n);
  } else if (codec == DT_CODEC_TOPK) {
    if (h->k > n)
      return dt__seterr(DT_ECORRUPT, "compressed frame: %u entries beyond the bucket of %zu "
                        "values", h->k, n);
  } else if (h->k != n) {
    return dt__seterr(DT_ECORRUPT, "compressed frame: %u entries, expected %zu", h->k, n);
  }
  if (codec == DT_CODEC_QSGD && (h->levels < 1 || h->levels > 127))
    return dt__seterr(DT_ECORRUPT, "compressed frame: qsgd levels %u outside 1..127", h->levels);
  if (h->scale < 0)
    return dt__seterr(DT_ECORRUPT, "compressed frame: negative scale %g", (double)h->scale);
  if (!isfinite(h->scale)) /* no encoder writes one: Inf/NaN rides in the flag */
    return dt__seterr(DT_ECORRUPT, "compressed frame: scale %g not finite", (double)h->scale);
  /* a dense section's size is in the frame: its count is checked by
   * dt__cz_sign_decode_add_d, here only that the count fits */
  size_t need = plan ? sign_dense_at(n, h->k, (h->flags & DT_CZ_FLAG_TWO) != 0) +
                           ((h->flags & DT_CZ_FLAG_DENSE) ? 4 : 0)
                     : dt_cz_frame_bytes(codec, n, h->k);
  if (bytes < need)
    return dt__seterr(DT_ECORRUPT, "compressed frame: %zu bytes, its header needs %zu (truncated)",
                      bytes, need);
  return DT_OK;
}

/* ---- fp16 / bf16 --------------------------------------------------------- */

void dt__cz_to_f16(const float *restrict x, uint16_t *restrict h, float *resid, size_t n) {
  size_t i = 0;
#if DT_CZ_V_F16
  i = dt__cz_to_f16_v(x, h, resid, n);
#endif
  for (; i < n; i++) {
    h[i] = dt_f32_to_f16(x[i]);
    if (resid) resid[i] = x[i] - dt_f16_to_f32(h[i]);
  }
}

void dt__cz_from_f16(const uint16_t *restrict h, float *restrict out, size_t n, int add) {
  size_t i = 0;
#if DT_CZ_V_F16
  i = dt__cz_from_f16_v(h, out, n, add);
#endif
  for (; i < n; i++) out[i] = (add ? out[i] : 0.0f) + dt_f16_to_f32(h[i]);
}

static inline uint16_t bf16_of(uint32_t b) {
  uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  uint32_t nan = (b >> 16) | 0x40u;
  return (uint16_t)((b & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

void dt__cz_to_bf16(const float *restrict x, uint16_t *restrict h, float *resid, size_t n) {
  const uint32_t *xb = (const uint32_t *)x;
  for (size_t i = 0; i < n; i++) h[i] = bf16_of(xb[i]);
  if (resid)
    for (size_t i = 0; i < n; i++) {
      uint32_t b = (uint32_t)h[i] << 16;
      float f;
      memcpy(&f, &b, 4);
      resid[i] = x[i] - f;
    }
}

void dt__cz_from_bf16(const uint16_t *restrict h, float *restrict out, size_t n, int add) {
  for (size_t i = 0; i < n; i++) {
    uint32_t b = (uint32_t)h[i] << 16;
    float f;
    memcpy(&f, &b, 4);
    out[i] = (add ? out[i] : 0.0f) + f;
  }
}

/* ---- int8 / qsgd --------------------------------------------------------- */

/* The largest |x[i]| as its bit pattern (0 for n = 0): for non-negative
 * floats the integer order of the bits is the float order, and every
 * Inf/NaN is above every finite value, so one pass gives both the max and
 * whether x holds anything non-finite (result >= 0x7f800000). */
#define NONFINITE_BITS 0x7f800000u
static uint32_t maxabs_bits(const float *restrict x, size_t n) {
  const uint32_t *restrict xb = (const uint32_t *)x;
  uint32_t m = 0;
  size_t i = 0;
#if DT_CZ_V_MAXABS
  m = dt__cz_maxabs_bits_v(xb, n, &i);
#endif
  for (; i < n; i++) {
    uint32_t v = xb[i] & 0x7fffffffu;
    m = v > m ? v : m;
  }
  return m;
}

static float bits_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* The sum of squares of x: in float lanes (vectorised, gcc: 2 x
 * vfmadd231ps), redone in double when that overflowed or may have lost
 * bits to subnormal squares. A float's square overflows for |x| > ~1.8e19
 * and is subnormal for |x| < ~1e-19: with float lanes alone a chunk of
 * huge finite values got an Inf norm (it decoded to NaN, and no non-finite
 * flag said why) and one of tiny values a norm too small for its own
 * values (they were clipped to the top level). A double holds the square
 * of any float. Below 2^-90 a sum of subnormal squares could be off
 * relatively; above it their error (< 2^-149 each) is below 2^-50 of the
 * sum. Double lanes throughout cost 2.7% of qsgd's encode speed; the
 * retry keeps the float path's speed and bits for every other chunk. */
static __attribute__((noinline, cold)) double sumsq_double(const float *restrict x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

static double sumsq(const float *restrict x, size_t n) {
  float acc[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += x[i + l] * x[i + l];
  double s = 0;
  for (int l = 0; l < 16; l++) s += acc[l];
  for (; i < n; i++) s += (double)x[i] * x[i];
  return s >= 0x1p-90 && s <= DBL_MAX ? s : sumsq_double(x, n);
}

/* The sum of |x|: in float lanes, redone in double when that overflowed
 * (16 values of ~2e37 in a lane: the block's scale was Inf, and the
 * receiver rejected the frame as corrupt). Double lanes throughout cost
 * 15% of sign's encode speed. */
static __attribute__((noinline, cold)) double abssum_double(const float *restrict x, size_t n) {
  double t = 0;
  for (size_t i = 0; i < n; i++) t += fabsf(x[i]);
  return t;
}

static double abssum(const float *restrict x, size_t n) {
  float acc[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += fabsf(x[i + l]);
  double t = 0;
  for (int l = 0; l < 16; l++) t += acc[l];
  for (; i < n; i++) t += fabsf(x[i]);
  return t <= DBL_MAX ? t : abssum_double(x, n);
}

/* The quantum for values up to top (int8: max|x| / 127; qsgd: the chunk's
 * norm / levels) as a float whose lim multiples are all finite floats: a
 * quantum rounded up, or the norm of many values near FLT_MAX, would
 * decode the largest level to Inf (FLT_MAX / 127 rounds up: 127 times it
 * is Inf). Capping the quantum at FLT_MAX / lim keeps every finite |x|
 * within lim quanta, so the error stays below one quantum. */
static float quantum(double top, int lim) {
  float st = (float)((top < FLT_MAX ? top : FLT_MAX) / lim);
  if ((double)st * lim > (double)FLT_MAX) st = nextafterf(st, 0.0f);
  return st;
}

/* Any Inf or NaN: x * 0 is NaN exactly for those, and NaN survives sums. */
static int nonfinite(const float *restrict x, size_t n) {
  float acc[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += x[i + l] * 0.0f;
  float s = 0;
  for (int l = 0; l < 16; l++) s += acc[l];
  for (; i < n; i++) s += x[i] * 0.0f;
  return s != s;
}

/* q[i] = stochastic round of x[i] * inv (|q| <= lim); resid = x - q*step.
 * block0 is the uniform block of x[0] (x starts at a block boundary). */
static inline __attribute__((always_inline)) void
quantize(const float *restrict x, int8_t *restrict q, float *resid, size_t n, float inv, float step,
         float lim, dt_cz_rng rng, uint64_t block0, int magnitude) {
  size_t b = 0;
#if DT_CZ_V_QUANT
  b = dt__cz_quantize_v(x, q, resid, n, inv, step, lim, rng, block0, magnitude);
#endif
  float u[UBLOCK];
  for (; b * UBLOCK < n; b++) {
    size_t lo = b * UBLOCK, m = n - lo < UBLOCK ? n - lo : UBLOCK;
    uniform_block(rng, block0 + b, u);
    const float *restrict xs = x + lo;
    int8_t *restrict qs = q + lo;
    float *rs = resid ? resid + lo : NULL;
    if (magnitude) {
      /* qsgd: the magnitude is rounded, the sign kept */
      for (size_t i = 0; i < m; i++) {
        float l = floorf(MADD(fabsf(xs[i]), inv, u[i]));
        l = l > lim ? lim : l;
        qs[i] = (int8_t)(int)copysignf(l, xs[i]);
      }
    } else {
      for (size_t i = 0; i < m; i++) {
        float l = floorf(MADD(xs[i], inv, u[i]));
        l = l > lim ? lim : l < -lim ? -lim : l;
        qs[i] = (int8_t)(int)l;
      }
    }
    if (rs)
      for (size_t i = 0; i < m; i++) rs[i] = MADD(-(float)qs[i], step, xs[i]);
  }
}

/* quantize with its rounding mode a constant, each mode's loops without
 * the other's branch. Where each copy lives is measured (paired, 128 KiB
 * buckets): qsgd's and the int8 ring's inlined into their block loops
 * (called once per chunk, qsgd encoded 2.5% slower, the ring 2.3%),
 * int8's whole-bucket one called (inlined into dt_cz_encode it encoded
 * 15% slower) — the placement gcc chose on its own before this file's
 * overflow fix changed its inlining. */
static __attribute__((noinline)) void
quantize_lin(const float *restrict x, int8_t *restrict q, float *resid, size_t n,
             float inv, float step, float lim, dt_cz_rng rng, uint64_t block0) {
  quantize(x, q, resid, n, inv, step, lim, rng, block0, 0);
}
static inline __attribute__((always_inline)) void
quantize_mag(const float *restrict x, int8_t *restrict q, float *resid, size_t n,
             float inv, float step, float lim, dt_cz_rng rng, uint64_t block0) {
  quantize(x, q, resid, n, inv, step, lim, rng, block0, 1);
}

static void dequantize_add(const int8_t *restrict q, float *restrict out, size_t n, float step) {
  for (size_t i = 0; i < n; i++) out[i] += (float)q[i] * step;
}

/* ---- int8 with a step per block (the ring of dt_compress_reduce) ---------- */

size_t dt__cz_i8b_bytes(size_t n) {
  return (DT_CZ_HDR_LEN + 4 * ((n + DT_CZ_I8_BLOCK - 1) / DT_CZ_I8_BLOCK) + n + 7) & ~(size_t)7;
}

void dt__cz_i8b_encode(const float *x, size_t n, dt_cz_rng rng, void *frame, float *resid,
                       int flags) {
  size_t nb = (n + DT_CZ_I8_BLOCK - 1) / DT_CZ_I8_BLOCK;
  uint8_t *p = (uint8_t *)frame + DT_CZ_HDR_LEN;
  int8_t *q = (int8_t *)(p + 4 * nb);
  /* first pass: every block's max |x| (kept in its step's slot) and
   * whether anything is non-finite, before any value or residual is
   * written (resid may be x) */
  uint32_t all = 0;
  for (size_t b = 0; b < nb; b++) {
    size_t lo = b * DT_CZ_I8_BLOCK, m = n - lo < DT_CZ_I8_BLOCK ? n - lo : DT_CZ_I8_BLOCK;
    uint32_t mb = maxabs_bits(x + lo, m);
    all = mb > all ? mb : all;
    memcpy(p + 4 * b, &mb, 4);
  }
  if (all >= NONFINITE_BITS) flags |= DT_CZ_FLAG_NONFINITE;
  dt__cz_put_hdr(frame, DT_CODEC_INT8, 0, flags | DT_CZ_FLAG_BLOCKS, n, n, 1.0f);
  for (size_t b = 0; b < nb; b++) {
    size_t lo = b * DT_CZ_I8_BLOCK, m = n - lo < DT_CZ_I8_BLOCK ? n - lo : DT_CZ_I8_BLOCK;
    uint32_t mb;
    memcpy(&mb, p + 4 * b, 4);
    float mx = flags & DT_CZ_FLAG_NONFINITE ? 0 : bits_f32(mb);
    float step = quantum(mx, 127);
    if (step > 0 && isfinite(127.0f / mx)) {
      quantize(x + lo, q + lo, resid ? resid + lo : NULL, m, 127.0f / mx, step, 127.0f, rng,
               lo / UBLOCK, 0);
    } else {
      step = 0;
      memset(q + lo, 0, m);
      if (resid && resid != x) memcpy(resid + lo, x + lo, m * sizeof *x);
    }
    memcpy(p + 4 * b, &step, 4);
  }
  size_t used = DT_CZ_HDR_LEN + 4 * nb + n, all_bytes = dt__cz_i8b_bytes(n);
  memset((uint8_t *)frame + used, 0, all_bytes - used); /* padding: every byte on the wire defined */
}

int dt__cz_i8b_decode_add(const void *frame, size_t bytes, size_t n, float *out, int *flags) {
  dt_cz_hdr h;
  if (!frame || bytes < DT_CZ_HDR_LEN)
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: %zu bytes, shorter than its %d-byte header",
                      bytes, DT_CZ_HDR_LEN);
  memcpy(&h, frame, sizeof h);
  if (h.magic != DT_CZ_MAGIC)
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: bad magic 0x%08x", h.magic);
  if (h.version != DT_CZ_VERSION)
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: version %u, expected %d", h.version,
                      DT_CZ_VERSION);
  if (h.codec != DT_CODEC_INT8)
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: codec %u, expected int8", h.codec);
  if (!(h.flags & DT_CZ_FLAG_BLOCKS) ||
      (h.flags & ~(DT_CZ_FLAG_NONFINITE | DT_CZ_FLAG_NOTE | DT_CZ_FLAG_BLOCKS)) || h.reserved ||
      h.levels)
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: flags 0x%02x / levels %u / reserved 0x%x",
                      h.flags, h.levels, h.reserved);
  if (h.n != n || h.k != n)
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: %u values / %u entries, the chunk holds %zu",
                      h.n, h.k, n);
  if (bytes < dt__cz_i8b_bytes(n))
    return dt__seterr(DT_ECORRUPT, "int8 ring frame: %zu bytes, %zu values need %zu (truncated)",
                      bytes, n, dt__cz_i8b_bytes(n));
  const uint8_t *p = (const uint8_t *)frame + DT_CZ_HDR_LEN;
  size_t nb = (n + DT_CZ_I8_BLOCK - 1) / DT_CZ_I8_BLOCK;
  for (size_t b = 0; b < nb; b++) { /* checked before any is used */
    float st;
    memcpy(&st, p + 4 * b, 4);
    if (!(st >= 0) || !isfinite(st))
      return dt__seterr(DT_ECORRUPT, "int8 ring frame: block %zu has step %g (negative or not "
                        "finite)", b, (double)st);
  }
  if (flags) *flags = h.flags;
  if (h.flags & DT_CZ_FLAG_NONFINITE) {
    for (size_t i = 0; i < n; i++) out[i] += NAN;
    return DT_OK;
  }
  const int8_t *q = (const int8_t *)(p + 4 * nb);
  for (size_t b = 0; b < nb; b++) {
    size_t lo = b * DT_CZ_I8_BLOCK, m = n - lo < DT_CZ_I8_BLOCK ? n - lo : DT_CZ_I8_BLOCK;
    float st;
    memcpy(&st, p + 4 * b, 4);
    dequantize_add(q + lo, out + lo, m, st);
  }
  return DT_OK;
}

/* ---- sign ---------------------------------------------------------------- */

static void sign_pack(const float *restrict x, uint8_t *restrict bits, float *resid, size_t n,
                      float s) {
  size_t i = 0;
#if DT_CZ_V_SIGN
  i = dt__cz_sign_pack_v(x, bits, resid, n, s);
#endif
  for (; i < n; i += 8) {
    size_t m = n - i < 8 ? n - i : 8;
    uint8_t b = 0;
    for (size_t j = 0; j < m; j++) {
      int pos = x[i + j] >= 0;
      b |= (uint8_t)(pos << j);
      if (resid) resid[i + j] = x[i + j] - (pos ? s : -s);
    }
    bits[i / 8] = b;
  }
}

static void sign_unpack_add(const uint8_t *restrict bits, float *restrict out, size_t n, float s) {
  size_t i = 0;
#if DT_CZ_V_SIGN
  i = dt__cz_sign_unpack_add_v(bits, out, n, s);
#endif
  for (; i < n; i++) out[i] += (bits[i / 8] >> (i % 8)) & 1 ? s : -s;
}

/* Sign frames over a block plan. end[b] is where block b ends (strictly
 * increasing, end[nb-1] = n); without a plan (end NULL) the blocks are
 * DT_CZ_SIGN_BLOCK values from the span's start, one scale each: the
 * frames of dt_cz_encode, the same bytes as before plans existed. A plan
 * comes from the model's layout (reduce.c: blocks that never straddle a
 * row or a layer) and is not sent: both sides make it from the layout and
 * the span, the frame says only that it used one (DT_CZ_FLAG_BLOCKS, its
 * entry count k = nb) and whether it carries two scales per block
 * (DT_CZ_FLAG_TWO: the mean of the block's values >= 0 and the mean |x|
 * of the others, as 1-bit SGD reconstructs each column from the means of
 * its two groups; one scale, the mean |x|, is EF-SGD's scaled sign). */
size_t dt__cz_sign_bytes(size_t n, size_t nb, int two) { return dt__cz_sign_bytes_d(n, nb, two, 0); }

/* Where a frame's dense section starts (DT_CZ_FLAG_DENSE): after the
 * scales and the bits, on a 4-byte boundary; it holds its value count
 * (u32) and then the dense blocks' values in f32, in block order. */
static size_t sign_dense_at(size_t n, size_t nb, int two) {
  return (DT_CZ_HDR_LEN + 4 * nb * (two ? 2 : 1) + (n + 7) / 8 + 3) & ~(size_t)3;
}

size_t dt__cz_sign_bytes_d(size_t n, size_t nb, int two, size_t nd) {
  return (sign_dense_at(n, nb, two) + (nd ? 4 + 4 * nd : 0) + 7) & ~(size_t)7;
}

static inline size_t blk_end(const uint32_t *end, size_t b, size_t n) {
  if (end) return end[b];
  size_t e = (b + 1) * DT_CZ_SIGN_BLOCK;
  return e < n ? e : n;
}

/* The sums of x's values >= 0 and of the others' |x|, and how many are
 * >= 0: in float lanes, redone in double when a sum overflowed (as
 * abssum). */
static __attribute__((noinline, cold)) void twosum_double(const float *restrict x, size_t n,
                                                          double *pos, double *neg) {
  double p = 0, q = 0;
  for (size_t i = 0; i < n; i++) {
    if (x[i] >= 0) p += x[i];
    else q -= x[i];
  }
  *pos = p;
  *neg = q;
}

static size_t twosum(const float *restrict x, size_t n, double *pos, double *neg) {
  float ap[16] = {0}, an[16] = {0};
  int cn[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) {
      float v = x[i + l];
      int ge = v >= 0;
      ap[l] += ge ? v : 0.0f;
      an[l] += ge ? 0.0f : -v;
      cn[l] += ge;
    }
  double p = 0, q = 0;
  size_t c = 0;
  for (int l = 0; l < 16; l++) {
    p += ap[l];
    q += an[l];
    c += (size_t)cn[l];
  }
  for (; i < n; i++) {
    if (x[i] >= 0) {
      p += x[i];
      c++;
    } else {
      q -= x[i];
    }
  }
  if (p > DBL_MAX || q > DBL_MAX) twosum_double(x, n, &p, &q);
  *pos = p;
  *neg = q;
  return c;
}

int dt__cz_sign_encode(const float *x, size_t n, const uint32_t *end, size_t nb, int two,
                       void *frame, float *resid, int flags) {
  return dt__cz_sign_encode_d(x, n, end, nb, two, NULL, frame, resid, flags);
}

/* The values of a plan's dense blocks (dense[b] != 0); 0 without. */
static size_t dense_count(const uint32_t *end, size_t nb, const uint8_t *dense) {
  size_t nd = 0;
  for (size_t b = 0; dense && b < nb; b++)
    if (dense[b]) nd += end[b] - (b ? end[b - 1] : 0);
  return nd;
}

int dt__cz_sign_encode_d(const float *x, size_t n, const uint32_t *end, size_t nb, int two,
                         const uint8_t *dense, void *frame, float *resid, int flags) {
  if (!x || !frame || n == 0 || n > UINT32_MAX || (end && (nb < 1 || nb > n)) || (two && !end) ||
      (dense && !end))
    return dt__seterr(DT_EINVAL, "sign encode: bad arguments (n = %zu, %zu blocks)", n, nb);
  if (end) {
    for (size_t b = 0; b < nb; b++)
      if (end[b] <= (b ? end[b - 1] : 0) || (b == nb - 1 && end[b] != n))
        return dt__seterr(DT_EINVAL, "sign encode: block %zu ends at %u (plan for %zu values)", b,
                          end[b], n);
  } else {
    nb = (n + DT_CZ_SIGN_BLOCK - 1) / DT_CZ_SIGN_BLOCK;
  }
  size_t nd = end ? dense_count(end, nb, dense) : 0;
  flags &= ~(DT_CZ_FLAG_BLOCKS | DT_CZ_FLAG_TWO | DT_CZ_FLAG_DENSE);
  if (!(flags & DT_CZ_FLAG_NONFINITE) && nonfinite(x, n)) flags |= DT_CZ_FLAG_NONFINITE;
  dt__cz_put_hdr(frame, DT_CODEC_SIGN, 0,
                 flags | (end ? DT_CZ_FLAG_BLOCKS : 0) | (two ? DT_CZ_FLAG_TWO : 0) |
                     (nd ? DT_CZ_FLAG_DENSE : 0),
                 n, end ? nb : n, 1.0f);
  uint8_t *p = (uint8_t *)frame + DT_CZ_HDR_LEN;
  float *scales = (float *)p;
  uint8_t *bits = p + 4 * nb * (two ? 2 : 1);
  int bad = (flags & DT_CZ_FLAG_NONFINITE) != 0;
  if (!end) {
    /* blocks of DT_CZ_SIGN_BLOCK: bits and residual in one pass a block */
    for (size_t b = 0; b < nb; b++) {
      size_t lo = b * DT_CZ_SIGN_BLOCK, m = blk_end(NULL, b, n) - lo;
      float s = bad ? 0 : (float)(abssum(x + lo, m) / (double)m);
      memcpy(&scales[b], &s, 4);
      sign_pack(x + lo, bits + lo / 8, resid ? resid + lo : NULL, m, s);
    }
    return DT_OK;
  }
  /* a plan's blocks need not start on a byte: the scales first, then the
   * bits of the whole span, then each block's residual (resid may be x) */
  for (size_t b = 0, lo = 0; b < nb; lo = end[b++]) {
    size_t m = end[b] - lo;
    if (bad || (dense && dense[b])) { /* a dense block's scales: 0, unused */
      memset(&scales[two ? 2 * b : b], 0, (two ? 2 : 1) * sizeof(float));
    } else if (two) {
      double ps, ns;
      size_t np = twosum(x + lo, m, &ps, &ns);
      float sp = np ? (float)(ps / (double)np) : 0.0f, sn = np < m ? (float)(ns / (double)(m - np)) : 0.0f;
      memcpy(&scales[2 * b], &sp, 4);
      memcpy(&scales[2 * b + 1], &sn, 4);
    } else {
      float s = (float)(abssum(x + lo, m) / (double)m);
      memcpy(&scales[b], &s, 4);
    }
  }
  sign_pack(x, bits, NULL, n, 0.0f);
  if (nd) {
    /* the dense blocks' values, exact: their residual is 0 */
    uint8_t *d = (uint8_t *)frame + sign_dense_at(n, nb, two);
    uint32_t c = (uint32_t)nd;
    memcpy(d, &c, 4);
    d += 4;
    for (size_t b = 0, lo = 0; b < nb; lo = end[b++])
      if (dense[b]) {
        memcpy(d, x + lo, (end[b] - lo) * sizeof *x);
        d += (end[b] - lo) * sizeof *x;
      }
  }
  if (resid)
    for (size_t b = 0, lo = 0; b < nb; lo = end[b++]) {
      if (dense && dense[b]) {
        memset(resid + lo, 0, (end[b] - lo) * sizeof *resid);
        continue;
      }
      float sp = scales[two ? 2 * b : b], sn = -scales[two ? 2 * b + 1 : b];
      for (size_t i = lo; i < end[b]; i++) resid[i] = x[i] - (x[i] >= 0 ? sp : sn);
    }
  return DT_OK;
}

int dt__cz_sign_decode_add(const void *frame, size_t bytes, size_t n, const uint32_t *end,
                           size_t nb, int two, float *out) {
  return dt__cz_sign_decode_add_d(frame, bytes, n, end, nb, two, NULL, out);
}

int dt__cz_sign_decode_add_d(const void *frame, size_t bytes, size_t n, const uint32_t *end,
                             size_t nb, int two, const uint8_t *dense, float *out) {
  dt_cz_hdr h;
  DT_CHECK(dt__cz_check_hdr(DT_CODEC_SIGN, frame, bytes, n, &h));
  int fplan = (h.flags & DT_CZ_FLAG_BLOCKS) != 0, ftwo = (h.flags & DT_CZ_FLAG_TWO) != 0;
  size_t nd = end ? dense_count(end, nb, dense) : 0;
  if (!end) {
    if (fplan)
      return dt__seterr(DT_ECORRUPT, "compressed frame: sign blocks cut by a layout plan (%u "
                        "blocks), expected blocks of %d values", h.k, DT_CZ_SIGN_BLOCK);
    nb = (n + DT_CZ_SIGN_BLOCK - 1) / DT_CZ_SIGN_BLOCK;
    two = 0;
  } else if (!fplan || h.k != nb || ftwo != (two != 0)) {
    return dt__seterr(DT_ECORRUPT, "compressed frame: sign frame with %s, %s scale%s; this "
                      "rank's plan has %zu blocks, %s", fplan ? "a plan's blocks" : "blocks of 256",
                      ftwo ? "two" : "one", ftwo ? "s a block" : " a block", nb,
                      two ? "two scales a block" : "one scale a block");
  }
  /* the dense section: present exactly when this rank's plan has dense
   * blocks, with their value count; the values finite unless the frame
   * is flagged non-finite */
  int fdense = (h.flags & DT_CZ_FLAG_DENSE) != 0;
  const uint8_t *dv = (const uint8_t *)frame + sign_dense_at(n, nb, two) + 4;
  if (fdense != (nd > 0))
    return dt__seterr(DT_ECORRUPT, "compressed frame: sign frame %s a dense section; this rank's "
                      "plan has %zu dense values", fdense ? "with" : "without", nd);
  if (nd) {
    uint32_t c;
    memcpy(&c, dv - 4, 4);
    if (c != nd)
      return dt__seterr(DT_ECORRUPT, "compressed frame: %u dense values; this rank's plan has %zu",
                        c, nd);
    if (bytes < dt__cz_sign_bytes_d(n, nb, two, nd))
      return dt__seterr(DT_ECORRUPT, "compressed frame: %zu bytes, its %zu dense values need %zu "
                        "(truncated)", bytes, nd, dt__cz_sign_bytes_d(n, nb, two, nd));
    if (!(h.flags & DT_CZ_FLAG_NONFINITE))
      for (size_t i = 0; i < nd; i++) {
        float v;
        memcpy(&v, dv + 4 * i, 4);
        if (!isfinite(v))
          return dt__seterr(DT_ECORRUPT, "compressed frame: dense value %zu is %g in a frame not "
                            "flagged non-finite", i, (double)v);
      }
  }
  const uint8_t *p = (const uint8_t *)frame + DT_CZ_HDR_LEN;
  size_t ns = nb * (two ? 2 : 1);
  for (size_t b = 0; b < ns; b++) { /* checked before any is used */
    float st;
    memcpy(&st, p + 4 * b, 4);
    if (!(st >= 0) || !isfinite(st))
      return dt__seterr(DT_ECORRUPT, "compressed frame: sign block %zu has scale %g (negative or "
                        "not finite)", two ? b / 2 : b, (double)st);
  }
  if (h.flags & DT_CZ_FLAG_NONFINITE) {
    for (size_t i = 0; i < n; i++) out[i] += NAN;
    return DT_OK;
  }
  const uint8_t *bits = p + 4 * ns;
  for (size_t b = 0, lo = 0; b < nb; lo = blk_end(end, b++, n)) {
    size_t hi = blk_end(end, b, n);
    if (dense && dense[b]) {
      for (size_t i = lo; i < hi; i++, dv += 4) {
        float v;
        memcpy(&v, dv, 4);
        out[i] += v;
      }
      continue;
    }
    float sp, sn;
    memcpy(&sp, p + 4 * (two ? 2 * b : b), 4);
    memcpy(&sn, p + 4 * (two ? 2 * b + 1 : b), 4);
    if (!two && lo % 8 == 0) {
      sign_unpack_add(bits + lo / 8, out + lo, hi - lo, sp);
      continue;
    }
    sn = -sn;
    for (size_t i = lo; i < hi; i++) out[i] += (bits[i / 8] >> (i % 8)) & 1 ? sp : sn;
  }
  return DT_OK;
}

/* ---- encode / decode ------------------------------------------------------ */

int dt_cz_encode(int codec, const float *x, size_t n, size_t k, int levels, dt_cz_rng rng,
                 void *frame, float *resid) {
  if (!x || !frame || n == 0 || n > UINT32_MAX)
    return dt__seterr(DT_EINVAL, "compress encode: bad arguments (n = %zu)", n);
  if (codec == DT_CODEC_SIGN) return dt__cz_sign_encode(x, n, NULL, 0, 0, frame, resid, 0);
  uint8_t *p = (uint8_t *)frame + DT_CZ_HDR_LEN;
  /* int8 finds non-finite values in its max pass */
  uint32_t mb = codec == DT_CODEC_INT8 ? maxabs_bits(x, n) : 0;
  int flags = (codec == DT_CODEC_INT8 ? mb >= NONFINITE_BITS : nonfinite(x, n))
                  ? DT_CZ_FLAG_NONFINITE : 0;
  switch (codec) {
  case DT_CODEC_FP16:
    dt__cz_put_hdr(frame, codec, 0, 0, n, n, 1.0f);
    dt__cz_to_f16(x, (uint16_t *)p, resid, n);
    return DT_OK;
  case DT_CODEC_BF16:
    dt__cz_put_hdr(frame, codec, 0, 0, n, n, 1.0f);
    dt__cz_to_bf16(x, (uint16_t *)p, resid, n);
    return DT_OK;
  case DT_CODEC_INT8: {
    float m = flags ? 0 : bits_f32(mb);
    float step = quantum(m, 127);
    dt__cz_put_hdr(frame, codec, 0, flags, n, n, step);
    if (step > 0 && isfinite(127.0f / m)) {
      quantize_lin(x, (int8_t *)p, resid, n, 127.0f / m, step, 127.0f, rng, 0);
    } else {
      memset(p, 0, n);
      if (resid && resid != x) memcpy(resid, x, n * sizeof *x);
    }
    return DT_OK;
  }
  case DT_CODEC_QSGD: {
    if (levels < 1 || levels > 127)
      return dt__seterr(DT_EINVAL, "dist.qsgd_levels = %d: must be 1..127", levels);
    /* QSGD's bucketing: one norm per DT_CZ_QSGD_CHUNK values, else the
     * variance grows with the square root of the bucket */
    size_t nc = (n + DT_CZ_QSGD_CHUNK - 1) / DT_CZ_QSGD_CHUNK;
    dt__cz_put_hdr(frame, codec, levels, flags, n, n, 1.0f);
    float *norms = (float *)p;
    int8_t *q = (int8_t *)(p + 4 * nc);
    for (size_t c = 0; c < nc; c++) {
      size_t lo = c * DT_CZ_QSGD_CHUNK, m = n - lo < DT_CZ_QSGD_CHUNK ? n - lo : DT_CZ_QSGD_CHUNK;
      double norm = flags ? 0 : sqrt(sumsq(x + lo, m));
      float step = quantum(norm, levels);
      norms[c] = step;
      if (step > 0 && isfinite(1.0f / step)) {
        quantize_mag(x + lo, q + lo, resid ? resid + lo : NULL, m, 1.0f / step, step,
                     (float)levels, rng, lo / UBLOCK);
      } else {
        memset(q + lo, 0, m);
        if (resid && resid != x) memcpy(resid + lo, x + lo, m * sizeof *x);
      }
    }
    return DT_OK;
  }
  case DT_CODEC_TOPK:
    return dt__cz_topk_encode(x, n, k, rng, frame, resid, flags);
  default:
    return dt__seterr(DT_EINVAL, "compress encode: codec %d has no frames", codec);
  }
}

int dt_cz_decode_add(int codec, const void *frame, size_t bytes, size_t n, float *out) {
  /* sign checks its own blocks (and refuses a frame cut by a layout plan) */
  if (codec == DT_CODEC_SIGN) return dt__cz_sign_decode_add(frame, bytes, n, NULL, 0, 0, out);
  dt_cz_hdr h;
  DT_CHECK(dt__cz_check_hdr(codec, frame, bytes, n, &h));
  const uint8_t *p = (const uint8_t *)frame + DT_CZ_HDR_LEN;
  if (h.flags & DT_CZ_FLAG_NONFINITE) {
    /* the sender's gradient was not finite: so is the sum (the training
     * loop's divergence check sees it) */
    for (size_t i = 0; i < n; i++) out[i] += NAN;
    return DT_OK;
  }
  switch (codec) {
  case DT_CODEC_TOPK: return dt__cz_topk_decode_add(&h, p, out);
  case DT_CODEC_FP16: dt__cz_from_f16((const uint16_t *)p, out, n, 1); break;
  case DT_CODEC_BF16: dt__cz_from_bf16((const uint16_t *)p, out, n, 1); break;
  case DT_CODEC_INT8: dequantize_add((const int8_t *)p, out, n, h.scale); break;
  case DT_CODEC_QSGD: {
    size_t nc = (n + DT_CZ_QSGD_CHUNK - 1) / DT_CZ_QSGD_CHUNK;
    const int8_t *q = (const int8_t *)(p + 4 * nc);
    for (size_t c = 0; c < nc; c++) { /* checked before any is used */
      float st;
      memcpy(&st, p + 4 * c, 4);
      if (st < 0)
        return dt__seterr(DT_ECORRUPT, "compressed frame: qsgd chunk %zu has negative scale %g", c,
                          (double)st);
      if (!isfinite(st))
        return dt__seterr(DT_ECORRUPT, "compressed frame: qsgd chunk %zu has scale %g (not "
                          "finite)", c, (double)st);
    }
    for (size_t c = 0; c < nc; c++) {
      size_t lo = c * DT_CZ_QSGD_CHUNK, m = n - lo < DT_CZ_QSGD_CHUNK ? n - lo : DT_CZ_QSGD_CHUNK;
      float st;
      memcpy(&st, p + 4 * c, 4);
      dequantize_add(q + lo, out + lo, m, st);
    }
    break;
  }
  default: return dt__seterr(DT_EINVAL, "compress decode: codec %d has no frames", codec);
  }
  return DT_OK;
}

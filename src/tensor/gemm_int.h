/*
 * gemm_int.h — the ISA-neutral parts of our own GEMM kernels
 * (gemm_avx512.c, gemm_avx2.c): reading a dt__gemm_op operand and the K
 * blocking. Internal to src/tensor/; the kernels, their register tiles and
 * their packing stay in each ISA's file.
 */
#ifndef DT_GEMM_INT_H
#define DT_GEMM_INT_H

#include "tensor/tensor.h"

#include <stddef.h>

/* Offset of row r, and of position x along the contiguous dimension; the
 * element is at p + row_off + pos_off. */
static inline size_t row_off(const dt__gemm_op *o, int r) {
  return o->rowoff ? (size_t)o->rowoff[r] : (size_t)r * o->ld;
}
static inline size_t pos_off(const dt__gemm_op *o, int x) {
  return o->seg ? (size_t)(x / o->seg) * o->segstride + x % o->seg : (size_t)x;
}

/* Length of the run of contiguous elements starting at x (<= n). */
static inline int op_run(const dt__gemm_op *o, int x, int n) {
  if (!o->seg) return n;
  int left = o->seg - x % o->seg;
  return left < n ? left : n;
}

/* The K blocking: balanced blocks of at most kc_max, a multiple of 16 where
 * possible (full transposes). A function of K alone — so every element of
 * C is summed in the same order whatever M, N or its place in a tile, and
 * B packed ahead of time is cut as the driver cuts it. */
static inline int gemm_kblock(int K, int kc_max) {
  int nkb = (K + kc_max - 1) / kc_max;
  int kcb = (K + nkb - 1) / nkb;
  if (nkb > 1) kcb = (kcb + 15) / 16 * 16;
  return kcb > kc_max ? kc_max : kcb;
}

/* C = beta * C (C not read when beta == 0): the product with K == 0. */
static inline void gemm_scale_c(int M, int N, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float *p = C + (size_t)i * ldc + j;
      *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

#endif /* DT_GEMM_INT_H */

/*
 * det_probe.c — a small fixed computation whose 64-bit hash says whether two
 * processes compute floating point the same way in deterministic mode: the
 * GEMM shapes a model's layers use, through dt_sgemm_f(DT_GEMM_FIXED) (our
 * AVX-512 or AVX2 kernels or the portable kernel, depending on the CPU and
 * DTRAIN_GEMM: three different sets of bits), and the
 * libm functions the layers call (expf, logf, erff, tanhf: glibc picks
 * CPU-specific variants of some at load time). Data parallel workers compare
 * it at start (src/parallel/ddp.c) and refuse to train together when it
 * differs. It does not prove two hosts agree on every input; it catches the
 * differences known to happen (kernel choice, ISA, libm variant).
 */
#include "tensor/tensor.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* Inputs with full mantissas, in [-1, 1), from a fixed integer sequence. */
static void fill(float *x, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((int32_t)s >> 8) / 8388608.0f;
  }
}

uint64_t dt_tensor_det_probe(void) {
  /* ta, tb, M, N, K: a final linear layer forward/backward (N = 10 is the
   * shape that went through OpenBLAS), a hidden layer, odd sizes. */
  static const int shapes[][5] = {{0, 1, 32, 10, 128}, {0, 0, 32, 128, 10}, {1, 0, 10, 128, 32},
                                  {0, 1, 32, 64, 96},  {0, 1, 7, 3, 300},   {0, 0, 9, 50, 17}};
  float A[32 * 300], Bm[300 * 128], C[32 * 128];
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int ta = shapes[s][0], tb = shapes[s][1], M = shapes[s][2], N = shapes[s][3], K = shapes[s][4];
    int lda = ta ? M : K, ldb = tb ? K : N;
    fill(A, (size_t)M * K, (uint32_t)s * 3 + 1);
    fill(Bm, (size_t)K * N, (uint32_t)s * 3 + 2);
    fill(C, (size_t)M * N, (uint32_t)s * 3 + 3);
    dt_sgemm_f(DT_GEMM_FIXED, ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, s & 1 ? 1.0f : 0.0f, C, N);
    h = fnv(h, C, sizeof(float) * (size_t)M * N);
  }
  /* Products two kernel sets could round differently while agreeing on the
   * ones above (the AVX-512 and AVX2 kernels sum each element in the same
   * order): beta other than 0, 1 (and powers of two) on edge tiles, and the dot form the
   * convolutions' weight gradients use (lanes summed across the register),
   * on a segmented operand as conv2d.c makes it. */
  fill(A, 13 * 21, 40);
  fill(Bm, 21 * 19, 41);
  fill(C, 13 * 19, 42);
  dt_sgemm_f(DT_GEMM_FIXED, 0, 0, 13, 19, 21, 0.75f, A, 21, Bm, 19, 0.7f, C, 19);
  h = fnv(h, C, sizeof(float) * 13 * 19);
  const dt__gemm_kern *k = dt__gemm_own();
  if (k) {
    static const int rowoff[9] = {0, 1, 2, 30, 31, 32, 60, 61, 62};
    dt__gemm_op a = {.p = A, .trans = 0, .ld = 150};
    dt__gemm_op b = {.p = Bm, .trans = 1, .rowoff = rowoff, .seg = 25, .segstride = 100};
    fill(A, 32 * 150, 43);
    fill(Bm, 300 * 2, 44);
    k->dot(32, 9, 150, 1.0f, &a, &b, 0.0f, C, 9);
    h = fnv(h, C, sizeof(float) * 32 * 9);
  }
  float x[256];
  fill(x, 256, 99);
  for (int i = 0; i < 256; i++) {
    float v[4] = {expf(x[i] * 20.0f), logf(fabsf(x[i]) * 100.0f + 1e-3f), erff(x[i] * 3.0f), tanhf(x[i] * 4.0f)};
    h = fnv(h, v, sizeof v);
  }
  return h;
}

/*
 * linear.c — fully connected layer: out = inp * weight^T + bias, weight in
 * PyTorch layout (OC, C). Forward and backward are GEMMs through
 * dt_sgemm; this file only arranges them. It does not allocate.
 */
#include "nn/kernels.h"
#include "tensor/tensor.h"

#include <string.h>

/* out's rows start as the bias: the product's beta (0 without a bias). */
static float bias_rows(float *out, const float *bias, int B, int OC) {
  if (!bias) return 0.0f;
  for (int b = 0; b < B; b++) memcpy(out + (size_t)b * OC, bias, sizeof(float) * OC);
  return 1.0f;
}

void dt_linear_forward_f(int gemm_flags, float *out, const float *inp, const float *weight,
                         const float *bias, int B, int C, int OC) {
  float beta = bias_rows(out, bias, B, OC);
  /* out(B,OC) = inp(B,C) * weight(OC,C)^T */
  dt_sgemm_f(gemm_flags, 0, 1, B, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void dt_linear_forward_packed(float *out, const float *inp, const float *wpacked,
                              const float *bias, int B, int C, int OC) {
  float beta = bias_rows(out, bias, B, OC);
  dt_sgemm_packed(B, OC, C, 1.0f, inp, C, wpacked, beta, out, OC);
}

void dt_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int B, int C, int OC) {
  dt_linear_forward_f(0, out, inp, weight, bias, B, C, OC);
}

void dt_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int B, int C, int OC) {
  dt_linear_backward_f(0, dinp, dweight, dbias, dout, inp, weight, B, C, OC);
}

void dt_linear_backward_f(int gemm_flags, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int C, int OC) {
  /* dinp(B,C) = dout(B,OC) * weight(OC,C) */
  if (dinp) dt_sgemm_f(gemm_flags, 0, 0, B, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  /* dweight(OC,C) = dout^T(OC,B) * inp(B,C) */
  if (dweight) dt_sgemm_f(gemm_flags, 1, 0, OC, C, B, 1.0f, dout, OC, inp, C, 0.0f, dweight, C);
  if (dbias) {
    memset(dbias, 0, sizeof(float) * OC);
    for (int b = 0; b < B; b++) {
      const float *restrict d = dout + (size_t)b * OC;
      float *restrict db = dbias;
      for (int o = 0; o < OC; o++) db[o] += d[o];
    }
  }
}

void dt_linear_backward_acc_f(int gemm_flags, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int B,
                              int C, int OC) {
  if (dinp) dt_sgemm_f(gemm_flags, 0, 0, B, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  /* beta = 1: the product is added to what dweight holds (micro-batches) */
  if (dweight) dt_sgemm_f(gemm_flags, 1, 0, OC, C, B, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) {
    for (int b = 0; b < B; b++) {
      const float *restrict d = dout + (size_t)b * OC;
      float *restrict db = dbias;
      for (int o = 0; o < OC; o++) db[o] += d[o];
    }
  }
}

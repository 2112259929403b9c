/*
 * conv2d.c — 2-D convolution (NCHW, PyTorch weight layout (OC,C,KH,KW),
 * stride, zero padding) as im2col + GEMM.
 *
 * The batch is processed in chunks of `bc` samples whose patch matrices sit
 * side by side in one (C*KH*KW) x (bc*OH*OW) matrix, so each step is one
 * large GEMM instead of bc small ones, while the chunk stays small enough to
 * live in cache (the whole batch's patch matrix for a 32->64 channel 3x3 conv
 * at 14x14 is 14 MB, far beyond L2, and this machine's memory is slow).
 * Forward: tmp(OC, bc*S) = W * col, then tmp is scattered into NCHW with the
 * bias. Backward per chunk: dout is packed to (OC, bc*S) once and used for
 * dW += dout * col^T and dcol = W^T * dout, then col2im.
 *
 * This file does not allocate; the caller supplies dt_conv2d_ws_floats()
 * floats of scratch.
 */
#include "nn/kernels.h"
#include "tensor/tensor.h"

#include <string.h>

#ifndef DT_CONV_CHUNK_FLOATS
/* Target size of one chunk's patch matrix (floats): 256 Ki floats = 1 MiB. */
#define DT_CONV_CHUNK_FLOATS (256 * 1024)
#endif

int dt_conv2d_geom_init(dt_conv2d_geom *g) {
  if (g->B <= 0 || g->C <= 0 || g->H <= 0 || g->W <= 0 || g->OC <= 0 || g->KH <= 0 ||
      g->KW <= 0 || g->stride <= 0 || g->pad < 0)
    return -1;
  int hp = g->H + 2 * g->pad, wp = g->W + 2 * g->pad;
  if (g->KH > hp || g->KW > wp) return -1;
  g->OH = (hp - g->KH) / g->stride + 1;
  g->OW = (wp - g->KW) / g->stride + 1;
  return 0;
}

static int chunk_samples(const dt_conv2d_geom *g) {
  size_t per = (size_t)g->C * g->KH * g->KW * g->OH * g->OW;
  size_t bc = DT_CONV_CHUNK_FLOATS / (per ? per : 1);
  if (bc < 1) bc = 1;
  if (bc > (size_t)g->B) bc = (size_t)g->B;
  return (int)bc;
}

size_t dt_conv2d_ws_floats(const dt_conv2d_geom *g) {
  size_t S = (size_t)g->OH * g->OW, K = (size_t)g->C * g->KH * g->KW;
  size_t bc = (size_t)chunk_samples(g);
  return (K + (size_t)g->OC) * bc * S;
}

void dt_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias,
                       const dt_conv2d_geom *g, float *ws) {
  const int S = g->OH * g->OW, K = g->C * g->KH * g->KW, OC = g->OC;
  const size_t inplane = (size_t)g->C * g->H * g->W;
  const int bc = chunk_samples(g);
  float *col = ws, *tmp = ws + (size_t)K * bc * S;
  for (int b0 = 0; b0 < g->B; b0 += bc) {
    int n = g->B - b0 < bc ? g->B - b0 : bc;
    size_t ld = (size_t)n * S;
    for (int i = 0; i < n; i++)
      dt_im2col(col + (size_t)i * S, ld, inp + (size_t)(b0 + i) * inplane, g->C, g->H, g->W,
                g->KH, g->KW, g->stride, g->pad, g->OH, g->OW);
    dt_sgemm(0, 0, OC, (int)ld, K, 1.0f, weight, K, col, (int)ld, 0.0f, tmp, (int)ld);
    for (int i = 0; i < n; i++) {
      float *o = out + (size_t)(b0 + i) * OC * S;
      for (int oc = 0; oc < OC; oc++) {
        const float *restrict t = tmp + (size_t)oc * ld + (size_t)i * S;
        float *restrict d = o + (size_t)oc * S;
        float bv = bias ? bias[oc] : 0.0f;
        for (int s = 0; s < S; s++) d[s] = t[s] + bv;
      }
    }
  }
}

void dt_conv2d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const dt_conv2d_geom *g, float *ws) {
  const int S = g->OH * g->OW, K = g->C * g->KH * g->KW, OC = g->OC;
  const size_t inplane = (size_t)g->C * g->H * g->W;
  const int bc = chunk_samples(g);
  float *col = ws, *tmp = ws + (size_t)K * bc * S;

  if (dbias) {
    for (int oc = 0; oc < OC; oc++) dbias[oc] = 0.0f;
    for (int b = 0; b < g->B; b++)
      for (int oc = 0; oc < OC; oc++)
        dbias[oc] += dt_vec_sum(dout + ((size_t)b * OC + oc) * S, (size_t)S);
  }
  if (!dweight && !dinp) return;
  for (int b0 = 0; b0 < g->B; b0 += bc) {
    int n = g->B - b0 < bc ? g->B - b0 : bc;
    size_t ld = (size_t)n * S;
    /* Pack dout of this chunk as (OC, n*S). */
    for (int i = 0; i < n; i++) {
      const float *src = dout + (size_t)(b0 + i) * OC * S;
      for (int oc = 0; oc < OC; oc++)
        memcpy(tmp + (size_t)oc * ld + (size_t)i * S, src + (size_t)oc * S, sizeof(float) * S);
    }
    if (dweight) {
      for (int i = 0; i < n; i++)
        dt_im2col(col + (size_t)i * S, ld, inp + (size_t)(b0 + i) * inplane, g->C, g->H, g->W,
                  g->KH, g->KW, g->stride, g->pad, g->OH, g->OW);
      /* dW(OC,K) (+)= dout(OC, n*S) * col(K, n*S)^T */
      dt_sgemm(0, 1, OC, K, (int)ld, 1.0f, tmp, (int)ld, col, (int)ld, b0 == 0 ? 0.0f : 1.0f,
               dweight, K);
    }
    if (dinp) {
      /* dcol(K, n*S) = W(OC,K)^T * dout(OC, n*S); col is free to reuse. */
      dt_sgemm(1, 0, K, (int)ld, OC, 1.0f, weight, K, tmp, (int)ld, 0.0f, col, (int)ld);
      for (int i = 0; i < n; i++)
        dt_col2im(dinp + (size_t)(b0 + i) * inplane, col + (size_t)i * S, ld, g->C, g->H, g->W,
                  g->KH, g->KW, g->stride, g->pad, g->OH, g->OW);
    }
  }
}

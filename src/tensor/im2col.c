/*
 * im2col.c — patch extraction for convolutions (im2col) and its adjoint
 * (col2im), plus tiny vector helpers. NCHW layout, zero padding. Rows of the
 * patch matrix are ordered (c, kh, kw), matching PyTorch's (OC,C,KH,KW)
 * weight layout, so conv forward is one GEMM weight(OC, C*KH*KW) x col.
 */
#include "tensor/tensor.h"

#include <string.h>

/* Range of output columns ow whose input column ow*stride - pad + kw lies in
 * [0, W): [*lo, *hi). */
static void valid_range(int OW, int W, int kw, int stride, int pad, int *lo, int *hi) {
  int off = kw - pad;
  /* ow*stride + off >= 0  <=> ow >= ceil(-off/stride) */
  int l = off >= 0 ? 0 : (-off + stride - 1) / stride;
  /* ow*stride + off <= W-1 <=> ow <= floor((W-1-off)/stride) */
  int h = (W - 1 - off) < 0 ? 0 : (W - 1 - off) / stride + 1;
  if (h > OW) h = OW;
  if (l > h) l = h;
  *lo = l;
  *hi = h;
}

void dt_im2col(float *col, size_t ldcol, const float *img, int C, int H, int W, int KH, int KW,
               int stride, int pad, int OH, int OW) {
  for (int c = 0; c < C; c++) {
    const float *plane = img + (size_t)c * H * W;
    for (int kh = 0; kh < KH; kh++) {
      for (int kw = 0; kw < KW; kw++) {
        float *row = col + ((size_t)(c * KH + kh) * KW + kw) * ldcol;
        int lo, hi;
        valid_range(OW, W, kw, stride, pad, &lo, &hi);
        for (int oh = 0; oh < OH; oh++) {
          float *restrict dst = row + (size_t)oh * OW;
          int ih = oh * stride - pad + kh;
          if (ih < 0 || ih >= H) {
            memset(dst, 0, sizeof(float) * OW);
            continue;
          }
          const float *restrict src = plane + (size_t)ih * W;
          int off = kw - pad;
          for (int ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
          if (stride == 1) {
            if (hi > lo) memcpy(dst + lo, src + lo + off, sizeof(float) * (hi - lo));
          } else {
            for (int ow = lo; ow < hi; ow++) dst[ow] = src[ow * stride + off];
          }
          for (int ow = hi; ow < OW; ow++) dst[ow] = 0.0f;
        }
      }
    }
  }
}

void dt_col2im(float *img, const float *col, size_t ldcol, int C, int H, int W, int KH, int KW,
               int stride, int pad, int OH, int OW) {
  memset(img, 0, sizeof(float) * (size_t)C * H * W);
  for (int c = 0; c < C; c++) {
    float *plane = img + (size_t)c * H * W;
    for (int kh = 0; kh < KH; kh++) {
      for (int kw = 0; kw < KW; kw++) {
        const float *row = col + ((size_t)(c * KH + kh) * KW + kw) * ldcol;
        int lo, hi;
        valid_range(OW, W, kw, stride, pad, &lo, &hi);
        for (int oh = 0; oh < OH; oh++) {
          int ih = oh * stride - pad + kh;
          if (ih < 0 || ih >= H) continue;
          const float *restrict src = row + (size_t)oh * OW;
          float *restrict dst = plane + (size_t)ih * W;
          int off = kw - pad;
          if (stride == 1) {
            for (int ow = lo; ow < hi; ow++) dst[ow + off] += src[ow];
          } else {
            for (int ow = lo; ow < hi; ow++) dst[ow * stride + off] += src[ow];
          }
        }
      }
    }
  }
}

void dt_vec_zero(float *x, size_t n) { memset(x, 0, sizeof(float) * n); }

void dt_vec_add(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

float dt_vec_sum(const float *x, size_t n) {
  /* Pairwise-ish: 8 partial sums keep the loop vectorisable and the rounding
   * error small for the sizes used here (bias gradients). */
  float s[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += x[i + j];
  float t = 0.0f;
  for (; i < n; i++) t += x[i];
  for (int j = 0; j < 8; j++) t += s[j];
  return t;
}

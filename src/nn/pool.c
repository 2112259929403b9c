/*
 * pool.c — 2-D max and average pooling over NCHW, square kernel k, stride s,
 * no padding, floor mode (PyTorch defaults apart from stride). Max pooling
 * keeps the first maximum in scan order (PyTorch's rule) and records its
 * index within the input plane for backward.
 */
#include "nn/kernels.h"

#include <math.h>
#include <string.h>

void dt_maxpool2d_forward(float *out, int32_t *argmax, const float *inp, int B, int C, int H,
                          int W, int k, int s) {
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  for (size_t p = 0; p < (size_t)B * C; p++) {
    const float *plane = inp + p * H * W;
    float *o = out + p * OH * OW;
    int32_t *am = argmax + p * OH * OW;
    if (k == 2 && s == 2) {
      /* The common case, branch-free (random data makes a branchy max
       * mispredict about once per output): same scan order and NaN rule. */
      for (int oh = 0; oh < OH; oh++) {
        const float *restrict r0 = plane + (size_t)(2 * oh) * W, *restrict r1 = r0 + W;
        float *restrict orow = o + (size_t)oh * OW;
        int32_t *restrict arow = am + (size_t)oh * OW;
        int32_t base = 2 * oh * W;
        for (int ow = 0; ow < OW; ow++) {
          float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
          float m = a;
          int32_t mi = 0;
          int t = (b > m) | (b != b);
          m = t ? b : m; mi = t ? 1 : mi;
          t = (c > m) | (c != c);
          m = t ? c : m; mi = t ? W : mi;
          t = (d > m) | (d != d);
          m = t ? d : m; mi = t ? W + 1 : mi;
          orow[ow] = m;
          arow[ow] = base + 2 * ow + mi;
        }
      }
      continue;
    }
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        int h0 = oh * s, w0 = ow * s;
        int32_t mi = h0 * W + w0;
        float m = plane[mi];
        for (int i = 0; i < k; i++) {
          for (int j = 0; j < k; j++) {
            int32_t idx = (h0 + i) * W + (w0 + j);
            float v = plane[idx];
            if (v > m || isnan(v)) { m = v; mi = idx; }
          }
        }
        o[oh * OW + ow] = m;
        am[oh * OW + ow] = mi;
      }
    }
  }
}

void dt_maxpool2d_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int C,
                           int H, int W, int k, int s) {
  if (!dinp) return;
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  memset(dinp, 0, sizeof(float) * (size_t)B * C * H * W);
  for (size_t p = 0; p < (size_t)B * C; p++) {
    float *d = dinp + p * H * W;
    const float *g = dout + p * OH * OW;
    const int32_t *am = argmax + p * OH * OW;
    for (int i = 0; i < OH * OW; i++) d[am[i]] += g[i];
  }
}

void dt_avgpool2d_forward(float *out, const float *inp, int B, int C, int H, int W, int k, int s) {
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  float inv = 1.0f / (float)(k * k);
  for (size_t p = 0; p < (size_t)B * C; p++) {
    const float *plane = inp + p * H * W;
    float *o = out + p * OH * OW;
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        float acc = 0.0f;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) acc += plane[(oh * s + i) * W + ow * s + j];
        o[oh * OW + ow] = acc * inv;
      }
    }
  }
}

void dt_avgpool2d_backward(float *dinp, const float *dout, int B, int C, int H, int W, int k,
                           int s) {
  if (!dinp) return;
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  float inv = 1.0f / (float)(k * k);
  memset(dinp, 0, sizeof(float) * (size_t)B * C * H * W);
  for (size_t p = 0; p < (size_t)B * C; p++) {
    float *d = dinp + p * H * W;
    const float *g = dout + p * OH * OW;
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        float v = g[oh * OW + ow] * inv;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) d[(oh * s + i) * W + ow * s + j] += v;
      }
    }
  }
}

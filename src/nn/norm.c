/*
 * norm.c — layer normalisation (per row over the trailing D elements) and
 * batch normalisation (per channel over batch and space), forward and
 * backward, with PyTorch's semantics: biased variance to normalise, unbiased
 * variance in batchnorm's running estimate, running = (1-m)*running + m*batch.
 * Statistics are accumulated in double: rows and channels are small, and it
 * keeps results within golden-file tolerance for any offset in the data.
 *
 * Batchnorm backward implements the training-mode gradient (statistics
 * depend on the batch); it is not the frozen-statistics (eval) gradient.
 */
#include "nn/kernels.h"

#include <math.h>
#include <string.h>

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int B, int D, float eps) {
  for (int b = 0; b < B; b++) {
    const float *x = inp + (size_t)b * D;
    float *o = out + (size_t)b * D;
    double s = 0.0;
    for (int i = 0; i < D; i++) s += x[i];
    double m = s / D;
    double v = 0.0;
    for (int i = 0; i < D; i++) { double d = x[i] - m; v += d * d; }
    v /= D;
    float rs = (float)(1.0 / sqrt(v + eps));
    float mf = (float)m;
    for (int i = 0; i < D; i++) {
      float n = (x[i] - mf) * rs;
      o[i] = weight ? n * weight[i] + (bias ? bias[i] : 0.0f) : n + (bias ? bias[i] : 0.0f);
    }
    mean[b] = mf;
    rstd[b] = rs;
  }
}

void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int B, int D) {
  if (dweight) memset(dweight, 0, sizeof(float) * D);
  if (dbias) memset(dbias, 0, sizeof(float) * D);
  for (int b = 0; b < B; b++) {
    const float *x = inp + (size_t)b * D, *g = dout + (size_t)b * D;
    float m = mean[b], rs = rstd[b];
    double sg = 0.0, sgn = 0.0; /* sum(dnorm), sum(dnorm * norm) */
    for (int i = 0; i < D; i++) {
      float n = (x[i] - m) * rs;
      float dn = g[i] * (weight ? weight[i] : 1.0f);
      sg += dn;
      sgn += (double)dn * n;
      if (dweight) dweight[i] += g[i] * n;
      if (dbias) dbias[i] += g[i];
    }
    if (!dinp) continue;
    float a = (float)(sg / D), c = (float)(sgn / D);
    float *d = dinp + (size_t)b * D;
    for (int i = 0; i < D; i++) {
      float n = (x[i] - m) * rs;
      float dn = g[i] * (weight ? weight[i] : 1.0f);
      d[i] = (dn - a - n * c) * rs;
    }
  }
}

void dt_batchnorm_forward(float *out, float *mean, float *rstd, float *running_mean,
                          float *running_var, const float *inp, const float *weight,
                          const float *bias, int B, int C, int S, float eps, float momentum,
                          int train) {
  size_t n = (size_t)B * S;
  for (int c = 0; c < C; c++) {
    float mf, rs;
    if (train) {
      double s = 0.0;
      for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * C + c) * S;
        for (int i = 0; i < S; i++) s += x[i];
      }
      double m = s / (double)n, v = 0.0;
      for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * C + c) * S;
        for (int i = 0; i < S; i++) { double d = x[i] - m; v += d * d; }
      }
      double var = v / (double)n;
      double uvar = n > 1 ? v / (double)(n - 1) : var;
      if (running_mean)
        running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * m);
      if (running_var)
        running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * uvar);
      mf = (float)m;
      rs = (float)(1.0 / sqrt(var + eps));
    } else {
      mf = running_mean[c];
      rs = (float)(1.0 / sqrt((double)running_var[c] + eps));
    }
    mean[c] = mf;
    rstd[c] = rs;
    float w = weight ? weight[c] : 1.0f, bb = bias ? bias[c] : 0.0f;
    float scale = rs * w, shift = bb - mf * rs * w;
    for (int b = 0; b < B; b++) {
      const float *restrict x = inp + ((size_t)b * C + c) * S;
      float *restrict o = out + ((size_t)b * C + c) * S;
      for (int i = 0; i < S; i++) o[i] = x[i] * scale + shift;
    }
  }
}

void dt_batchnorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int B, int C, int S) {
  size_t n = (size_t)B * S;
  for (int c = 0; c < C; c++) {
    float m = mean[c], rs = rstd[c];
    double sg = 0.0, sgn = 0.0; /* sum(dout), sum(dout * norm) */
    for (int b = 0; b < B; b++) {
      const float *x = inp + ((size_t)b * C + c) * S, *g = dout + ((size_t)b * C + c) * S;
      for (int i = 0; i < S; i++) {
        sg += g[i];
        sgn += (double)g[i] * ((x[i] - m) * rs);
      }
    }
    if (dweight) dweight[c] = (float)sgn;
    if (dbias) dbias[c] = (float)sg;
    if (!dinp) continue;
    float w = weight ? weight[c] : 1.0f;
    float a = (float)(sg / (double)n), k = (float)(sgn / (double)n);
    float sc = w * rs;
    for (int b = 0; b < B; b++) {
      const float *restrict x = inp + ((size_t)b * C + c) * S, *restrict g = dout + ((size_t)b * C + c) * S;
      float *restrict d = dinp + ((size_t)b * C + c) * S;
      for (int i = 0; i < S; i++) d[i] = sc * (g[i] - a - ((x[i] - m) * rs) * k);
    }
  }
}

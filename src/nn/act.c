/*
 * act.c — element-wise activations: ReLU and exact (erf) GELU, forward and
 * backward over flat arrays. No tanh approximation: GELU matches PyTorch's
 * default approximate='none'.
 */
#include "nn/kernels.h"

#include <math.h>

void dt_relu_forward(float *out, const float *inp, size_t N) {
  /* out may alias inp, so no restrict here; the loop still vectorises. */
  for (size_t i = 0; i < N; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void dt_relu_backward(float *dinp, const float *dout, const float *out, size_t N) {
  if (!dinp) return;
  for (size_t i = 0; i < N; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

void dt_gelu_forward(float *out, const float *inp, size_t N) {
  for (size_t i = 0; i < N; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + erff(x * INV_SQRT2));
  }
}

void dt_gelu_backward(float *dinp, const float *dout, const float *inp, size_t N) {
  if (!dinp) return;
  for (size_t i = 0; i < N; i++) {
    float x = inp[i];
    float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
    float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}

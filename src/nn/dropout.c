/*
 * dropout.c — inverted dropout whose mask is a pure function of
 * (seed, step, global sample index, layer id, element), drawn from the
 * counter-based RNG (stream DT_RNG_DROPOUT). The rank and the position of a
 * sample inside a local batch never enter, so any split of the global batch
 * over workers draws the same masks.
 *
 * Counter layout: a = step; b = H(global sample, layer id) + element/4, where
 * H is a 64-bit mix, and each Philox call yields 4 uniforms for 4 consecutive
 * elements. An element is kept when its 24-bit uniform u in [0,1) has
 * u >= p, so P(keep) = 1 - p up to 2^-24.
 */
#include "core/core.h"
#include "nn/kernels.h"

static uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void dt_dropout_forward(float *out, float *mask, const float *inp, int B, size_t D, float p,
                        uint64_t seed, uint64_t step, int64_t sample0, int layer_id) {
  size_t N = (size_t)B * D;
  if (!(p > 0.0f)) { /* p <= 0 (or NaN): identity */
    for (size_t i = 0; i < N; i++) { mask[i] = 1.0f; out[i] = inp[i]; }
    return;
  }
  if (p >= 1.0f) {
    for (size_t i = 0; i < N; i++) { mask[i] = 0.0f; out[i] = 0.0f; }
    return;
  }
  float scale = 1.0f / (1.0f - p);
  uint64_t lkey = mix64((uint64_t)(uint32_t)layer_id ^ 0x632BE59BD9B4E019ull);
  for (int b = 0; b < B; b++) {
    uint64_t base = mix64((uint64_t)(sample0 + b) ^ lkey);
    float *m = mask + (size_t)b * D;
    const float *x = inp + (size_t)b * D;
    float *o = out + (size_t)b * D;
    for (size_t j = 0; j < D; j += 4) {
      uint32_t r[4];
      dt_rng4(seed, DT_RNG_DROPOUT, step, base + j / 4, r);
      size_t n = D - j < 4 ? D - j : 4;
      for (size_t t = 0; t < n; t++) m[j + t] = dt_u32_to_unit(r[t]) >= p ? scale : 0.0f;
    }
    for (size_t j = 0; j < D; j++) o[j] = x[j] * m[j];
  }
}

void dt_dropout_backward(float *dinp, const float *dout, const float *mask, size_t N) {
  if (!dinp) return;
  for (size_t i = 0; i < N; i++) dinp[i] = dout[i] * mask[i];
}

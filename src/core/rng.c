/*
 * rng.c — the counter-based RNG: Philox4x32-10 and helpers built on it
 * (uniform fills, permutations). Every random number in dtrain is a pure
 * function of (seed, stream, counter), so data order, initialisation and
 * dropout do not depend on how many workers there are or which thread runs.
 */
#include "core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void dt_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
  uint32_t k0 = key[0], k1 = key[1];
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void dt_rng4(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b, uint32_t out[4]) {
  /* The stream is folded into the key so different purposes never share a
   * counter space. */
  uint32_t key[2] = {(uint32_t)seed ^ (stream * 0x85EBCA6Bu), (uint32_t)(seed >> 32) + stream};
  uint32_t ctr[4] = {(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32)};
  dt_philox4x32(key, ctr, out);
}

void dt_rng_uniform(float *out, size_t n, float lo, float hi, uint64_t seed, uint32_t stream,
                    uint64_t a) {
  float scale = hi - lo;
  for (size_t i = 0; i < n; i += 4) {
    uint32_t r[4];
    dt_rng4(seed, stream, a, i / 4, r);
    for (size_t j = 0; j < 4 && i + j < n; j++) out[i + j] = lo + scale * dt_u32_to_unit(r[j]);
  }
}

/* Unbiased integer in [0, bound) by Lemire's multiply-shift with rejection. */
static uint64_t bounded(uint64_t seed, uint32_t stream, uint64_t a, uint64_t *ctr, uint64_t bound) {
  for (;;) {
    uint32_t r[4];
    dt_rng4(seed, stream, a, (*ctr)++, r);
    uint64_t x = ((uint64_t)r[0] << 32) | r[1];
    /* 64-bit x times bound, high word; reject the small biased zone. */
    __uint128_t m = (__uint128_t)x * bound;
    uint64_t lo = (uint64_t)m;
    if (lo >= bound || lo >= (uint64_t)(-bound) % bound) return (uint64_t)(m >> 64);
  }
}

void dt_rng_permutation(int64_t *perm, int64_t n, uint64_t seed, uint32_t stream, uint64_t a) {
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  uint64_t ctr = 0;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)bounded(seed, stream, a, &ctr, (uint64_t)i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

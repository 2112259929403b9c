/*
 * codec_simd.h — what codec.c and its vector kernels (codec_simd.c)
 * share: the Philox block's layout and key schedule, and the kernels'
 * prototypes. Each DT_CZ_V_* is 1 when the build's target has that
 * kernel's instructions (-march=native: AVX-512 first, else AVX2 with
 * F16C / FMA where a kernel needs them) and 0 otherwise; codec.c then
 * runs its portable loops alone. A kernel takes what its vectors can
 * (whole vectors or whole blocks), returns how far it got and leaves the
 * tail to codec.c's portable loop: the same bits either way
 * (tests/compress/test_codec_simd.c builds codec.c without the target
 * macros and compares).
 *
 * Nothing outside src/comm/compress/ includes it.
 */
#ifndef DT_COMM_COMPRESS_CODEC_SIMD_H
#define DT_COMM_COMPRESS_CODEC_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "comm/compress/compress.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#define DT_CZ_V_PHILOX 1 /* dt__cz_philox16_v */
#define DT_CZ_V_MAXABS 1 /* dt__cz_maxabs_bits_v */
#define DT_CZ_V_SIGN 1   /* dt__cz_sign_pack_v, dt__cz_sign_unpack_add_v */
#else
#define DT_CZ_V_PHILOX 0
#define DT_CZ_V_MAXABS 0
#define DT_CZ_V_SIGN 0
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
#define DT_CZ_V_F16 1 /* dt__cz_to_f16_v, dt__cz_from_f16_v */
#else
#define DT_CZ_V_F16 0
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define DT_CZ_V_QUANT 1 /* dt__cz_quantize_v */
#else
#define DT_CZ_V_QUANT 0
#endif

#define DT_CZ_LANES 16   /* Philox counters per call */
#define DT_CZ_UBLOCK 128 /* uniforms per Philox call: 16 lanes x 4 words x 2 halves */

/* Philox's key and counters for uniform block `block` of a stream. */
typedef struct { uint32_t k0, k1, c0, c1, c2, c3; } dt__cz_phx;
static inline dt__cz_phx dt__cz_block_args(dt_cz_rng rng, uint64_t block) {
  dt__cz_phx a = {(uint32_t)rng.seed, (uint32_t)(rng.seed >> 32) ^ 0x637a0000u,
                  (uint32_t)(block * DT_CZ_LANES),
                  (uint32_t)(block >> 28) + ((uint32_t)(rng.stream >> 32) << 12),
                  (uint32_t)rng.step,
                  (uint32_t)rng.stream ^ (uint32_t)(rng.step >> 32) * 0x9E3779B9u};
  return a;
}

/* Philox4x32-10 of counters c0base + 0..15 (c1..c3 shared): word w of
 * lane l in out[w][l]. */
void dt__cz_philox16_v(uint32_t k0, uint32_t k1, uint32_t c0base, uint32_t c1, uint32_t c2,
                       uint32_t c3, uint32_t out[4][DT_CZ_LANES]);
/* f32 -> f16 (resid, if not NULL, gets x - decoded) and f16 -> f32 (added
 * to out when add): values done, a multiple of 16. */
size_t dt__cz_to_f16_v(const float *x, uint16_t *h, float *resid, size_t n);
size_t dt__cz_from_f16_v(const uint16_t *h, float *out, size_t n, int add);
/* The largest |x| bits of xb[0 .. *done), *done a multiple of 32. */
uint32_t dt__cz_maxabs_bits_v(const uint32_t *xb, size_t n, size_t *done);
/* codec.c's quantize over whole uniform blocks: blocks done. */
size_t dt__cz_quantize_v(const float *x, int8_t *q, float *resid, size_t n, float inv, float step,
                         float lim, dt_cz_rng rng, uint64_t block0, int magnitude);
/* Sign bits of x (x >= 0, ordered) 8 to a byte, resid = x -+ s; and the
 * decode, out += +-s: values done, a multiple of 8. */
size_t dt__cz_sign_pack_v(const float *x, uint8_t *bits, float *resid, size_t n, float s);
size_t dt__cz_sign_unpack_add_v(const uint8_t *bits, float *out, size_t n, float s);

#endif /* DT_COMM_COMPRESS_CODEC_SIMD_H */

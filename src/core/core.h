/*
 * core.h — the base layer every other layer may include: error recording and
 * the DT_CHECK macros, logging, tunable parameters read from the environment,
 * aligned allocation, clocks, the counter-based RNG (Philox4x32-10) and
 * crc32c. Nothing here knows about tensors, models or networks.
 */
#ifndef DT_CORE_H
#define DT_CORE_H

#include "dtrain/core.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors ------------------------------------------------------------ */

/* Records a one-line message for dt_errmsg() and returns rc, so callers can
 * write `return dt__seterr(DT_EINVAL, "%s:%d: ...", file, line);`. */
int dt__seterr(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current thread message with more context ("loading x: <old>"). */
int dt__preerr(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt__clearerr(void);

#define DT_CHECK(call)                                                         \
  do {                                                                         \
    int dt__rc_ = (call);                                                      \
    if (dt__rc_ < 0) return dt__rc_;                                           \
  } while (0)

#define DT_CHECK_GOTO(call, rc, label)                                         \
  do {                                                                         \
    (rc) = (call);                                                             \
    if ((rc) < 0) goto label;                                                  \
  } while (0)

/* ---- logging ----------------------------------------------------------- */

enum dt_log_level { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG };

/* Log to stderr if level <= the DTRAIN_LOG_LEVEL parameter (default INFO;
 * accepts error|warn|info|debug or 0..3). Thread-safe: one write per line. */
void dt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define DT_LOG_ERR(...) dt_log(DT_LOG_ERROR, __VA_ARGS__)
#define DT_LOG_WARN(...) dt_log(DT_LOG_WARN, __VA_ARGS__)
#define DT_LOG_INFO(...) dt_log(DT_LOG_INFO, __VA_ARGS__)
#define DT_LOG_DEBUG(...) dt_log(DT_LOG_DEBUG, __VA_ARGS__)

/* ---- parameters (NCCL style: every knob from the environment) ---------- */

/* Reads environment variable `name` as an integer; returns `def` if unset.
 * A set but malformed value logs a warning naming the variable and returns
 * def. Values are read once per call (cheap enough; cache in hot paths). */
int64_t dt_param_int(const char *name, int64_t def);
const char *dt_param_str(const char *name, const char *def);

/* ---- memory ------------------------------------------------------------ */

/* 64-byte aligned allocation (cache line / AVX-512). Free with dt_free. */
void *dt_alloc(size_t bytes);
void *dt_calloc(size_t bytes);
void dt_free(void *p);

/* ---- clocks ------------------------------------------------------------ */

double dt_now(void);       /* monotonic seconds */
int64_t dt_now_ns(void);   /* monotonic nanoseconds */

/* ---- counter-based RNG -------------------------------------------------- */

/* Philox4x32-10 (Salmon et al., SC'11): a pure function of (key, counter).
 * dtrain keys randomness by (seed, purpose) and counts by (step, global sample
 * index, element), never by rank, so results do not depend on the number of
 * workers. */
typedef struct dt_philox_ctr { uint32_t v[4]; } dt_philox_ctr;
void dt_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

/* Convenience: 4 random u32 for (seed, stream, a, b). `stream` separates
 * purposes (init, shuffle, dropout, ...). */
void dt_rng4(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b, uint32_t out[4]);
/* Uniform float in [0,1) from 24 random bits. */
static inline float dt_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

enum dt_rng_stream {
  DT_RNG_INIT = 1,    /* parameter initialisation: a = layer index, b = element block */
  DT_RNG_SHUFFLE = 2, /* data order: a = epoch */
  DT_RNG_DROPOUT = 3, /* dropout: a = step, b = (global sample index, layer, element block) */
  DT_RNG_AUGMENT = 4,
  DT_RNG_USER = 16
};

/* Fills `n` uniform floats in [lo, hi) as a pure function of (seed, stream, a)
 * and the element index. */
void dt_rng_uniform(float *out, size_t n, float lo, float hi, uint64_t seed,
                    uint32_t stream, uint64_t a);
/* Fisher-Yates permutation of 0..n-1 as a pure function of (seed, stream, a). */
void dt_rng_permutation(int64_t *perm, int64_t n, uint64_t seed, uint32_t stream, uint64_t a);

/* ---- checksums --------------------------------------------------------- */

uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t len);
/* SHA-256 of buf, the 32 raw bytes (OpenSSL libcrypto). */
void dt_sha256(const void *buf, size_t len, uint8_t out[32]);
/* SHA-256 of buf as 64 lowercase hex digits plus NUL. */
void dt_sha256_hex(const void *buf, size_t len, char out[65]);
/* n bytes as 2n lowercase hex digits plus NUL (out holds 2n + 1 chars). */
void dt_hex(const uint8_t *bytes, size_t n, char *out);

#endif /* DT_CORE_H */

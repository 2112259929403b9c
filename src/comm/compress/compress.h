/*
 * compress.h — gradient compression for data-parallel synchronisation
 * (docs/compress.md): codecs that shrink one bucket of f32 gradients for
 * the wire, error feedback (what a codec did not send is added to the
 * next step's gradient), and the per-bucket compressed reduction the ddp
 * layer calls instead of a dense allreduce.
 *
 * Codecs, by how they are reduced:
 *   linear (allreduce):  fp16, bf16 (cast for the wire, summed by the
 *                        collective), powersgd (low rank: P = MQ and
 *                        Q = M^T P are allreduced in f32);
 *   int8 ring:           a ring allreduce whose hops carry int8 frames
 *                        with a step per block, requantised at every hop
 *                        (dt__cz_i8b_*, below);
 *   framed (allgather):  qsgd (norm-scaled levels, stochastic rounding),
 *                        sign (scaled sign, 1 bit per value), topk
 *                        (DGC-style sparsification). Every rank sends one
 *                        fixed-size frame; every rank decodes all frames
 *                        in rank order, so all ranks end with the same bits.
 * Randomness (stochastic rounding, top-k sampling, PowerSGD's first Q) is
 * counter-based: keyed by (seed, step, bucket offset, rank), so a run is
 * reproducible for a fixed worker count.
 *
 * Frames (compressed data crossing the network) are validated before a
 * single value is used: a bad frame is DT_ECORRUPT with a message naming
 * the field, never a wild write (tests/fuzz/fuzz_comm_compress.c).
 *
 * Not here: the choice of buckets (parallel/ddp.c), the transports, and
 * the decision to compress at all (dt__compress_pays: compression is left
 * off on one host unless forced).
 */
#ifndef DT_COMM_COMPRESS_H
#define DT_COMM_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef enum dt_codec {
  DT_CODEC_NONE,
  DT_CODEC_FP16,
  DT_CODEC_BF16,
  DT_CODEC_INT8,
  DT_CODEC_QSGD,
  DT_CODEC_SIGN,
  DT_CODEC_TOPK,
  DT_CODEC_POWERSGD,
  DT_CODEC_COUNT
} dt_codec;

/* "none", "fp16", ... (index = dt_codec, NULL-terminated). */
extern const char *const dt__codec_names[];

typedef struct dt_compress_cfg {
  int codec;             /* enum dt_codec (dist.compress) */
  int error_feedback;    /* dist.error_feedback: keep and re-add the residual */
  double ratio;          /* topk: fraction of values sent (dist.compress_ratio) */
  int qsgd_levels;       /* qsgd: levels per sign, 1..127 (dist.qsgd_levels) */
  int rank;              /* powersgd: rank of the approximation (dist.powersgd_rank) */
  int warm_rank;         /* powersgd: rank before step warm_steps, 0 = rank (dist.powersgd_warm_rank) */
  int64_t warm_steps;    /* powersgd: steps at warm_rank (dist.powersgd_warm_steps) */
  int warmup_epochs;     /* topk: density 1/4, 1/16, ... over these epochs */
  int64_t start_step;    /* dense allreduce before this step (dist.compress_start_step) */
  float clip;            /* local L2 clip of a bucket's gradient, 0 = off */
  float momentum;        /* worker momentum before the codec (0 = off); topk also masks what it sent (DGC) */
  uint64_t seed;         /* train.seed */
  int sign_blocks;       /* sign: block rule 0..3 (DTRAIN_CZ_SIGN_BLOCKS), -1: that knob's */
  int sign_two;          /* sign: two scales per block (DTRAIN_CZ_SIGN_TWO), -1: that knob's */
  /* sign's momentum before the codec under the optimizer's own (signum,
   * DTRAIN_CZ_SIGN_MOM): > 0 (= momentum, = the optimizer's SGD momentum,
   * no dampening, no Nesterov) hands the optimizer D_t - m D_{t-1}, D the
   * summed decoded velocities, so its momentum buffer is their sum plus
   * the weight decay it adds, as in dense SGD; 0 off */
  float opt_momentum;
  /* sign with a block plan: every weight matrix, and every stretch of
   * parameters between matrices (biases, other layers), of at most this
   * many values is sent dense (f32) inside the sign frame
   * (DTRAIN_CZ_SIGN_DENSE); 0 none, -1: that knob's */
  int64_t sign_dense;
} dt_compress_cfg;
#define DT_COMPRESS_CFG_INIT {DT_CODEC_NONE, 1, 0.01, 15, 2, 0, 0, 0, 0, 0.0f, 0.0f, 42, -1, -1, 0.0f, -1}

/* Linear codecs are reduced by allreduce, the others by allgather. */
int dt_codec_is_linear(int codec);

/* ---- frames (one bucket of one rank) --------------------------------------
 * Little-endian header, then the payload:
 *   int8: n int8 (value = q x scale)
 *   qsgd: ceil(n/512) f32 steps (norm/levels of each chunk of 512), n int8
 *   sign: ceil(n/256) f32 scales (mean |x| of each block of 256 values),
 *         then ceil(n/8) bytes (bit i = value i >= 0)
 *   topk: k uint32 indices (strictly increasing, < n), then k f32 values
 *   fp16, bf16: n uint16 (bench and tests; the reduction sends them raw) */
#define DT_CZ_MAGIC 0x5a43544cu /* "LTCZ" */
#define DT_CZ_VERSION 2 /* 2: sign frames carry a scale per block */
#define DT_CZ_HDR_LEN 24
#define DT_CZ_QSGD_CHUNK 512 /* values per qsgd norm (a multiple of 128) */
#define DT_CZ_SIGN_BLOCK 256 /* values per sign scale (a multiple of 16) */
typedef struct dt_cz_hdr {
  uint32_t magic;
  uint8_t codec, version, levels, flags; /* levels: qsgd only; flags: 0 */
  uint32_t n;                            /* values in the bucket */
  uint32_t k;                            /* entries: k for topk, n otherwise */
  float scale;                           /* int8: step; others 1 */
  uint32_t reserved;                     /* 0 */
} dt_cz_hdr;

/* Bytes of a frame of codec for n values (k entries for topk), rounded up
 * to 8 so frames can sit back to back. */
size_t dt_cz_frame_bytes(int codec, size_t n, size_t k);

/* Encodes x[0..n) into frame (dt_cz_frame_bytes(codec, n, k) bytes). If
 * resid is not NULL it receives x minus what the frame decodes to (the
 * error-feedback residual; may alias x). rng = (seed, step, stream id):
 * the stochastic rounding of int8/qsgd, the threshold sample of topk.
 * topk sends exactly k = the frame's entry count (1 <= k <= n). */
typedef struct dt_cz_rng { uint64_t seed, step, stream; } dt_cz_rng;
int dt_cz_encode(int codec, const float *x, size_t n, size_t k, int levels, dt_cz_rng rng,
                 void *frame, float *resid);
/* Validates a frame (bytes long) for codec and n values and adds what it
 * encodes to out[0..n). DT_ECORRUPT with a message naming the field (bad
 * magic, version, codec, n, k beyond the bucket, an index out of range or
 * out of order, a non-finite scale or value, a truncated frame); out is
 * untouched then. */
int dt_cz_decode_add(int codec, const void *frame, size_t bytes, size_t n, float *out);

/* Counter-based uniform draws in [0,1) for stochastic rounding: u[i] for
 * element `first + i` of stream (rng). Exposed for tests. */
void dt__cz_uniform(dt_cz_rng rng, size_t first, float *u, size_t n);

/* ---- int8 frames of the compressed ring (exposed for tests and fuzzing) ----
 * The int8 reduction is a ring allreduce whose every hop carries a chunk's
 * partial sum as one of these frames: the header (codec int8, flag
 * DT_CZ_FLAG_BLOCKS, n = k = the chunk's values, scale 1), then
 * ceil(n/DT_CZ_I8_BLOCK) f32 steps (max |x| / 127 of each block), then n
 * int8 (value = q x step); n may be 0. _bytes: the frame's size, rounded up
 * to 8. _encode: stochastic rounding keyed by rng; resid (may be NULL or
 * alias x) gets x - decoded; flags are added to the header's (the note).
 * _decode_add validates the whole frame first (DT_ECORRUPT naming the
 * field, out untouched) and returns the header's flags in *flags (may be
 * NULL). */
#define DT_CZ_FLAG_BLOCKS 4    /* int8 ring frame: a step per block */
#define DT_CZ_I8_BLOCK 256     /* values per int8 ring step (a multiple of 128) */
#define DT_CZ_RING_TAG 0x7c5a20 /* the ring's user tag on the workers' communicator */
size_t dt__cz_i8b_bytes(size_t n);
void dt__cz_i8b_encode(const float *x, size_t n, dt_cz_rng rng, void *frame, float *resid,
                       int flags);
int dt__cz_i8b_decode_add(const void *frame, size_t bytes, size_t n, float *out, int *flags);

/* ---- sign frames over a block plan (exposed for tests and fuzzing) --------
 * end[0..nb) are where the blocks end (strictly increasing, end[nb-1] = n;
 * end NULL: blocks of DT_CZ_SIGN_BLOCK values from the start, the frames
 * of dt_cz_encode). A plan's frame has the flag DT_CZ_FLAG_BLOCKS and k =
 * nb; with two (a plan only) each block carries two scales, the mean of
 * its values >= 0 and the mean |x| of the others (DT_CZ_FLAG_TWO), else
 * one, the mean |x|. Payload: the scales (f32, block order; two: positive
 * then negative), then ceil(n/8) bytes of bits (bit i = value i >= 0).
 * _bytes: the frame's size, rounded up to 8. _encode: resid (NULL, or
 * may alias x) gets x - decoded; flags (DT_CZ_FLAG_NOTE) are added to the
 * header's; DT_EINVAL for a bad plan. _decode_add validates the whole
 * frame against the receiver's own plan first (DT_ECORRUPT naming the
 * field, out untouched). */
#define DT_CZ_FLAG_TWO 8 /* sign frame: two scales per block */
size_t dt__cz_sign_bytes(size_t n, size_t nb, int two);
int dt__cz_sign_encode(const float *x, size_t n, const uint32_t *end, size_t nb, int two,
                       void *frame, float *resid, int flags);
int dt__cz_sign_decode_add(const void *frame, size_t bytes, size_t n, const uint32_t *end,
                           size_t nb, int two, float *out);
/* The same with dense blocks (DTRAIN_CZ_SIGN_DENSE): dense[b] != 0 (dense
 * NULL: none) sends block b's values as they are, in f32, and its
 * residual is 0. Such a frame has the flag DT_CZ_FLAG_DENSE and, after
 * the bits on a 4-byte boundary, the dense values' count (u32) and the
 * values in block order; a dense block's scales are 0 and its bits
 * unused. The receiver's plan (end and dense) must give the same count:
 * a frame with a dense section the plan lacks, without one it has, or
 * with another count is DT_ECORRUPT, as is a non-finite dense value in a
 * frame not flagged DT_CZ_FLAG_NONFINITE. _bytes_d: nd = the dense
 * values (0: no section; the size of dt__cz_sign_bytes). */
#define DT_CZ_FLAG_DENSE 16 /* sign frame: dense blocks' values follow the bits */
size_t dt__cz_sign_bytes_d(size_t n, size_t nb, int two, size_t nd);
int dt__cz_sign_encode_d(const float *x, size_t n, const uint32_t *end, size_t nb, int two,
                         const uint8_t *dense, void *frame, float *resid, int flags);
int dt__cz_sign_decode_add_d(const void *frame, size_t bytes, size_t n, const uint32_t *end,
                             size_t nb, int two, const uint8_t *dense, float *out);

/* ---- PowerSGD pieces (exposed for tests) ---------------------------------- */
/* Orthonormalises the r columns of p (m x r, row-major) in place: modified
 * Gram-Schmidt in double, twice. A column with no norm left becomes 0. */
void dt__cz_orthonormalize(float *p, int m, int r);

/* PowerSGD's products (powersgd.c; exposed for tests) of M (rows x cols,
 * row-major), P (rows x r, row-major) and Q (r x cols: r contiguous
 * columns), r <= 64: P = M Q; Q = M^T P; out = (M or 0) + sgn P Q^T. Every
 * element is a chain of fused multiply-adds in a fixed order (P: 16 lane
 * sums over the columns, added in lane order, then the columns past the
 * last 16; Q: over rows; out: over j): the AVX-512 kernels and the
 * portable loops (contracted to fused multiply-adds by the compiler where
 * the machine has them) give the same bits. */
void dt__cz_psgd_pmq(const float *M, int rows, int cols, const float *Q, int r, float *P);
void dt__cz_psgd_qmtp(const float *M, int rows, int cols, const float *P, int r, float *Q);
void dt__cz_psgd_pq(const float *M, int rows, int cols, const float *P, int r, const float *Q,
                    float sgn, float *out);

/* ---- the compressed reduction of a model's buckets ------------------------ */

typedef struct dt_compress dt_compress;

/* A weight matrix inside the gradient buffer (rows x cols at off, row
 * major): powersgd compresses these; everything else goes dense. */
typedef struct dt_cz_matrix { size_t off; int rows, cols; } dt_cz_matrix;

/* A compressor for nparams gradients of rank `rank` of nranks; mats (may be
 * NULL with nmats 0) are copied. DT_EINVAL naming the key on a bad cfg. */
int dt_compress_create(dt_compress **out, const dt_compress_cfg *cfg, size_t nparams,
                       const dt_cz_matrix *mats, int nmats, int rank, int nranks);
void dt_compress_destroy(dt_compress *z);
/* The step (0-based optimizer step) and epoch (0-based) that follow. */
void dt_compress_begin_step(dt_compress *z, int64_t step, int epoch);
/* Collective over c: g[off .. off+n) of every rank, each scaled by its own
 * `scale`, is compressed (with error feedback) and summed over ranks; the
 * sum replaces g's span on every rank, bit-identical everywhere. Spans
 * passed in one step must not overlap; the same spans come in the same
 * order on every rank. One caller thread at a time. */
int dt_compress_reduce(dt_compress *z, dt_comm *c, float *g, size_t off, size_t n, float scale);

/* Fuses the framed codecs' (qsgd, sign, topk) collectives of a step: every
 * step's compressed reductions are nspans spans (ddp's buckets, every rank
 * alike); each is encoded (with its error feedback) when it comes, and the
 * last one sends all of this rank's frames in one allgather and writes the
 * sums of every span. Until then an earlier span of the step is not
 * reduced yet (ddp reads none before the step's last reduction returns).
 * One collective per step instead of one per bucket: fewer rounds in which
 * every rank must be scheduled. nspans <= 1 turns it off; other codecs and
 * the dense steps before dist.compress_start_step ignore it. DT_ENOMEM. */
int dt_compress_fuse(dt_compress *z, int nspans);

/* Checkpoint notes (engine/ckpt_run.c): one flag rank 0 sends along with a
 * step's compressed gradients — a bit in its frames' header, one extra
 * element of the fp16/bf16 or PowerSGD allreduce — so every rank learns
 * of a checkpoint only rank 0 decided (a timer, a signal) without a
 * collective of its own. Steps before dist.compress_start_step send their
 * gradients dense: with notes enabled one 4-byte broadcast per step
 * carries the flag then. _enable: every rank alike, before a step. _set:
 * after dt_compress_begin_step, this rank's flag for the step (only rank
 * 0's counts). _get: after the step's reductions, rank 0's flag (0 when
 * the step reduced nothing). */
void dt_compress_note_enable(dt_compress *z);
void dt_compress_note_set(dt_compress *z, int note);
int dt_compress_note_get(const dt_compress *z);

/* The residual error feedback keeps (nparams floats; NULL without EF). */
const float *dt_compress_residual(const dt_compress *z);

/* This worker's state for a checkpoint (state.c): the residual, the worker
 * momentum and PowerSGD's Q, with a header naming the codec, the parts,
 * the gradient count and this rank of nranks. _bytes: its size (0: the
 * compressor keeps no state, e.g. fp16 without error feedback). _save
 * fills exactly that many bytes. _load checks the header first: another
 * codec, parts, worker count, rank, model or PowerSGD rank is DT_EMISMATCH
 * naming both sides and leaves z as it was; a bad length or magic is
 * DT_ECORRUPT. */
size_t dt_compress_state_bytes(const dt_compress *z);
int dt_compress_state_save(const dt_compress *z, void *buf, size_t len);
int dt_compress_state_load(dt_compress *z, const void *buf, size_t len);

typedef struct dt_compress_stats {
  uint64_t bytes_sent;   /* payload this rank contributed to collectives */
  uint64_t dense_bytes;  /* what 4-byte values would have been */
  int64_t buckets;       /* reductions done */
} dt_compress_stats;
void dt_compress_get_stats(const dt_compress *z, dt_compress_stats *out);

/* `dtrain bench compress`: every framed codec's encode and decode speed on
 * one core for buckets of n values (topk at ratio), each measured for
 * about `seconds`; a table to out_file (a FILE *). */
int dt_cz_bench(void *out_file, size_t n, double ratio, double seconds);

/* Whether compression pays on communicator c: not when every rank shares
 * one host (memory speed; the tuning rule of docs/compress.md), unless
 * forced. */
int dt__compress_pays(const dt_comm *c, int forced);

#endif /* DT_COMM_COMPRESS_H */

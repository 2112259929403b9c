/*
 * compress_int.h — what the files of src/comm/compress/ share among
 * themselves: header helpers, the raw fp16/bf16 kernels, top-k's frame
 * halves and the compressor's state. Nothing outside this folder includes
 * it (tests and the benchmark use compress.h).
 */
#ifndef DT_COMM_COMPRESS_INT_H
#define DT_COMM_COMPRESS_INT_H

#include "comm/compress/compress.h"

#define DT_CZ_FLAG_NONFINITE 1 /* the encoded input held Inf/NaN: decode adds NaN */
#define DT_CZ_FLAG_NOTE 2      /* rank 0's checkpoint note (dt_compress_note_set) */

void dt__cz_put_hdr(void *frame, int codec, int levels, int flags, size_t n, size_t k, float scale);
int dt__cz_check_hdr(int codec, const void *frame, size_t bytes, size_t n, dt_cz_hdr *h);

/* Raw conversions; resid (may be NULL or alias x) gets x - decoded. */
void dt__cz_to_f16(const float *x, uint16_t *h, float *resid, size_t n);
void dt__cz_from_f16(const uint16_t *h, float *out, size_t n, int add);
void dt__cz_to_bf16(const float *x, uint16_t *h, float *resid, size_t n);
void dt__cz_from_bf16(const uint16_t *h, float *out, size_t n, int add);

int dt__cz_topk_encode(const float *x, size_t n, size_t k, dt_cz_rng rng, void *frame, float *resid,
                       int flags);
int dt__cz_topk_decode_add(const dt_cz_hdr *h, const uint8_t *payload, float *out);
/* Entries top-k sends for n values at density d (at least 1, at most n). */
size_t dt__cz_topk_k(size_t n, double density);

struct dt_compress {
  dt_compress_cfg cfg;
  size_t nparams;
  int rank, nranks;
  float *resid;          /* error feedback: nparams (NULL without EF) */
  float *mom;            /* topk momentum correction: nparams (NULL without) */
  float *prev;           /* cfg.opt_momentum: last step's summed velocities D (NULL without) */
  float *work;           /* the bucket's gradient plus residual: nparams */
  uint8_t *frames;       /* allgather: every rank's frame */
  size_t frames_cap;
  uint16_t *half;        /* fp16/bf16 wire buffer */
  size_t half_cap;
  dt_cz_matrix *mats;    /* powersgd */
  int nmats;
  float **q;             /* powersgd: each matrix's Q (cols x rank), warm-started */
  float *pq;             /* powersgd: P's / Q's and the dense rest of a bucket */
  size_t pq_cap;
  /* fused framed collectives (dt_compress_fuse): this step's spans so far */
  int fuse;              /* spans per step sent in one allgather (0, 1: each alone) */
  int npend;
  /* framed: g the span, fb its frame's bytes, at the frame's place in
   * sbuf; powersgd: g the gradients' base, at the span's offset */
  struct dt_cz_pend { float *g; size_t n, fb, at, off; } *pend; /* fuse entries */
  uint8_t *sbuf;         /* this rank's frames of the step, back to back */
  size_t sbuf_cap, spos;
  /* sign's block plan (DTRAIN_CZ_SIGN_BLOCKS > 0): blocks never straddle
   * the starts in sseg (rows, layers; sorted, sseg[0] = 0) and hold at
   * most sblk values (0: no cut); stwo: two scales per block */
  size_t *sseg, nsseg, sblk;
  int splan, stwo;
  uint32_t *plan;        /* one span's block ends */
  size_t plan_cap;
  size_t plan_off, plan_n, plan_nb; /* the span z->plan is for (plan_nb 0: none) */
  /* DTRAIN_CZ_SIGN_DENSE: sdense[j] != 0 sends segment j dense (NULL:
   * none is); pdense the span's blocks' flags, pnd their values */
  uint8_t *sdense, *pdense;
  size_t pnd;
  int64_t step;
  int epoch;
  dt_compress_stats st;
  /* checkpoint notes: rank 0's flag rides with the step's collectives */
  int note_on;           /* dense steps: a broadcast carries it */
  int note_out;          /* this rank's flag for the step (0 but on rank 0) */
  int note_in;           /* rank 0's flag, once a reduction of the step ran */
  int note_dense_done;   /* the dense broadcast of this step ran */
};

int dt__cz_powersgd_reduce(dt_compress *z, dt_comm *c, float *g, size_t off, size_t n);

/* powersgd: the columns each matrix's Q keeps (the larger of the rank and
 * the warm rank; the steps at the lower one use Q's first columns). */
static inline int dt__cz_qrank(const dt_compress *z) {
  return z->cfg.warm_rank > z->cfg.rank ? z->cfg.warm_rank : z->cfg.rank;
}

#endif /* DT_COMM_COMPRESS_INT_H */

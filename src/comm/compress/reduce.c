/*
 * reduce.c — the compressor of one model's gradients (dt_compress): per
 * bucket it forms the value to send (this rank's scaled gradient, clipped
 * if asked, passed through DGC's local momentum if asked, plus the error
 * feedback residual), compresses it, runs the collective that suits the
 * codec (allreduce for fp16/bf16/powersgd, a ring of int8 frames for
 * int8, allgather of fixed-size frames for qsgd/sign/topk), writes the sum over ranks back into the
 * gradient span and keeps what was not sent as the next residual.
 *
 * Error-feedback bookkeeping: residual_after = value - what this rank's
 * frame decodes to, so over a run sum(sent) + final residual = sum of the
 * scaled gradients up to rounding (tests/compress/test_compress_ef.c).
 *
 * Framed codecs are decoded in rank order on every rank, so the sum has the
 * same bits everywhere (and run to run: the randomness is keyed by seed,
 * step, bucket offset and rank).
 *
 * Not here: the codecs (codec.c, topk.c, powersgd.c), the buckets
 * (parallel/ddp.c).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/compress/compress_int.h"
#include "core/core.h"

static int check_cfg(const dt_compress_cfg *c) {
  if (c->codec < 0 || c->codec >= DT_CODEC_COUNT)
    return dt__seterr(DT_EINVAL, "dist.compress = %d: unknown codec", c->codec);
  if (c->codec == DT_CODEC_TOPK && !(c->ratio > 0 && c->ratio <= 1))
    return dt__seterr(DT_EINVAL, "dist.compress_ratio = %g: must be in (0, 1]", c->ratio);
  if (c->codec == DT_CODEC_QSGD && (c->qsgd_levels < 1 || c->qsgd_levels > 127))
    return dt__seterr(DT_EINVAL, "dist.qsgd_levels = %d: must be 1..127", c->qsgd_levels);
  if (c->codec == DT_CODEC_POWERSGD && (c->rank < 1 || c->rank > 64))
    return dt__seterr(DT_EINVAL, "dist.powersgd_rank = %d: must be 1..64", c->rank);
  if (c->codec == DT_CODEC_POWERSGD && (c->warm_rank < 0 || c->warm_rank > 64 || c->warm_steps < 0))
    return dt__seterr(DT_EINVAL, "dist.powersgd_warm_rank = %d / dist.powersgd_warm_steps = %lld: "
                      "must be 0..64 and >= 0", c->warm_rank, (long long)c->warm_steps);
  if (!(c->clip >= 0) || !isfinite(c->clip))
    return dt__seterr(DT_EINVAL, "dist.compress_clip = %g: must be >= 0", (double)c->clip);
  if (!(c->momentum >= 0 && c->momentum < 1))
    return dt__seterr(DT_EINVAL, "dist.compress_momentum = %g: must be in [0, 1)",
                      (double)c->momentum);
  if (c->momentum > 0 && c->codec == DT_CODEC_NONE)
    return dt__seterr(DT_EINVAL, "dist.compress_momentum = %g: needs a codec (dist.compress)",
                      (double)c->momentum);
  if (c->opt_momentum != 0 && (c->codec != DT_CODEC_SIGN || c->opt_momentum != c->momentum))
    return dt__seterr(DT_EINVAL, "compress: the optimizer's momentum before the codec (%g) is "
                      "sign's, with the worker momentum equal to it (%g)", (double)c->opt_momentum,
                      (double)c->momentum);
  if (c->sign_blocks > 3 || c->sign_two > 1)
    return dt__seterr(DT_EINVAL, "compress: sign block rule %d / two scales %d: must be 0..3 / "
                      "0..1 (-1: DTRAIN_CZ_SIGN_BLOCKS / DTRAIN_CZ_SIGN_TWO)", c->sign_blocks,
                      c->sign_two);
  if (c->sign_dense < -1)
    return dt__seterr(DT_EINVAL, "compress: sign dense threshold %lld: must be >= 0 (-1: "
                      "DTRAIN_CZ_SIGN_DENSE)", (long long)c->sign_dense);
  if (c->warmup_epochs < 0 || c->start_step < 0)
    return dt__seterr(DT_EINVAL, "dist.compress_warmup_epochs / dist.compress_start_step must "
                      "be >= 0");
  return DT_OK;
}

/* sign's block plan (DTRAIN_CZ_SIGN_BLOCKS): the starts its blocks may not
 * straddle. Rule 1 and 2: every row of every weight matrix, and where
 * the parameters between matrices (biases, other layers) start; rule 3:
 * each matrix and each stretch between them; rule 1 cuts each into
 * pieces of at most DT_CZ_SIGN_BLOCK values. A block that straddled a
 * row or a layer took its scale from values of another magnitude (the
 * CNN: conv1's last weights and biases with conv2's first filter, fc1's
 * biases with fc2). 1 on failure (out of memory). */
static int sign_segments(dt_compress *z, const dt_cz_matrix *mats, int nmats) {
  int rule = z->cfg.sign_blocks >= 0 ? z->cfg.sign_blocks : (int)dt_param(DT_PARAM_CZ_SIGN_BLOCKS);
  if (rule <= 0) return 0;
  z->splan = 1;
  z->stwo = (z->cfg.sign_two >= 0 ? z->cfg.sign_two : dt_param(DT_PARAM_CZ_SIGN_TWO)) != 0;
  z->sblk = rule == 1 ? DT_CZ_SIGN_BLOCK : 0;
  int64_t thr = z->cfg.sign_dense >= 0 ? z->cfg.sign_dense : dt_param(DT_PARAM_CZ_SIGN_DENSE);
  size_t dmax = thr > 0 ? (size_t)thr : 0;
  size_t cap = 2;
  for (int i = 0; i < nmats; i++) cap += (rule == 3 ? 1 : (size_t)mats[i].rows) + 1;
  z->sseg = malloc(cap * sizeof *z->sseg);
  z->sdense = dmax ? calloc(cap, 1) : NULL;
  if (!z->sseg || (dmax && !z->sdense)) return 1;
  /* push: a segment starting at `at` (a later start at the same place
   * replaces it: an empty stretch before a matrix) */
  size_t ns = 0, prev = 0;
#define PUSH(at, d)                                                                              \
  do {                                                                                           \
    size_t at_ = (at);                                                                           \
    if (ns && at_ == z->sseg[ns - 1]) {                                                          \
      if (z->sdense) z->sdense[ns - 1] = (d);                                                    \
    } else if ((!ns || at_ > z->sseg[ns - 1]) && (at_ < z->nparams || !ns)) {                    \
      if (z->sdense) z->sdense[ns] = (d);                                                        \
      z->sseg[ns++] = at_;                                                                       \
    }                                                                                            \
  } while (0)
  for (int i = 0; i < nmats; i++) {
    const dt_cz_matrix *m = &mats[i];
    size_t rows = rule == 3 ? 1 : (size_t)m->rows, len = (size_t)m->rows * (size_t)m->cols;
    if (m->off > prev || i == 0) PUSH(prev, m->off - prev <= dmax); /* the stretch before it */
    if (len <= dmax) {
      PUSH(m->off, 1); /* a small matrix: one dense segment */
    } else {
      for (size_t r = 0; r < rows; r++) PUSH(m->off + r * (len / rows), 0);
    }
    prev = m->off + len;
  }
  PUSH(prev, z->nparams - prev <= dmax); /* the stretch after the last matrix */
#undef PUSH
  z->nsseg = ns;
  int any = 0;
  for (size_t j = 0; z->sdense && j < ns; j++) any |= z->sdense[j];
  if (!any) {
    free(z->sdense);
    z->sdense = NULL;
  }
  return 0;
}

/* The block ends of span [off, off + n) under sign's plan into z->plan
 * (made the same way on every rank): the segments the span meets, each
 * clipped to the span and, with a cut, split into near-equal pieces.
 * Returns the block count; 0 when out of memory (error set). */
static size_t sign_plan(dt_compress *z, size_t off, size_t n) {
  /* the last span's plan again (its frame's size, its encode and every
   * peer's decode ask for the same span in turn) */
  if (z->plan_nb && z->plan_off == off && z->plan_n == n) return z->plan_nb;
  z->plan_nb = 0;
  if (z->plan_cap < n) {
    uint32_t *p = realloc(z->plan, n * sizeof *p);
    uint8_t *d = z->sdense ? realloc(z->pdense, n) : NULL;
    if (p) z->plan = p;
    if (d) z->pdense = d;
    if (!p || (z->sdense && !d)) {
      dt__seterr(DT_ENOMEM, "compress: out of memory for a sign plan of %zu values", n);
      return 0;
    }
    z->plan_cap = n;
  }
  z->pnd = 0;
  size_t lo = 0, hi = z->nsseg; /* the last segment starting at or before off */
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (z->sseg[mid] <= off) lo = mid;
    else hi = mid;
  }
  size_t nb = 0, pos = off, stop = off + n;
  for (size_t j = lo; pos < stop; j++) {
    size_t e = j + 1 < z->nsseg ? z->sseg[j + 1] : z->nparams;
    e = e < stop ? e : stop;
    int dense = z->sdense && z->sdense[j];
    size_t len = e - pos, pieces = z->sblk && !dense ? (len + z->sblk - 1) / z->sblk : 1;
    size_t at = pos - off;
    for (size_t i = 0; i < pieces; i++) {
      at += len / pieces + (i < len % pieces);
      if (z->sdense) z->pdense[nb] = (uint8_t)dense;
      z->plan[nb++] = (uint32_t)at;
    }
    if (dense) z->pnd += len;
    pos = e;
  }
  z->plan_off = off, z->plan_n = n, z->plan_nb = nb;
  return nb;
}

/* A span's frame size, and its decode into g (added): sign's plan frames
 * need the plan of the span at off, the others only n. */
static size_t span_frame_bytes(dt_compress *z, size_t off, size_t n, size_t k) {
  if (z->cfg.codec == DT_CODEC_SIGN && z->splan) {
    size_t nb = sign_plan(z, off, n);
    return nb ? dt__cz_sign_bytes_d(n, nb, z->stwo, z->pnd) : 0;
  }
  return dt_cz_frame_bytes(z->cfg.codec, n, k);
}

static int span_decode_add(dt_compress *z, const void *frame, size_t fb, size_t off, size_t n,
                           float *g) {
  if (z->cfg.codec == DT_CODEC_SIGN && z->splan) {
    size_t nb = sign_plan(z, off, n);
    if (!nb) return DT_ENOMEM;
    return dt__cz_sign_decode_add_d(frame, fb, n, z->plan, nb, z->stwo, z->pdense, g);
  }
  return dt_cz_decode_add(z->cfg.codec, frame, fb, n, g);
}

int dt_compress_create(dt_compress **out, const dt_compress_cfg *cfg, size_t nparams,
                       const dt_cz_matrix *mats, int nmats, int rank, int nranks) {
  if (!out || !cfg || nranks < 1 || rank < 0 || rank >= nranks || nmats < 0 || (nmats && !mats))
    return dt__seterr(DT_EINVAL, "compress: bad arguments (rank %d of %d)", rank, nranks);
  *out = NULL;
  DT_CHECK(check_cfg(cfg));
  dt_compress *z = calloc(1, sizeof *z);
  if (!z) return dt__seterr(DT_ENOMEM, "compress: out of memory");
  z->cfg = *cfg;
  z->nparams = nparams;
  z->rank = rank;
  z->nranks = nranks;
  size_t np = nparams ? nparams : 1;
  int fail = 0;
  z->work = malloc(np * sizeof *z->work);
  fail |= !z->work;
  if (cfg->error_feedback && cfg->codec != DT_CODEC_NONE) {
    z->resid = calloc(np, sizeof *z->resid);
    fail |= !z->resid;
  }
  if (cfg->momentum > 0) {
    z->mom = calloc(np, sizeof *z->mom);
    fail |= !z->mom;
  }
  if (cfg->opt_momentum > 0) {
    z->prev = calloc(np, sizeof *z->prev);
    fail |= !z->prev;
  }
  if (cfg->codec == DT_CODEC_POWERSGD && nmats) {
    z->mats = malloc((size_t)nmats * sizeof *z->mats);
    z->q = calloc((size_t)nmats, sizeof *z->q);
    fail |= !z->mats || !z->q;
    if (!fail) {
      memcpy(z->mats, mats, (size_t)nmats * sizeof *mats);
      z->nmats = nmats;
      for (int i = 0; i < nmats && !fail; i++) {
        if (mats[i].rows < 1 || mats[i].cols < 1 ||
            mats[i].off + (size_t)mats[i].rows * (size_t)mats[i].cols > nparams ||
            (i && mats[i].off < mats[i - 1].off + (size_t)mats[i - 1].rows * mats[i - 1].cols)) {
          dt_compress_destroy(z);
          return dt__seterr(DT_EINVAL, "compress: matrix %d (%dx%d at %zu) outside the %zu "
                            "gradients or overlapping its predecessor", i, mats[i].rows,
                            mats[i].cols, mats[i].off, nparams);
        }
        size_t qn = (size_t)mats[i].cols * (size_t)dt__cz_qrank(z);
        z->q[i] = malloc(qn * sizeof(float));
        fail |= !z->q[i];
        /* the same first Q on every rank: keyed by seed and matrix only */
        if (!fail) dt_rng_uniform(z->q[i], qn, -1.0f, 1.0f, cfg->seed, DT_RNG_USER + 8, (uint64_t)i);
      }
    }
  }
  if (!fail && cfg->codec == DT_CODEC_SIGN) fail = sign_segments(z, mats, nmats);
  if (fail) {
    dt_compress_destroy(z);
    return dt__seterr(DT_ENOMEM, "compress: out of memory for %zu gradients", nparams);
  }
  *out = z;
  return DT_OK;
}

void dt_compress_destroy(dt_compress *z) {
  if (!z) return;
  for (int i = 0; z->q && i < z->nmats; i++) free(z->q[i]);
  free(z->q);
  free(z->mats);
  free(z->resid);
  free(z->mom);
  free(z->prev);
  free(z->work);
  free(z->frames);
  free(z->half);
  free(z->pq);
  free(z->pend);
  free(z->sbuf);
  free(z->sseg);
  free(z->sdense);
  free(z->pdense);
  free(z->plan);
  free(z);
}

void dt_compress_begin_step(dt_compress *z, int64_t step, int epoch) {
  z->step = step;
  z->epoch = epoch;
  z->note_out = z->note_in = z->note_dense_done = 0;
  z->npend = 0; /* a step that failed half-way leaves nothing behind */
  z->spos = 0;
}

int dt_compress_fuse(dt_compress *z, int nspans) {
  free(z->pend);
  z->pend = NULL;
  z->fuse = z->npend = 0;
  if (nspans <= 1) return DT_OK;
  z->pend = calloc((size_t)nspans, sizeof *z->pend);
  if (!z->pend) return dt__seterr(DT_ENOMEM, "compress: out of memory");
  z->fuse = nspans;
  return DT_OK;
}

void dt_compress_note_enable(dt_compress *z) { z->note_on = 1; }
void dt_compress_note_set(dt_compress *z, int note) { z->note_out = note != 0 && z->rank == 0; }
int dt_compress_note_get(const dt_compress *z) { return z->note_in; }

const float *dt_compress_residual(const dt_compress *z) { return z ? z->resid : NULL; }

void dt_compress_get_stats(const dt_compress *z, dt_compress_stats *out) { *out = z->st; }

static int grow(void **p, size_t *cap, size_t bytes) {
  if (*cap >= bytes) return DT_OK;
  void *q = realloc(*p, bytes);
  if (!q) return dt__seterr(DT_ENOMEM, "compress: out of memory for %zu bytes", bytes);
  *p = q;
  *cap = bytes;
  return DT_OK;
}

/* topk's density this epoch: DGC's warm-up 1/4, 1/16, 1/64, ... over the
 * first warmup_epochs epochs, never below the configured ratio. */
static double density(const dt_compress *z) {
  double d = z->cfg.ratio;
  if (z->epoch < z->cfg.warmup_epochs) {
    double w = pow(0.25, z->epoch + 1);
    if (w > d) d = w;
  }
  return d;
}

static int comm_err(dt_comm *c, int rc, const char *what) {
  const char *m = dt_comm_errmsg(c);
  return dt__seterr(rc, "%s: %s", what, m && *m ? m : dt_errmsg());
}

/* sign under the optimizer's momentum (cfg.opt_momentum, signum): g holds
 * D_t, the sum of the workers' decoded velocities over this span; the
 * optimizer gets D_t - m D_{t-1}, so its buffer b_t = m b_{t-1} + that
 * (+ its weight decay) stays D_t plus the decay filtered as in dense SGD
 * (b - D obeys x_t = m x_{t-1} + wd p: rounding decays too). */
static void feed_opt(dt_compress *z, float *restrict g, size_t off, size_t n) {
  if (!z->prev) return;
  float *restrict d = z->prev + off;
  const float m = z->cfg.opt_momentum;
  for (size_t i = 0; i < n; i++) {
    float D = g[i];
    g[i] = D - m * d[i];
    d[i] = D;
  }
}

/* The fused allgather of a step's frames (dt_compress_fuse): every rank's
 * frames sit back to back in one block of spos bytes, in span order. */
static int flush_framed(dt_compress *z, dt_comm *c) {
  size_t total = z->spos;
  DT_CHECK(grow((void **)&z->frames, &z->frames_cap, total * (size_t)z->nranks));
  int rc = dt_comm_allgather(c, z->sbuf, z->frames, total, DT_U8);
  if (rc < 0) return comm_err(c, rc, "compressed gradients (fused allgather)");
  z->st.bytes_sent += total;
  if (z->frames[z->pend[0].at + offsetof(dt_cz_hdr, flags)] & DT_CZ_FLAG_NOTE) z->note_in = 1;
  for (int j = 0; j < z->npend; j++) {
    const struct dt_cz_pend *p = &z->pend[j];
    memset(p->g, 0, p->n * sizeof *p->g);
    for (int r = 0; r < z->nranks; r++) {
      rc = span_decode_add(z, z->frames + total * (size_t)r + p->at, p->fb, p->off, p->n, p->g);
      if (rc < 0)
        return dt__preerr(rc, "gradient frame of rank %d (span %d of the step's fused frames)", r,
                          j);
    }
    feed_opt(z, p->g, p->off, p->n);
  }
  z->npend = 0;
  z->spos = 0;
  return DT_OK;
}

static int reduce_framed(dt_compress *z, dt_comm *c, float *g, float *w, size_t off, size_t n) {
  int codec = z->cfg.codec;
  size_t k = codec == DT_CODEC_TOPK ? dt__cz_topk_k(n, density(z)) : n;
  size_t fb = span_frame_bytes(z, off, n, k);
  if (!fb) return DT_ENOMEM;
  int fused = z->fuse > 1;
  uint8_t *mine;
  if (fused) {
    if (z->npend >= z->fuse)
      return dt__seterr(DT_EINVAL, "compress: more than %d spans in one fused step", z->fuse);
    DT_CHECK(grow((void **)&z->sbuf, &z->sbuf_cap, z->spos + fb));
    mine = z->sbuf + z->spos;
  } else {
    DT_CHECK(grow((void **)&z->frames, &z->frames_cap, fb * (size_t)(z->nranks + 1)));
    mine = z->frames + fb * (size_t)z->nranks;
  }
  memset(mine, 0, fb); /* padding too: every byte on the wire is defined */
  dt_cz_rng rng = {z->cfg.seed, (uint64_t)z->step, ((uint64_t)z->rank << 32) | (uint32_t)off};
  float *resid = z->resid ? z->resid + off : NULL;
  if (codec == DT_CODEC_SIGN && z->splan) {
    size_t nb = sign_plan(z, off, n); /* the plan span_frame_bytes made (before z->plan is read) */
    DT_CHECK(dt__cz_sign_encode_d(w, n, z->plan, nb, z->stwo, z->pdense, mine, resid, 0));
  } else {
    DT_CHECK(dt_cz_encode(codec, w, n, k, z->cfg.qsgd_levels, rng, mine, resid));
  }
  if (z->note_out) mine[offsetof(dt_cz_hdr, flags)] |= DT_CZ_FLAG_NOTE;
  if (z->mom && z->resid && codec == DT_CODEC_TOPK) {
    /* DGC momentum factor masking: what was sent leaves the velocity too */
    float *u = z->mom + off;
    const uint8_t *ix = mine + DT_CZ_HDR_LEN;
    for (size_t j = 0; j < k; j++) {
      uint32_t i;
      memcpy(&i, ix + 4 * j, 4);
      u[i] = 0;
    }
  }
  if (fused) {
    z->pend[z->npend++] = (struct dt_cz_pend){g, n, fb, z->spos, off};
    z->spos += fb;
    return z->npend < z->fuse ? DT_OK : flush_framed(z, c);
  }
  int rc = dt_comm_allgather(c, mine, z->frames, fb, DT_U8);
  if (rc < 0) return comm_err(c, rc, "compressed gradients (allgather)");
  z->st.bytes_sent += fb;
  if (z->frames[offsetof(dt_cz_hdr, flags)] & DT_CZ_FLAG_NOTE) z->note_in = 1; /* rank 0's */
  memset(g, 0, n * sizeof *g);
  for (int r = 0; r < z->nranks; r++) {
    rc = span_decode_add(z, z->frames + fb * (size_t)r, fb, off, n, g);
    if (rc < 0) return dt__preerr(rc, "gradient frame of rank %d (bucket at %zu)", r, off);
  }
  feed_opt(z, g, off, n);
  return DT_OK;
}

/* int8: a ring allreduce on int8 frames (docs/compress.md, "int8 ring").
 * The span is cut into nranks chunks. Reduce-scatter: at hop s this rank
 * quantises its running partial sum of chunk (r-s-1) mod N (its own value
 * at the first hop) into an int8 frame with a step per block and sends it
 * right; it decodes the frame from the left into chunk (r-s-2) mod N and
 * adds its own value. After N-1 hops it holds chunk r's full sum in f32,
 * quantises it once more, and the N final frames are allgathered; every
 * rank decodes them all, so every rank ends with the same bits. Each rank
 * quantises each of its chunks exactly once per step, and the error of
 * that quantisation (its own value's, a partial sum's, or the final sum's)
 * becomes its residual there: the sum over ranks of the residuals plus the
 * reduced result equals the sum of the values to rounding. Bytes per rank:
 * 2(N-1)/N of the span at 1 + 4/DT_CZ_I8_BLOCK bytes per value, against 4
 * for the dense ring. */
#define I8_RING_TAG DT_CZ_RING_TAG

static int reduce_int8_ring(dt_compress *z, dt_comm *c, float *g, float *w, size_t off, size_t n) {
  int N = z->nranks, r = z->rank;
  int right = (r + 1) % N, left = (r + N - 1) % N;
  size_t base = n / (size_t)N, extra = n % (size_t)N;
#define CH_OFF(i) ((size_t)(i) * base + ((size_t)(i) < extra ? (size_t)(i) : extra))
#define CH_CNT(i) (base + ((size_t)(i) < extra))
  size_t fbmax = dt__cz_i8b_bytes(base + (extra > 0));
  DT_CHECK(grow((void **)&z->frames, &z->frames_cap, fbmax * (size_t)(N + 2)));
  uint8_t *all = z->frames, *sbuf = all + fbmax * (size_t)N, *rbuf = sbuf + fbmax;
  float *resid = z->resid ? z->resid + off : NULL;
  /* g is free from here (w holds this rank's value): it keeps the partial sums */
  for (int s = 0; s < N - 1; s++) {
    int sb = (r - s - 1 + 2 * N) % N, rb = (r - s - 2 + 2 * N) % N;
    size_t so = CH_OFF(sb), sn = CH_CNT(sb), ro = CH_OFF(rb), rn = CH_CNT(rb);
    dt_cz_rng rng = {z->cfg.seed, (uint64_t)z->step, ((uint64_t)z->rank << 32) | (uint32_t)(off + so)};
    dt__cz_i8b_encode((s == 0 ? w : g) + so, sn, rng, sbuf, resid ? resid + so : NULL, 0);
    dt_comm_req rq[2];
    int rc = dt_comm_irecv(c, left, I8_RING_TAG, rbuf, dt__cz_i8b_bytes(rn), &rq[0]);
    if (rc == DT_OK) {
      rc = dt_comm_isend(c, right, I8_RING_TAG, sbuf, dt__cz_i8b_bytes(sn), &rq[1]);
      if (rc == DT_OK) rc = dt_comm_waitall(c, rq, 2);
      else (void)dt_comm_waitall(c, rq, 1);
    }
    if (rc < 0) return comm_err(c, rc, "compressed gradients (int8 ring)");
    z->st.bytes_sent += dt__cz_i8b_bytes(sn);
    memcpy(g + ro, w + ro, rn * sizeof *g);
    rc = dt__cz_i8b_decode_add(rbuf, dt__cz_i8b_bytes(rn), rn, g + ro, NULL);
    if (rc < 0)
      return dt__preerr(rc, "gradient frame of rank %d (int8 ring, hop %d, bucket at %zu)", left,
                        s + 1, off);
  }
  size_t mo = CH_OFF(r), mn = CH_CNT(r);
  uint8_t *mine = all + fbmax * (size_t)r;
  memset(mine, 0, fbmax);
  dt_cz_rng rng = {z->cfg.seed, (uint64_t)z->step, ((uint64_t)z->rank << 32) | (uint32_t)(off + mo)};
  dt__cz_i8b_encode((N == 1 ? w : g) + mo, mn, rng, mine, resid ? resid + mo : NULL,
                    z->note_out ? DT_CZ_FLAG_NOTE : 0);
  int rc = dt_comm_allgather(c, mine, all, fbmax, DT_U8);
  if (rc < 0) return comm_err(c, rc, "compressed gradients (int8 ring allgather)");
  z->st.bytes_sent += fbmax;
  memset(g, 0, n * sizeof *g);
  for (int i = 0; i < N; i++) {
    int fl = 0;
    rc = dt__cz_i8b_decode_add(all + fbmax * (size_t)i, fbmax, CH_CNT(i), g + CH_OFF(i), &fl);
    if (rc < 0)
      return dt__preerr(rc, "gradient frame of rank %d (int8 ring, final chunk, bucket at %zu)", i,
                        off);
    if (i == 0 && (fl & DT_CZ_FLAG_NOTE)) z->note_in = 1; /* rank 0's */
  }
#undef CH_OFF
#undef CH_CNT
  return DT_OK;
}

static int reduce_half(dt_compress *z, dt_comm *c, float *g, float *w, size_t off, size_t n) {
  DT_CHECK(grow((void **)&z->half, &z->half_cap, (n + 1) * sizeof *z->half));
  float *resid = z->resid ? z->resid + off : NULL;
  int bf = z->cfg.codec == DT_CODEC_BF16;
  if (bf) dt__cz_to_bf16(w, z->half, resid, n);
  else dt__cz_to_f16(w, z->half, resid, n);
  /* one more element: rank 0's note, 1.0 (exact in both) or 0 */
  z->half[n] = z->note_out ? (bf ? 0x3f80 : 0x3c00) : 0;
  int rc = dt_comm_allreduce(c, z->half, z->half, n + 1, bf ? DT_BF16 : DT_F16, DT_OP_SUM);
  if (rc < 0) return comm_err(c, rc, "compressed gradients (allreduce)");
  if (z->half[n]) z->note_in = 1;
  z->st.bytes_sent += 2 * (n + 1);
  if (bf) dt__cz_from_bf16(z->half, g, n, 0);
  else dt__cz_from_f16(z->half, g, n, 0);
  return DT_OK;
}

/* powersgd with dt_compress_fuse: the spans' values wait in work until
 * the step's last one, then the whole range they cover is one span (two
 * allreduces per step instead of two per bucket). The products per
 * element and the allreduces' order per element do not depend on how the
 * range was cut, so the bits are those of one reduction per bucket.
 * g: this span. */
static int powersgd_fused(dt_compress *z, dt_comm *c, float *g, size_t off, size_t n) {
  if (z->npend >= z->fuse)
    return dt__seterr(DT_EINVAL, "compress: more than %d spans in one fused step", z->fuse);
  z->pend[z->npend++] = (struct dt_cz_pend){g - off, n, 0, off, off};
  if (z->npend < z->fuse) return DT_OK;
  size_t lo = SIZE_MAX, hi = 0, tot = 0;
  for (int j = 0; j < z->npend; j++) {
    const struct dt_cz_pend *p = &z->pend[j];
    lo = p->at < lo ? p->at : lo;
    hi = p->at + p->n > hi ? p->at + p->n : hi;
    tot += p->n;
  }
  z->npend = 0;
  if (tot != hi - lo)
    return dt__seterr(DT_EINVAL, "compress: the %d fused spans of a step (%zu values) do not "
                      "cover one range (%zu..%zu)", z->fuse, tot, lo, hi);
  return dt__cz_powersgd_reduce(z, c, z->pend[0].g + lo, lo, hi - lo);
}

int dt_compress_reduce(dt_compress *z, dt_comm *c, float *g, size_t off, size_t n, float scale) {
  if (!z || !c || !g || off > z->nparams || n > z->nparams - off)
    return dt__seterr(DT_EINVAL, "compress: span %zu+%zu outside the %zu gradients", off, n,
                      z ? z->nparams : 0);
  if (n == 0) return DT_OK;
  g += off; /* from here on g is the span */
  z->st.buckets++;
  z->st.dense_bytes += 4 * n;
  if (z->cfg.codec == DT_CODEC_NONE || z->step < z->cfg.start_step) {
    if (z->mom) {
      /* worker momentum replaces the optimizer's (optim.momentum = 0):
       * the dense steps before dist.compress_start_step keep it too, or
       * they would be plain SGD. The sum of the velocities is the
       * velocity of the summed gradient, so these steps are dense
       * momentum SGD exactly, and the velocity goes on into the codec. */
      float *restrict u = z->mom + off;
      float m = z->cfg.momentum;
      for (size_t i = 0; i < n; i++) g[i] = u[i] = m * u[i] + g[i] * scale;
    } else if (scale != 1.0f) {
      for (size_t i = 0; i < n; i++) g[i] *= scale;
    }
    int rc = dt_comm_allreduce(c, g, g, n, DT_F32, DT_OP_SUM);
    if (rc < 0) return comm_err(c, rc, "gradients (allreduce)");
    feed_opt(z, g, off, n);
    z->st.bytes_sent += 4 * n;
    if (z->note_on && !z->note_dense_done) {
      int32_t v = z->note_out;
      rc = dt_comm_broadcast(c, &v, 1, DT_I32, 0);
      if (rc < 0) return comm_err(c, rc, "checkpoint note (broadcast)");
      z->note_dense_done = 1;
      z->note_in = v != 0;
    }
    return DT_OK;
  }
  if (z->cfg.clip > 0) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)(g[i] * scale) * (g[i] * scale);
    if (s > (double)z->cfg.clip * z->cfg.clip) scale *= (float)(z->cfg.clip / sqrt(s));
  }
  int codec = z->cfg.codec;
  if (z->resid && (codec == DT_CODEC_TOPK || codec == DT_CODEC_SIGN || codec == DT_CODEC_QSGD)) {
    /* Framed codecs with error feedback form the value in the residual
     * itself and encode it in place (their encoders allow resid == x):
     * top-k then only zeroes what it sent instead of copying the bucket
     * back, and no work buffer is streamed (the same bits as through
     * work: r + u is u + r). One pass: scale, worker momentum, residual. */
    float *restrict w = z->resid + off;
    if (z->mom) {
      float *restrict u = z->mom + off;
      float m = z->cfg.momentum;
      for (size_t i = 0; i < n; i++) {
        u[i] = m * u[i] + g[i] * scale;
        w[i] += u[i];
      }
    } else {
      for (size_t i = 0; i < n; i++) w[i] = g[i] * scale + w[i];
    }
    return reduce_framed(z, c, g, w, off, n);
  }
  float *restrict w = z->work + off;
  /* One pass: scale, worker momentum, residual (three passes cost a
   * third of the codec's time on the MLP's buckets). */
  const float *restrict r = z->resid ? z->resid + off : NULL;
  if (z->mom) {
    float *restrict u = z->mom + off;
    float m = z->cfg.momentum;
    if (r)
      for (size_t i = 0; i < n; i++) {
        u[i] = m * u[i] + g[i] * scale;
        w[i] = u[i] + r[i];
      }
    else
      for (size_t i = 0; i < n; i++) w[i] = u[i] = m * u[i] + g[i] * scale;
  } else if (r) {
    for (size_t i = 0; i < n; i++) w[i] = g[i] * scale + r[i];
  } else {
    for (size_t i = 0; i < n; i++) w[i] = g[i] * scale;
  }
  switch (z->cfg.codec) {
  case DT_CODEC_FP16:
  case DT_CODEC_BF16: return reduce_half(z, c, g, w, off, n);
  case DT_CODEC_POWERSGD:
    if (z->fuse > 1) return powersgd_fused(z, c, g, off, n);
    return dt__cz_powersgd_reduce(z, c, g, off, n);
  case DT_CODEC_INT8: return reduce_int8_ring(z, c, g, w, off, n);
  default: return reduce_framed(z, c, g, w, off, n);
  }
}

int dt__compress_pays(const dt_comm *c, int forced) {
  if (forced) return 1;
  if (!c || dt_comm_size(c) < 2) return 0;
  struct dt_comm_topo t;
  if (dt_comm_topology(c, &t) < 0) return 1;
  /* one host: gradients move at memory speed and a codec only adds work
   * (bench/RESULTS.md, compression on shm) */
  return t.nhosts > 1;
}

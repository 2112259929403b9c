/*
 * state.c — a compressor's per-worker state as one blob, for checkpoints
 * (docs/compress.md "Checkpoints"): the error-feedback residual, the worker
 * momentum (dist.compress_momentum, DGC's velocity for topk) and
 * PowerSGD's warm-started Q of every matrix. Residuals and velocities
 * differ from rank to rank; Q is the same everywhere but rides along, so
 * one blob restores one worker.
 *
 * Layout (little-endian): a 48-byte header — magic "LTCS", version, codec,
 * which parts follow (1 residual, 2 momentum, 4 Q, 8 sign's summed
 * velocities under the optimizer's momentum), the gradient count,
 * the rank and worker count that saved it, the matrix count and PowerSGD
 * rank, and the step it was saved after — then the residual (nparams f32),
 * the momentum (nparams f32), the summed velocities (nparams f32), every
 * matrix's Q (cols x rank f32).
 *
 * Loading checks the whole header against the compressor before writing
 * anything: another codec, another set of parts (error feedback or worker
 * momentum turned on or off), another worker count, rank, model size or
 * PowerSGD rank is DT_EMISMATCH naming both sides, and the compressor is
 * left as it was (zeros at the start of a run): the caller decides to go on
 * with a warning. A blob of the wrong length is DT_ECORRUPT.
 *
 * Not here: when checkpoints are taken or who writes them (engine/ckpt_run.c).
 */
#include <stdio.h>
#include <string.h>

#include "comm/compress/compress_int.h"
#include "core/core.h"

#define STATE_MAGIC 0x53435a4cu /* "LZCS" little-endian: 'L' 'Z' 'C' 'S' */
#define STATE_VERSION 1u
#define STATE_HDR 48
#define PART_RESID 1u
#define PART_MOM 2u
#define PART_Q 4u
#define PART_PREV 8u

typedef struct state_hdr {
  uint32_t magic, version, codec, parts;
  uint64_t nparams;
  uint32_t rank, nranks, nmats, qrank;
  int64_t step;
} state_hdr;

static uint32_t parts_of(const dt_compress *z) {
  return (z->resid ? PART_RESID : 0) | (z->mom ? PART_MOM : 0) | (z->nmats ? PART_Q : 0) |
         (z->prev ? PART_PREV : 0);
}

static size_t q_floats(const dt_compress *z, int i) {
  return (size_t)z->mats[i].cols * (size_t)dt__cz_qrank(z);
}

static size_t body_floats(const dt_compress *z, uint32_t parts) {
  size_t n = 0;
  if (parts & PART_RESID) n += z->nparams;
  if (parts & PART_MOM) n += z->nparams;
  if (parts & PART_PREV) n += z->nparams;
  if (parts & PART_Q)
    for (int i = 0; i < z->nmats; i++) n += q_floats(z, i);
  return n;
}

size_t dt_compress_state_bytes(const dt_compress *z) {
  if (!z) return 0;
  uint32_t parts = parts_of(z);
  return parts ? STATE_HDR + body_floats(z, parts) * sizeof(float) : 0;
}

static void put_hdr(uint8_t *p, const state_hdr *h) {
  memset(p, 0, STATE_HDR);
  dt_put_le32(p, h->magic);
  dt_put_le32(p + 4, h->version);
  dt_put_le32(p + 8, h->codec);
  dt_put_le32(p + 12, h->parts);
  dt_put_le64(p + 16, h->nparams);
  dt_put_le32(p + 24, h->rank);
  dt_put_le32(p + 28, h->nranks);
  dt_put_le32(p + 32, h->nmats);
  dt_put_le32(p + 36, h->qrank);
  dt_put_le64(p + 40, (uint64_t)h->step);
}

static void get_hdr(const uint8_t *p, state_hdr *h) {
  h->magic = dt_get_le32(p);
  h->version = dt_get_le32(p + 4);
  h->codec = dt_get_le32(p + 8);
  h->parts = dt_get_le32(p + 12);
  h->nparams = dt_get_le64(p + 16);
  h->rank = dt_get_le32(p + 24);
  h->nranks = dt_get_le32(p + 28);
  h->nmats = dt_get_le32(p + 32);
  h->qrank = dt_get_le32(p + 36);
  h->step = (int64_t)dt_get_le64(p + 40);
}

static uint8_t *put_floats(uint8_t *p, const float *x, size_t n) {
  memcpy(p, x, n * sizeof(float));
  return p + n * sizeof(float);
}

int dt_compress_state_save(const dt_compress *z, void *buf, size_t len) {
  size_t want = dt_compress_state_bytes(z);
  if (!z || !buf || !want || len != want)
    return dt__seterr(DT_EINVAL, "compress state: a buffer of %zu bytes for %zu", len, want);
  state_hdr h = {STATE_MAGIC, STATE_VERSION, (uint32_t)z->cfg.codec, parts_of(z),
                 z->nparams, (uint32_t)z->rank, (uint32_t)z->nranks, (uint32_t)z->nmats,
                 (uint32_t)(z->nmats ? dt__cz_qrank(z) : 0), z->step};
  uint8_t *p = buf;
  put_hdr(p, &h);
  p += STATE_HDR;
  if (z->resid) p = put_floats(p, z->resid, z->nparams);
  if (z->mom) p = put_floats(p, z->mom, z->nparams);
  if (z->prev) p = put_floats(p, z->prev, z->nparams);
  for (int i = 0; i < z->nmats; i++) p = put_floats(p, z->q[i], q_floats(z, i));
  return DT_OK;
}

static const char *codec_name(uint32_t c) {
  return c < DT_CODEC_COUNT ? dt__codec_names[c] : "unknown";
}

static void parts_text(uint32_t parts, char *b, size_t cap) {
  snprintf(b, cap, "%s%s%s%s%s", parts & PART_RESID ? " error-feedback residuals" : "",
           parts & PART_MOM ? " worker momentum" : "", parts & PART_Q ? " PowerSGD Q" : "",
           parts & PART_PREV ? " sign's summed velocities" : "", parts ? "" : " nothing");
}

int dt_compress_state_load(dt_compress *z, const void *buf, size_t len) {
  if (!z || (!buf && len))
    return dt__seterr(DT_EINVAL, "compress state: no compressor or no data");
  if (len < STATE_HDR)
    return dt__seterr(DT_ECORRUPT, "compress state: %zu bytes, shorter than its header", len);
  state_hdr h;
  get_hdr(buf, &h);
  if (h.magic != STATE_MAGIC)
    return dt__seterr(DT_ECORRUPT, "compress state: bad magic 0x%08x", h.magic);
  if (h.version != STATE_VERSION)
    return dt__seterr(DT_EMISMATCH, "compress state: version %u, this dtrain reads %u", h.version,
                      STATE_VERSION);
  if (h.codec != (uint32_t)z->cfg.codec)
    return dt__seterr(DT_EMISMATCH, "saved with dist.compress = %s, this run uses %s",
                      codec_name(h.codec), dt__codec_names[z->cfg.codec]);
  if (h.nranks != (uint32_t)z->nranks || h.rank != (uint32_t)z->rank)
    return dt__seterr(DT_EMISMATCH, "saved by rank %u of %u workers, this is rank %d of %d",
                      h.rank, h.nranks, z->rank, z->nranks);
  if (h.nparams != z->nparams)
    return dt__seterr(DT_EMISMATCH, "saved for %llu gradients, this model has %zu",
                      (unsigned long long)h.nparams, z->nparams);
  const uint32_t parts = parts_of(z);
  if (h.parts != parts) {
    char a[128], b[128];
    parts_text(h.parts, a, sizeof a);
    parts_text(parts, b, sizeof b);
    return dt__seterr(DT_EMISMATCH, "saved with%s, this run keeps%s (dist.error_feedback or "
                      "dist.compress_momentum changed)", a, b);
  }
  if (h.nmats != (uint32_t)z->nmats || (z->nmats && h.qrank != (uint32_t)dt__cz_qrank(z)))
    return dt__seterr(DT_EMISMATCH, "saved with %u PowerSGD matrices of rank %u, this run has "
                      "%d of rank %d", h.nmats, h.qrank, z->nmats, dt__cz_qrank(z));
  if (len != STATE_HDR + body_floats(z, parts) * sizeof(float))
    return dt__seterr(DT_ECORRUPT, "compress state: %zu bytes, its header needs %zu", len,
                      STATE_HDR + body_floats(z, parts) * sizeof(float));
  const uint8_t *p = (const uint8_t *)buf + STATE_HDR;
  if (z->resid) memcpy(z->resid, p, z->nparams * sizeof(float)), p += z->nparams * sizeof(float);
  if (z->mom) memcpy(z->mom, p, z->nparams * sizeof(float)), p += z->nparams * sizeof(float);
  if (z->prev) memcpy(z->prev, p, z->nparams * sizeof(float)), p += z->nparams * sizeof(float);
  for (int i = 0; i < z->nmats; i++) {
    memcpy(z->q[i], p, q_floats(z, i) * sizeof(float));
    p += q_floats(z, i) * sizeof(float);
  }
  return DT_OK;
}

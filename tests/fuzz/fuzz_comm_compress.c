/*
 * fuzz_comm_compress.c — libFuzzer target for compressed gradient frames
 * (dt_cz_decode_add, src/comm/compress/codec.c) and the int8 ring's
 * frames (dt__cz_i8b_decode_add): the first byte picks the codec (0xff:
 * the int8 ring; 0xfe: sign over a block plan with dense blocks,
 * dt__cz_sign_decode_add_d), the next two the bucket size; the rest is the frame as it would
 * arrive from a peer. A frame is either rejected (DT_ECORRUPT with a
 * message, the output untouched) or accepted and decoded without touching
 * memory outside the bucket (ASan); an accepted frame's header must hold
 * the invariants the decoder relies on.
 */
#include "comm/compress/compress.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

/* A rejected frame: DT_ECORRUPT with a message, the output untouched. */
static void check_rejected(int rc, const float *out, size_t n) {
  if (rc != DT_ECORRUPT || !dt_errmsg()[0]) abort();
  for (size_t i = 0; i < n; i++)
    if (out[i] != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  static const int codecs[] = {DT_CODEC_FP16, DT_CODEC_BF16, DT_CODEC_INT8,
                               DT_CODEC_QSGD, DT_CODEC_SIGN, DT_CODEC_TOPK};
  int codec = codecs[data[0] % 6];
  size_t n = 1 + (((size_t)data[1] << 8 | data[2]) % 4096);
  data += 3;
  size -= 3;
  /* frames arrive 8-byte aligned (allgather blocks): copy like the receiver */
  uint8_t *f = aligned_alloc(8, (size + 15) & ~(size_t)7); /* C11: size a multiple of 8 */
  float *out = calloc(n, sizeof *out);
  if (!f || !out) abort();
  memcpy(f, data, size);
  if (data[-3] == 0xfe) {
    /* sign over a block plan with dense blocks (DTRAIN_CZ_SIGN_DENSE):
     * blocks of 37 values, block b dense when bit b % 8 of the size's low
     * byte is set, two scales when its high byte is odd */
    size_t nb = (n + 36) / 37, nd = 0;
    int two = data[-2] & 1;
    uint32_t *end = malloc(nb * sizeof *end);
    uint8_t *dense = malloc(nb);
    if (!end || !dense) abort();
    for (size_t b = 0; b < nb; b++) {
      end[b] = (uint32_t)(b + 1 == nb ? n : 37 * (b + 1));
      dense[b] = (data[-1] >> (b % 8)) & 1;
      if (dense[b]) nd += end[b] - (b ? end[b - 1] : 0);
    }
    int rc = dt__cz_sign_decode_add_d(f, size, n, end, nb, two, dense, out);
    if (rc < 0) {
      check_rejected(rc, out, n);
    } else {
      dt_cz_hdr h;
      memcpy(&h, f, sizeof h);
      if (h.magic != DT_CZ_MAGIC || h.n != n || h.k != nb || h.codec != DT_CODEC_SIGN) abort();
      if (!(h.flags & DT_CZ_FLAG_BLOCKS) || ((h.flags & DT_CZ_FLAG_DENSE) != 0) != (nd > 0)) abort();
      if (dt__cz_sign_bytes_d(n, nb, two, nd) > size) abort();
    }
    free(end);
    free(dense);
    free(f);
    free(out);
    return 0;
  }
  if (data[-3] == 0xff) {
    int fl = 0;
    int rc = dt__cz_i8b_decode_add(f, size, n - 1, out, &fl); /* n - 1: chunks may be empty */
    if (rc < 0) {
      check_rejected(rc, out, n);
    } else {
      dt_cz_hdr h;
      memcpy(&h, f, sizeof h);
      if (h.magic != DT_CZ_MAGIC || h.n != n - 1 || h.k != n - 1 || h.codec != DT_CODEC_INT8) abort();
      if (!(fl & DT_CZ_FLAG_BLOCKS) || dt__cz_i8b_bytes(n - 1) > size) abort();
    }
    free(f);
    free(out);
    return 0;
  }
  int rc = dt_cz_decode_add(codec, f, size, n, out);
  if (rc < 0) {
    check_rejected(rc, out, n);
  } else {
    dt_cz_hdr h;
    memcpy(&h, f, sizeof h);
    if (h.magic != DT_CZ_MAGIC || h.n != n || h.k > n || h.codec != codec) abort();
    if (dt_cz_frame_bytes(codec, n, h.k) > size) abort();
  }
  free(f);
  free(out);
  return 0;
}

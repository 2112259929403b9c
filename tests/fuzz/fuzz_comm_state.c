/*
 * fuzz_comm_state.c — libFuzzer target for a compressor's per-worker
 * checkpoint state (dt_compress_state_load, src/comm/compress/state.c):
 * the input is the blob as read from a worker-R.safetensors file, loaded
 * into a powersgd compressor with error feedback and worker momentum
 * (rank 1 of 2). It is either rejected (DT_ECORRUPT or DT_EMISMATCH with a
 * message, the state untouched) or accepted, and then saving gives the
 * same bytes back.
 */
#include "comm/compress/compress.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  enum { NP = 16 * 4 + 4 };
  dt_cz_matrix m = {0, 16, 4};
  dt_compress_cfg c = DT_COMPRESS_CFG_INIT;
  c.codec = DT_CODEC_POWERSGD;
  c.momentum = 0.5f;
  dt_compress *z = NULL;
  if (dt_compress_create(&z, &c, NP, &m, 1, 1, 2) != DT_OK) abort();
  const size_t len = dt_compress_state_bytes(z);
  uint8_t *before = malloc(len), *after = malloc(len);
  if (!before || !after) abort();
  if (dt_compress_state_save(z, before, len) != DT_OK) abort();
  int rc = dt_compress_state_load(z, data, size);
  if (dt_compress_state_save(z, after, len) != DT_OK) abort();
  if (rc < 0) {
    if ((rc != DT_ECORRUPT && rc != DT_EMISMATCH) || !dt_errmsg()[0]) abort();
    if (memcmp(before, after, len)) abort(); /* untouched on rejection */
  } else if (size != len || memcmp(data + 48, after + 48, len - 48)) {
    abort();
  }
  free(before);
  free(after);
  dt_compress_destroy(z);
  return 0;
}

/*
 * fuzz_data_idx.c — libFuzzer target for the IDX reader (raw and gzip). The
 * input is split into an images file and a labels file at an offset taken
 * from its first two bytes (low 15 bits); when the top bit is set both
 * parts are gzip-compressed first, so the decoder paths behind valid gzip
 * (growth from the size hint, trailing data, multi-member) are reached too.
 * Both go through dt__idx_load_mem, the code dt_idx_load runs after reading
 * the files. The payload limit is lowered so
 * no input can make the reader allocate much; any crash, leak or sanitizer
 * report is a bug.
 */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data/data_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A malloc'd gzip member holding p[0..n); *out_len its size. */
static uint8_t *gzip_mem(const uint8_t *p, size_t n, size_t *out_len) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (deflateInit2(&zs, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
  size_t cap = deflateBound(&zs, (uLong)n) + 32;
  uint8_t *out = malloc(cap);
  zs.next_in = (Bytef *)p;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) abort();
  *out_len = zs.total_out;
  deflateEnd(&zs);
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int once;
  if (!once) {
    setenv("DTRAIN_DATA_MAX_BYTES", "16777216", 1);
    dt__param_reload();
    once = 1;
  }
  if (size < 2) return 0;
  size_t split = (size_t)data[0] | (size_t)(data[1] & 0x7f) << 8;
  int gz = data[1] >> 7;
  data += 2;
  size -= 2;
  if (split > size) split = size;
  /* Heap copies of exactly each file, so ASan sees any read past the end. */
  size_t il = split, ll = size - split;
  uint8_t *img, *lab;
  if (gz) {
    img = gzip_mem(data, split, &il);
    lab = gzip_mem(data + split, size - split, &ll);
  } else {
    img = malloc(il ? il : 1);
    lab = malloc(ll ? ll : 1);
    memcpy(img, data, il);
    memcpy(lab, data + split, ll);
  }
  dt_dataset ds;
  if (dt__idx_load_mem(&ds, img, il, "img", lab, ll, "lab") == DT_OK) {
    if (ds.n <= 0 || ds.dim != (int64_t)ds.h * ds.w || ds.nclasses < 1 || ds.nclasses > 256) abort();
    for (int64_t i = 0; i < ds.n; i++)
      if (ds.y[i] < 0 || ds.y[i] >= ds.nclasses) abort();
    dt_dataset_free(&ds);
  } else if (ds.x || ds.y || !dt_errmsg()[0]) {
    abort(); /* failures leave nothing allocated and always say why */
  }
  free(img);
  free(lab);
  return 0;
}

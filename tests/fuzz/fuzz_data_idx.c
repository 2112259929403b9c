/*
 * fuzz_data_idx.c — libFuzzer target for the IDX reader (raw and gzip). The
 * input is split into an images file and a labels file at an offset taken
 * from its first two bytes, and both go through dt__idx_load_mem, the code
 * dt_idx_load runs after reading the files. The payload limit is lowered so
 * no input can make the reader allocate much; any crash, leak or sanitizer
 * report is a bug.
 */
#include <stdlib.h>
#include <string.h>

#include "data/data_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int once;
  if (!once) {
    setenv("DTRAIN_DATA_MAX_BYTES", "16777216", 1);
    once = 1;
  }
  if (size < 2) return 0;
  size_t split = (size_t)data[0] | (size_t)data[1] << 8;
  data += 2;
  size -= 2;
  if (split > size) split = size;
  /* Heap copies of exactly each file, so ASan sees any read past the end. */
  uint8_t *img = malloc(split ? split : 1), *lab = malloc(size - split ? size - split : 1);
  memcpy(img, data, split);
  memcpy(lab, data + split, size - split);
  dt_dataset ds;
  if (dt__idx_load_mem(&ds, img, split, "img", lab, size - split, "lab") == DT_OK) {
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

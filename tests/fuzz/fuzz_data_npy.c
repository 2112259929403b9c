/*
 * fuzz_data_npy.c — libFuzzer target for the .npy reader: the input is
 * split into a features file and a labels file at an offset taken from its
 * first two bytes, and both go through dt__npy_load_mem, the code
 * dt_npy_load runs after reading the files. The payload limit is lowered so
 * no input can make it allocate much; any crash, leak or sanitizer report
 * is a bug.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int once;
  if (!once) {
    setenv("DTRAIN_DATA_MAX_BYTES", "16777216", 1);
    dt__param_reload();
    once = 1;
  }
  if (size < 2) return 0;
  size_t split = (size_t)data[0] | (size_t)data[1] << 8;
  data += 2;
  size -= 2;
  if (split > size) split = size;
  /* Heap copies of exactly each file, so ASan sees any read past the end. */
  uint8_t *x = malloc(split ? split : 1), *y = malloc(size - split ? size - split : 1);
  memcpy(x, data, split);
  memcpy(y, data + split, size - split);
  dt_dataset ds;
  if (dt__npy_load_mem(&ds, x, split, "x.npy", y, size - split, "y.npy") == DT_OK) {
    if (ds.n <= 0 || ds.dim != (int64_t)ds.c * ds.h * ds.w || ds.nclasses < 1) abort();
    for (int64_t i = 0; i < ds.n * ds.dim; i++)
      if (!isfinite(ds.x[i])) abort();
    dt_dataset_free(&ds);
  } else if (ds.x || ds.y || !dt_errmsg()[0]) {
    abort();
  }
  free(x);
  free(y);
  return 0;
}

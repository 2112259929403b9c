/*
 * fuzz_data_csv.c — libFuzzer target for the CSV reader: the input is the
 * file's text, its first byte picks the label column (-2 .. 5), and it goes
 * through dt__csv_parse_mem, the code dt_csv_load runs after reading the
 * file. Successful parses are checked for consistency; any crash, leak or
 * sanitizer report is a bug.
 */
#include <stdlib.h>
#include <string.h>

#include "data/data_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int label_col = (int)(data[0] % 8) - 2;
  /* A heap copy of exactly the text, so ASan sees any read past its end. */
  char *text = malloc(size - 1 ? size - 1 : 1);
  memcpy(text, data + 1, size - 1);
  dt_dataset ds;
  if (dt__csv_parse_mem(&ds, text, size - 1, "fuzz.csv", label_col) == DT_OK) {
    if (ds.n <= 0 || ds.dim < 1 || ds.nclasses < 1) abort();
    for (int64_t i = 0; i < ds.n; i++)
      if (ds.y[i] < 0 || ds.y[i] >= ds.nclasses) abort();
    dt_dataset_free(&ds);
  } else if (ds.x || ds.y || !dt_errmsg()[0]) {
    abort();
  }
  free(text);
  return 0;
}

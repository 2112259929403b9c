/*
 * fuzz_ckpt_files.c — libFuzzer target for the two parsers of checkpoint
 * files read from disk: the first byte picks one (even: a safetensors file
 * through dt__st_parse; odd: manifest.json through dt__manifest_parse), the
 * rest is the file. A parse that succeeds must describe tensors inside the
 * buffer that tile its data section; a failure must leave a message. Any
 * crash, leak or sanitizer report is a bug.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int which = data[0] & 1;
  data++;
  size--;
  /* a heap copy of exactly the file, so ASan sees any read past its end */
  uint8_t *b = malloc(size ? size : 1);
  memcpy(b, data, size);
  if (which == 0) {
    dt_st st;
    if (dt__st_parse(&st, b, size, "f.safetensors") == DT_OK) {
      uint64_t total = 0;
      for (int i = 0; i < st.n; i++) {
        const dt_st_tensor *t = &st.t[i];
        if (t->end < t->begin || st.data_off + t->end > size) abort();
        if ((const uint8_t *)t->data != b + st.data_off + t->begin) abort();
        total += t->end - t->begin;
      }
      if (total != size - st.data_off) abort();
      dt__st_free(&st);
    } else if (!dt_errmsg()[0]) {
      abort();
    }
  } else {
    dt_ckpt_info info;
    memset(&info, 0, sizeof info);
    if (dt__manifest_parse((const char *)b, size, "manifest.json", &info) == DT_OK) {
      if (info.nfiles < 1 || info.nfiles > DT_CKPT_FILES_MAX) abort();
      for (int i = 0; i < info.nfiles; i++)
        if (strchr(info.files[i].name, '/') || strlen(info.files[i].sha256) != 64) abort();
    } else if (!dt_errmsg()[0]) {
      abort();
    }
  }
  free(b);
  return 0;
}

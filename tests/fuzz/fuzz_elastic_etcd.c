/*
 * fuzz_elastic_etcd.c — libFuzzer target for the etcd store's reply parser
 * (dt__etcd_range_reply): any bytes as a /v3/kv/range reply. An accepted
 * reply that found a key must give a value buffer (empty values too) and a
 * revision >= 0; one that found none, no buffer; a refusal must leave a
 * message and no buffer.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "elastic/store_etcd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int found = -1;
  unsigned char *val = (unsigned char *)1;
  size_t vlen = 7;
  int64_t rev = -7;
  dt__clearerr();
  int rc = dt__etcd_range_reply((const char *)data, size, &found, &val, &vlen, &rev);
  if (rc < 0) {
    if (!dt_errmsg()[0] || found || val) abort();
    return 0;
  }
  if (found != 0 && found != 1) abort();
  if (found && (!val || rev < 0)) abort();
  if (!found && (val || vlen)) abort();
  if (val) {
    volatile unsigned char s = 0;
    for (size_t i = 0; i < vlen; i++) s ^= val[i]; /* ASan: all of it readable */
    (void)s;
  }
  free(val);
  return 0;
}

/*
 * fuzz_comm_store.c — libFuzzer target for the store protocol parser
 * (dt__kv_parse) in request and reply mode: a stream of arbitrary bytes is
 * parsed message by message as the server and client do; accepted messages
 * must lie inside the buffer, respect the key and value bounds and carry no
 * NUL in request keys.
 */
#include "comm/store_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int reply = 0; reply < 2; reply++) {
    size_t off = 0;
    while (off < size) {
      struct dt_kv_msg m;
      size_t used = 0;
      char why[128];
      int rc = dt__kv_parse(data + off, size - off, reply, &m, &used, why);
      if (rc != DT_OK) {
        if (rc != DT_EAGAIN && rc != DT_EPROTO) abort();
        break;
      }
      if (used < DT_KV_HDR || used > size - off) abort();
      if (used != DT_KV_HDR + (size_t)m.klen + m.vlen + m.v2len) abort();
      if (m.vlen > DT_STORE_VAL_MAX || m.v2len > DT_STORE_VAL_MAX) abort();
      if (!reply && (m.klen == 0 || m.klen > DT_STORE_KEY_MAX || memchr(m.key, 0, m.klen))) abort();
      /* touch every byte the parser handed out */
      volatile uint8_t sink = 0;
      for (uint32_t i = 0; i < m.klen; i++) sink ^= m.key[i];
      for (uint32_t i = 0; i < m.vlen; i++) sink ^= m.val[i];
      for (uint32_t i = 0; i < m.v2len; i++) sink ^= m.val2[i];
      (void)sink;
      off += used;
    }
  }
  return 0;
}

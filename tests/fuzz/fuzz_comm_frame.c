/*
 * fuzz_comm_frame.c — libFuzzer target for the stream transports' frame
 * header parser (dt__frame_decode): arbitrary bytes are cut into frames the
 * way tcp.c reads them (a 24-byte header, then the declared payload), and
 * every accepted header must satisfy the invariants the transport relies on
 * (known type, zero flags, bounded length) and re-encode to the same bytes.
 */
#include "comm/wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t off = 0;
  while (size - off >= DT_FRAME_HDR_LEN) {
    struct dt_frame_hdr h;
    char why[128];
    if (dt__frame_decode(data + off, &h, why) < 0) {
      if (!memchr(why, 0, sizeof why)) abort(); /* reason must be a string */
      break;
    }
    if (h.magic != DT_FRAME_MAGIC || h.version != DT_FRAME_VERSION || h.flags) abort();
    if (h.type < DT_FRAME_DATA || h.type > DT_FRAME_TYPE_MAX) abort();
    if (h.len > (h.type == DT_FRAME_DATA ? DT_FRAME_MAX_LEN : DT_FRAME_CTRL_MAX)) abort();
    uint8_t again[DT_FRAME_HDR_LEN];
    dt__frame_encode(&h, again);
    if (memcmp(again, data + off, DT_FRAME_HDR_LEN)) abort();
    off += DT_FRAME_HDR_LEN;
    if (h.len > size - off) break; /* truncated: the transport waits for more */
    off += (size_t)h.len;
  }
  return 0;
}

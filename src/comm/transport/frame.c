/*
 * frame.c — encoding and validation of the fixed 24-byte frame header every
 * stream transport message starts with (transport.h: struct dt_frame_hdr).
 *
 * Validation is the security boundary for bytes from the network: magic,
 * version, known type, zero flags and a bounded length, with a reason a
 * caller logs before closing the connection. It does not read sockets.
 */
#include "comm/transport.h"

#include <stdio.h>
#include <string.h>

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

void dt__frame_encode(const struct dt_frame_hdr *h, uint8_t out[DT_FRAME_HDR_LEN]) {
  put32(out, h->magic);
  out[4] = h->version;
  out[5] = h->type;
  out[6] = (uint8_t)h->flags;
  out[7] = (uint8_t)(h->flags >> 8);
  put64(out + 8, h->tag);
  put64(out + 16, h->len);
}

int dt__frame_decode(const uint8_t in[DT_FRAME_HDR_LEN], struct dt_frame_hdr *h, char *why) {
  h->magic = get32(in);
  h->version = in[4];
  h->type = in[5];
  h->flags = (uint16_t)(in[6] | in[7] << 8);
  h->tag = get64(in + 8);
  h->len = get64(in + 16);
  if (h->magic != DT_FRAME_MAGIC) {
    snprintf(why, 128, "bad frame magic 0x%08x", h->magic);
    return DT_EPROTO;
  }
  if (h->version != DT_FRAME_VERSION) {
    snprintf(why, 128, "unsupported frame version %u", h->version);
    return DT_EPROTO;
  }
  if (h->type < DT_FRAME_DATA || h->type > DT_FRAME_TYPE_MAX) {
    snprintf(why, 128, "unknown frame type %u", h->type);
    return DT_EPROTO;
  }
  if (h->flags) {
    snprintf(why, 128, "nonzero frame flags 0x%x", h->flags);
    return DT_EPROTO;
  }
  uint64_t max = h->type == DT_FRAME_DATA ? DT_FRAME_MAX_LEN : DT_FRAME_CTRL_MAX;
  if (h->len > max) {
    snprintf(why, 128, "frame length %llu exceeds %llu", (unsigned long long)h->len,
             (unsigned long long)max);
    return DT_EPROTO;
  }
  return DT_OK;
}

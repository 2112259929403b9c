/*
 * store_int.h — internals shared by the store client (store.c), the TCP
 * store server (store_server.c), the file store (store_file.c) and the
 * store-protocol fuzz target: the backend table and the wire message.
 *
 * Wire: every request and reply is a 24-byte little-endian header
 *   magic "DTKV" (u32) | version u8 | op u8 (reply: status, a negated DT_E*)
 *   | flags u16 (0) | klen u32 | vlen u32 | v2len u32 | timeout_ms u32
 * followed by klen key bytes, vlen value bytes and v2len bytes of a second
 * value (compare-and-set's desired value). Keys are bounded by
 * DT_STORE_KEY_MAX, values by DT_STORE_VAL_MAX. Before the first request the
 * connection runs the auth.c challenge-response (server nonce first).
 */
#ifndef DT_COMM_STORE_INT_H
#define DT_COMM_STORE_INT_H

#include "comm/comm.h"

#define DT_KV_MAGIC 0x564b5444u /* "DTKV" */
#define DT_KV_VERSION 1
#define DT_KV_HDR 24

enum dt_kv_op { DT_KV_SET = 1, DT_KV_GET, DT_KV_ADD, DT_KV_CAS, DT_KV_DEL, DT_KV_CHECK, DT_KV_OP_MAX = DT_KV_CHECK };

struct dt_kv_msg {
  uint8_t op;          /* request op, or reply status (-rc) */
  uint32_t timeout_ms;
  const uint8_t *key;  /* points into the parsed buffer */
  uint32_t klen;
  const uint8_t *val;
  uint32_t vlen;
  const uint8_t *val2;
  uint32_t v2len;
};

/* Parses one message from buf[0..len). Returns DT_OK with *used bytes
 * consumed, DT_EAGAIN if more bytes are needed, or DT_EPROTO with a reason in
 * why (>= 128 bytes). `reply` selects reply validation (op is a status). */
int dt__kv_parse(const uint8_t *buf, size_t len, bool reply, struct dt_kv_msg *m, size_t *used,
                 char *why);
/* Encodes a message header into out. */
void dt__kv_encode_hdr(uint8_t out[DT_KV_HDR], uint8_t op, uint32_t klen, uint32_t vlen,
                       uint32_t v2len, uint32_t timeout_ms);

/* A store backend. `self` is the backend's state. All calls are already
 * serialised by store.c. */
struct dt_store_backend {
  const char *name;
  int (*set)(void *self, const char *key, const void *val, size_t len, double timeout_s);
  /* wait: if buf == NULL only waits for existence. */
  int (*get)(void *self, const char *key, void *buf, size_t cap, size_t *len, double timeout_s);
  int (*add)(void *self, const char *key, int64_t delta, int64_t *result, double timeout_s);
  int (*cas)(void *self, const char *key, const void *exp, size_t elen, const void *des,
             size_t dlen, bool *swapped, void *cur, size_t cap, size_t *curlen, double timeout_s);
  int (*del)(void *self, const char *key, bool *existed, double timeout_s);
  void (*destroy)(void *self);
};

int dt__store_wrap(dt_store **out, const struct dt_store_backend *be, void *self);

/* Shared semantics of the in-memory table (server and file store): applies
 * compare-and-set to a current value. */
bool dt__kv_cas_match(const void *cur, size_t curlen, bool exists, const void *exp, size_t elen);

#endif

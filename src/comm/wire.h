/*
 * wire.h — what travels on dtrain's TCP connections, in one place for the
 * tcp transport and the store: the transport frame header (magic, version,
 * type, tag, length) with its bounds and validation, the store's request /
 * reply message with its bounds and validation, and the HMAC-SHA256
 * challenge-response every connection runs before anything else.
 *
 * Both codecs are the security boundary for bytes from the network: a
 * header that fails validation closes that connection with the returned
 * reason (both have libFuzzer targets: tests/fuzz/fuzz_comm_frame.c,
 * fuzz_comm_store.c). Challenge-response: each side sends a random 32-byte
 * nonce; each proves knowledge of the job token by sending
 * HMAC-SHA256(token, label || nonce_mine || nonce_theirs), with a different
 * label per direction so a reflected answer is useless; the token never
 * crosses the wire. Not here: sockets, connection state machines (tcp.c,
 * store.c, store_server.c), encryption of the traffic.
 */
#ifndef DT_COMM_WIRE_H
#define DT_COMM_WIRE_H

#include "comm/comm.h"

/* ---- transport frames (tcp) ------------------------------------------------ */

/* Every frame on a stream connection starts with this fixed 24-byte header,
 * little-endian on the wire. A header that fails dt__frame_validate closes
 * the connection with the logged reason. */
#define DT_FRAME_MAGIC 0x44544652u /* "DTFR" */
#define DT_FRAME_VERSION 1
#define DT_FRAME_HDR_LEN 24
#define DT_FRAME_MAX_LEN (1ull << 34) /* 16 GiB: bound on any single message */
#define DT_FRAME_CTRL_MAX 4096        /* bound on control frames (hello, abort, ...) */

enum dt_frame_type {
  DT_FRAME_DATA = 1,    /* payload of a send; tag matches a receive */
  DT_FRAME_HELLO = 2,   /* first frame on a connection: job, ranks, nonce */
  DT_FRAME_AUTH = 3,    /* HMAC answer to the challenge */
  DT_FRAME_AUTH_OK = 4,
  DT_FRAME_ABORT = 5,   /* payload: int32 code + message; the sender aborted */
  DT_FRAME_BYE = 6,     /* clean close */
  DT_FRAME_TYPE_MAX = 6
};

struct dt_frame_hdr {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t flags;   /* must be 0 in version 1 */
  uint64_t tag;
  uint64_t len;     /* payload bytes following the header */
};

/* Encodes h into 24 bytes. */
void dt__frame_encode(const struct dt_frame_hdr *h, uint8_t out[DT_FRAME_HDR_LEN]);
/* Decodes and validates 24 bytes: magic, version, type known, flags zero,
 * length within DT_FRAME_MAX_LEN (DT_FRAME_CTRL_MAX for control frames).
 * Returns DT_OK or DT_EPROTO with the reason in why (>= 128 bytes). */
int dt__frame_decode(const uint8_t in[DT_FRAME_HDR_LEN], struct dt_frame_hdr *h, char *why);

/* ---- authentication ------------------------------------------------------ */

#define DT_AUTH_NONCE_LEN 32
#define DT_AUTH_MAC_LEN 32
/* mac = HMAC-SHA256(token, label || nonce_a || nonce_b). Returns DT_ENOTSUP
 * when built without libcrypto. */
int dt__auth_mac(const uint8_t *token, size_t token_len, const char *label,
                 const uint8_t *nonce_a, const uint8_t *nonce_b, uint8_t mac[DT_AUTH_MAC_LEN]);
/* Fills buf with cryptographically random bytes. */
int dt__auth_random(uint8_t *buf, size_t len);
/* Constant-time comparison; true if equal. */
bool dt__auth_equal(const uint8_t *a, const uint8_t *b, size_t len);
/* The checking half of the challenge-response: true if mac is the proof
 * dt__auth_mac(token, label, nonce_a, nonce_b) computes (false also when
 * HMAC is unavailable). */
bool dt__auth_verify(const uint8_t *token, size_t token_len, const char *label, const uint8_t *nonce_a,
                     const uint8_t *nonce_b, const uint8_t mac[DT_AUTH_MAC_LEN]);
/* The job token: cfg_token, else DTRAIN_JOB_TOKEN, else none (len 0). */
void dt__auth_token(const char *cfg_token, const uint8_t **tok, size_t *len);

/* ---- store messages ------------------------------------------------------ */

/* Every store request and reply is a 24-byte little-endian header
 *   magic "DTKV" (u32) | version u8 | op u8 (reply: status, a negated DT_E*)
 *   | flags u16 (0) | klen u32 | vlen u32 | v2len u32 | timeout_ms u32
 * followed by klen key bytes, vlen value bytes and v2len bytes of a second
 * value (compare-and-set's desired value). Keys are bounded by
 * DT_STORE_KEY_MAX, values by DT_STORE_VAL_MAX. Before the first request the
 * connection runs the challenge-response below (server nonce first). */
#define DT_KV_MAGIC 0x564b5444u /* "DTKV" */
#define DT_KV_VERSION 1
#define DT_KV_HDR 24

/* DT_KV_BEAT (elastic's watcher, one call per heartbeat): adds 1 to the
 * counter named by the value, then waits like GET for the key; the reply
 * (DT_OK, also when the wait timed out) holds one byte (1: the key exists)
 * and, as its second value, the value of the key named by the request's
 * second value (empty if missing), read when answered. */
enum dt_kv_op { DT_KV_SET = 1, DT_KV_GET, DT_KV_ADD, DT_KV_CAS, DT_KV_DEL, DT_KV_CHECK, DT_KV_BEAT,
                DT_KV_OP_MAX = DT_KV_BEAT };

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

#endif /* DT_COMM_WIRE_H */

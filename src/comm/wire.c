/*
 * wire.c — the codecs and the challenge-response of wire.h: transport frame
 * headers, store messages, HMAC-SHA256 proofs of the job token. Pure
 * functions over bytes: it reads no socket and keeps no state.
 */
#include "comm/wire.h"

#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>


/* ---- transport frames ---------------------------------------------------- */

void dt__frame_encode(const struct dt_frame_hdr *h, uint8_t out[DT_FRAME_HDR_LEN]) {
  dt_put_le32(out, h->magic);
  out[4] = h->version;
  out[5] = h->type;
  out[6] = (uint8_t)h->flags;
  out[7] = (uint8_t)(h->flags >> 8);
  dt_put_le64(out + 8, h->tag);
  dt_put_le64(out + 16, h->len);
}

int dt__frame_decode(const uint8_t in[DT_FRAME_HDR_LEN], struct dt_frame_hdr *h, char *why) {
  h->magic = dt_get_le32(in);
  h->version = in[4];
  h->type = in[5];
  h->flags = (uint16_t)(in[6] | in[7] << 8);
  h->tag = dt_get_le64(in + 8);
  h->len = dt_get_le64(in + 16);
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

/* ---- store messages ------------------------------------------------------ */


void dt__kv_encode_hdr(uint8_t out[DT_KV_HDR], uint8_t op, uint32_t klen, uint32_t vlen,
                       uint32_t v2len, uint32_t timeout_ms) {
  dt_put_le32(out, DT_KV_MAGIC);
  out[4] = DT_KV_VERSION;
  out[5] = op;
  out[6] = out[7] = 0;
  dt_put_le32(out + 8, klen);
  dt_put_le32(out + 12, vlen);
  dt_put_le32(out + 16, v2len);
  dt_put_le32(out + 20, timeout_ms);
}

int dt__kv_parse(const uint8_t *buf, size_t len, bool reply, struct dt_kv_msg *m, size_t *used,
                 char *why) {
  if (len < DT_KV_HDR) return DT_EAGAIN;
  if (dt_get_le32(buf) != DT_KV_MAGIC) {
    snprintf(why, 128, "bad store magic 0x%08x", dt_get_le32(buf));
    return DT_EPROTO;
  }
  if (buf[4] != DT_KV_VERSION) {
    snprintf(why, 128, "unsupported store protocol version %u", buf[4]);
    return DT_EPROTO;
  }
  m->op = buf[5];
  if (buf[6] || buf[7]) {
    snprintf(why, 128, "nonzero store flags");
    return DT_EPROTO;
  }
  if (!reply && (m->op < DT_KV_SET || m->op > DT_KV_OP_MAX)) {
    snprintf(why, 128, "unknown store op %u", m->op);
    return DT_EPROTO;
  }
  m->klen = dt_get_le32(buf + 8);
  m->vlen = dt_get_le32(buf + 12);
  m->v2len = dt_get_le32(buf + 16);
  m->timeout_ms = dt_get_le32(buf + 20);
  if ((!reply && (m->klen == 0 || m->klen > DT_STORE_KEY_MAX)) || (reply && m->klen)) {
    snprintf(why, 128, "store key length %u out of range", m->klen);
    return DT_EPROTO;
  }
  if (m->vlen > DT_STORE_VAL_MAX || m->v2len > DT_STORE_VAL_MAX) {
    snprintf(why, 128, "store value length %u/%u exceeds %u", m->vlen, m->v2len, DT_STORE_VAL_MAX);
    return DT_EPROTO;
  }
  size_t total = DT_KV_HDR + (size_t)m->klen + m->vlen + m->v2len;
  if (len < total) return DT_EAGAIN;
  m->key = buf + DT_KV_HDR;
  m->val = m->key + m->klen;
  m->val2 = m->val + m->vlen;
  if (!reply && memchr(m->key, 0, m->klen)) {
    snprintf(why, 128, "store key contains a NUL byte");
    return DT_EPROTO;
  }
  *used = total;
  return DT_OK;
}

/* ---- authentication ------------------------------------------------------ */

#if __has_include(<openssl/hmac.h>)
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#define HAVE_CRYPTO 1
#endif

int dt__auth_mac(const uint8_t *token, size_t token_len, const char *label,
                 const uint8_t *nonce_a, const uint8_t *nonce_b, uint8_t mac[DT_AUTH_MAC_LEN]) {
#ifdef HAVE_CRYPTO
  uint8_t msg[64 + 2 * DT_AUTH_NONCE_LEN];
  size_t ll = strlen(label);
  if (ll > 64) ll = 64;
  memcpy(msg, label, ll);
  memcpy(msg + ll, nonce_a, DT_AUTH_NONCE_LEN);
  memcpy(msg + ll + DT_AUTH_NONCE_LEN, nonce_b, DT_AUTH_NONCE_LEN);
  unsigned int outlen = 0;
  static const uint8_t empty[1] = {0};
  if (!HMAC(EVP_sha256(), token_len ? token : empty, (int)token_len, msg,
            ll + 2 * DT_AUTH_NONCE_LEN, mac, &outlen) ||
      outlen != DT_AUTH_MAC_LEN)
    return dt__seterr(DT_EAUTH, "auth: HMAC-SHA256 failed");
  return DT_OK;
#else
  (void)token; (void)token_len; (void)label; (void)nonce_a; (void)nonce_b;
  memset(mac, 0, DT_AUTH_MAC_LEN);
  return dt__seterr(DT_ENOTSUP, "auth: built without OpenSSL libcrypto");
#endif
}

int dt__auth_random(uint8_t *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = getrandom(buf + got, len - got, 0);
    if (n <= 0) return dt__seterr(DT_EIO, "auth: getrandom failed");
    got += (size_t)n;
  }
  return DT_OK;
}

bool dt__auth_equal(const uint8_t *a, const uint8_t *b, size_t len) {
  uint8_t d = 0;
  for (size_t i = 0; i < len; i++) d |= (uint8_t)(a[i] ^ b[i]);
  return d == 0;
}

void dt__auth_token(const char *cfg_token, const uint8_t **tok, size_t *len) {
  const char *t = cfg_token ? cfg_token : dt_param_s(DT_PARAM_JOB_TOKEN);
  *tok = (const uint8_t *)(t ? t : "");
  *len = t ? strlen(t) : 0;
}

bool dt__auth_verify(const uint8_t *token, size_t token_len, const char *label, const uint8_t *nonce_a,
                     const uint8_t *nonce_b, const uint8_t mac[DT_AUTH_MAC_LEN]) {
  uint8_t want[DT_AUTH_MAC_LEN];
  if (dt__auth_mac(token, token_len, label, nonce_a, nonce_b, want) < 0) return false;
  return dt__auth_equal(want, mac, DT_AUTH_MAC_LEN);
}

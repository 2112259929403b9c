/*
 * auth.c — the job token and the HMAC-SHA256 challenge-response every
 * connection (transport or store) runs before anything else.
 *
 * The protocol (used by tcp.c and store.c): each side sends a random 32-byte
 * nonce; each proves knowledge of the token by sending
 * HMAC-SHA256(token, label || nonce_mine || nonce_theirs), with a different
 * label per direction so a reflected answer is useless. The token never
 * crosses the wire. Not here: encryption of the traffic (a job on an
 * untrusted network should run over a VPN or TLS tunnel).
 */
#include "comm/transport.h"

#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

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
  const char *t = cfg_token ? cfg_token : dt_param_str("DTRAIN_JOB_TOKEN", NULL);
  *tok = (const uint8_t *)(t ? t : "");
  *len = t ? strlen(t) : 0;
}

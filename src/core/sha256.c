/*
 * sha256.c — SHA-256 through OpenSSL's libcrypto, raw (32 bytes) and as
 * lowercase hex, for parameter and config fingerprints (summary.json, the
 * data-parallel parameter and config checks). Callers that compare or store
 * digests use the raw form; hex is for people and JSON, never parsed back.
 * It hashes; it does not sign or authenticate.
 */
#include <openssl/evp.h>
#include <string.h>

#include "core/core.h"

void dt_sha256(const void *buf, size_t len, uint8_t out[32]) {
  unsigned int mdlen = 0;
  if (!EVP_Digest(buf, len, out, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
    memset(out, 0, 32); /* only on a broken libcrypto */
}

void dt_hex(const uint8_t *bytes, size_t n, char *out) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex[bytes[i] >> 4];
    out[2 * i + 1] = hex[bytes[i] & 15];
  }
  out[2 * n] = '\0';
}

void dt_sha256_hex(const void *buf, size_t len, char out[65]) {
  uint8_t md[32];
  dt_sha256(buf, len, md);
  dt_hex(md, 32, out);
}

/*
 * sha256.c — SHA-256 as lowercase hex through OpenSSL's libcrypto, for
 * parameter and config fingerprints (summary.json, the data-parallel
 * parameter check). It hashes; it does not sign or authenticate.
 */
#include <openssl/evp.h>
#include <string.h>

#include "core/core.h"

void dt_sha256_hex(const void *buf, size_t len, char out[65]) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  if (!EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32) {
    memset(out, '0', 64); /* only on a broken libcrypto */
    out[64] = '\0';
    return;
  }
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[64] = '\0';
}

/*
 * sha256.c — SHA-256 through OpenSSL's libcrypto, raw (32 bytes) and as
 * lowercase hex, for parameter and config fingerprints (summary.json, the
 * data-parallel parameter and config checks). Callers that compare or store
 * digests use the raw form; hex is for people and JSON, never parsed back.
 * Also incremental (begin, update, end), for a digest of data that no one
 * buffer holds (the pipeline's parameters, one stage's span after another).
 * It hashes; it does not sign or authenticate.
 */
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

void dt_sha256(const void *buf, size_t len, uint8_t out[32]) {
  unsigned int mdlen = 0;
  if (!EVP_Digest(buf, len, out, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
    memset(out, 0, 32); /* only on a broken libcrypto */
}

struct dt_sha256_ctx {
  EVP_MD_CTX *md;
};

dt_sha256_ctx *dt_sha256_begin(void) {
  dt_sha256_ctx *c = malloc(sizeof *c);
  if (!c) return NULL;
  if (!(c->md = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(c->md, EVP_sha256(), NULL)) {
    EVP_MD_CTX_free(c->md);
    free(c);
    return NULL;
  }
  return c;
}

void dt_sha256_update(dt_sha256_ctx *c, const void *buf, size_t len) {
  if (c && len) EVP_DigestUpdate(c->md, buf, len);
}

void dt_sha256_end(dt_sha256_ctx *c, uint8_t out[32]) {
  unsigned int mdlen = 0;
  if (!c || !EVP_DigestFinal_ex(c->md, out, &mdlen) || mdlen != 32) memset(out, 0, 32);
  if (c) EVP_MD_CTX_free(c->md);
  free(c);
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

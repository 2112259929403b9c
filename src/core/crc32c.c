/*
 * crc32c.c — CRC-32C (Castagnoli), table-driven, for checkpoint and frame
 * checksums. Slicing-by-1 is enough for the sizes it sees today; measure
 * before making it faster.
 */
#include "core.h"

#include <pthread.h>

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
}

uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&table_once, build_table);
  const uint8_t *p = buf;
  crc = ~crc;
  while (len--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

/*
 * fuzz_ps_msg.c — libFuzzer target for the parameter server's message
 * parser (dt_ps_msg_parse): the first bytes pick the receiving side and the
 * sender, the next 64 are a header. Every accepted header must satisfy what
 * the server and the worker rely on before they read a payload (a known
 * type for that direction, the sender it came from, a key of the map held
 * by the server involved (without replicas; with replicas a loss moves
 * ranges, so the server checks what it holds), a payload size equal to the key's length, a
 * finite rate and weight; rows only of a key of rows, no more than it
 * has), and re-encode to the same bytes but the
 * reserved fields; a refusal must leave a message. LOST and REJOIN (a
 * server lost, a server back) reach servers only with replicas. Bit 0x40 of the first
 * byte feeds the header to the re-replication copy parser
 * (dt_ps_msg_parse_copy) instead: a copy names a key of the map, a record
 * of one, two or three floats per parameter, and its sender.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps.h"

static dt_ps_map maps[2]; /* without replicas, with 2 */
static int ready;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) {
    /* layer 1: 25 rows of 8 (an embedding), the rest dense */
    uint64_t len[] = {0, 200, 30, 0, 7, 1}, rowlen[] = {1, 8, 1, 1, 1, 1};
    for (int i = 0; i < 2; i++)
      if (dt_ps_map_build_rows(&maps[i], len, rowlen, 6, 3) < 0) abort();
    if (dt_ps_map_set_replicas(&maps[1], 2) < 0) abort();
    ready = 1;
  }
  const dt_ps_map *mp = size && (data[0] & 0x80) ? &maps[1] : &maps[0];
  if (size < 2) return 0;
  int to = (data[0] & 1) ? -1 : (data[0] >> 1) % 3; /* a worker, or server 0..2 */
  int from = data[1] % 5;                           /* 3 workers; 3 servers */
  data += 2;
  size -= 2;
  dt_ps_msg m;
  if (data[-2] & 0x40) {
    if (dt_ps_msg_parse_copy(data, size, mp, from, &m) < 0) {
      if (!dt_errmsg()[0]) abort();
      return 0;
    }
    if (size != DT_PS_HDR_BYTES || m.type != DT_PS_COPY || m.sender != from || m.key < 0 ||
        m.key >= mp->nkeys || m.clock < 0 || m.flags > 2)
      abort();
    const uint64_t L = mp->keys[m.key].len;
    if (m.count != L && m.count != 2 * L && m.count != 3 * L) abort();
    return 0;
  }
  if (dt_ps_msg_parse(data, size, mp, 3, to, from, &m) < 0) {
    if (!dt_errmsg()[0]) abort();
    return 0;
  }
  if (size != DT_PS_HDR_BYTES || m.sender != from) abort();
  if (to >= 0 && !(m.type == DT_PS_HELLO || m.type == DT_PS_PUSH || m.type == DT_PS_PULL ||
                   m.type == DT_PS_BYE ||
                   ((m.type == DT_PS_LOST || m.type == DT_PS_REJOIN) && mp->replicas > 1)))
    abort();
  if ((m.type == DT_PS_LOST || m.type == DT_PS_REJOIN) && (m.aux >= 3 || m.key || m.count || m.flags))
    abort();
  if (to < 0 && !(m.type == DT_PS_WELCOME || m.type == DT_PS_PARAMS || m.type == DT_PS_ERR))
    abort();
  if (m.type == DT_PS_PUSH || m.type == DT_PS_PULL || m.type == DT_PS_PARAMS) {
    if (m.key < 0 || m.key >= mp->nkeys) abort();
    /* without replicas the server involved holds the key */
    int d = ((to >= 0 ? to : from) - mp->keys[m.key].server + 3) % 3;
    if (mp->replicas < 2 && d != 0) abort();
    if (m.flags & DT_PS_F_STATE) {
      const uint64_t L = mp->keys[m.key].len;
      if (m.flags != DT_PS_F_STATE || m.type == DT_PS_PUSH) abort();
      if (m.type == DT_PS_PULL ? m.count != 0 : (m.count != L && m.count != 2 * L && m.count != 3 * L))
        abort();
    } else if (m.flags & DT_PS_F_ROWS) {
      const dt_ps_key *K = &mp->keys[m.key];
      if (K->rowlen < 2 || K->len % K->rowlen || m.count > K->len / K->rowlen) abort();
      if (m.flags & (DT_PS_F_SPARSE | DT_PS_F_PULL | DT_PS_F_FINAL)) abort();
    } else if (m.flags & DT_PS_F_SPARSE) {
      if (m.type != DT_PS_PUSH || m.count > mp->keys[m.key].len) abort();
    } else if (m.count != (m.type == DT_PS_PULL ? 0 : mp->keys[m.key].len)) {
      abort();
    }
  }
  if (m.type == DT_PS_PUSH && (!isfinite(m.lr) || !isfinite(m.weight))) abort();
  uint8_t again[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&m, again);
  /* reserved bytes 44..47 and 56..63 are not read back */
  if (memcmp(again, data, 44) || memcmp(again + 48, data + 48, 8)) abort();
  return 0;
}

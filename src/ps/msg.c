/*
 * msg.c — the parameter server's message header: a fixed 64-byte
 * little-endian record (magic, version, type, sender, key, flags, clock,
 * count, lr, weight, aux) that precedes every payload, and its parser. The
 * parser is the server's and the worker's only view of what a peer sent:
 * it checks every field against the key-range map before anything is read
 * into a buffer, so a push for an unknown key or of the wrong size is
 * refused with a message naming the sender and the key (fuzzed by
 * tests/fuzz/fuzz_ps_msg.c).
 *
 * It does not send or receive (server.c, client.c do).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ps/ps.h"

static const char *const type_names[] = {"?",      "hello", "welcome", "push",
                                         "pull",   "params", "bye",    "err",
                                         "lost",   "copy",   "rejoin"};

const char *dt_ps_type_name(int type) {
  return type > 0 && type < DT_PS_TYPE_MAX ? type_names[type] : "?";
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* layout: 0 magic, 4 version(16) type(16), 8 sender, 12 key, 16 flags, 20 lr,
 * 24 clock, 32 count, 40 weight, 44 reserved, 48 aux, 56 reserved */
void dt_ps_msg_encode(const dt_ps_msg *m, uint8_t out[DT_PS_HDR_BYTES]) {
  memset(out, 0, DT_PS_HDR_BYTES);
  put32(out, DT_PS_MAGIC);
  put32(out + 4, (uint32_t)DT_PS_VERSION | ((uint32_t)m->type << 16));
  put32(out + 8, (uint32_t)m->sender);
  put32(out + 12, (uint32_t)m->key);
  put32(out + 16, m->flags);
  put32(out + 20, fbits(m->lr));
  put64(out + 24, (uint64_t)m->clock);
  put64(out + 32, m->count);
  put32(out + 40, fbits(m->weight));
  put64(out + 48, m->aux);
}

/* The fields of a 64-byte header (magic and version checked by the caller). */
static void decode(const uint8_t *buf, dt_ps_msg *m) {
  m->type = (int)(get32(buf + 4) >> 16);
  m->sender = (int32_t)get32(buf + 8);
  m->key = (int32_t)get32(buf + 12);
  m->flags = get32(buf + 16);
  m->lr = bitsf(get32(buf + 20));
  m->clock = (int64_t)get64(buf + 24);
  m->count = get64(buf + 32);
  m->weight = bitsf(get32(buf + 40));
  m->aux = get64(buf + 48);
}

int dt_ps_msg_parse(const uint8_t *buf, size_t len, const dt_ps_map *map, int nworkers, int to,
                    int from, dt_ps_msg *out) {
  const char *who = to >= 0 ? "worker" : "server";
  if (!buf || !map || !out) return dt__seterr(DT_EINVAL, "ps message: NULL argument");
  if (len != DT_PS_HDR_BYTES)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent a %zu-byte header (expected %d)", who, from,
                      len, DT_PS_HDR_BYTES);
  if (get32(buf) != DT_PS_MAGIC)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent a header with bad magic 0x%08x", who, from,
                      get32(buf));
  uint32_t vt = get32(buf + 4);
  if ((vt & 0xffff) != DT_PS_VERSION)
    return dt__seterr(DT_EPROTO, "ps: %s %d speaks protocol version %u (this is %d)", who, from,
                      vt & 0xffff, DT_PS_VERSION);
  dt_ps_msg m;
  decode(buf, &m);
  const int to_server = to >= 0;
  int ok_type = to_server ? (m.type == DT_PS_HELLO || m.type == DT_PS_PUSH ||
                             m.type == DT_PS_PULL || m.type == DT_PS_BYE ||
                             ((m.type == DT_PS_LOST || m.type == DT_PS_REJOIN) &&
                              map->replicas > 1))
                          : (m.type == DT_PS_WELCOME || m.type == DT_PS_PARAMS ||
                             m.type == DT_PS_ERR);
  if (!ok_type)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent a message of type %d (%s) that a %s does not "
                      "take", who, from, m.type, dt_ps_type_name(m.type),
                      to_server ? "server" : "worker");
  if (m.sender != from)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent a header claiming to be from %d", who, from,
                      m.sender);
  if (to_server ? (from < 0 || from >= nworkers) : (from < 0 || from >= map->nservers))
    return dt__seterr(DT_EPROTO, "ps: message from unknown %s %d", who, from);
  if (m.flags & ~(DT_PS_F_PULL | DT_PS_F_FINAL | DT_PS_F_SPARSE | DT_PS_F_ROWS | DT_PS_F_STATE |
                  DT_PS_F_WIN | DT_PS_F_JOIN))
    return dt__seterr(DT_EPROTO, "ps: %s %d sent unknown flags 0x%x", who, from, m.flags);
  if ((m.flags & DT_PS_F_JOIN) && (m.type != DT_PS_HELLO || m.flags != DT_PS_F_JOIN))
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s with the join flag (flags 0x%x)", who, from,
                      dt_ps_type_name(m.type), m.flags);
  if (m.type == DT_PS_ERR) {
    if (m.count != 0 || m.clock >= 0)
      return dt__seterr(DT_EPROTO, "ps: server %d sent a malformed refusal", from);
    *out = m;
    return DT_OK;
  }
  if (m.clock < 0)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s with negative clock %lld", who, from,
                      dt_ps_type_name(m.type), (long long)m.clock);
  if (m.type == DT_PS_LOST || m.type == DT_PS_REJOIN) {
    if (m.count || m.key || m.flags || m.aux >= (uint64_t)map->nservers)
      return dt__seterr(DT_EPROTO, "ps: worker %d sent a malformed loss notice (server %llu)",
                        from, (unsigned long long)m.aux);
    *out = m;
    return DT_OK;
  }
  if (m.type == DT_PS_HELLO || m.type == DT_PS_WELCOME || m.type == DT_PS_BYE) {
    if (m.type == DT_PS_BYE && (m.count || m.key))
      return dt__seterr(DT_EPROTO, "ps: worker %d sent a malformed bye", from);
    *out = m;
    return DT_OK;
  }
  /* PUSH, PULL, PARAMS name a key of the server involved */
  int srv = to_server ? to : from;
  if (m.key < 0 || m.key >= map->nkeys)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s for unknown key %d (the map has %d keys)",
                      who, from, dt_ps_type_name(m.type), m.key, map->nkeys);
  const dt_ps_key *K = &map->keys[m.key];
  /* with replicas a loss moves ranges to other servers (dt_ps_holders):
   * the server checks what it holds */
  if (map->replicas < 2 && !dt_ps_map_holds(map, srv, m.key))
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s for key %d, held by server %d%s, not %d", who,
                      from, dt_ps_type_name(m.type), m.key, K->server,
                      map->replicas > 1 ? " and its replicas" : "", srv);
  if ((m.flags & DT_PS_F_WIN) && (m.flags & (DT_PS_F_SPARSE | DT_PS_F_ROWS)))
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s for key %d through the window with flags "
                      "0x%x that a window does not take", who, from, dt_ps_type_name(m.type),
                      m.key, m.flags);
  if ((m.flags & DT_PS_F_SPARSE) && m.type != DT_PS_PUSH)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s for key %d marked sparse", who, from,
                      dt_ps_type_name(m.type), m.key);
  if (m.flags & DT_PS_F_STATE) {
    /* a checkpoint record: asked by a pull, answered by params (the key's
     * floats, then one or two more per float of optimizer state) */
    if (m.flags != DT_PS_F_STATE || m.type == DT_PS_PUSH ||
        (m.type == DT_PS_PULL ? m.count != 0
                              : (m.count != K->len && m.count != 2 * K->len &&
                                 m.count != 3 * K->len)))
      return dt__seterr(DT_EPROTO, "ps: %s %d sent %s of key %d's state with %llu floats and "
                        "flags 0x%x", who, from, dt_ps_type_name(m.type), m.key,
                        (unsigned long long)m.count, m.flags);
    *out = m;
    return DT_OK;
  }
  if (m.flags & DT_PS_F_ROWS) {
    /* rows of an embedding key: a push without a pull, a pull, or its reply */
    if (K->rowlen < 2 || (m.flags & (DT_PS_F_SPARSE | DT_PS_F_FINAL | DT_PS_F_PULL)))
      return dt__seterr(DT_EPROTO, "ps: %s %d sent %s of rows for key %d (%s)", who, from,
                        dt_ps_type_name(m.type), m.key,
                        K->rowlen < 2 ? "a dense key" : "with flags that rows do not take");
    if (m.count > K->len / K->rowlen)
      return dt__seterr(DT_EPROTO, "ps: %s %d sent %s for key %d with %llu rows (the key has "
                        "%llu)", who, from, dt_ps_type_name(m.type), m.key,
                        (unsigned long long)m.count, (unsigned long long)(K->len / K->rowlen));
    if (m.type == DT_PS_PUSH && (!isfinite(m.lr) || m.lr < 0 || !isfinite(m.weight) ||
                                 m.weight < 0 || m.weight > 1))
      return dt__seterr(DT_EPROTO, "ps: worker %d sent push for key %d with lr %g weight %g",
                        from, m.key, (double)m.lr, (double)m.weight);
    *out = m;
    return DT_OK;
  }
  uint64_t want = m.type == DT_PS_PULL ? 0 : K->len;
  if ((m.flags & DT_PS_F_SPARSE) && m.count > K->len)
    return dt__seterr(DT_EPROTO, "ps: worker %d sent a sparse push for key %d with %llu pairs "
                      "(the key has %llu floats)", from, m.key, (unsigned long long)m.count,
                      (unsigned long long)K->len);
  if (!(m.flags & DT_PS_F_SPARSE) && m.count != want)
    return dt__seterr(DT_EPROTO, "ps: %s %d sent %s for key %d with %llu floats (the key has "
                      "%llu%s)", who, from, dt_ps_type_name(m.type), m.key,
                      (unsigned long long)m.count, (unsigned long long)K->len,
                      m.type == DT_PS_PULL ? "; a pull carries none" : "");
  if (m.type == DT_PS_PUSH && (!isfinite(m.lr) || m.lr < 0 || !isfinite(m.weight) ||
                               m.weight < 0 || m.weight > 1))
    return dt__seterr(DT_EPROTO, "ps: worker %d sent push for key %d with lr %g weight %g", from,
                      m.key, (double)m.lr, (double)m.weight);
  *out = m;
  return DT_OK;
}

int dt_ps_msg_parse_copy(const uint8_t *buf, size_t len, const dt_ps_map *map, int from,
                         dt_ps_msg *out) {
  if (!buf || !map || !out) return dt__seterr(DT_EINVAL, "ps message: NULL argument");
  if (len != DT_PS_HDR_BYTES || get32(buf) != DT_PS_MAGIC ||
      (get32(buf + 4) & 0xffff) != DT_PS_VERSION)
    return dt__seterr(DT_EPROTO, "ps: server %d sent a malformed copy header", from);
  dt_ps_msg m;
  decode(buf, &m);
  if (m.type != DT_PS_COPY || m.sender != from || m.key < 0 || m.key >= map->nkeys ||
      m.clock < 0 || m.flags > 2)
    return dt__seterr(DT_EPROTO, "ps: server %d sent a malformed copy (type %d, key %d, clock "
                      "%lld, flags 0x%x)", from, m.type, m.key, (long long)m.clock, m.flags);
  const uint64_t n = map->keys[m.key].len;
  if (m.count != n && m.count != 2 * n && m.count != 3 * n)
    return dt__seterr(DT_EPROTO, "ps: server %d sent a copy of key %d with %llu floats (the key "
                      "has %llu)", from, m.key, (unsigned long long)m.count,
                      (unsigned long long)n);
  *out = m;
  return DT_OK;
}

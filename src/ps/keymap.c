/*
 * keymap.c — the key-range map of the parameter server: which server holds
 * which floats of the flat parameter buffer, cut into keys (the pieces of
 * layers inside one server's range) that workers push and pull one at a
 * time. Balanced by bytes: server s's share ends near (s + 1) * P / S; a
 * boundary moves to a layer boundary within an eighth of a share, so small
 * layers stay whole and a layer larger than that is split between servers.
 * A layer of rows (an embedding: rowlen floats a row) is only ever cut
 * between rows, so a row lives whole in one key: workers push and pull
 * such keys row by row (sparse rows, docs/ps.md).
 * A pure function of the layer sizes and the server count, hashed, so every
 * rank can check it holds the same map as the servers.
 *
 * It does not know which rank a server is (ps.h: dt_ps_server_rank) or move
 * any data.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps.h"

void dt_ps_map_free(dt_ps_map *m) {
  if (!m) return;
  free(m->keys);
  free(m->srv_key0);
  free(m->srv_lo);
  memset(m, 0, sizeof *m);
}

static uint64_t nearest_boundary(const uint64_t *len, int nlayers, uint64_t target,
                                 uint64_t tol, uint64_t lo) {
  uint64_t best = target, bestd = tol + 1, at = 0;
  for (int i = 0; i <= nlayers; i++) {
    if (at > lo) {
      uint64_t d = at > target ? at - target : target - at;
      if (d <= tol && d < bestd) best = at, bestd = d;
    }
    if (i < nlayers) at += len[i];
  }
  return best;
}

/* b moved to a row boundary of the layer it falls in (rowlen[i] > 1). */
static uint64_t row_align(const uint64_t *len, const uint64_t *rowlen, int nlayers, uint64_t b) {
  uint64_t at = 0;
  for (int i = 0; i < nlayers; i++) {
    if (b > at && b < at + len[i] && rowlen && rowlen[i] > 1) {
      uint64_t r = rowlen[i], k = (b - at + r / 2) / r;
      return at + k * r;
    }
    at += len[i];
  }
  return b;
}

int dt_ps_map_build(dt_ps_map *m, const uint64_t *len, int nlayers, int nservers) {
  return dt_ps_map_build_rows(m, len, NULL, nlayers, nservers);
}

int dt_ps_map_build_rows(dt_ps_map *m, const uint64_t *len, const uint64_t *rowlen, int nlayers,
                         int nservers) {
  return dt_ps_map_build_pieces(m, len, rowlen, nlayers, nservers, 0, 0);
}

int dt_ps_map_build_pieces(dt_ps_map *m, const uint64_t *len, const uint64_t *rowlen, int nlayers,
                           int nservers, uint64_t piece, int even_first) {
  return dt_ps_map_build_layers(m, len, rowlen, NULL, nlayers, nservers, piece, even_first);
}

int dt_ps_map_build_layers(dt_ps_map *m, const uint64_t *len, const uint64_t *rowlen,
                           const uint64_t *lpiece, int nlayers, int nservers, uint64_t piece,
                           int even_first) {
  if (!m) return dt__seterr(DT_EINVAL, "ps map: NULL map");
  memset(m, 0, sizeof *m);
  if (nservers < 1) return dt__seterr(DT_EINVAL, "ps map: %d servers (need at least 1)", nservers);
  uint64_t P = 0;
  for (int i = 0; i < nlayers; i++) P += len[i];
  if (P == 0) return dt__seterr(DT_EINVAL, "ps map: the model has no parameters");
  if ((uint64_t)nservers > P)
    return dt__seterr(DT_EINVAL, "ps map: %d servers for %llu parameters", nservers,
                      (unsigned long long)P);
  m->nservers = nservers;
  m->replicas = 1;
  m->nparams = P;
  m->srv_lo = calloc((size_t)nservers + 1, sizeof *m->srv_lo);
  m->srv_key0 = calloc((size_t)nservers + 1, sizeof *m->srv_key0);
  if (!m->srv_lo || !m->srv_key0) goto oom;
  /* server boundaries */
  uint64_t share = P / (uint64_t)nservers, tol = share / 8;
  m->srv_lo[0] = 0;
  for (int s = 1; s < nservers; s++) {
    uint64_t target = P * (uint64_t)s / (uint64_t)nservers;
    uint64_t b = nearest_boundary(len, nlayers, target, tol, m->srv_lo[s - 1]);
    b = row_align(len, rowlen, nlayers, b);
    if (b <= m->srv_lo[s - 1]) b = row_align(len, rowlen, nlayers, m->srv_lo[s - 1] + 1);
    if (b <= m->srv_lo[s - 1]) b = m->srv_lo[s - 1] + 1;
    if (b > P - (uint64_t)(nservers - s)) b = P - (uint64_t)(nservers - s);
    m->srv_lo[s] = b;
  }
  m->srv_lo[nservers] = P;
  /* even_first: a dense first layer of at least (S-1)/S of the floats is
   * cut evenly over the servers (the last one also takes the later
   * layers): it is final last, so its equal shares end backward together */
  int f = 0;
  while (f < nlayers && len[f] == 0) f++;
  if (even_first && nservers > 1 && f < nlayers && !(rowlen && rowlen[f] > 1) &&
      len[f] * (uint64_t)nservers >= P * (uint64_t)(nservers - 1) && len[f] >= (uint64_t)nservers) {
    uint64_t off = 0;
    for (int i = 0; i < f; i++) off += len[i];
    for (int s = 1; s < nservers; s++) m->srv_lo[s] = off + len[f] * (uint64_t)s / (uint64_t)nservers;
  }
  /* keys: every nonempty intersection of a layer and a server range, a
   * dense one cut into near-equal pieces of at most `piece` floats */
  uint64_t cap64 = (uint64_t)nlayers + (uint64_t)nservers;
  for (int i = 0; i < nlayers; i++) {
    uint64_t pc = lpiece ? lpiece[i] : piece;
    if (pc) cap64 += len[i] / pc + 1;
  }
  int cap = cap64 > DT_PS_MAX_KEYS ? DT_PS_MAX_KEYS + 1 : (int)cap64;
  m->keys = calloc((size_t)cap, sizeof *m->keys);
  if (!m->keys) goto oom;
  int nk = 0, srv = 0;
  uint64_t at = 0;
  for (int i = 0; i < nlayers; i++) {
    uint64_t lo = at, hi = at + len[i];
    at = hi;
    while (lo < hi) {
      while (srv < nservers - 1 && lo >= m->srv_lo[srv + 1]) srv++;
      uint64_t end = hi < m->srv_lo[srv + 1] ? hi : m->srv_lo[srv + 1];
      uint64_t r = rowlen && rowlen[i] > 1 && (end - lo) % rowlen[i] == 0 &&
                           (lo - (at - len[i])) % rowlen[i] == 0 ? rowlen[i] : 1;
      uint64_t pc = lpiece ? lpiece[i] : piece;
      uint64_t np = r == 1 && pc ? (end - lo + pc - 1) / pc : 1;
      for (uint64_t p = 0; p < np; p++) {
        if (nk == cap || nk == DT_PS_MAX_KEYS) {
          dt_ps_map_free(m);
          return dt__seterr(DT_EINVAL, "ps map: more than %d keys", DT_PS_MAX_KEYS);
        }
        uint64_t a = lo + (end - lo) * p / np, b = lo + (end - lo) * (p + 1) / np;
        m->keys[nk++] = (dt_ps_key){a, b - a, srv, i, r};
      }
      lo = end;
    }
  }
  m->nkeys = nk;
  for (int s = 0, k = 0; s <= nservers; s++) {
    while (k < nk && m->keys[k].server < s) k++;
    m->srv_key0[s] = k;
  }
  /* the digest: server bounds and every key, as little-endian u64s */
  size_t words = (size_t)nservers + 3 + 5 * (size_t)nk, w = 0;
  uint8_t *buf = malloc(words * 8);
  if (!buf) goto oom;
  uint64_t head[3] = {P, (uint64_t)nservers, (uint64_t)nk};
  for (int i = 0; i < 3; i++, w++)
    for (int b = 0; b < 8; b++) buf[w * 8 + b] = (uint8_t)(head[i] >> (8 * b));
  for (int s = 0; s < nservers; s++, w++)
    for (int b = 0; b < 8; b++) buf[w * 8 + b] = (uint8_t)(m->srv_lo[s + 1] >> (8 * b));
  for (int k = 0; k < nk; k++) {
    uint64_t v[5] = {m->keys[k].off, m->keys[k].len, (uint64_t)m->keys[k].server,
                     (uint64_t)m->keys[k].layer, m->keys[k].rowlen};
    for (int i = 0; i < 5; i++, w++)
      for (int b = 0; b < 8; b++) buf[w * 8 + b] = (uint8_t)(v[i] >> (8 * b));
  }
  dt_sha256(buf, words * 8, m->sha);
  free(buf);
  return DT_OK;
oom:
  dt_ps_map_free(m);
  return dt__seterr(DT_ENOMEM, "ps map: out of memory");
}

int dt_ps_map_set_replicas(dt_ps_map *m, int replicas) {
  if (replicas < 1 || replicas > m->nservers || replicas > DT_PS_MAX_REPLICAS)
    return dt__seterr(DT_EINVAL, "ps.replicas = %d needs 1 to %d (the number of servers, at "
                      "most %d)", replicas, m->nservers, DT_PS_MAX_REPLICAS);
  m->replicas = replicas;
  return DT_OK;
}

uint64_t dt_ps_piece(int consistency) {
  int64_t p = dt_param(DT_PARAM_PS_PIECE);
  if (p < 0) return consistency == DT_PS_BSP ? 0 : 32768;
  return (uint64_t)p;
}

/* The first layer with parameters when it is linear: backward makes its
 * weight gradient in pieces (nn dt__model_set_ready_piece), so its keys'
 * pieces leave while backward still makes the rest; -1 otherwise. */
static int piecewise_layer(const dt_model *model, int n) {
  for (int i = 0; i < n; i++) {
    const dt_layer_info *L = dt_model_layer(model, i);
    if (L->nparams) return L->kind == DT_L_LINEAR ? i : -1;
  }
  return -1;
}

int dt_ps_map_from_model(dt_ps_map *m, const dt_model *model, int nservers, int consistency) {
  int n = dt_model_nlayers(model);
  if (n <= 0) return dt__seterr(DT_EINVAL, "ps map: the model has no layers");
  uint64_t *len = calloc(3 * (size_t)n, sizeof *len), *rowlen = len + n, *lpiece = len + 2 * n;
  if (!len) return dt__seterr(DT_ENOMEM, "ps map: out of memory");
  for (int i = 0; i < n; i++) {
    const dt_layer_info *L = dt_model_layer(model, i);
    len[i] = L->nparams;
    /* an embedding's rows: its output per id */
    rowlen[i] = L->kind == DT_L_EMBEDDING
                    ? (uint64_t)L->out_c / (uint64_t)((size_t)L->in_c * L->in_h * L->in_w)
                    : 1;
  }
  /* the default (-1) cuts only a first linear layer, whose gradient comes
   * in pieces: a layer whose gradient is final at once gains nothing from
   * pieces but more messages (quiet 2026-11-27, asp colocated: the CNN,
   * whose linear(128) was cut, 0.77x ddp in pieces, 0.90x whole) */
  uint64_t piece = dt_ps_piece(consistency);
  int pw = dt_param(DT_PARAM_PS_PIECE) < 0 ? piecewise_layer(model, n) : -2;
  for (int i = 0; i < n; i++) lpiece[i] = pw == -2 || i == pw ? piece : 0;
  int rc = dt_ps_map_build_layers(m, len, rowlen, lpiece, n, nservers, piece,
                                  consistency == DT_PS_BSP && dt_param(DT_PARAM_PS_EVEN_FIRST));
  free(len);
  return rc;
}

size_t dt_ps_map_describe(const dt_ps_map *m, const dt_model *model, char *buf, size_t cap) {
  size_t n = 0;
#define PUT(...)                                                                   \
  do {                                                                             \
    int w_ = snprintf(buf && n < cap ? buf + n : NULL, buf && n < cap ? cap - n : 0, \
                      __VA_ARGS__);                                                \
    if (w_ > 0) n += (size_t)w_;                                                   \
  } while (0)
  if (buf && cap) buf[0] = '\0';
  for (int s = 0; s < m->nservers; s++) {
    uint64_t lo = m->srv_lo[s], hi = m->srv_lo[s + 1];
    PUT("ps: server %d: %llu floats (%.1f KiB) [%llu, %llu):", s, (unsigned long long)(hi - lo),
        (double)(hi - lo) * 4 / 1024, (unsigned long long)lo, (unsigned long long)hi);
    for (int k = m->srv_key0[s], e; k < m->srv_key0[s + 1]; k = e) {
      const dt_ps_key *K = &m->keys[k];
      const dt_layer_info *L = model ? dt_model_layer(model, K->layer) : NULL;
      /* the pieces of one layer on this server: one entry */
      for (e = k + 1; e < m->srv_key0[s + 1] && m->keys[e].layer == K->layer; e++) {}
      if (e - k > 1)
        PUT(" keys %d-%d = layer %d%s%s%s [%llu, %llu) (%d pieces)", k, e - 1, K->layer + 1,
            L ? " '" : "", L ? L->name : "", L ? "'" : "", (unsigned long long)K->off,
            (unsigned long long)(m->keys[e - 1].off + m->keys[e - 1].len), e - k);
      else
        PUT(" key %d = layer %d%s%s%s [%llu, %llu)", k, K->layer + 1, L ? " '" : "",
            L ? L->name : "", L ? "'" : "", (unsigned long long)K->off,
            (unsigned long long)(K->off + K->len));
      if (K->rowlen > 1) PUT(" (%llu rows)", (unsigned long long)(K->len / K->rowlen));
      PUT("%s", e < m->srv_key0[s + 1] ? "," : "");
    }
    if (m->replicas > 1) {
      PUT("; replicas on server");
      for (int r = 1; r < m->replicas; r++) PUT(" %d", (s + r) % m->nservers);
    }
    PUT("\n");
  }
#undef PUT
  return n;
}

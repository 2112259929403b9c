/*
 * match.c — posted/unexpected receive matching for every transport (see
 * match.h for the rules). Plain singly linked queues walked from the head:
 * collectives keep a handful of requests in flight per peer, so a walk is
 * a few pointer hops and beats any index. No locking, no allocation, no
 * payload copies: those stay with the transport.
 */
#include "comm/transport/match.h"

static size_t cap_default(void) {
  return (size_t)dt_param(DT_PARAM_UNEXPECTED_MAX_MB) << 20;
}

void dt__match_init(struct dt_match *m, size_t cap_bytes) {
  *m = (struct dt_match){0};
  m->ux_cap = cap_bytes ? cap_bytes : cap_default();
}

static inline bool src_ok(int want, int src) { return want == DT_MATCH_ANY_SRC || want == src; }

void dt__match_post(struct dt_match *m, struct dt_tp_req *r) {
  r->next = NULL;
  if (m->posted_tail) m->posted_tail->next = r;
  else m->posted = r;
  m->posted_tail = r;
}

struct dt_tp_req *dt__match_posted(struct dt_match *m, int src, uint64_t tag) {
  struct dt_tp_req *prev = NULL;
  for (struct dt_tp_req *q = m->posted; q; prev = q, q = q->next) {
    if (q->tag != tag || !src_ok(q->peer, src)) continue;
    if (prev) prev->next = q->next;
    else m->posted = q->next;
    if (m->posted_tail == q) m->posted_tail = prev;
    q->next = NULL;
    return q;
  }
  return NULL;
}

int dt__match_ux_add(struct dt_match *m, struct dt_match_msg *u, int src, uint64_t tag, size_t len) {
  if (len > m->ux_cap || m->ux_bytes > m->ux_cap - len)
    return dt__seterr(DT_ENOMEM,
                      "rank %d sent %zu bytes (tag 0x%llx) that no receive expects while %zu bytes in "
                      "%zu early messages are already buffered (bound %zu MiB, DTRAIN_UNEXPECTED_MAX_MB)",
                      src, len, (unsigned long long)tag, m->ux_bytes, m->ux_count, m->ux_cap >> 20);
  u->next = NULL;
  u->src = src;
  u->tag = tag;
  u->len = len;
  u->req = NULL;
  if (m->ux_tail) m->ux_tail->next = u;
  else m->ux = u;
  m->ux_tail = u;
  m->ux_bytes += len;
  m->ux_count++;
  return DT_OK;
}

struct dt_match_msg *dt__match_ux_find(struct dt_match *m, int src, uint64_t tag) {
  for (struct dt_match_msg *u = m->ux; u; u = u->next)
    if (!u->req && u->tag == tag && src_ok(src, u->src)) return u;
  return NULL;
}

void dt__match_ux_remove(struct dt_match *m, struct dt_match_msg *u) {
  struct dt_match_msg *prev = NULL;
  for (struct dt_match_msg *q = m->ux; q; prev = q, q = q->next) {
    if (q != u) continue;
    if (prev) prev->next = q->next;
    else m->ux = q->next;
    if (m->ux_tail == q) m->ux_tail = prev;
    q->next = NULL;
    m->ux_bytes -= q->len;
    m->ux_count--;
    return;
  }
}

struct dt_match_msg *dt__match_ux_take(struct dt_match *m, int src, uint64_t tag) {
  struct dt_match_msg *u = dt__match_ux_find(m, src, tag);
  if (u) dt__match_ux_remove(m, u);
  return u;
}

bool dt__match_cancel(struct dt_match *m, struct dt_tp_req *r) {
  struct dt_tp_req *prev = NULL;
  for (struct dt_tp_req *q = m->posted; q; prev = q, q = q->next) {
    if (q != r) continue;
    if (prev) prev->next = q->next;
    else m->posted = q->next;
    if (m->posted_tail == q) m->posted_tail = prev;
    q->next = NULL;
    return true;
  }
  for (struct dt_match_msg *u = m->ux; u; u = u->next)
    if (u->req == r) {
      u->req = NULL;
      return true;
    }
  return false;
}

void dt__match_fail(struct dt_match *m, int rc) {
  for (struct dt_tp_req *r = m->posted, *n; r; r = n) {
    n = r->next;
    r->next = NULL;
    r->status = rc;
  }
  m->posted = m->posted_tail = NULL;
  for (struct dt_match_msg *u = m->ux; u; u = u->next)
    if (u->req) {
      u->req->status = rc;
      u->req = NULL;
    }
}

void dt__match_drain(struct dt_match *m, void (*free_msg)(struct dt_match_msg *u)) {
  for (struct dt_match_msg *u = m->ux, *n; u; u = n) {
    n = u->next;
    u->next = NULL;
    if (free_msg) free_msg(u);
  }
  m->ux = m->ux_tail = NULL;
  m->ux_bytes = m->ux_count = 0;
}

/*
 * comm.c — the communicator: rendezvous through the store, per-peer
 * transport endpoints, point-to-point calls, collective fingerprints,
 * sub-communicators, topology, deadlines and abort.
 *
 * A "world" is what dt_comm_create builds: the transport contexts and one
 * endpoint per peer. Communicators made by split share their parent's world
 * and tell their messages apart by a context id in the high 32 bits of the
 * transport tag. Every collective runs between coll_begin and coll_end: the
 * call gets a sequence number, a deadline and a fingerprint (sequence,
 * collective, op, dtype, count, root) that rides in the first message to
 * each peer and is checked on the first message from each peer. That first
 * message always has the same length (FP_MSG: the 32-byte fingerprint and
 * up to FP_INL bytes of the data, the rest following as a second message),
 * so ranks in different collectives still exchange it without a length
 * error and learn each other's call; a small collective thus costs one
 * message per peer, not two. A mismatch, a lost peer or an expired deadline
 * inside a collective aborts the whole world (every transport tells its
 * peers), so every rank returns the same error and message instead of
 * hanging. Not here: building and freeing communicators (comm_create.c),
 * the collective entry points and split (dispatch.c), algorithms (algo/,
 * which call back only through coll.h), algorithm choice (tuning.c),
 * anything transport-specific (transport/).
 */
#define _GNU_SOURCE
#include "comm/coll.h"
#include "comm/comm_int.h"
#include "comm/transport.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- names ------------------------------------------------------------- */

const char *dt_coll_name(dt_coll c) {
  static const char *n[] = {"?", "allreduce", "broadcast", "reduce", "allgather",
                            "reduce_scatter", "alltoall", "barrier"};
  return (unsigned)c < DT_COLL_COUNT ? n[c] : "?";
}

static const char *const algo_names[] = {"auto", "ring", "rhd", "tree", "hier", "direct"};
const char *dt_algo_name(dt_algo a) { return (unsigned)a < DT_ALGO_COUNT ? algo_names[a] : "?"; }
int dt_algo_parse(const char *s, dt_algo *out) {
  if (!out) return dt__seterr(DT_EINVAL, "algorithm parse: out is NULL");
  for (int i = 0; s && i < DT_ALGO_COUNT; i++)
    if (!strcmp(s, algo_names[i])) return *out = (dt_algo)i, DT_OK;
  if (s && (!strcmp(s, "halving-doubling") || !strcmp(s, "rabenseifner"))) return *out = DT_ALGO_RHD, DT_OK;
  return dt__seterr(DT_EINVAL, "unknown algorithm '%s' (auto ring rhd tree hier direct)", s ? s : "(null)");
}

/* ---- errors ------------------------------------------------------------ */

int dt__comm_err(dt_comm *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return dt__seterr(rc, "%s", c->err);
}

const char *dt_comm_errmsg(const dt_comm *c) { return c ? c->err : ""; }

static void world_abort(struct world *w, int rc, const char *why) {
  int expect = 0;
  pthread_mutex_lock(&w->amu);
  if (atomic_compare_exchange_strong(&w->aborted, &expect, 1)) {
    snprintf(w->abort_msg, sizeof w->abort_msg, "%s", why);
    w->abort_rc = rc;
  }
  pthread_mutex_unlock(&w->amu);
  for (int i = 0; i < w->ntp; i++) w->tops[i]->abort(w->tctx[i], rc, why);
}

/* If some transport was aborted (by a peer or by us), returns its code and
 * message. */
static int world_aborted(struct world *w, const char **msg) {
  for (int i = 0; i < w->ntp; i++) {
    int rc = 0;
    const char *m = w->tops[i]->abort_reason(w->tctx[i], &rc);
    if (m && m[0] && rc < 0) {
      /* One transport aborted (say shm saw a local rank die): the others
       * must tell their peers too, or a rank on another host only sees
       * this one close its connection cleanly and never learns why. */
      if (!atomic_load(&w->aborted)) world_abort(w, rc, m);
      *msg = m;
      return rc;
    }
  }
  if (atomic_load(&w->aborted)) {
    pthread_mutex_lock(&w->amu);
    *msg = w->abort_msg;
    int rc = w->abort_rc ? w->abort_rc : DT_EABORTED;
    pthread_mutex_unlock(&w->amu);
    return rc;
  }
  return 0;
}

void dt_comm_abort(dt_comm *c, int rc, const char *why) {
  if (!c) return;
  char m[400];
  snprintf(m, sizeof m, "rank %d aborted the job: %s", c->w->rank, why ? why : "abort requested");
  world_abort(c->w, rc < 0 ? rc : DT_EABORTED, m);
}

/* ---- accessors --------------------------------------------------------- */

int dt__comm_tolerate_loss(dt_comm *c) {
  if (!c) return dt__seterr(DT_EINVAL, "comm: NULL communicator");
  struct world *w = c->w;
  for (int i = 0; i < w->ntp; i++)
    if (!w->tops[i]->tolerate_loss)
      return dt__comm_err(c, DT_ENOTSUP, "comm: the %s transport cannot go on after a peer is "
                          "lost (shm, tcp can)", w->tops[i]->name);
  for (int i = 0; i < w->ntp; i++) w->tops[i]->tolerate_loss(w->tctx[i]);
  return DT_OK;
}

int dt__comm_aborted(const dt_comm *c) { return c && atomic_load(&c->w->aborted); }

void dt__comm_set_send_hook(dt_comm *c, void (*hook)(void *ud), void *ud) {
  if (!c) return;
  c->send_hook = hook;
  c->send_hook_ud = ud;
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : -1; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : 0; }
int dt_comm_world_rank(const dt_comm *c, int r) { return r >= 0 && r < c->size ? c->wr[r] : -1; }
const char *dt_comm_transport_name(const dt_comm *c, int peer) {
  if (peer < 0 || peer >= c->size) return "?";
  int wp = c->wr[peer];
  if (wp == c->w->rank) return "self";
  return c->w->tops[c->w->tp_of[wp]]->name;
}
void dt_comm_set_timeout(dt_comm *c, double s) {
  if (c && s > 0) c->timeout = s;
}
double dt_comm_timeout(const dt_comm *c) { return c->timeout; }
void dt_comm_set_algo(dt_comm *c, dt_algo a) {
  if ((unsigned)a < DT_ALGO_COUNT) c->algo = a;
}
dt_algo dt_comm_algo(const dt_comm *c) { return c->algo; }
void dt_comm_set_obs(dt_comm *c, dt_obs *o) {
  if (c) c->w->obs = o;
}
dt_obs *dt_comm_obs(const dt_comm *c) { return c ? c->w->obs : NULL; }
void dt_comm_bytes(const dt_comm *c, uint64_t *sent, uint64_t *recvd) {
  if (sent) *sent = atomic_load(&c->w->sent);
  if (recvd) *recvd = atomic_load(&c->w->recvd);
}

int dt_comm_host_of(const dt_comm *c, int r) { return r >= 0 && r < c->size ? c->host[r] : -1; }

int dt_comm_topology(const dt_comm *c, struct dt_comm_topo *t) {
  t->nhosts = c->nhosts;
  t->host = c->host[c->rank];
  t->local_rank = t->local_size = 0;
  for (int r = 0; r < c->size; r++) {
    if (c->host[r] != t->host) continue;
    if (r < c->rank) t->local_rank++;
    t->local_size++;
  }
  t->one_per_host_leader = t->local_rank == 0;
  return DT_OK;
}

/* ---- point-to-point core ----------------------------------------------- */

static int post(dt_comm *c, int peer, uint64_t tag, void *buf, size_t bytes, int kind, struct comm_req *r) {
  memset(r, 0, sizeof *r);
  r->peer = peer;
  r->fp_check = r->fp_send = -1;
  r->used = 1;
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return dt__comm_err(c, DT_EINVAL, "comm: rank %d: bad peer %d (size %d)", c->rank, peer, c->size);
  struct world *w = c->w;
  int wp = c->wr[peer];
  const struct dt_transport_ops *o = w->tops[w->tp_of[wp]];
  r->tp.buf = buf;
  r->tp.len = bytes;
  r->tp.tag = tag;
  r->tp.peer = wp;
  r->tp.kind = kind;
  /* Counted before the transport call: a locked add right after a send
   * would wait until the send's stores have reached the peer (shm), most of
   * a small message's latency. Taken back if the call fails. */
  _Atomic uint64_t *ctr = kind == DT_TP_SEND ? &w->sent : &w->recvd;
  atomic_fetch_add_explicit(ctr, bytes, memory_order_relaxed);
  int rc = kind == DT_TP_SEND ? o->isend(w->ep[wp], &r->tp) : o->irecv(w->ep[wp], &r->tp);
  if (rc < 0) {
    atomic_fetch_sub_explicit(ctr, bytes, memory_order_relaxed);
    const char *m = NULL;
    int arc = world_aborted(w, &m);
    if (arc < 0) return dt__comm_err(c, arc, "%s", m);
    /* a transport that refuses a dead endpoint may leave no message */
    const char *em = dt_errmsg();
    return dt__comm_err(c, rc, "comm: rank %d: %s to rank %d failed: %s", c->rank,
                kind == DT_TP_SEND ? "send" : "receive", peer, em && *em ? em : dt_strerror(rc));
  }
  return DT_OK;
}

static uint64_t user_tag(dt_comm *c, int tag) { return (uint64_t)c->ctxid << 32 | (uint32_t)tag; }

int dt_comm_isend(dt_comm *c, int peer, int tag, const void *buf, size_t bytes, dt_comm_req *req) {
  if (!c) return dt__seterr(DT_EINVAL, "comm send: communicator c is NULL");
  if (!buf && bytes) return dt__comm_err(c, DT_EINVAL, "comm send: buf is NULL");
  if (tag < 0 || tag > DT_COMM_TAG_MAX) return dt__comm_err(c, DT_EINVAL, "comm: tag %d out of range", tag);
  return post(c, peer, user_tag(c, tag), (void *)buf, bytes, DT_TP_SEND, (struct comm_req *)req);
}
int dt_comm_irecv(dt_comm *c, int peer, int tag, void *buf, size_t bytes, dt_comm_req *req) {
  if (!c) return dt__seterr(DT_EINVAL, "comm recv: communicator c is NULL");
  if (!buf && bytes) return dt__comm_err(c, DT_EINVAL, "comm recv: buf is NULL");
  if (tag < 0 || tag > DT_COMM_TAG_MAX) return dt__comm_err(c, DT_EINVAL, "comm: tag %d out of range", tag);
  return post(c, peer, user_tag(c, tag), buf, bytes, DT_TP_RECV, (struct comm_req *)req);
}

static void fp_encode(const struct fp *f, uint8_t *o) {
  uint32_t m = FP_MAGIC;
  memset(o, 0, FP_LEN);
  memcpy(o, &m, 4);
  o[4] = f->coll, o[5] = f->op, o[6] = f->dtype;
  memcpy(o + 8, &f->root, 4);
  memcpy(o + 12, &f->rank, 4);
  memcpy(o + 16, &f->seq, 8);
  memcpy(o + 24, &f->count, 8);
}
static void fp_decode(const uint8_t *i, struct fp *f, uint32_t *magic) {
  memcpy(magic, i, 4);
  f->coll = i[4], f->op = i[5], f->dtype = i[6];
  memcpy(&f->root, i + 8, 4);
  memcpy(&f->rank, i + 12, 4);
  memcpy(&f->seq, i + 16, 8);
  memcpy(&f->count, i + 24, 8);
}

static void fp_describe(const struct fp *f, char *o, size_t cap) {
  int n = snprintf(o, cap, "%s(seq %llu", dt_coll_name((dt_coll)f->coll), (unsigned long long)f->seq);
  if (f->coll == DT_COLL_ALLREDUCE || f->coll == DT_COLL_REDUCE || f->coll == DT_COLL_REDUCE_SCATTER)
    n += snprintf(o + n, cap - (size_t)n, ", %s", dt_redop_name((dt_redop)f->op));
  if (f->coll != DT_COLL_BARRIER)
    n += snprintf(o + n, cap - (size_t)n, ", %s, count %llu", dt_dtype_name((dt_dtype)f->dtype),
                  (unsigned long long)f->count);
  if (f->coll == DT_COLL_BROADCAST || f->coll == DT_COLL_REDUCE)
    n += snprintf(o + n, cap - (size_t)n, ", root %d", f->root);
  snprintf(o + n, cap - (size_t)n, ")");
}

/* Checks the fingerprint received from member p. */
static int fp_check(dt_comm *c, int p) {
  struct fp got;
  uint32_t magic;
  fp_decode(c->fp_in[p], &got, &magic);
  if (magic == FP_MAGIC && got.seq == c->cur.seq && got.coll == c->cur.coll && got.op == c->cur.op &&
      got.dtype == c->cur.dtype && got.count == c->cur.count && got.root == c->cur.root)
    return DT_OK;
  char mine[160], theirs[160];
  fp_describe(&c->cur, mine, sizeof mine);
  if (magic != FP_MAGIC) snprintf(theirs, sizeof theirs, "a non-collective message");
  else fp_describe(&got, theirs, sizeof theirs);
  char msg[400];
  snprintf(msg, sizeof msg, "collective mismatch: rank %d called %s but rank %d called %s", c->rank,
           mine, p, theirs);
  world_abort(c->w, DT_EMISMATCH, msg);
  return dt__comm_err(c, DT_EMISMATCH, "%s", msg);
}

/* A request that moves no bytes of its own: its data rode in the
 * fingerprint message, whose request the caller attaches. */
static void inline_req(dt_comm *c, int peer, struct comm_req *r) {
  memset(r, 0, sizeof *r);
  r->peer = peer;
  r->fp_check = r->fp_send = -1;
  r->used = 1;
  r->tp.peer = c->wr[peer];
  /* relaxed: a seq_cst store (a locked exchange) right after the send it
   * rides with would wait for that send's stores to reach the peer */
  atomic_store_explicit(&r->tp.status, 1, memory_order_relaxed);
}

int dt__coll_isend(dt_comm *c, int peer, const void *buf, size_t bytes, dt_comm_req *req) {
  uint64_t tag = (uint64_t)c->ctxid << 32 | TAG_COLL;
  struct comm_req *r = (struct comm_req *)req;
  if (c->send_hook) c->send_hook(c->send_hook_ud);
  if (peer >= 0 && peer < c->size && peer != c->rank && !c->fp_sent[peer]) {
    /* First message to peer: fingerprint + the first FP_INL data bytes. */
    size_t inl = bytes < FP_INL ? bytes : FP_INL;
    memcpy(c->fp_obuf[peer], c->fp_out, FP_LEN);
    if (inl) memcpy(c->fp_obuf[peer] + FP_LEN, buf, inl);
    /* zero padding, not stale bytes: a transport may leave trailing zeros
     * off the wire (shm does for small messages) */
    if (inl < FP_INL) memset(c->fp_obuf[peer] + FP_LEN + inl, 0, FP_INL - inl);
    DT_CHECK(post(c, peer, tag, c->fp_obuf[peer], FP_MSG, DT_TP_SEND, &c->fp_sreq[peer]));
    c->fp_sent[peer] = 1;
    if (bytes > inl) DT_CHECK(post(c, peer, tag, (uint8_t *)buf + inl, bytes - inl, DT_TP_SEND, r));
    else inline_req(c, peer, r);
    r->fp_send = peer;
    return DT_OK;
  }
  return post(c, peer, tag, (void *)buf, bytes, DT_TP_SEND, r);
}

int dt__coll_irecv(dt_comm *c, int peer, void *buf, size_t bytes, dt_comm_req *req) {
  uint64_t tag = (uint64_t)c->ctxid << 32 | TAG_COLL;
  struct comm_req *r = (struct comm_req *)req;
  if (peer >= 0 && peer < c->size && peer != c->rank && !c->fp_posted[peer]) {
    size_t inl = bytes < FP_INL ? bytes : FP_INL;
    DT_CHECK(post(c, peer, tag, c->fp_in[peer], FP_MSG, DT_TP_RECV, &c->fp_rreq[peer]));
    c->fp_posted[peer] = 1;
    if (bytes > inl) DT_CHECK(post(c, peer, tag, (uint8_t *)buf + inl, bytes - inl, DT_TP_RECV, r));
    else inline_req(c, peer, r);
    r->fp_check = peer;
    r->inl_dst = buf;
    r->inl_len = inl;
    return DT_OK;
  }
  return post(c, peer, tag, buf, bytes, DT_TP_RECV, r);
}

static void cancel_pending(dt_comm *c, struct dt_tp_req **v, int n) {
  struct world *w = c->w;
  for (int i = 0; i < n; i++)
    if (v[i]->status == 0) {
      int t = w->tp_of[v[i]->peer];
      w->tops[t]->cancel(w->tctx[t], v[i]);
      if (v[i]->status == 0) v[i]->status = DT_EABORTED;
    }
}

/* Waits for a list of transport requests, possibly over several transports. */
static int wait_list(dt_comm *c, struct dt_tp_req **v, int n, int64_t deadline, char *err) {
  struct world *w = c->w;
  if (n == 0) return DT_OK;
  int t0 = w->tp_of[v[0]->peer];
  bool mixed = false;
  for (int i = 1; i < n; i++) mixed |= w->tp_of[v[i]->peer] != t0;
  if (!mixed) return w->tops[t0]->wait(w->tctx[t0], v, n, deadline, err);
  /* Requests over several transports: poll each with test() until done. */
  for (unsigned spin = 0;; spin++) {
    bool all = true;
    for (int i = 0; i < n; i++) {
      if (v[i]->status) {
        if (v[i]->status < 0) {
          snprintf(err, DT_TP_ERR_MAX, "request with rank %d failed", v[i]->peer);
          return v[i]->status;
        }
        continue;
      }
      int t = w->tp_of[v[i]->peer];
      int r = w->tops[t]->test(w->tctx[t], v[i]);
      if (r < 0) {
        snprintf(err, DT_TP_ERR_MAX, "request with rank %d failed", v[i]->peer);
        return r;
      }
      if (!r) all = false;
    }
    if (all) return DT_OK;
    if (dt_now_ns() > deadline) {
      for (int i = 0; i < n; i++)
        if (!v[i]->status) {
          snprintf(err, DT_TP_ERR_MAX, "rank %d did not %s before the deadline", v[i]->peer,
                   v[i]->kind == DT_TP_RECV ? "send" : "receive");
          break;
        }
      return DT_ETIMEDOUT;
    }
    if (spin > 64) sched_yield();
  }
}

int dt_comm_waitall(dt_comm *c, dt_comm_req *reqs, int n) {
  struct dt_tp_req *stackv[64], **v = stackv;
  int cap = 2 * n + 1;
  if (cap > 64) {
    v = malloc((size_t)cap * sizeof *v);
    if (!v) return dt__comm_err(c, DT_ENOMEM, "comm: out of memory");
  }
  /* pending or already failed (a failure must be reported, not skipped);
   * fingerprint receives first */
  int m = 0, nfp;
  for (int i = 0; i < n; i++) {
    struct comm_req *r = (struct comm_req *)&reqs[i];
    if (r->used && r->fp_check >= 0 && c->fp_rreq[r->fp_check].tp.status != 1) v[m++] = &c->fp_rreq[r->fp_check].tp;
  }
  nfp = m;
  for (int i = 0; i < n; i++) {
    struct comm_req *r = (struct comm_req *)&reqs[i];
    if (!r->used) continue;
    if (r->fp_send >= 0 && c->fp_sreq[r->fp_send].tp.status != 1) v[m++] = &c->fp_sreq[r->fp_send].tp;
    if (r->tp.status != 1) v[m++] = &r->tp;
  }
  int64_t deadline = c->in_coll ? c->deadline_ns : dt_now_ns() + (int64_t)(c->timeout * 1e9);
  char err[DT_TP_ERR_MAX] = "";
  /* Fingerprints first: a mismatch explains any error that follows it, and
   * a peer in another collective may never send the rest we wait for (its
   * whole message fit in the fingerprint's), so check them before waiting
   * for anything else. Transports progress every request while waiting. */
  int rc = DT_OK, fprc = DT_OK;
  int64_t t_wait = c->in_coll ? 0 : dt_now_ns(); /* inside a collective its deadline says since when */
  for (int phase = 0; phase < 2 && rc == DT_OK && fprc == DT_OK; phase++) {
    /* phase 0 also checks fingerprints that had arrived before the wait */
    if (phase == 1) rc = wait_list(c, v, m, deadline, err);
    else if (nfp > 0 && nfp < m) rc = wait_list(c, v, nfp, deadline, err);
    for (int i = 0; i < n && fprc == DT_OK; i++) {
      struct comm_req *r = (struct comm_req *)&reqs[i];
      if (r->used && r->fp_check >= 0 && c->fp_rreq[r->fp_check].tp.status == 1) {
        fprc = fp_check(c, r->fp_check);
        if (fprc == DT_OK && r->inl_len) memcpy(r->inl_dst, c->fp_in[r->fp_check] + FP_LEN, r->inl_len);
        r->fp_check = -1;
      }
    }
  }
  /* The first request still pending names the rank that made no progress
   * (looked up before cancelling, which completes them). */
  int late = -1;
  if (rc == DT_ETIMEDOUT) /* not done: still pending, or failed by an abort that ended the wait */
    for (int i = 0; i < m && late < 0; i++)
      if (v[i]->status != 1)
        for (int q = 0; q < c->size; q++)
          if (c->wr[q] == v[i]->peer) late = q;
  if (rc < 0 || fprc < 0) cancel_pending(c, v, m);
  if (v != stackv) free(v);
  for (int i = 0; i < n; i++) ((struct comm_req *)&reqs[i])->used = 0;
  if (fprc < 0) return fprc;
  if (rc == DT_OK) return DT_OK;
  const char *am = NULL;
  int arc = world_aborted(c->w, &am);
  if (arc < 0 && rc != DT_ETIMEDOUT) return dt__comm_err(c, arc, "%s", am);
  if (rc == DT_ETIMEDOUT) {
    /* "rank 2 made no progress for 60 s in allreduce #17 (f32 x 4096)": who, how long, in which
     * call (the same numbering on every rank), then the transport's detail. */
    int64_t since = c->in_coll ? c->deadline_ns - (int64_t)(c->timeout * 1e9) : t_wait;
    double el = (double)(dt_now_ns() - since) / 1e9;
    char who[32], call[96];
    if (late >= 0) snprintf(who, sizeof who, "rank %d", late);
    else snprintf(who, sizeof who, "a peer");
    if (c->in_coll && c->cur.coll == DT_COLL_BARRIER)
      snprintf(call, sizeof call, "barrier #%llu", (unsigned long long)c->cur.seq);
    else if (c->in_coll)
      snprintf(call, sizeof call, "%s #%llu (%s x %llu)", dt_coll_name((dt_coll)c->cur.coll),
               (unsigned long long)c->cur.seq, dt_dtype_name((dt_dtype)c->cur.dtype),
               (unsigned long long)c->cur.count);
    else
      snprintf(call, sizeof call, "a point-to-point wait");
    return dt__comm_err(c, rc, "comm: rank %d: %s made no progress for %.3g s in %s (deadline %.3g s): %s",
                        c->rank, who, el, call, c->timeout, err);
  }
  return dt__comm_err(c, rc, "comm: rank %d: %s", c->rank, err[0] ? err : dt_strerror(rc));
}

int dt_comm_test(dt_comm *c, dt_comm_req *req, bool *done) {
  struct comm_req *r = (struct comm_req *)req;
  *done = false;
  if (!r->used || r->tp.status == 1) return *done = true, DT_OK;
  if (r->tp.status < 0) return dt__comm_err(c, r->tp.status, "comm: request with rank %d failed", r->peer);
  struct world *w = c->w;
  int t = w->tp_of[r->tp.peer];
  int x = w->tops[t]->test(w->tctx[t], &r->tp);
  if (x < 0) {
    const char *am = NULL;
    int arc = world_aborted(w, &am);
    return arc < 0 ? dt__comm_err(c, arc, "%s", am) : dt__comm_err(c, x, "comm: request with rank %d failed", r->peer);
  }
  *done = x == 1;
  if (*done) r->used = 0;
  return DT_OK;
}

/* Blocking point-to-point calls are flight-recorder entries of their own
 * (numbered per communicator and peer direction by tag). */
int dt_comm_send(dt_comm *c, int peer, int tag, const void *buf, size_t bytes) {
  dt_comm_req r;
  int64_t t = c ? dt_obs_fr_begin(c->w->obs, "send", c->ctxid, (uint64_t)tag, bytes, peer) : -1;
  int rc = dt_comm_isend(c, peer, tag, buf, bytes, &r);
  if (rc == DT_OK) rc = dt_comm_waitall(c, &r, 1);
  if (c) dt_obs_fr_end(c->w->obs, t, rc);
  return rc;
}
int dt_comm_recv(dt_comm *c, int peer, int tag, void *buf, size_t bytes) {
  dt_comm_req r;
  int64_t t = c ? dt_obs_fr_begin(c->w->obs, "recv", c->ctxid, (uint64_t)tag, bytes, peer) : -1;
  int rc = dt_comm_irecv(c, peer, tag, buf, bytes, &r);
  if (rc == DT_OK) rc = dt_comm_waitall(c, &r, 1);
  if (c) dt_obs_fr_end(c->w->obs, t, rc);
  return rc;
}

int dt__coll_sendrecv(dt_comm *c, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                      size_t rbytes) {
  dt_comm_req r[2];
  int n = 0;
  if (from >= 0) DT_CHECK(dt__coll_irecv(c, from, rbuf, rbytes, &r[n++]));
  if (to >= 0) DT_CHECK(dt__coll_isend(c, to, sbuf, sbytes, &r[n++]));
  return dt_comm_waitall(c, r, n);
}

void *dt__coll_scratch(dt_comm *c, int i, size_t bytes) {
  if (bytes <= c->scratch_cap[i]) return c->scratch[i];
  dt_free(c->scratch[i]);
  size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
  c->scratch[i] = dt_alloc(cap);
  c->scratch_cap[i] = c->scratch[i] ? cap : 0;
  if (!c->scratch[i]) dt__comm_err(c, DT_ENOMEM, "comm: cannot allocate %zu bytes of scratch", bytes);
  return c->scratch[i];
}

/* ---- collective framing ------------------------------------------------ */

int dt__coll_begin(dt_comm *c, dt_coll coll, dt_redop op, dt_dtype t, size_t count, int root) {
  const char *am = NULL;
  int arc = world_aborted(c->w, &am);
  if (arc < 0) return dt__comm_err(c, arc, "%s", am);
  if (c->in_coll) return dt__comm_err(c, DT_EINVAL, "comm: rank %d: collective called inside a collective", c->rank);
  c->in_coll = true;
  c->deadline_ns = dt_now_ns() + (int64_t)(c->timeout * 1e9);
  c->cur = (struct fp){++c->seq, count, root, c->rank, (uint8_t)coll, (uint8_t)op, (uint8_t)t};
  c->fr_ticket = dt_obs_fr_begin(c->w->obs, dt_coll_name(coll), c->ctxid, c->seq,
                                 (uint64_t)count * dt_dtype_size(t),
                                 coll == DT_COLL_BROADCAST || coll == DT_COLL_REDUCE ? root : -1);
  fp_encode(&c->cur, c->fp_out);
  memset(c->fp_sent, 0, (size_t)c->size);
  memset(c->fp_posted, 0, (size_t)c->size);
  return DT_OK;
}

int dt__coll_end(dt_comm *c, int rc) {
  if (rc == DT_OK) {
    /* fingerprint sends still in flight (their data went with them) */
    dt_comm_req tmp[1];
    for (int p = 0; p < c->size && rc == DT_OK; p++)
      if (c->fp_sent[p] && c->fp_sreq[p].tp.status == 0) {
        struct comm_req *r = (struct comm_req *)tmp;
        memset(r, 0, sizeof *r);
        r->used = 1;
        r->fp_check = -1;
        r->fp_send = p;
        atomic_store_explicit(&r->tp.status, 1, memory_order_relaxed);
        rc = dt_comm_waitall(c, tmp, 1);
      }
    for (int p = 0; p < c->size && rc == DT_OK; p++)
      if (c->fp_posted[p] && c->fp_rreq[p].tp.status == 0)
        rc = dt__comm_err(c, DT_EPROTO, "comm: internal: fingerprint from rank %d never arrived", p);
  }
  c->in_coll = false;
  dt_obs_fr_end(c->w->obs, c->fr_ticket, rc);
  if (rc < 0) {
    /* A failed collective leaves peers mid-call: abort the world so they
     * return now with this message instead of waiting for their deadline. */
    char m[512];
    snprintf(m, sizeof m, "%s", c->err[0] ? c->err : dt_errmsg());
    const char *am = NULL;
    if (world_aborted(c->w, &am) == 0) world_abort(c->w, rc, m);
    dt__comm_err(c, rc, "%s", m);
  }
  return rc;
}


/*
 * tcp.c — the TCP transport: `nconn` non-blocking, TCP_NODELAY connections
 * ("lanes", dist.tcp_connections or DTRAIN_TCP_NCONN, default 1) per peer, driven by epoll from the caller's thread
 * (no progress thread: on a 2-core machine a thread hand-off costs more than
 * it hides). Sends and receives progress together (full duplex), receives
 * land straight in the user's buffer when posted in time, and frames that
 * arrive early are buffered per (peer, tag) in order (matching: the shared
 * match.c, one queue pair per lane).
 *
 * Striping: a message of at least DTRAIN_TCP_STRIPE_MIN bytes (default
 * 256 KiB) is cut into up to nconn contiguous parts of at least 64 KiB
 * (64-byte aligned; part i on lane i), each an ordinary frame with the
 * message's tag; smaller messages use lane 0. Both sides derive the cut
 * from the exact length and the endpoint's lane count, so per-lane FIFO
 * matching keeps the per (peer, tag) order of whole messages. A part that
 * fails (wrong length, cancel) cancels its siblings and fails the message;
 * a BYE ends one lane; EOF without BYE, a reset or a malformed frame on any
 * lane loses the peer.
 *
 * Connections: the higher rank dials the lower rank's listening socket,
 * once per lane; the acceptor adopts the dialer's lane count and the
 * endpoint exists once every lane has passed the handshake (tcp_conn.c).
 * Handshake on every lane (every frame a validated struct dt_frame_hdr,
 * control payloads bounded by DT_FRAME_CTRL_MAX):
 *   dialer   -> HELLO {job hash, from, to, lane, nlanes, nonce_d}
 *   acceptor -> HELLO {nonce_a, HMAC(token, "dt-tcp-acc", nonce_d, nonce_a)}
 *   dialer   -> AUTH  {HMAC(token, "dt-tcp-dial", nonce_a, nonce_d)}
 *   acceptor -> AUTH_OK
 * The listening socket is served for the communicator's whole life, so a
 * stranger (wrong token, random bytes, truncated or oversized frames) is
 * turned away with a logged reason at any time without disturbing the job;
 * strangers that do not finish the handshake within DTRAIN_AUTH_TIMEOUT_MS
 * are closed, at most DTRAIN_AUTH_PENDING_MAX may wait (oldest closed
 * first), and EMFILE closes an idle stranger or the new connection instead
 * of leaving the listener readable in a loop (accept_guard.c).
 * A frame failing validation on an established connection, an EOF or a
 * reset without a prior BYE means the peer is lost: the context aborts with
 * DT_EPEERLOST naming it and sends ABORT frames to every other peer.
 * Liveness: TCP keepalive (2 s idle, 1 s probes, 3 misses) turns a
 * silently vanished host on an idle connection into DT_EPEERLOST (with data
 * in flight, set DTRAIN_TCP_USER_TIMEOUT_MS or rely on the deadline); a
 * process that dies is seen at once through its FIN or RST. A live but
 * hung process is caught by the caller's deadline instead.
 * Knobs: DTRAIN_TCP_BUFFER (SO_SNDBUF/SO_RCVBUF, default: kernel
 * autotuning), DTRAIN_TCP_KEEPIDLE, DTRAIN_TCP_USER_TIMEOUT_MS,
 * DTRAIN_TCP_SPIN_US (poll, yielding the core, this long before sleeping in
 * epoll_wait; default 0: no measurable gain on a shared 2-core host).
 * This file is the data path: frames out and in, matching, the epoll
 * progress engine, waiting, cancel, abort, close, and the ops table. The
 * listener, dialing, the handshake and the context's creation are in
 * tcp_conn.c; the structures both share in tcp_int.h.
 * Not here: TLS, IPv6 listening.
 */

#define _GNU_SOURCE
#include "comm/transport/tcp_int.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------- */

static void ep_watch(struct dt_tp_ctx *x, struct dt_tp_ep *e, bool out) {
  struct epoll_event ev = {(e->deferred ? 0 : EPOLLIN) | EPOLLRDHUP | (out ? EPOLLOUT : 0), {.ptr = e}};
  epoll_ctl(x->efd, EPOLL_CTL_MOD, e->fd, &ev);
  e->want_out = out;
}

/* ---- stripes ----------------------------------------------------------- */

static struct stripe *stripe_of_part(struct dt_tp_req *r) { return (struct stripe *)(uintptr_t)r->priv[4]; }
static struct stripe *stripe_of_parent(struct dt_tp_req *r) { return (struct stripe *)(uintptr_t)r->priv[5]; }

/* How a message of len bytes is cut for an endpoint with nlanes lanes:
 * the number of parts, each *per bytes (64-byte aligned) but the last.
 * Both sides derive it from the exact length, so they agree. */
static int stripe_parts(const struct dt_tp_ctx *x, int nlanes, size_t len, size_t *per) {
  if (nlanes < 2 || len < x->stripe_min || len < 2 * PART_MIN) return 1;
  size_t n = len / PART_MIN;
  if (n > (size_t)nlanes) n = (size_t)nlanes;
  *per = ((len + n - 1) / n + 63) & ~(size_t)63;
  while (n > 1 && (n - 1) * *per >= len) n--; /* every part non-empty */
  return (int)n;
}

static struct stripe *stripe_new(struct dt_tp_ep *h, struct dt_tp_req *r, int n, size_t per) {
  struct stripe *st = calloc(1, sizeof *st + (size_t)n * sizeof st->part[0]);
  if (!st) return NULL;
  st->parent = r;
  st->nparts = st->left = n;
  for (int i = 0; i < n; i++) {
    struct dt_tp_req *q = &st->part[i];
    size_t off = (size_t)i * per;
    q->buf = (uint8_t *)r->buf + off;
    q->len = r->len - off < per ? r->len - off : per;
    q->tag = r->tag;
    q->peer = r->peer;
    q->kind = r->kind;
    q->priv[4] = (uint64_t)(uintptr_t)st;
  }
  st->next = h->stripes;
  if (h->stripes) h->stripes->prev = st;
  h->stripes = st;
  r->priv[5] = (uint64_t)(uintptr_t)st;
  return st;
}

/* Unlinks and frees st, then reports rc (1 or an error) on the parent —
 * last, since the caller may reuse the parent as soon as it sees it. */
static void stripe_finish(struct dt_tp_ep *h, struct stripe *st, int rc) {
  struct dt_tp_req *r = st->parent;
  if (st->prev) st->prev->next = st->next;
  else h->stripes = st->next;
  if (st->next) st->next->prev = st->prev;
  free(st);
  r->priv[5] = 0;
  if (rc == 1) r->done = r->len;
  if (r->status == 0) r->status = rc;
}

static void lane_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r);

/* A part failed: take its siblings off their lanes, fail the message. */
static void stripe_fail(struct dt_tp_ep *h, struct stripe *st, int rc) {
  if (!st->rc) st->rc = rc;
  for (int i = 0; i < st->nparts; i++)
    if (st->part[i].status == 0 && st->part[i].ep) lane_cancel(h->x, &st->part[i]);
  if (!st->posting) stripe_finish(h, st, st->rc);
}

/* Sets the outcome of a request on a lane: a whole message directly, a
 * part through its stripe (which may free the part: touch r no more). */
static void req_set(struct dt_tp_req *r, int rc) {
  struct stripe *sp = stripe_of_part(r);
  if (!sp) {
    r->status = rc;
    return;
  }
  if (r->status != 0) return;
  r->status = rc;
  struct dt_tp_ep *h = r->ep->head;
  if (rc < 0) {
    stripe_fail(h, sp, rc);
    return;
  }
  if (--sp->left == 0 && !sp->posting) stripe_finish(h, sp, sp->rc ? sp->rc : 1);
}

/* Fails every request waiting on lane e (queued sends, posted and claiming
 * receives, the one being read into) with rc. */
static void lane_fail(struct dt_tp_ep *e, int rc) {
  struct dt_tp_req *q = e->sq, *p = e->mt.posted, *cur = e->cur_req;
  e->sq = e->sq_tail = NULL;
  e->mt.posted = e->mt.posted_tail = NULL;
  e->cur_req = NULL;
  for (struct dt_tp_req *n; q; q = n) n = q->next, req_set(q, rc);
  for (struct dt_tp_req *n; p; p = n) n = p->next, req_set(p, rc);
  for (struct dt_match_msg *u = e->mt.ux; u; u = u->next)
    if (u->req) {
      struct dt_tp_req *r = u->req;
      u->req = NULL;
      req_set(r, rc);
    }
  if (cur && cur->status == 0) req_set(cur, rc);
}

/* Fails every request of the endpoint on every lane, and every stripe (the
 * endpoint is lost, aborted or closed). */
static void fail_ep_reqs(struct dt_tp_ep *e, int rc) {
  struct dt_tp_ep *h = e->head;
  for (int i = 0; i < h->nlanes; i++) lane_fail(h->lanes[i], rc);
  for (struct stripe *st = h->stripes, *nx; st; st = nx) {
    nx = st->next;
    if (st->posting) { /* finished by its poster */
      if (!st->rc) st->rc = rc;
      continue;
    }
    stripe_finish(h, st, rc);
  }
}

static void do_abort_locked(struct dt_tp_ctx *x, int rc, const char *why);
static void recv_progress(struct dt_tp_ep *e);

/* The peer behind lane e is gone (or spoke garbage): every lane dies. */
static void ep_lost(struct dt_tp_ep *e, const char *why) {
  struct dt_tp_ctx *x = e->x;
  struct dt_tp_ep *h = e->head;
  if (e->dead) return;
  if (e->bye) {
    /* It said goodbye on this lane: the lane's stream is over (everything
     * sent on it was read before the BYE), but other lanes may still hold
     * data sent before the close; only requests on this lane fail. */
    e->dead = true;
    epoll_ctl(x->efd, EPOLL_CTL_DEL, e->fd, NULL);
    lane_fail(e, DT_ECLOSED);
    return;
  }
  for (int i = 0; i < h->nlanes; i++) {
    struct dt_tp_ep *l = h->lanes[i];
    if (l->dead) continue;
    l->dead = true;
    epoll_ctl(x->efd, EPOLL_CTL_DEL, l->fd, NULL);
  }
  fail_ep_reqs(h, DT_EPEERLOST);
  if (atomic_load(&x->abort_rc)) return; /* already failing for another reason */
  char m[DT_TP_ERR_MAX];
  if (h->nlanes > 1) snprintf(m, sizeof m, "rank %d lost: %s (connection %d of %d)", e->peer, why, e->lane, h->nlanes);
  else snprintf(m, sizeof m, "rank %d lost: %s", e->peer, why);
  DT_LOG_WARN("tcp: rank %d: %s", x->rank, m);
  if (atomic_load(&x->tolerate)) return; /* the others go on (tolerate_loss) */
  do_abort_locked(x, DT_EPEERLOST, m);
}

static void tcp_tolerate_loss(struct dt_tp_ctx *x) {
  if (x) atomic_store(&x->tolerate, 1);
}

/* ---- sending ----------------------------------------------------------- */

static void send_progress(struct dt_tp_ep *e) {
  struct dt_tp_ctx *x = e->x;
  while (e->sq && !e->dead) {
    struct dt_tp_req *r = e->sq;
    uint8_t *hdr = (uint8_t *)r->priv;
    struct iovec iov[2];
    int n = 0;
    if (e->s_hdr_done < DT_FRAME_HDR_LEN)
      iov[n++] = (struct iovec){hdr + e->s_hdr_done, DT_FRAME_HDR_LEN - e->s_hdr_done};
    if (r->len > r->done) iov[n++] = (struct iovec){(uint8_t *)r->buf + r->done, r->len - r->done};
    ssize_t w = n ? 0 : 0;
    if (n) {
      struct msghdr mh = {0};
      mh.msg_iov = iov;
      mh.msg_iovlen = (size_t)n;
      w = sendmsg(e->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (!e->want_out) ep_watch(x, e, true);
          return;
        }
        if (errno == EINTR) continue;
        char why[128];
        snprintf(why, sizeof why, "send failed: %s", strerror(errno));
        /* A failed send may hide an ABORT or BYE frame the peer sent before
         * it went away: read what is there first so the real reason wins. */
        recv_progress(e);
        ep_lost(e, why);
        return;
      }
    }
    size_t ww = (size_t)w;
    if (e->s_hdr_done < DT_FRAME_HDR_LEN) {
      size_t h = DT_FRAME_HDR_LEN - e->s_hdr_done;
      if (ww < h) { e->s_hdr_done += ww; continue; }
      e->s_hdr_done = DT_FRAME_HDR_LEN;
      ww -= h;
    }
    r->done += ww;
    if (r->done == r->len) {
      e->sq = r->next;
      if (!e->sq) e->sq_tail = NULL;
      e->s_hdr_done = 0;
      req_set(r, 1);
    }
  }
  if (e->want_out && !e->sq && !e->dead) ep_watch(x, e, false);
}

/* Writes a small control frame if the send queue is idle; best effort. */
static bool send_ctrl(struct dt_tp_ep *e, uint8_t type, const void *p, size_t len) {
  if (e->dead || e->sq) return false;
  uint8_t buf[DT_FRAME_HDR_LEN + DT_FRAME_CTRL_MAX];
  struct dt_frame_hdr h = {DT_FRAME_MAGIC, DT_FRAME_VERSION, type, 0, 0, len};
  dt__frame_encode(&h, buf);
  if (len) memcpy(buf + DT_FRAME_HDR_LEN, p, len);
  ssize_t w = send(e->fd, buf, DT_FRAME_HDR_LEN + len, MSG_NOSIGNAL | MSG_DONTWAIT);
  return w == (ssize_t)(DT_FRAME_HDR_LEN + len);
}

/* ---- receiving --------------------------------------------------------- */

static void umsg_free(struct dt_match_msg *m) {
  struct umsg *u = (struct umsg *)m;
  free(u->data);
  free(u);
}

/* The current frame becomes a buffered early message (read as it comes).
 * On failure (memory, or the early-message bound) the peer is lost. */
static int ux_start(struct dt_tp_ep *e) {
  struct umsg *u = calloc(1, sizeof *u);
  if (u) u->data = malloc(e->cur.len ? e->cur.len : 1);
  if (!u || !u->data) {
    free(u);
    ep_lost(e, "out of memory buffering an early message");
    return -1;
  }
  if (dt__match_ux_add(&e->mt, &u->m, e->peer, e->cur.tag, e->cur.len) < 0) {
    umsg_free(&u->m);
    ep_lost(e, dt_errmsg());
    return -1;
  }
  e->cur_u = u;
  e->target = u->data;
  return 0;
}

static void finish_frame(struct dt_tp_ep *e) {
  struct dt_tp_ctx *x = e->x;
  if (e->cur.type == DT_FRAME_DATA) {
    if (e->cur_req) {
      struct dt_tp_req *r = e->cur_req;
      e->cur_req = NULL;
      r->done = r->len;
      req_set(r, 1);
    } else if (e->cur_u) {
      e->cur_u->complete = true;
    }
  } else if (e->cur.type == DT_FRAME_ABORT) {
    int32_t code = DT_EABORTED;
    char msg[DT_TP_ERR_MAX];
    size_t l = e->cur.len;
    if (l >= 4) memcpy(&code, e->ctrl, 4);
    if (code >= 0 || code < -100) code = DT_EABORTED;
    size_t ml = l > 4 ? l - 4 : 0;
    if (ml > sizeof msg - 1) ml = sizeof msg - 1;
    memcpy(msg, e->ctrl + (l >= 4 ? 4 : 0), ml);
    msg[ml] = '\0';
    for (size_t i = 0; i < ml; i++)
      if ((unsigned char)msg[i] < 32) msg[i] = '?';
    do_abort_locked(x, code, msg);
  } else if (e->cur.type == DT_FRAME_BYE) {
    e->bye = true;
  }
  free(e->ctrl);
  e->ctrl = NULL;
  e->in_payload = false;
  e->hdr_got = 0;
  e->cur_req = NULL;
  e->cur_u = NULL;
  e->discard = false;
}

/* Called when a full header was read: validates and picks a target. */
static int start_frame(struct dt_tp_ep *e) {
  struct dt_tp_ctx *x = e->x;
  char why[128];
  if (dt__frame_decode(e->hdr, &e->cur, why) < 0) {
    char m[200];
    snprintf(m, sizeof m, "malformed frame from rank %d: %s", e->peer, why);
    ep_lost(e, m);
    return -1;
  }
  e->got = 0;
  e->in_payload = true;
  if (e->cur.type != DT_FRAME_DATA) {
    if (e->cur.type != DT_FRAME_ABORT && e->cur.type != DT_FRAME_BYE) {
      char m[200];
      snprintf(m, sizeof m, "out-of-sequence frame type %u from rank %d", e->cur.type, e->peer);
      ep_lost(e, m);
      return -1;
    }
    e->ctrl = malloc(e->cur.len + 1);
    if (!e->ctrl) { ep_lost(e, "out of memory"); return -1; }
    e->target = e->ctrl;
  } else {
    struct dt_tp_req *r = dt__match_posted(&e->mt, e->peer, e->cur.tag);
    if (r) {
      if (r->len != e->cur.len) {
        snprintf(x->err_last, sizeof x->err_last,
                 "rank %d sent %llu bytes for tag 0x%llx, %zu expected%s", e->peer,
                 (unsigned long long)e->cur.len, (unsigned long long)e->cur.tag, r->len,
                 stripe_of_part(r) ? " (one part of a striped message)" : "");
        req_set(r, DT_EPROTO);
        e->discard = true;
        e->target = x->discard_buf;
      } else {
        e->cur_req = r;
        e->target = r->buf;
      }
    } else if (e->cur.len >= DEFER_MIN && !dt__match_has_posted(&e->mt)) {
      /* Nothing else is expected from this peer right now: leave the payload
       * in the socket until its receive is posted, so it lands in the user's
       * buffer with no copy and no fresh allocation (page faults dominate
       * large buffered messages). A receive for another tag, or the peer
       * hanging up, turns it into a buffered message (undefer). */
      e->deferred = true;
      e->target = NULL;
      ep_watch(x, e, e->want_out);
      return 0;
    } else if (ux_start(e) < 0) {
      return -1;
    }
  }
  if (e->cur.len == 0) finish_frame(e);
  return 0;
}

static void recv_progress(struct dt_tp_ep *e) {
  while (!e->dead && !e->deferred) {
    ssize_t r;
    if (!e->in_payload) {
      r = recv(e->fd, e->hdr + e->hdr_got, DT_FRAME_HDR_LEN - e->hdr_got, MSG_DONTWAIT);
      if (r > 0) {
        e->hdr_got += (size_t)r;
        if (e->hdr_got == DT_FRAME_HDR_LEN && start_frame(e) < 0) return;
        continue;
      }
    } else {
      size_t want = e->cur.len - e->got;
      uint8_t *dst = e->target + e->got;
      if (e->discard) {
        dst = e->target;
        if (want > 65536) want = 65536;
      }
      r = recv(e->fd, dst, want, MSG_DONTWAIT);
      if (r > 0) {
        e->got += (size_t)r;
        if (e->cur_u) e->cur_u->got = e->got;
        if (e->got == e->cur.len) finish_frame(e);
        continue;
      }
    }
    if (r == 0) {
      ep_lost(e, e->hdr_got || e->in_payload ? "connection closed in the middle of a frame"
                                             : "connection closed by peer");
      return;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == EINTR) continue;
    char why[128];
    snprintf(why, sizeof why, "receive failed: %s", strerror(errno));
    ep_lost(e, why);
    return;
  }
}

/* The deferred frame becomes a buffered early message (read as it comes). */
static int undefer(struct dt_tp_ep *e) {
  e->deferred = false;
  if (ux_start(e) < 0) return -1;
  ep_watch(e->x, e, e->want_out);
  return 0;
}

/* ---- the progress engine ----------------------------------------------- */

/* One round: wait up to timeout_ms for events and handle them. Called with
 * x->mu held; drops it while blocked in epoll_wait. */
void dt__tcp_progress(struct dt_tp_ctx *x, int timeout_ms) {
  struct epoll_event evs[64];
  dt__tcp_relisten(x);
  if (timeout_ms) pthread_mutex_unlock(&x->mu);
  int n = epoll_wait(x->efd, evs, 64, timeout_ms);
  if (timeout_ms) pthread_mutex_lock(&x->mu);
  for (int i = 0; i < n; i++) {
    int kind = *(int *)evs[i].data.ptr;
    uint32_t ev = evs[i].events;
    if (kind == K_LISTEN) {
      dt__tcp_accept_all(x);
    } else if (kind == K_WAKE) {
      uint64_t v;
      ssize_t rr = read(x->wfd, &v, sizeof v);
      (void)rr;
    } else if (kind == K_EP) {
      struct dt_tp_ep *e = evs[i].data.ptr;
      if (e->dead) continue;
      if (ev & EPOLLOUT) send_progress(e);
      if (e->deferred && (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) undefer(e);
      if (!e->dead && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) recv_progress(e);
    } else if (kind == K_PEND) {
      struct pend *p = evs[i].data.ptr;
      bool still = false;
      for (struct pend *q = x->pend; q; q = q->next) still |= q == p;
      if (still) dt__tcp_pend_event(x, p);
    }
  }
  dt__tcp_pend_expire(x);
}

/* ---- ops --------------------------------------------------------------- */

/* Queues send r (a whole message or one part) on lane e. */
static void lane_isend(struct dt_tp_ep *e, struct dt_tp_req *r) {
  r->ep = e;
  r->done = 0;
  r->next = NULL;
  if (e->dead) {
    req_set(r, e->bye ? DT_ECLOSED : DT_EPEERLOST);
    return;
  }
  struct dt_frame_hdr h = {DT_FRAME_MAGIC, DT_FRAME_VERSION, DT_FRAME_DATA, 0, r->tag, r->len};
  dt__frame_encode(&h, (uint8_t *)r->priv);
  if (e->sq_tail) e->sq_tail->next = r;
  else e->sq = r;
  e->sq_tail = r;
  if (e->sq == r) send_progress(e); /* eager attempt: small messages leave now */
}

/* Posts receive r (a whole message or one part) on lane e. */
static void lane_irecv(struct dt_tp_ep *e, struct dt_tp_req *r) {
  struct dt_tp_ctx *x = e->x;
  r->ep = e;
  r->done = 0;
  r->next = NULL;
  const char *part = stripe_of_part(r) ? " (one part of a striped message)" : "";
  /* an early frame with this tag? (FIFO: the first one) */
  struct umsg *u = (struct umsg *)dt__match_ux_take(&e->mt, e->peer, r->tag);
  if (u) {
    size_t ulen = u->m.len;
    if (ulen != r->len) {
      snprintf(x->err_last, sizeof x->err_last, "rank %d sent %zu bytes for tag 0x%llx, %zu expected%s",
               e->peer, ulen, (unsigned long long)r->tag, r->len, part);
      if (!u->complete) { e->discard = true; e->target = x->discard_buf; e->cur_u = NULL; }
      umsg_free(&u->m);
      req_set(r, DT_EPROTO);
    } else if (u->complete) {
      if (ulen) memcpy(r->buf, u->data, ulen);
      r->done = r->len;
      umsg_free(&u->m);
      req_set(r, 1);
    } else { /* still arriving: continue straight into the user's buffer */
      memcpy(r->buf, u->data, u->got);
      e->cur_u = NULL;
      e->cur_req = r;
      e->target = r->buf;
      umsg_free(&u->m);
    }
    return;
  }
  if (e->dead) {
    req_set(r, e->bye ? DT_ECLOSED : DT_EPEERLOST);
    return;
  }
  if (e->deferred) {
    if (r->tag == e->cur.tag) { /* the waiting frame is ours: read it in place */
      e->deferred = false;
      if (r->len != e->cur.len) {
        snprintf(x->err_last, sizeof x->err_last, "rank %d sent %llu bytes for tag 0x%llx, %zu expected%s",
                 e->peer, (unsigned long long)e->cur.len, (unsigned long long)r->tag, r->len, part);
        e->discard = true;
        e->target = x->discard_buf;
        req_set(r, DT_EPROTO);
      } else {
        e->cur_req = r;
        e->target = r->buf;
      }
      ep_watch(x, e, e->want_out);
      recv_progress(e);
      return;
    }
    if (undefer(e) < 0) {
      if (r->status == 0) req_set(r, DT_EPEERLOST);
      return;
    }
  }
  dt__match_post(&e->mt, r);
}

/* Posts a send or receive on endpoint h (the head lane): whole on lane 0,
 * or as parts, part i on lane i. */
static int ep_post(struct dt_tp_ep *h, struct dt_tp_req *r, bool send) {
  struct dt_tp_ctx *x = h->x;
  pthread_mutex_lock(&x->mu);
  int arc = atomic_load(&x->abort_rc);
  if (arc || (h->dead && !h->bye)) {
    r->status = arc ? arc : DT_EPEERLOST;
    pthread_mutex_unlock(&x->mu);
    return r->status;
  }
  r->ep = h;
  r->done = 0;
  r->next = NULL;
  r->priv[5] = 0;
  size_t per = 0;
  int n = stripe_parts(x, h->nlanes, r->len, &per);
  struct stripe *st = n > 1 ? stripe_new(h, r, n, per) : NULL;
  if (!st) {
    r->priv[4] = 0;
    if (send) lane_isend(h, r);
    else lane_irecv(h, r);
    r->ep = h;
  } else {
    st->posting = true;
    for (int i = 0; i < n && !st->rc; i++) {
      if (send) lane_isend(h->lanes[i], &st->part[i]);
      else lane_irecv(h->lanes[i], &st->part[i]);
    }
    st->posting = false;
    if (st->rc) stripe_fail(h, st, st->rc);
    else if (st->left == 0) stripe_finish(h, st, 1);
  }
  int rc = r->status < 0 ? r->status : DT_OK;
  pthread_mutex_unlock(&x->mu);
  return rc;
}

static int tcp_isend(struct dt_tp_ep *e, struct dt_tp_req *r) { return ep_post(e, r, true); }
static int tcp_irecv(struct dt_tp_ep *e, struct dt_tp_req *r) { return ep_post(e, r, false); }

/* Pushes queued sends on every lane of endpoint h. */
static void push_sends(struct dt_tp_ep *h) {
  for (int i = 0; i < h->nlanes; i++)
    if (h->lanes[i]->sq) send_progress(h->lanes[i]);
}

static int tcp_test(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  if (r->status == 0) {
    if (r->kind == DT_TP_SEND && r->ep) push_sends(r->ep->head);
    dt__tcp_progress(x, 0);
  }
  int s = r->status;
  if (s == 0 && atomic_load(&x->abort_rc)) s = atomic_load(&x->abort_rc);
  pthread_mutex_unlock(&x->mu);
  return s;
}

static int tcp_wait(struct dt_tp_ctx *x, struct dt_tp_req **v, int n, int64_t deadline, char *err) {
  pthread_mutex_lock(&x->mu);
  int rc = DT_OK;
  int64_t spin_start = 0;
  for (;;) {
    int pending = -1;
    for (int i = 0; i < n; i++) {
      int s = v[i]->status;
      if (s < 0) {
        rc = s;
        int arc = atomic_load(&x->abort_rc);
        if (arc && s == arc) snprintf(err, DT_TP_ERR_MAX, "%s", x->abort_msg);
        else if (s == DT_EPROTO) snprintf(err, DT_TP_ERR_MAX, "%s", x->err_last);
        else snprintf(err, DT_TP_ERR_MAX, "%s with rank %d failed: %s",
                      v[i]->kind == DT_TP_SEND ? "send" : "receive", v[i]->peer, dt_strerror(s));
        goto out;
      }
      if (s == 0 && pending < 0) pending = i;
    }
    if (pending < 0) break;
    int arc = atomic_load(&x->abort_rc);
    if (arc) {
      rc = arc;
      snprintf(err, DT_TP_ERR_MAX, "%s", x->abort_msg);
      goto out;
    }
    int64_t left = deadline - dt_now_ns();
    if (left <= 0) {
      rc = DT_ETIMEDOUT;
      snprintf(err, DT_TP_ERR_MAX, "rank %d did not %s before the deadline", v[pending]->peer,
               v[pending]->kind == DT_TP_RECV ? "send" : "receive");
      goto out;
    }
    if (x->spin_ns > 0) { /* poll briefly before sleeping in epoll_wait */
      if (!spin_start) spin_start = dt_now_ns();
      if (dt_now_ns() - spin_start < x->spin_ns) {
        dt__tcp_progress(x, 0);
        pthread_mutex_unlock(&x->mu);
        sched_yield();
        pthread_mutex_lock(&x->mu);
        continue;
      }
    }
    int ms = (int)(left / 1000000) + 1;
    dt__tcp_progress(x, ms > 1000 ? 1000 : ms);
    spin_start = 0;
  }
out:
  pthread_mutex_unlock(&x->mu);
  return rc;
}

/* Takes r (a whole message or one part) off its lane. */
static void lane_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  struct dt_tp_ep *e = r->ep;
  if (!e || r->status != 0) return;
  if (r->kind == DT_TP_RECV) {
    dt__match_cancel(&e->mt, r);
  } else {
    struct dt_tp_req *prev = NULL;
    for (struct dt_tp_req **q = &e->sq; *q; prev = *q, q = &(*q)->next)
      if (*q == r) {
        if (prev == NULL && (e->s_hdr_done || r->done)) {
          /* half-sent frame: the stream cannot be resynchronised */
          shutdown(e->fd, SHUT_RDWR);
        }
        *q = r->next;
        if (e->sq_tail == r) e->sq_tail = prev;
        if (prev == NULL) e->s_hdr_done = 0;
        break;
      }
  }
  if (e->cur_req == r) { /* being received into: drop the rest */
    e->cur_req = NULL;
    e->discard = true;
    e->target = x->discard_buf;
  }
  r->status = DT_EABORTED;
}

static void tcp_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  struct stripe *st = stripe_of_parent(r);
  if (st && r->status == 0) {
    for (int i = 0; i < st->nparts; i++)
      if (st->part[i].status == 0 && st->part[i].ep) lane_cancel(x, &st->part[i]);
    stripe_finish(r->ep->head, st, DT_EABORTED);
  } else if (r->status == 0) {
    lane_cancel(x, r);
  }
  if (r->status == 0) r->status = DT_EABORTED;
  pthread_mutex_unlock(&x->mu);
}

static void do_abort_locked(struct dt_tp_ctx *x, int rc, const char *why) {
  if (atomic_load(&x->abort_rc)) return;
  snprintf(x->abort_msg, sizeof x->abort_msg, "%s", why);
  atomic_store(&x->abort_rc, rc < 0 ? rc : DT_EABORTED);
  char m[DT_TP_ERR_MAX + 4];
  int32_t code = rc < 0 ? rc : DT_EABORTED;
  memcpy(m, &code, 4);
  int ml;
  if (strstr(why, "(reported by rank")) ml = snprintf(m + 4, DT_TP_ERR_MAX, "%s", why);
  else ml = snprintf(m + 4, DT_TP_ERR_MAX, "%s (reported by rank %d)", why, x->rank);
  if (ml >= DT_TP_ERR_MAX) ml = DT_TP_ERR_MAX - 1;
  for (int p = 0; p < x->size; p++) {
    struct dt_tp_ep *e = x->ep[p];
    if (!e) continue;
    /* any idle lane carries the message; if none is idle, the peer sees EOF */
    bool told = false, live = false;
    for (int i = 0; i < e->nlanes && !told; i++) {
      live |= !e->lanes[i]->dead;
      told = send_ctrl(e->lanes[i], DT_FRAME_ABORT, m, 4 + (size_t)ml);
    }
    if (!live) continue;
    if (!told)
      for (int i = 0; i < e->nlanes; i++)
        if (!e->lanes[i]->dead) shutdown(e->lanes[i]->fd, SHUT_WR);
    fail_ep_reqs(e, atomic_load(&x->abort_rc));
  }
  uint64_t one = 1;
  ssize_t w = write(x->wfd, &one, sizeof one);
  (void)w;
}

static void tcp_abort(struct dt_tp_ctx *x, int rc, const char *why) {
  if (atomic_load(&x->abort_rc)) return;
  pthread_mutex_lock(&x->mu);
  do_abort_locked(x, rc, why);
  pthread_mutex_unlock(&x->mu);
}

static void tcp_close(struct dt_tp_ep *h) {
  struct dt_tp_ctx *x = h->x;
  pthread_mutex_lock(&x->mu);
  /* flush what is queued (bounded), then say goodbye on every lane */
  double until = dt_now() + 1.0;
  for (;;) {
    bool queued = false;
    for (int i = 0; i < h->nlanes; i++) {
      struct dt_tp_ep *l = h->lanes[i];
      if (l->sq && !l->dead) send_progress(l);
      queued |= l->sq && !l->dead;
    }
    if (!queued || dt_now() >= until) break;
    dt__tcp_progress(x, 1);
  }
  for (int i = 0; i < h->nlanes; i++) {
    struct dt_tp_ep *l = h->lanes[i];
    if (l->dead) continue;
    send_ctrl(l, DT_FRAME_BYE, NULL, 0);
    epoll_ctl(x->efd, EPOLL_CTL_DEL, l->fd, NULL);
  }
  fail_ep_reqs(h, DT_ECLOSED);
  struct dt_tp_ep **lanes = h->lanes;
  int n = h->nlanes;
  if (x->ep[h->peer] == h) x->ep[h->peer] = NULL;
  for (int i = 0; i < n; i++) {
    struct dt_tp_ep *l = lanes[i];
    dt__match_drain(&l->mt, umsg_free);
    free(l->ctrl);
    close(l->fd);
    free(l);
  }
  free(lanes);
  pthread_mutex_unlock(&x->mu);
}

static void tcp_finalize(struct dt_tp_ctx *x) {
  if (!x) return;
  for (int p = 0; p < x->size; p++)
    if (x->ep[p]) tcp_close(x->ep[p]);
  dt__tcp_ctx_free(x);
}

static const char *tcp_abort_reason(struct dt_tp_ctx *x, int *rc) {
  *rc = atomic_load(&x->abort_rc);
  return *rc ? x->abort_msg : "";
}

const struct dt_transport_ops dt__transport_tcp = {
    "tcp", dt__tcp_init, dt__tcp_can_connect, dt__tcp_connect, tcp_isend, tcp_irecv, tcp_test,
    tcp_wait, tcp_cancel, tcp_abort, tcp_close, tcp_finalize, tcp_abort_reason, NULL,
    tcp_tolerate_loss};

/*
 * tcp.c — the TCP transport: `nconn` non-blocking, TCP_NODELAY connections
 * ("lanes") per peer, driven by epoll from the caller's thread (no progress
 * thread: on a 2-core machine a thread hand-off costs more than it hides).
 * Sends and receives progress together on every lane (full duplex),
 * receives land straight in the user's buffer when posted in time, and
 * frames that arrive early are buffered per (lane, tag) in order.
 *
 * Striping: a message of at least DTRAIN_TCP_STRIPE_MIN bytes (default
 * 256 KiB) is cut into up to nconn contiguous parts of at least 64 KiB
 * (64-byte aligned; part i on lane i), each an ordinary frame with the
 * message's tag; smaller messages use lane 0. Both sides derive the split
 * from the exact length and the endpoint's lane count, so per-lane FIFO
 * matching keeps the per (peer, tag) order of whole messages. A part that
 * fails (wrong length, cancel) cancels its siblings and fails the message.
 *
 * Connections (made in tcp_handshake.c): the higher rank dials the lower
 * rank's listening socket, once per lane; the acceptor adopts the dialer's
 * lane count (1..16) and the endpoint exists once every lane has passed
 * the handshake (lanes wait outside epoll until then). Handshake, on every lane (every frame a
 * validated struct dt_frame_hdr, control payloads bounded):
 *   dialer   -> HELLO {job hash, from, to, lane, nlanes, nonce_d}
 *   acceptor -> HELLO {nonce_a, HMAC(token, "dt-tcp-acc", nonce_d, nonce_a)}
 *   dialer   -> AUTH  {HMAC(token, "dt-tcp-dial", nonce_a, nonce_d)}
 *   acceptor -> AUTH_OK
 * The listening socket is served for the communicator's whole life, so a
 * stranger (wrong token, random bytes, truncated or oversized frames) is
 * turned away with a logged reason at any time without disturbing the job.
 * A frame failing validation on an established lane, an EOF or a reset
 * without a prior BYE means the peer is lost: the context aborts with
 * DT_EPEERLOST naming it and sends ABORT frames to every other peer.
 * Liveness: TCP keepalive (2 s idle, 1 s probes, 3 misses) turns a
 * silently vanished host on an idle connection into DT_EPEERLOST (with data
 * in flight, set DTRAIN_TCP_USER_TIMEOUT_MS or rely on the deadline); a
 * process that dies is seen at once through its FIN or RST. A live but
 * hung process is caught by the caller's deadline instead.
 * Knobs: DTRAIN_TCP_NCONN (lanes when the config says 0; default
 * TCP_NCONN_DEFAULT, measured in docs/comm.md), DTRAIN_TCP_STRIPE_MIN,
 * DTRAIN_TCP_BUFFER (SO_SNDBUF/SO_RCVBUF, default: kernel autotuning),
 * DTRAIN_TCP_KEEPIDLE, DTRAIN_TCP_USER_TIMEOUT_MS, DTRAIN_TCP_SPIN_US
 * (poll, yielding the core, this long before sleeping in epoll_wait;
 * default 0: no measurable gain on a shared 2-core host).
 * Not here: TLS, IPv6 listening.
 */
#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/transport/tcp_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void ep_watch(struct dt_tp_ctx *x, struct dt_tp_ep *e, bool out) {
  struct epoll_event ev = {(e->deferred ? 0 : EPOLLIN) | EPOLLRDHUP | (out ? EPOLLOUT : 0), {.ptr = e}};
  epoll_ctl(x->efd, EPOLL_CTL_MOD, e->fd, &ev);
  e->want_out = out;
}

/* ---- stripes ----------------------------------------------------------- */

static struct stripe *stripe_of_part(struct dt_tp_req *r) { return (struct stripe *)(uintptr_t)r->priv[4]; }
static struct stripe *stripe_of_parent(struct dt_tp_req *r) { return (struct stripe *)(uintptr_t)r->priv[5]; }

/* How a message of len bytes is cut for an endpoint with nlanes lanes. */
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

/* A part failed: cancel the siblings still queued, fail the message. */
static void stripe_fail(struct dt_tp_ep *h, struct stripe *st, int rc) {
  if (!st->rc) st->rc = rc;
  for (int i = 0; i < st->nparts; i++)
    if (st->part[i].status == 0 && st->part[i].ep) lane_cancel(h->x, &st->part[i]);
  if (!st->posting) stripe_finish(h, st, st->rc);
}

/* Sets the outcome of a queued request: a plain one directly, a part
 * through its stripe. */
static void req_set(struct dt_tp_req *r, int st) {
  struct stripe *sp = stripe_of_part(r);
  if (!sp) {
    r->status = st;
    return;
  }
  if (r->status != 0) return;
  r->status = st;
  struct dt_tp_ep *h = r->ep->head;
  if (st < 0) {
    stripe_fail(h, sp, st);
    return;
  }
  if (--sp->left == 0 && !sp->posting) stripe_finish(h, sp, sp->rc ? sp->rc : 1);
}

/* Fails every request queued on every lane of the endpoint and every
 * stripe (the endpoint is lost, aborted or closed). */
static void fail_ep_reqs(struct dt_tp_ep *e, int rc) {
  struct dt_tp_ep *h = e->head;
  for (int i = 0; i < h->nlanes; i++) {
    struct dt_tp_ep *l = h->lanes[i];
    for (struct dt_tp_req *r = l->sq, *n; r; r = n) n = r->next, r->status = rc;
    for (struct dt_tp_req *r = l->rq, *n; r; r = n) n = r->next, r->status = rc;
    if (l->cur_req && l->cur_req->status == 0) l->cur_req->status = rc;
    l->sq = l->sq_tail = l->rq = l->rq_tail = NULL;
    l->cur_req = NULL;
  }
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
    struct dt_tp_req *q = e->sq, *r = e->rq, *cur = e->cur_req;
    e->sq = e->sq_tail = e->rq = e->rq_tail = NULL;
    e->cur_req = NULL;
    for (struct dt_tp_req *n; q; q = n) n = q->next, req_set(q, DT_ECLOSED);
    for (struct dt_tp_req *n; r; r = n) n = r->next, req_set(r, DT_ECLOSED);
    if (cur && cur->status == 0) req_set(cur, DT_ECLOSED);
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
  snprintf(m, sizeof m, "rank %d lost: %s", e->peer, why);
  DT_LOG_WARN("tcp: rank %d: %s", x->rank, m);
  do_abort_locked(x, DT_EPEERLOST, m);
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

static void finish_frame(struct dt_tp_ep *e) {
  struct dt_tp_ctx *x = e->x;
  if (e->cur.type == DT_FRAME_DATA) {
    if (e->cur_req) {
      e->cur_req->done = e->cur_req->len;
      req_set(e->cur_req, 1);
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
    struct dt_tp_req *prev = NULL, *r = e->rq;
    for (; r && r->tag != e->cur.tag; prev = r, r = r->next) {}
    if (r) {
      if (prev) prev->next = r->next;
      else e->rq = r->next;
      if (e->rq_tail == r) e->rq_tail = prev;
      if (r->len != e->cur.len) {
        snprintf(x->err_last, sizeof x->err_last,
                 "rank %d sent %llu bytes for tag 0x%llx, %zu expected%s", e->peer,
                 (unsigned long long)e->cur.len, (unsigned long long)e->cur.tag, r->len,
                 stripe_of_part(r) ? " (one part of a striped message)" : "");
        e->discard = true;
        e->target = x->discard_buf;
        req_set(r, DT_EPROTO);
      } else {
        e->cur_req = r;
        e->target = r->buf;
      }
    } else if (e->cur.len >= DEFER_MIN && !e->rq) {
      /* Nothing else is expected from this peer right now: leave the payload
       * in the socket until its receive is posted, so it lands in the user's
       * buffer with no copy and no fresh allocation (page faults dominate
       * large buffered messages). A receive for another tag, or the peer
       * hanging up, turns it into a buffered message (undefer). */
      e->deferred = true;
      e->target = NULL;
      ep_watch(x, e, e->want_out);
      return 0;
    } else {
      struct umsg *u = calloc(1, sizeof *u);
      if (u) u->data = malloc(e->cur.len ? e->cur.len : 1);
      if (!u || !u->data) {
        free(u);
        ep_lost(e, "out of memory buffering an early message");
        return -1;
      }
      u->tag = e->cur.tag;
      u->len = e->cur.len;
      if (e->uq_tail) e->uq_tail->next = u;
      else e->uq = u;
      e->uq_tail = u;
      e->cur_u = u;
      e->target = u->data;
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
  struct umsg *u = calloc(1, sizeof *u);
  if (u) u->data = malloc(e->cur.len);
  if (!u || !u->data) {
    free(u);
    e->deferred = false;
    ep_lost(e, "out of memory buffering an early message");
    return -1;
  }
  u->tag = e->cur.tag;
  u->len = e->cur.len;
  if (e->uq_tail) e->uq_tail->next = u;
  else e->uq = u;
  e->uq_tail = u;
  e->cur_u = u;
  e->target = u->data;
  e->deferred = false;
  ep_watch(e->x, e, e->want_out);
  return 0;
}

/* ---- the progress engine ----------------------------------------------- */

/* One round: wait up to timeout_ms for events and handle them. Called with
 * x->mu held; drops it while blocked in epoll_wait. */
void dt__tcp_progress(struct dt_tp_ctx *x, int timeout_ms) {
  struct epoll_event evs[64];
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
  /* handshakes that take too long from strangers */
  double now = dt_now();
  for (struct pend *p = x->pend, *nx; p; p = nx) {
    nx = p->next;
    if (p->st >= P_ACC_WAIT_HELLO && now > p->deadline) dt__tcp_pend_reject(x, p, "handshake timed out");
  }
}

/* ---- ops --------------------------------------------------------------- */

static void ctx_free(struct dt_tp_ctx *x) {
  if (x->lfd >= 0) close(x->lfd);
  if (x->efd >= 0) close(x->efd);
  if (x->wfd >= 0) close(x->wfd);
  while (x->pend) dt__tcp_pend_remove(x, x->pend, true);
  for (int p = 0; x->build && p < x->size; p++) {
    if (!x->build[p]) continue;
    for (int i = 0; i < x->build_n[p]; i++)
      if (x->build[p][i]) close(x->build[p][i]->fd), free(x->build[p][i]);
    free(x->build[p]);
  }
  free(x->build);
  free(x->build_n);
  free(x->ep);
  free(x->token);
  free(x->discard_buf);
  pthread_mutex_destroy(&x->mu);
  free(x);
}

static int tcp_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr) {
  struct dt_tp_ctx *x = calloc(1, sizeof *x);
  if (!x) return dt__seterr(DT_ENOMEM, "tcp: out of memory");
  x->kind_listen = K_LISTEN;
  x->kind_wake = K_WAKE;
  pthread_mutex_init(&x->mu, NULL);
  x->lfd = x->efd = x->wfd = -1;
  x->rank = in->rank;
  x->size = in->size;
  x->job_hash = hash_str(in->job ? in->job : "");
  x->bufsize = (int)dt_param_int("DTRAIN_TCP_BUFFER", 0);
  x->spin_ns = dt_param_int("DTRAIN_TCP_SPIN_US", 0) * 1000;
  int nconn = in->nconn > 0 ? in->nconn : (int)dt_param_int("DTRAIN_TCP_NCONN", TCP_NCONN_DEFAULT);
  x->nconn = nconn < 1 ? 1 : nconn > MAX_LANES ? MAX_LANES : nconn;
  int64_t smin = dt_param_int("DTRAIN_TCP_STRIPE_MIN", 256 * 1024);
  x->stripe_min = smin < 2 * PART_MIN ? 2 * PART_MIN : (size_t)smin;
  x->ep = calloc((size_t)in->size, sizeof *x->ep);
  x->build = calloc((size_t)in->size, sizeof *x->build);
  x->build_n = calloc((size_t)in->size, sizeof *x->build_n);
  x->token = malloc(in->token_len + 1);
  x->discard_buf = malloc(65536);
  if (!x->ep || !x->build || !x->build_n || !x->token || !x->discard_buf) {
    ctx_free(x);
    return dt__seterr(DT_ENOMEM, "tcp: out of memory");
  }
  if (in->token_len) memcpy(x->token, in->token, in->token_len);
  x->token_len = in->token_len;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  const char *bind_addr = in->bind_addr ? in->bind_addr : "127.0.0.1";
  if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
    ctx_free(x);
    return dt__seterr(DT_EINVAL, "tcp: bind address '%s' is not an IPv4 address", bind_addr);
  }
  x->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (x->lfd < 0 || bind(x->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(x->lfd, 256)) {
    int e = errno;
    ctx_free(x);
    return dt__seterr(DT_EIO, "tcp: cannot listen on %s: %s", bind_addr, strerror(e));
  }
  socklen_t sl = sizeof sa;
  getsockname(x->lfd, (struct sockaddr *)&sa, &sl);
  x->efd = epoll_create1(EPOLL_CLOEXEC);
  x->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event e1 = {EPOLLIN, {.ptr = &x->kind_listen}}, e2 = {EPOLLIN, {.ptr = &x->kind_wake}};
  if (x->efd < 0 || x->wfd < 0 || epoll_ctl(x->efd, EPOLL_CTL_ADD, x->lfd, &e1) ||
      epoll_ctl(x->efd, EPOLL_CTL_ADD, x->wfd, &e2)) {
    ctx_free(x);
    return dt__seterr(DT_EIO, "tcp: epoll setup failed");
  }
  char ip[32];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  snprintf(addr, DT_TP_ADDR_MAX, "%s:%d", ip, ntohs(sa.sin_port));
  *out = x;
  return DT_OK;
}

static bool tcp_can_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *p) {
  return p->addr && strchr(p->addr, ':') != NULL;
}

/* Queues r (a whole message or one part) on lane e. Called with x->mu. */
static void lane_isend(struct dt_tp_ep *e, struct dt_tp_req *r) {
  struct dt_tp_ctx *x = e->x;
  int arc = atomic_load(&x->abort_rc);
  r->ep = e;
  r->done = 0;
  r->next = NULL;
  if (e->dead || arc) {
    req_set(r, arc ? arc : e->bye ? DT_ECLOSED : DT_EPEERLOST);
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
  int arc = atomic_load(&x->abort_rc);
  r->ep = e;
  r->done = 0;
  r->next = NULL;
  /* an early frame with this tag? (FIFO: the first one) */
  struct umsg *prev = NULL, *u = e->uq;
  for (; u && u->tag != r->tag; prev = u, u = u->next) {}
  if (u) {
    if (prev) prev->next = u->next;
    else e->uq = u->next;
    if (e->uq_tail == u) e->uq_tail = prev;
    int st = 0;
    if (u->len != r->len) {
      st = DT_EPROTO;
      snprintf(x->err_last, sizeof x->err_last, "rank %d sent %zu bytes for tag 0x%llx, %zu expected%s",
               e->peer, u->len, (unsigned long long)r->tag, r->len,
               stripe_of_part(r) ? " (one part of a striped message)" : "");
      if (!u->complete) { e->discard = true; e->target = x->discard_buf; e->cur_u = NULL; }
    } else if (u->complete) {
      if (u->len) memcpy(r->buf, u->data, u->len);
      r->done = r->len;
      st = 1;
    } else { /* still arriving: continue straight into the user's buffer */
      memcpy(r->buf, u->data, u->got);
      e->cur_u = NULL;
      e->cur_req = r;
      e->target = r->buf;
    }
    free(u->data);
    free(u);
    if (st) req_set(r, st);
    return;
  }
  if (e->dead || arc) {
    req_set(r, arc ? arc : e->bye ? DT_ECLOSED : DT_EPEERLOST);
    return;
  }
  if (e->deferred) {
    if (r->tag == e->cur.tag) { /* the waiting frame is ours: read it in place */
      e->deferred = false;
      if (r->len != e->cur.len) {
        snprintf(x->err_last, sizeof x->err_last, "rank %d sent %llu bytes for tag 0x%llx, %zu expected%s",
                 e->peer, (unsigned long long)e->cur.len, (unsigned long long)r->tag, r->len,
                 stripe_of_part(r) ? " (one part of a striped message)" : "");
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
      req_set(r, DT_EPEERLOST);
      return;
    }
  }
  if (e->rq_tail) e->rq_tail->next = r;
  else e->rq = r;
  e->rq_tail = r;
}

/* Posts a send or receive on endpoint h (the head lane): whole on lane 0,
 * or as parts over the lanes. */
static int post(struct dt_tp_ep *h, struct dt_tp_req *r, bool send) {
  struct dt_tp_ctx *x = h->x;
  pthread_mutex_lock(&x->mu);
  r->priv[4] = r->priv[5] = 0;
  r->ep = h;
  r->done = 0;
  r->next = NULL;
  size_t per = 0;
  int n = stripe_parts(x, h->nlanes, r->len, &per);
  if (n == 1 || atomic_load(&x->abort_rc)) {
    if (send) lane_isend(h, r);
    else lane_irecv(h, r);
  } else {
    struct stripe *st = stripe_new(h, r, n, per);
    if (!st) {
      pthread_mutex_unlock(&x->mu);
      r->status = DT_ENOMEM;
      return dt__seterr(DT_ENOMEM, "tcp: out of memory");
    }
    st->posting = true;
    for (int i = 0; i < n && !st->rc; i++) {
      if (send) lane_isend(h->lanes[i], &st->part[i]);
      else lane_irecv(h->lanes[i], &st->part[i]);
    }
    st->posting = false;
    if (st->rc) stripe_fail(h, st, st->rc);
    else if (st->left == 0) stripe_finish(h, st, 1);
  }
  int s = r->status;
  pthread_mutex_unlock(&x->mu);
  return s < 0 && s != DT_EPROTO ? s : DT_OK; /* a wrong length is reported by wait */
}

static int tcp_isend(struct dt_tp_ep *e, struct dt_tp_req *r) { return post(e, r, true); }
static int tcp_irecv(struct dt_tp_ep *e, struct dt_tp_req *r) { return post(e, r, false); }

/* Pushes queued sends on every lane of r's endpoint. */
static void send_progress_all(struct dt_tp_req *r) {
  struct dt_tp_ep *h = r->ep->head;
  for (int i = 0; i < h->nlanes; i++)
    if (h->lanes[i]->sq) send_progress(h->lanes[i]);
}

static int tcp_test(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  if (r->status == 0) {
    if (r->kind == DT_TP_SEND && r->ep) send_progress_all(r);
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

/* Takes r (a whole message or one part) off its lane. Called with x->mu. */
static void lane_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  struct dt_tp_ep *e = r->ep;
  if (e && r->status == 0) {
    struct dt_tp_req **q = r->kind == DT_TP_SEND ? &e->sq : &e->rq;
    struct dt_tp_req **tail = r->kind == DT_TP_SEND ? &e->sq_tail : &e->rq_tail, *prev = NULL;
    for (; *q; prev = *q, q = &(*q)->next)
      if (*q == r) {
        if (r->kind == DT_TP_SEND && prev == NULL && (e->s_hdr_done || r->done)) {
          /* half-sent frame: the stream cannot be resynchronised */
          shutdown(e->fd, SHUT_RDWR);
        }
        *q = r->next;
        if (*tail == r) *tail = prev;
        if (r->kind == DT_TP_SEND && prev == NULL) e->s_hdr_done = 0;
        break;
      }
    if (e->cur_req == r) { /* being received into: drop the rest */
      e->cur_req = NULL;
      e->discard = true;
      e->target = x->discard_buf;
    }
  }
  if (r->status == 0) r->status = DT_EABORTED;
}

static void tcp_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  struct stripe *st = stripe_of_parent(r);
  if (st && r->status == 0) {
    for (int i = 0; i < st->nparts; i++)
      if (st->part[i].status == 0 && st->part[i].ep) lane_cancel(x, &st->part[i]);
    stripe_finish(r->ep->head, st, DT_EABORTED);
  } else if (!st) {
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
    bool told = false;
    for (int i = 0; i < e->nlanes && !told; i++) told = send_ctrl(e->lanes[i], DT_FRAME_ABORT, m, 4 + (size_t)ml);
    if (!told)
      for (int i = 0; i < e->nlanes; i++) shutdown(e->lanes[i]->fd, SHUT_WR);
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

static void tcp_close(struct dt_tp_ep *e) {
  struct dt_tp_ctx *x = e->x;
  pthread_mutex_lock(&x->mu);
  struct dt_tp_ep *h = e->head;
  /* flush what is queued (bounded), then say goodbye on every lane */
  double until = dt_now() + 1.0;
  for (;;) {
    bool busy = false;
    for (int i = 0; i < h->nlanes; i++) {
      struct dt_tp_ep *l = h->lanes[i];
      if (!l->dead && l->sq) send_progress(l);
      busy |= !l->dead && l->sq != NULL;
    }
    if (!busy || dt_now() >= until) break;
    dt__tcp_progress(x, 1);
  }
  for (int i = 0; i < h->nlanes; i++) {
    struct dt_tp_ep *l = h->lanes[i];
    if (l->dead) continue;
    send_ctrl(l, DT_FRAME_BYE, NULL, 0);
    epoll_ctl(x->efd, EPOLL_CTL_DEL, l->fd, NULL);
  }
  fail_ep_reqs(h, DT_ECLOSED);
  if (x->ep[h->peer] == h) x->ep[h->peer] = NULL;
  struct dt_tp_ep **lanes = h->lanes;
  int n = h->nlanes;
  for (int i = 0; i < n; i++) {
    struct dt_tp_ep *l = lanes[i];
    for (struct umsg *u = l->uq, *nx; u; u = nx) nx = u->next, free(u->data), free(u);
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
  ctx_free(x);
}

static const char *tcp_abort_reason(struct dt_tp_ctx *x, int *rc) {
  *rc = atomic_load(&x->abort_rc);
  return *rc ? x->abort_msg : "";
}

const struct dt_transport_ops dt__transport_tcp = {
    "tcp", tcp_init, tcp_can_connect, dt__tcp_connect, tcp_isend, tcp_irecv, tcp_test,
    tcp_wait, tcp_cancel, tcp_abort, tcp_close, tcp_finalize, tcp_abort_reason};

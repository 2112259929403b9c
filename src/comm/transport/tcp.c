/*
 * tcp.c — the TCP transport: one non-blocking, TCP_NODELAY connection per
 * peer with large socket buffers, driven by epoll from the caller's thread
 * (no progress thread: on a 2-core machine a thread hand-off costs more than
 * it hides). Sends and receives progress together (full duplex), receives
 * land straight in the user's buffer when posted in time, and frames that
 * arrive early are buffered per (peer, tag) in order (matching: the shared
 * match.c, one queue pair per endpoint).
 *
 * Connections: the higher rank dials the lower rank's listening socket.
 * Handshake (every frame a validated struct dt_frame_hdr, control payloads
 * bounded by DT_FRAME_CTRL_MAX):
 *   dialer   -> HELLO {job hash, from, to, nonce_d}
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
 * Not here: several connections per peer (nconn is accepted but 1 is used),
 * TLS, IPv6 listening.
 */
#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/accept_guard.h"
#include "comm/transport/match.h"

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

enum { K_LISTEN = 1, K_WAKE, K_EP, K_PEND };

#define DEFER_MIN (64 * 1024) /* early frames at least this large wait in the socket */

struct umsg { /* a frame that arrived before its receive was posted */
  struct dt_match_msg m; /* tag, len */
  size_t got;
  bool complete;
  uint8_t *data;
};

struct dt_tp_ep {
  int kind; /* K_EP */
  struct dt_tp_ctx *x;
  int fd, peer;
  bool dead, bye, want_out;
  bool deferred;                  /* a large early frame waits in the socket */
  /* send side */
  struct dt_tp_req *sq, *sq_tail;
  size_t s_hdr_done; /* bytes of the head request's header already sent */
  /* receive side */
  struct dt_match mt;             /* posted receives, early frames */
  uint8_t hdr[DT_FRAME_HDR_LEN];
  size_t hdr_got;
  struct dt_frame_hdr cur;        /* frame being read (hdr complete) */
  bool in_payload;
  uint8_t *target;                /* where payload goes */
  size_t got;
  struct dt_tp_req *cur_req;      /* matched receive, or NULL */
  struct umsg *cur_u;             /* buffered frame, or NULL */
  uint8_t *ctrl;                  /* control payload */
  bool discard;                   /* payload for a failed receive: drop it */
};

enum pstate { P_DIAL_CONNECTING, P_DIAL_WAIT_HELLO, P_DIAL_WAIT_OK, P_ACC_WAIT_HELLO, P_ACC_WAIT_AUTH };

struct pend {
  int kind; /* K_PEND */
  struct pend *next;
  int fd;
  enum pstate st;
  int peer;           /* dialer: target; acceptor: claimed rank once known */
  uint8_t nonce_me[DT_AUTH_NONCE_LEN], nonce_peer[DT_AUTH_NONCE_LEN];
  uint8_t in[DT_FRAME_HDR_LEN + 128];
  size_t in_got;
  double deadline;
  double since;       /* acceptor: accepted at (dt_now) */
  char who[64];
  int fail_rc;        /* dialer: error to report */
  bool shed;          /* dialer: closed before the acceptor's greeting */
  char fail[200];
};

struct dt_tp_ctx {
  int kind_listen, kind_wake; /* epoll tags (K_LISTEN, K_WAKE) */
  pthread_mutex_t mu;
  int rank, size;
  int lfd, efd, wfd;
  uint64_t job_hash;
  uint8_t *token;
  size_t token_len;
  int bufsize;
  int64_t spin_ns;      /* DTRAIN_TCP_SPIN_US */
  struct dt_tp_ep **ep; /* per peer */
  struct pend *pend;
  struct dt_accept_guard guard; /* spare descriptor for EMFILE */
  char guard_name[32];
  bool listen_off;              /* listener out of epoll while paused */
  double auth_timeout;
  int pending_max;
  _Atomic int abort_rc;
  char abort_msg[DT_TP_ERR_MAX];
  char err_last[DT_TP_ERR_MAX];
  uint8_t *discard_buf;
};

/* ---- helpers ----------------------------------------------------------- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void set_sock_opts(int fd, int bufsize) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* A host that vanishes without a FIN (power loss, partition) must still
   * become DT_EPEERLOST within seconds: keepalive probes after 2 s idle,
   * every second, 3 misses. TCP_USER_TIMEOUT (unacknowledged data) is off
   * by default: newer kernels also apply it to zero-window probing, which
   * would kill a healthy connection whose receiver computes for a while
   * without reading (large early frames deliberately wait in the socket). */
  int idle = (int)dt_param(DT_PARAM_TCP_KEEPIDLE), intvl = 1, cnt = 3;
  unsigned int uto = (unsigned int)dt_param(DT_PARAM_TCP_USER_TIMEOUT_MS);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  if (uto) setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto);
  if (bufsize > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
  }
}

static void ep_watch(struct dt_tp_ctx *x, struct dt_tp_ep *e, bool out) {
  struct epoll_event ev = {(e->deferred ? 0 : EPOLLIN) | EPOLLRDHUP | (out ? EPOLLOUT : 0), {.ptr = e}};
  epoll_ctl(x->efd, EPOLL_CTL_MOD, e->fd, &ev);
  e->want_out = out;
}

static void fail_ep_reqs(struct dt_tp_ep *e, int rc) {
  for (struct dt_tp_req *r = e->sq, *n; r; r = n) n = r->next, r->status = rc;
  dt__match_fail(&e->mt, rc);
  if (e->cur_req && e->cur_req->status == 0) e->cur_req->status = rc;
  e->sq = e->sq_tail = NULL;
  e->cur_req = NULL;
}

static void do_abort_locked(struct dt_tp_ctx *x, int rc, const char *why);
static void recv_progress(struct dt_tp_ep *e);

/* The peer behind e is gone (or spoke garbage). */
static void ep_lost(struct dt_tp_ep *e, const char *why) {
  struct dt_tp_ctx *x = e->x;
  if (e->dead) return;
  e->dead = true;
  epoll_ctl(x->efd, EPOLL_CTL_DEL, e->fd, NULL);
  if (e->bye) { /* it said goodbye: only its own pending requests fail */
    fail_ep_reqs(e, DT_ECLOSED);
    return;
  }
  fail_ep_reqs(e, DT_EPEERLOST);
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
      r->status = 1;
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
      e->cur_req->done = e->cur_req->len;
      e->cur_req->status = 1;
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
        r->status = DT_EPROTO;
        snprintf(x->err_last, sizeof x->err_last,
                 "rank %d sent %llu bytes for tag 0x%llx, %zu expected", e->peer,
                 (unsigned long long)e->cur.len, (unsigned long long)e->cur.tag, r->len);
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

/* ---- handshake --------------------------------------------------------- */

static void pend_remove(struct dt_tp_ctx *x, struct pend *p, bool close_fd) {
  for (struct pend **pp = &x->pend; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  epoll_ctl(x->efd, EPOLL_CTL_DEL, p->fd, NULL);
  if (close_fd) close(p->fd);
  free(p);
}

static void pend_reject(struct dt_tp_ctx *x, struct pend *p, const char *why) {
  DT_LOG_WARN("tcp: rank %d: rejected connection from %s: %s", x->rank, p->who, why);
  pend_remove(x, p, true);
}

static bool write_frame(int fd, uint8_t type, const void *pl, size_t len) {
  uint8_t buf[DT_FRAME_HDR_LEN + 256];
  struct dt_frame_hdr h = {DT_FRAME_MAGIC, DT_FRAME_VERSION, type, 0, 0, len};
  dt__frame_encode(&h, buf);
  if (len) memcpy(buf + DT_FRAME_HDR_LEN, pl, len);
  return send(fd, buf, DT_FRAME_HDR_LEN + len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)(DT_FRAME_HDR_LEN + len);
}

static int make_ep(struct dt_tp_ctx *x, int fd, int peer) {
  struct dt_tp_ep *e = calloc(1, sizeof *e);
  if (!e) return DT_ENOMEM;
  e->kind = K_EP;
  e->x = x;
  e->fd = fd;
  e->peer = peer;
  dt__match_init(&e->mt, 0);
  struct epoll_event ev = {EPOLLIN | EPOLLRDHUP, {.ptr = e}};
  if (epoll_ctl(x->efd, EPOLL_CTL_ADD, fd, &ev)) {
    free(e);
    return DT_EIO;
  }
  x->ep[peer] = e;
  return DT_OK;
}

/* Reads exactly one frame (header + payload <= 128 bytes) into p->in.
 * Returns 1 when complete, 0 if more is needed, -1 on error (reason in why). */
static int pend_read(struct pend *p, uint8_t want_type, size_t want_len, char *why) {
  for (;;) {
    size_t need = p->in_got < DT_FRAME_HDR_LEN ? DT_FRAME_HDR_LEN : DT_FRAME_HDR_LEN + want_len;
    if (p->in_got == need) break;
    ssize_t r = recv(p->fd, p->in + p->in_got, need - p->in_got, MSG_DONTWAIT);
    if (r == 0) { snprintf(why, 128, "connection closed during handshake"); return -1; }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      snprintf(why, 128, "handshake read: %s", strerror(errno));
      return -1;
    }
    p->in_got += (size_t)r;
    if (p->in_got == DT_FRAME_HDR_LEN) {
      struct dt_frame_hdr h;
      if (dt__frame_decode(p->in, &h, why) < 0) return -1;
      if (h.type != want_type || h.len != want_len) {
        snprintf(why, 128, "unexpected handshake frame (type %u, %llu bytes)", h.type,
                 (unsigned long long)h.len);
        return -1;
      }
    }
  }
  p->in_got = 0;
  return 1;
}

#define HELLO_D_LEN (8 + 4 + 4 + DT_AUTH_NONCE_LEN)
#define HELLO_A_LEN (DT_AUTH_NONCE_LEN + DT_AUTH_MAC_LEN)

static void pend_event(struct dt_tp_ctx *x, struct pend *p) {
  char why[128];
  int r;
  switch (p->st) {
  case P_DIAL_CONNECTING: {
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err == EINPROGRESS || err == EALREADY) return;
    if (err) { /* not listening yet: retry in the connect loop */
      p->fail_rc = DT_EAGAIN;
      snprintf(p->fail, sizeof p->fail, "connect: %s", strerror(err));
      return;
    }
    uint8_t pl[HELLO_D_LEN];
    int32_t from = x->rank, to = p->peer;
    memcpy(pl, &x->job_hash, 8);
    memcpy(pl + 8, &from, 4);
    memcpy(pl + 12, &to, 4);
    memcpy(pl + 16, p->nonce_me, DT_AUTH_NONCE_LEN);
    if (!write_frame(p->fd, DT_FRAME_HELLO, pl, sizeof pl)) {
      p->fail_rc = DT_EAGAIN;
      snprintf(p->fail, sizeof p->fail, "handshake write failed");
      return;
    }
    p->st = P_DIAL_WAIT_HELLO;
    struct epoll_event ev = {EPOLLIN | EPOLLRDHUP, {.ptr = p}};
    epoll_ctl(x->efd, EPOLL_CTL_MOD, p->fd, &ev);
    return;
  }
  case P_DIAL_WAIT_HELLO: {
    bool none_yet = p->in_got == 0;
    r = pend_read(p, DT_FRAME_HELLO, HELLO_A_LEN, why);
    if (r == 0) return;
    if (r < 0 && none_yet) {
      /* Closed before its greeting: the acceptor may be shedding strangers
       * (out of descriptors), or be another job: dial again a few times. */
      p->fail_rc = DT_EAGAIN;
      p->shed = true;
      snprintf(p->fail, sizeof p->fail, "rank %d closed the connection before its greeting (busy, or another job?): %s",
               p->peer, why);
      return;
    }
    if (r < 0) {
      p->fail_rc = DT_EAUTH;
      snprintf(p->fail, sizeof p->fail, "rank %d refused the handshake (wrong job token or job?): %s", p->peer, why);
      return;
    }
    uint8_t *pl = p->in + DT_FRAME_HDR_LEN, mac[DT_AUTH_MAC_LEN];
    memcpy(p->nonce_peer, pl, DT_AUTH_NONCE_LEN);
    if (!dt__auth_verify(x->token, x->token_len, "dt-tcp-acc", p->nonce_me, p->nonce_peer,
                         pl + DT_AUTH_NONCE_LEN)) {
      p->fail_rc = DT_EAUTH;
      snprintf(p->fail, sizeof p->fail, "rank %d failed to prove the job token", p->peer);
      return;
    }
    dt__auth_mac(x->token, x->token_len, "dt-tcp-dial", p->nonce_peer, p->nonce_me, mac);
    if (!write_frame(p->fd, DT_FRAME_AUTH, mac, sizeof mac)) {
      p->fail_rc = DT_EPEERLOST;
      snprintf(p->fail, sizeof p->fail, "handshake write to rank %d failed", p->peer);
      return;
    }
    p->st = P_DIAL_WAIT_OK;
    return;
  }
  case P_DIAL_WAIT_OK: {
    r = pend_read(p, DT_FRAME_AUTH_OK, 0, why);
    if (r == 0) return;
    if (r < 0) {
      p->fail_rc = DT_EAUTH;
      snprintf(p->fail, sizeof p->fail, "rank %d rejected our job token: %s", p->peer, why);
      return;
    }
    int fd = p->fd, peer = p->peer;
    pend_remove(x, p, false);
    if (make_ep(x, fd, peer) < 0) close(fd);
    return;
  }
  case P_ACC_WAIT_HELLO: {
    r = pend_read(p, DT_FRAME_HELLO, HELLO_D_LEN, why);
    if (r == 0) return;
    if (r < 0) { pend_reject(x, p, why); return; }
    uint8_t *pl = p->in + DT_FRAME_HDR_LEN;
    uint64_t jh;
    int32_t from, to;
    memcpy(&jh, pl, 8);
    memcpy(&from, pl + 8, 4);
    memcpy(&to, pl + 12, 4);
    if (jh != x->job_hash) { pend_reject(x, p, "different job"); return; }
    if (to != x->rank || from <= x->rank || from >= x->size) {
      snprintf(why, sizeof why, "bad ranks in hello (from %d to %d)", from, to);
      pend_reject(x, p, why);
      return;
    }
    p->peer = from;
    memcpy(p->nonce_peer, pl + 16, DT_AUTH_NONCE_LEN);
    uint8_t out[HELLO_A_LEN];
    memcpy(out, p->nonce_me, DT_AUTH_NONCE_LEN);
    dt__auth_mac(x->token, x->token_len, "dt-tcp-acc", p->nonce_peer, p->nonce_me, out + DT_AUTH_NONCE_LEN);
    if (!write_frame(p->fd, DT_FRAME_HELLO, out, sizeof out)) { pend_reject(x, p, "write failed"); return; }
    p->st = P_ACC_WAIT_AUTH;
    return;
  }
  case P_ACC_WAIT_AUTH: {
    r = pend_read(p, DT_FRAME_AUTH, DT_AUTH_MAC_LEN, why);
    if (r == 0) return;
    if (r < 0) { pend_reject(x, p, why); return; }
    if (!dt__auth_verify(x->token, x->token_len, "dt-tcp-dial", p->nonce_me, p->nonce_peer,
                         p->in + DT_FRAME_HDR_LEN)) {
      snprintf(why, sizeof why, "wrong job token (HMAC mismatch) claiming rank %d", p->peer);
      pend_reject(x, p, why);
      return;
    }
    if (x->ep[p->peer]) { /* live or lost: a rank connects once per communicator */
      snprintf(why, sizeof why, "rank %d is already connected", p->peer);
      pend_reject(x, p, why);
      return;
    }
    if (!write_frame(p->fd, DT_FRAME_AUTH_OK, NULL, 0)) { pend_reject(x, p, "write failed"); return; }
    int fd = p->fd, peer = p->peer;
    pend_remove(x, p, false);
    if (make_ep(x, fd, peer) < 0) close(fd);
    return;
  }
  }
}

/* The oldest accepted connection still in its handshake (NULL if none). */
static struct pend *oldest_stranger(struct dt_tp_ctx *x, int *count) {
  struct pend *o = NULL;
  int n = 0;
  for (struct pend *p = x->pend; p; p = p->next) {
    if (p->st < P_ACC_WAIT_HELLO) continue;
    n++;
    if (!o || p->since < o->since) o = p;
  }
  if (count) *count = n;
  return o;
}

/* Out of descriptors: close the oldest stranger once it has idled a second
 * (a real peer answers within a round trip). */
static int evict_idle(void *arg) {
  struct dt_tp_ctx *x = arg;
  struct pend *o = oldest_stranger(x, NULL);
  double idle = o ? dt_now() - o->since : 0;
  if (!o || idle < 1.0) return 0;
  char why[96];
  snprintf(why, sizeof why, "out of file descriptors; in its handshake for %.1f s", idle);
  pend_reject(x, o, why);
  return 1;
}

static void accept_all(struct dt_tp_ctx *x) {
  for (int k = 0; k < 64; k++) {
    char who[64];
    int fd = dt__accept_guarded(&x->guard, x->lfd, who, sizeof who, evict_idle, x);
    if (fd < 0) {
      if (dt__accept_paused(&x->guard, dt_now()) && !x->listen_off) {
        struct epoll_event ev = {0, {.ptr = &x->kind_listen}};
        epoll_ctl(x->efd, EPOLL_CTL_MOD, x->lfd, &ev); /* level-triggered: stop the wake-ups */
        x->listen_off = true;
      }
      return;
    }
    struct pend *p = calloc(1, sizeof *p);
    if (!p) { close(fd); continue; }
    p->kind = K_PEND;
    p->fd = fd;
    p->st = P_ACC_WAIT_HELLO;
    p->peer = -1;
    p->since = dt_now();
    p->deadline = p->since + x->auth_timeout;
    snprintf(p->who, sizeof p->who, "%s", who);
    dt__auth_random(p->nonce_me, sizeof p->nonce_me);
    set_sock_opts(fd, x->bufsize);
    struct epoll_event ev = {EPOLLIN | EPOLLRDHUP, {.ptr = p}};
    epoll_ctl(x->efd, EPOLL_CTL_ADD, fd, &ev);
    p->next = x->pend;
    x->pend = p;
    int strangers;
    struct pend *o = oldest_stranger(x, &strangers);
    /* Over the cap (never below the world size: every peer may be in its
     * handshake at once), the oldest goes once it has had a second. */
    if (strangers > (x->pending_max > x->size ? x->pending_max : x->size) && dt_now() - o->since >= 1.0) {
      char why[96];
      snprintf(why, sizeof why, "more than %d connections in their handshake (DTRAIN_AUTH_PENDING_MAX); oldest first",
               x->pending_max);
      pend_reject(x, o, why);
    }
  }
}

/* After a pause (no descriptor even for the spare), listen again. */
static void relisten(struct dt_tp_ctx *x) {
  if (!x->listen_off || dt__accept_paused(&x->guard, dt_now())) return;
  struct epoll_event ev = {EPOLLIN, {.ptr = &x->kind_listen}};
  epoll_ctl(x->efd, EPOLL_CTL_MOD, x->lfd, &ev);
  x->listen_off = false;
}

/* ---- the progress engine ----------------------------------------------- */

/* One round: wait up to timeout_ms for events and handle them. Called with
 * x->mu held; drops it while blocked in epoll_wait. */
static void progress(struct dt_tp_ctx *x, int timeout_ms) {
  struct epoll_event evs[64];
  relisten(x);
  if (timeout_ms) pthread_mutex_unlock(&x->mu);
  int n = epoll_wait(x->efd, evs, 64, timeout_ms);
  if (timeout_ms) pthread_mutex_lock(&x->mu);
  for (int i = 0; i < n; i++) {
    int kind = *(int *)evs[i].data.ptr;
    uint32_t ev = evs[i].events;
    if (kind == K_LISTEN) {
      accept_all(x);
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
      if (still) pend_event(x, p);
    }
  }
  /* handshakes that take too long from strangers */
  double now = dt_now();
  for (struct pend *p = x->pend, *nx; p; p = nx) {
    nx = p->next;
    if (p->st >= P_ACC_WAIT_HELLO && now > p->deadline) {
      char why[96];
      snprintf(why, sizeof why, "handshake not finished within %.1f s (DTRAIN_AUTH_TIMEOUT_MS)", x->auth_timeout);
      pend_reject(x, p, why);
    }
  }
}

/* ---- ops --------------------------------------------------------------- */

static void ctx_free(struct dt_tp_ctx *x) {
  dt__accept_guard_close(&x->guard);
  if (x->lfd >= 0) close(x->lfd);
  if (x->efd >= 0) close(x->efd);
  if (x->wfd >= 0) close(x->wfd);
  while (x->pend) pend_remove(x, x->pend, true);
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
  x->guard.spare = -1;
  x->rank = in->rank;
  x->size = in->size;
  x->job_hash = hash_str(in->job ? in->job : "");
  x->bufsize = (int)dt_param(DT_PARAM_TCP_BUFFER);
  x->spin_ns = dt_param(DT_PARAM_TCP_SPIN_US) * 1000;
  x->ep = calloc((size_t)in->size, sizeof *x->ep);
  x->token = malloc(in->token_len + 1);
  x->discard_buf = malloc(65536);
  if (!x->ep || !x->token || !x->discard_buf) {
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
  snprintf(x->guard_name, sizeof x->guard_name, "tcp: rank %d", x->rank);
  dt__accept_guard_init(&x->guard, x->guard_name);
  x->auth_timeout = dt__auth_timeout_s();
  x->pending_max = dt__auth_pending_max();
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

static int dial_start(struct dt_tp_ctx *x, const struct dt_tp_peer *peer, struct pend **out, char *err) {
  char host[64];
  const char *colon = strrchr(peer->addr, ':');
  size_t hl = (size_t)(colon - peer->addr);
  if (hl >= sizeof host) { snprintf(err, DT_TP_ERR_MAX, "bad address %s", peer->addr); return DT_EINVAL; }
  memcpy(host, peer->addr, hl);
  host[hl] = '\0';
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    snprintf(err, DT_TP_ERR_MAX, "bad address %s", peer->addr);
    return DT_EINVAL;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) { snprintf(err, DT_TP_ERR_MAX, "socket: %s", strerror(errno)); return DT_EIO; }
  set_sock_opts(fd, x->bufsize);
  struct pend *p = calloc(1, sizeof *p);
  if (!p) { close(fd); return DT_ENOMEM; }
  p->kind = K_PEND;
  p->fd = fd;
  p->peer = peer->rank;
  p->st = P_DIAL_CONNECTING;
  snprintf(p->who, sizeof p->who, "%s", peer->addr);
  dt__auth_random(p->nonce_me, sizeof p->nonce_me);
  p->next = x->pend;
  x->pend = p;
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  struct epoll_event ev = {EPOLLOUT | EPOLLIN | EPOLLRDHUP, {.ptr = p}};
  epoll_ctl(x->efd, EPOLL_CTL_ADD, fd, &ev);
  if (rc < 0 && errno != EINPROGRESS) {
    p->fail_rc = DT_EAGAIN;
    snprintf(p->fail, sizeof p->fail, "connect: %s", strerror(errno));
  } else if (rc == 0) {
    pend_event(x, p);
  }
  *out = p;
  return DT_OK;
}

static bool pend_alive(struct dt_tp_ctx *x, struct pend *p) {
  for (struct pend *q = x->pend; q; q = q->next)
    if (q == p) return true;
  return false;
}

static int tcp_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *peer, int64_t deadline,
                       struct dt_tp_ep **out, char *err) {
  pthread_mutex_lock(&x->mu);
  struct pend *p = NULL;
  int rc = DT_OK;
  double retry_at = 0;
  int sheds = 0; /* dials closed before the greeting, retried with backoff */
  for (;;) {
    if (x->ep[peer->rank]) {
      if (!x->ep[peer->rank]->dead) break;
      /* connected, then gone: a rank connects once per communicator, so
       * waiting longer cannot help */
      rc = DT_EPEERLOST;
      snprintf(err, DT_TP_ERR_MAX, "rank %d connected, then closed the connection during setup",
               peer->rank);
      break;
    }
    if (atomic_load(&x->abort_rc)) {
      rc = atomic_load(&x->abort_rc);
      snprintf(err, DT_TP_ERR_MAX, "%s", x->abort_msg);
      break;
    }
    if (peer->rank < x->rank) { /* we dial */
      if (p && pend_alive(x, p) && p->fail_rc) {
        if (p->fail_rc != DT_EAGAIN) {
          rc = p->fail_rc;
          snprintf(err, DT_TP_ERR_MAX, "%s", p->fail);
          pend_remove(x, p, true);
          break;
        }
        snprintf(err, DT_TP_ERR_MAX, "%s (%s)", p->fail, peer->addr);
        bool shed = p->shed;
        pend_remove(x, p, true);
        p = NULL;
        retry_at = dt_now() + 0.01;
        if (shed) {
          if (++sheds > 12) { /* about 4 s: not a busy peer but a refusal */
            rc = DT_EAUTH;
            break;
          }
          retry_at = dt_now() + (sheds < 6 ? 0.01 * (1 << sheds) : 0.5);
        }
      }
      if (p && !pend_alive(x, p)) p = NULL; /* it became an endpoint (checked above) or died */
      if (!p && dt_now() >= retry_at) {
        rc = dial_start(x, peer, &p, err);
        if (rc < 0) break;
        continue;
      }
    }
    int64_t left = deadline - dt_now_ns();
    if (left <= 0) {
      rc = DT_ETIMEDOUT;
      if (!err[0]) snprintf(err, DT_TP_ERR_MAX, "rank %d did not connect before the deadline", peer->rank);
      else {
        char tmp[DT_TP_ERR_MAX];
        snprintf(tmp, sizeof tmp, "deadline expired connecting to rank %d: %s", peer->rank, err);
        memcpy(err, tmp, DT_TP_ERR_MAX);
      }
      break;
    }
    int ms = (int)(left / 1000000) + 1;
    progress(x, ms > 10 ? 10 : ms);
  }
  if (rc < 0 && p && pend_alive(x, p)) pend_remove(x, p, true);
  if (rc == DT_OK) *out = x->ep[peer->rank];
  pthread_mutex_unlock(&x->mu);
  return rc;
}

static int tcp_isend(struct dt_tp_ep *e, struct dt_tp_req *r) {
  struct dt_tp_ctx *x = e->x;
  pthread_mutex_lock(&x->mu);
  int arc = atomic_load(&x->abort_rc);
  if (e->dead || arc) {
    r->status = arc ? arc : e->bye ? DT_ECLOSED : DT_EPEERLOST;
    pthread_mutex_unlock(&x->mu);
    return r->status;
  }
  r->ep = e;
  r->done = 0;
  r->next = NULL;
  struct dt_frame_hdr h = {DT_FRAME_MAGIC, DT_FRAME_VERSION, DT_FRAME_DATA, 0, r->tag, r->len};
  dt__frame_encode(&h, (uint8_t *)r->priv);
  if (e->sq_tail) e->sq_tail->next = r;
  else e->sq = r;
  e->sq_tail = r;
  if (e->sq == r) send_progress(e); /* eager attempt: small messages leave now */
  pthread_mutex_unlock(&x->mu);
  return DT_OK;
}

static int tcp_irecv(struct dt_tp_ep *e, struct dt_tp_req *r) {
  struct dt_tp_ctx *x = e->x;
  pthread_mutex_lock(&x->mu);
  int arc = atomic_load(&x->abort_rc);
  r->ep = e;
  r->done = 0;
  r->next = NULL;
  /* an early frame with this tag? (FIFO: the first one) */
  struct umsg *u = (struct umsg *)dt__match_ux_take(&e->mt, e->peer, r->tag);
  if (u) {
    size_t ulen = u->m.len;
    if (ulen != r->len) {
      r->status = DT_EPROTO;
      snprintf(x->err_last, sizeof x->err_last, "rank %d sent %zu bytes for tag 0x%llx, %zu expected",
               e->peer, ulen, (unsigned long long)r->tag, r->len);
      if (!u->complete) { e->discard = true; e->target = x->discard_buf; e->cur_u = NULL; }
    } else if (u->complete) {
      if (ulen) memcpy(r->buf, u->data, ulen);
      r->done = r->len;
      r->status = 1;
    } else { /* still arriving: continue straight into the user's buffer */
      memcpy(r->buf, u->data, u->got);
      e->cur_u = NULL;
      e->cur_req = r;
      e->target = r->buf;
    }
    umsg_free(&u->m);
    pthread_mutex_unlock(&x->mu);
    return DT_OK;
  }
  if (e->dead || arc) {
    r->status = arc ? arc : e->bye ? DT_ECLOSED : DT_EPEERLOST;
    pthread_mutex_unlock(&x->mu);
    return r->status;
  }
  if (e->deferred) {
    if (r->tag == e->cur.tag) { /* the waiting frame is ours: read it in place */
      e->deferred = false;
      if (r->len != e->cur.len) {
        r->status = DT_EPROTO;
        snprintf(x->err_last, sizeof x->err_last, "rank %d sent %llu bytes for tag 0x%llx, %zu expected",
                 e->peer, (unsigned long long)e->cur.len, (unsigned long long)r->tag, r->len);
        e->discard = true;
        e->target = x->discard_buf;
      } else {
        e->cur_req = r;
        e->target = r->buf;
      }
      ep_watch(x, e, e->want_out);
      recv_progress(e);
      pthread_mutex_unlock(&x->mu);
      return DT_OK;
    }
    if (undefer(e) < 0) {
      r->status = DT_EPEERLOST;
      pthread_mutex_unlock(&x->mu);
      return r->status;
    }
  }
  dt__match_post(&e->mt, r);
  pthread_mutex_unlock(&x->mu);
  return DT_OK;
}

static int tcp_test(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  if (r->status == 0) {
    if (r->kind == DT_TP_SEND && r->ep) send_progress(r->ep);
    progress(x, 0);
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
        progress(x, 0);
        pthread_mutex_unlock(&x->mu);
        sched_yield();
        pthread_mutex_lock(&x->mu);
        continue;
      }
    }
    int ms = (int)(left / 1000000) + 1;
    progress(x, ms > 1000 ? 1000 : ms);
    spin_start = 0;
  }
out:
  pthread_mutex_unlock(&x->mu);
  return rc;
}

static void tcp_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  struct dt_tp_ep *e = r->ep;
  if (e && r->status == 0 && r->kind == DT_TP_RECV) {
    dt__match_cancel(&e->mt, r);
  } else if (e && r->status == 0) {
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
  if (e && r->status == 0) {
    if (e->cur_req == r) { /* being received into: drop the rest */
      e->cur_req = NULL;
      e->discard = true;
      e->target = x->discard_buf;
    }
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
    if (!e || e->dead) continue;
    if (!send_ctrl(e, DT_FRAME_ABORT, m, 4 + (size_t)ml)) shutdown(e->fd, SHUT_WR);
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
  if (!e->dead) {
    /* flush what is queued (bounded), then say goodbye */
    double until = dt_now() + 1.0;
    while (e->sq && !e->dead && dt_now() < until) {
      send_progress(e);
      if (e->sq) progress(x, 1);
    }
    if (!e->dead) send_ctrl(e, DT_FRAME_BYE, NULL, 0);
    epoll_ctl(x->efd, EPOLL_CTL_DEL, e->fd, NULL);
  }
  fail_ep_reqs(e, DT_ECLOSED);
  dt__match_drain(&e->mt, umsg_free);
  free(e->ctrl);
  close(e->fd);
  if (x->ep[e->peer] == e) x->ep[e->peer] = NULL;
  free(e);
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
    "tcp", tcp_init, tcp_can_connect, tcp_connect, tcp_isend, tcp_irecv, tcp_test,
    tcp_wait, tcp_cancel, tcp_abort, tcp_close, tcp_finalize, tcp_abort_reason, NULL};

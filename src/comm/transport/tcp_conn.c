/*
 * tcp_conn.c — how the TCP transport's connections come to be: the
 * listening socket (served for the communicator's whole life, strangers
 * turned away with a logged reason, the pending-handshake cap and timeout,
 * EMFILE handling through accept_guard.c), dialing, the HMAC handshake on
 * both sides (protocol in tcp.c's header), socket options, and the
 * endpoint that a finished handshake becomes. Also the context's creation
 * and teardown.
 *
 * It does not move data: frames, matching, the epoll progress engine and
 * the transport's ops table are in tcp.c; the structures both share are in
 * tcp_int.h. Knobs read here: DTRAIN_TCP_BUFFER, DTRAIN_TCP_KEEPIDLE,
 * DTRAIN_TCP_USER_TIMEOUT_MS, DTRAIN_TCP_SPIN_US, DTRAIN_AUTH_TIMEOUT_MS,
 * DTRAIN_AUTH_PENDING_MAX.
 */
#define _GNU_SOURCE
#include "comm/transport/tcp_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------- */

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

/* A lane passed the handshake: keep it (outside epoll, so nothing is read
 * from it before its endpoint exists) until the peer's last lane arrives,
 * then make the endpoint (lane 0 is its head) and watch every lane. */
static int lane_ready(struct dt_tp_ctx *x, int fd, int peer, int lane, int nlanes) {
  if (!x->build[peer]) {
    x->build[peer] = calloc((size_t)nlanes, sizeof **x->build);
    if (!x->build[peer]) return DT_ENOMEM;
    x->build_n[peer] = nlanes;
  }
  struct dt_tp_ep *e = calloc(1, sizeof *e);
  if (!e) return DT_ENOMEM;
  e->kind = K_EP;
  e->x = x;
  e->fd = fd;
  e->peer = peer;
  e->lane = lane;
  e->nlanes = nlanes;
  dt__match_init(&e->mt, 0);
  struct dt_tp_ep **b = x->build[peer];
  b[lane] = e;
  for (int i = 0; i < nlanes; i++)
    if (!b[i]) return DT_OK;
  struct dt_tp_ep *h = b[0];
  h->lanes = b;
  x->build[peer] = NULL;
  x->build_n[peer] = 0;
  for (int i = 0; i < nlanes; i++) {
    b[i]->head = h;
    struct epoll_event ev = {EPOLLIN | EPOLLRDHUP, {.ptr = b[i]}};
    if (epoll_ctl(x->efd, EPOLL_CTL_ADD, b[i]->fd, &ev)) {
      for (int j = 0; j < nlanes; j++) {
        if (j < i) epoll_ctl(x->efd, EPOLL_CTL_DEL, b[j]->fd, NULL);
        close(b[j]->fd);
        free(b[j]);
      }
      free(b);
      return DT_EIO;
    }
  }
  x->ep[peer] = h;
  return DT_OK;
}

/* Tests only (DTRAIN_TEST_TCP_SHED): the listener closes this many of the
 * first connections it accepts before they finish the handshake, half of
 * them before its greeting and half after it, as an acceptor shedding
 * strangers (out of descriptors, over DTRAIN_AUTH_PENDING_MAX, or past
 * DTRAIN_AUTH_TIMEOUT_MS on a loaded host) does to a real peer's lane. */
static bool test_shed(struct dt_tp_ctx *x, struct pend *p, bool greeted) {
  if (x->shed_left <= 0 || (x->shed_left % 2 == 0) != greeted) return false;
  x->shed_left--;
  pend_reject(x, p, greeted ? "test: shed after the greeting (DTRAIN_TEST_TCP_SHED)"
                            : "test: shed before the greeting (DTRAIN_TEST_TCP_SHED)");
  return true;
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

#define HELLO_D_LEN (8 + 4 + 4 + 2 + 2 + DT_AUTH_NONCE_LEN)
#define HELLO_A_LEN (DT_AUTH_NONCE_LEN + DT_AUTH_MAC_LEN)

void dt__tcp_pend_event(struct dt_tp_ctx *x, struct pend *p) {
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
    uint16_t lane = (uint16_t)p->lane, nl = (uint16_t)p->nlanes;
    memcpy(pl, &x->job_hash, 8);
    memcpy(pl + 8, &from, 4);
    memcpy(pl + 12, &to, 4);
    memcpy(pl + 16, &lane, 2);
    memcpy(pl + 18, &nl, 2);
    memcpy(pl + 20, p->nonce_me, DT_AUTH_NONCE_LEN);
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
    bool none_yet = p->in_got == 0;
    r = pend_read(p, DT_FRAME_AUTH_OK, 0, why);
    if (r == 0) return;
    if (r < 0 && none_yet) {
      /* Closed instead of answering our proof: a wrong token, or the
       * acceptor shedding a connection whose handshake it timed out
       * (DTRAIN_AUTH_TIMEOUT_MS on a loaded host). It never counted this
       * lane, so dial it again; a real refusal fails after a few tries. */
      p->fail_rc = DT_EAGAIN;
      p->shed = true;
      snprintf(p->fail, sizeof p->fail, "rank %d rejected our job token (or shed the connection): %s", p->peer, why);
      return;
    }
    if (r < 0) {
      p->fail_rc = DT_EAUTH;
      snprintf(p->fail, sizeof p->fail, "rank %d rejected our job token: %s", p->peer, why);
      return;
    }
    int fd = p->fd, peer = p->peer, lane = p->lane, nl = p->nlanes;
    pend_remove(x, p, false);
    if (lane_ready(x, fd, peer, lane, nl) < 0) close(fd);
    return;
  }
  case P_ACC_WAIT_HELLO: {
    r = pend_read(p, DT_FRAME_HELLO, HELLO_D_LEN, why);
    if (r == 0) return;
    if (r < 0) { pend_reject(x, p, why); return; }
    uint8_t *pl = p->in + DT_FRAME_HDR_LEN;
    uint64_t jh;
    int32_t from, to;
    uint16_t lane, nl;
    memcpy(&jh, pl, 8);
    memcpy(&from, pl + 8, 4);
    memcpy(&to, pl + 12, 4);
    memcpy(&lane, pl + 16, 2);
    memcpy(&nl, pl + 18, 2);
    if (jh != x->job_hash) { pend_reject(x, p, "different job"); return; }
    if (to != x->rank || from <= x->rank || from >= x->size) {
      snprintf(why, sizeof why, "bad ranks in hello (from %d to %d)", from, to);
      pend_reject(x, p, why);
      return;
    }
    if (nl < 1 || nl > MAX_LANES || lane >= nl) {
      snprintf(why, sizeof why, "bad lane in hello (%u of %u)", lane, nl);
      pend_reject(x, p, why);
      return;
    }
    if (test_shed(x, p, false)) return;
    p->peer = from;
    p->lane = lane;
    p->nlanes = nl;
    memcpy(p->nonce_peer, pl + 20, DT_AUTH_NONCE_LEN);
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
    if (test_shed(x, p, true)) return;
    struct dt_tp_ep **b = x->build[p->peer];
    if (x->ep[p->peer] || (b && b[p->lane])) { /* live or lost: a rank connects once per communicator */
      snprintf(why, sizeof why, "rank %d is already connected (lane %d)", p->peer, p->lane);
      pend_reject(x, p, why);
      return;
    }
    if (b && x->build_n[p->peer] != p->nlanes) {
      snprintf(why, sizeof why, "rank %d changed its lane count (%d, then %d)", p->peer, x->build_n[p->peer],
               p->nlanes);
      pend_reject(x, p, why);
      return;
    }
    if (!write_frame(p->fd, DT_FRAME_AUTH_OK, NULL, 0)) { pend_reject(x, p, "write failed"); return; }
    int fd = p->fd, peer = p->peer, lane = p->lane, nl = p->nlanes;
    pend_remove(x, p, false);
    if (lane_ready(x, fd, peer, lane, nl) < 0) close(fd);
    return;
  }
  }
}

/* The oldest accepted connection still in its handshake (NULL if none). */
static struct pend *oldest_stranger(struct dt_tp_ctx *x) {
  struct pend *o = NULL;
  for (struct pend *p = x->pend; p; p = p->next) {
    if (p->st < P_ACC_WAIT_HELLO) continue;
    if (!o || p->since < o->since) o = p;
  }
  return o;
}

/* Out of descriptors: close the oldest stranger once it has idled a second
 * (a real peer answers within a round trip). */
static int evict_idle(void *arg) {
  struct dt_tp_ctx *x = arg;
  struct pend *o = oldest_stranger(x);
  double idle = o ? dt_now() - o->since : 0;
  if (!o || idle < 1.0) return 0;
  char why[96];
  snprintf(why, sizeof why, "out of file descriptors; in its handshake for %.1f s", idle);
  pend_reject(x, o, why);
  return 1;
}

void dt__tcp_accept_all(struct dt_tp_ctx *x) {
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
  }
}

/* After a pause (no descriptor even for the spare), listen again. */
void dt__tcp_relisten(struct dt_tp_ctx *x) {
  if (!x->listen_off || dt__accept_paused(&x->guard, dt_now())) return;
  struct epoll_event ev = {EPOLLIN, {.ptr = &x->kind_listen}};
  epoll_ctl(x->efd, EPOLL_CTL_MOD, x->lfd, &ev);
  x->listen_off = false;
}

/* Closes strangers whose handshake took longer than DTRAIN_AUTH_TIMEOUT_MS. */
void dt__tcp_pend_expire(struct dt_tp_ctx *x) {
  double now = dt_now();
  for (struct pend *p = x->pend, *nx; p; p = nx) {
    nx = p->next;
    if (p->st >= P_ACC_WAIT_HELLO && now > p->deadline) {
      char why[96];
      snprintf(why, sizeof why, "handshake not finished within %.1f s (DTRAIN_AUTH_TIMEOUT_MS)", x->auth_timeout);
      pend_reject(x, p, why);
    }
  }
  /* The cap (never below the world size x lanes: every lane of every peer
   * may be in its handshake at once) as a standing bound, checked on every
   * pass like the deadlines, not only when a connection arrives: beyond
   * it, the oldest that have had a second go. Accepted connections are
   * put at the list's head, so it runs newest first and the strangers
   * past the first `cap` of it are the oldest ones. */
  const int floor = x->size * x->nconn;
  const int cap = x->pending_max > floor ? x->pending_max : floor;
  int i = 0;
  for (struct pend *p = x->pend, *nx; p; p = nx) {
    nx = p->next;
    if (p->st < P_ACC_WAIT_HELLO || i++ < cap || now - p->since < 1.0) continue;
    char why[96];
    snprintf(why, sizeof why, "more than %d connections in their handshake (DTRAIN_AUTH_PENDING_MAX); oldest first",
             x->pending_max);
    pend_reject(x, p, why);
  }
}

/* ---- ops --------------------------------------------------------------- */

void dt__tcp_ctx_free(struct dt_tp_ctx *x) {
  dt__accept_guard_close(&x->guard);
  if (x->lfd >= 0) close(x->lfd);
  if (x->efd >= 0) close(x->efd);
  if (x->wfd >= 0) close(x->wfd);
  while (x->pend) pend_remove(x, x->pend, true);
  for (int p = 0; x->build && p < x->size; p++) { /* lanes of endpoints never completed */
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

int dt__tcp_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr) {
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
  int64_t nconn = in->nconn > 0 ? in->nconn : dt_param(DT_PARAM_TCP_NCONN);
  x->nconn = nconn < 1 ? 1 : nconn > MAX_LANES ? MAX_LANES : (int)nconn;
  int64_t smin = dt_param(DT_PARAM_TCP_STRIPE_MIN);
  x->stripe_min = smin < 2 * PART_MIN ? 2 * PART_MIN : (size_t)smin;
  x->shed_left = (int)dt_param(DT_PARAM_TEST_TCP_SHED);
  x->ep = calloc((size_t)in->size, sizeof *x->ep);
  x->build = calloc((size_t)in->size, sizeof *x->build);
  x->build_n = calloc((size_t)in->size, sizeof *x->build_n);
  x->token = malloc(in->token_len + 1);
  x->discard_buf = malloc(65536);
  if (!x->ep || !x->build || !x->build_n || !x->token || !x->discard_buf) {
    dt__tcp_ctx_free(x);
    return dt__seterr(DT_ENOMEM, "tcp: out of memory");
  }
  if (in->token_len) memcpy(x->token, in->token, in->token_len);
  x->token_len = in->token_len;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  const char *bind_addr = in->bind_addr ? in->bind_addr : "127.0.0.1";
  if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
    dt__tcp_ctx_free(x);
    return dt__seterr(DT_EINVAL, "tcp: bind address '%s' is not an IPv4 address", bind_addr);
  }
  snprintf(x->guard_name, sizeof x->guard_name, "tcp: rank %d", x->rank);
  dt__accept_guard_init(&x->guard, x->guard_name);
  x->auth_timeout = dt__auth_timeout_s();
  x->pending_max = dt__auth_pending_max();
  x->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (x->lfd < 0 || bind(x->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(x->lfd, 256)) {
    int e = errno;
    dt__tcp_ctx_free(x);
    return dt__seterr(DT_EIO, "tcp: cannot listen on %s: %s", bind_addr, strerror(e));
  }
  socklen_t sl = sizeof sa;
  getsockname(x->lfd, (struct sockaddr *)&sa, &sl);
  x->efd = epoll_create1(EPOLL_CLOEXEC);
  x->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event e1 = {EPOLLIN, {.ptr = &x->kind_listen}}, e2 = {EPOLLIN, {.ptr = &x->kind_wake}};
  if (x->efd < 0 || x->wfd < 0 || epoll_ctl(x->efd, EPOLL_CTL_ADD, x->lfd, &e1) ||
      epoll_ctl(x->efd, EPOLL_CTL_ADD, x->wfd, &e2)) {
    dt__tcp_ctx_free(x);
    return dt__seterr(DT_EIO, "tcp: epoll setup failed");
  }
  char ip[32];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  snprintf(addr, DT_TP_ADDR_MAX, "%s:%d", ip, ntohs(sa.sin_port));
  *out = x;
  return DT_OK;
}

bool dt__tcp_can_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *p) {
  return p->addr && strchr(p->addr, ':') != NULL;
}

static int dial_start(struct dt_tp_ctx *x, const struct dt_tp_peer *peer, int lane, struct pend **out,
                      char *err) {
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
  p->lane = lane;
  p->nlanes = x->nconn;
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
    dt__tcp_pend_event(x, p);
  }
  *out = p;
  return DT_OK;
}

static bool pend_alive(struct dt_tp_ctx *x, struct pend *p) {
  for (struct pend *q = x->pend; q; q = q->next)
    if (q == p) return true;
  return false;
}

/* Connects to one peer: the higher rank dials every lane, the lower waits
 * for them. A lane the acceptor closed before it was counted (before its
 * greeting, or instead of the AUTH_OK; see test_shed) is dialed again with
 * backoff, on its own: the other lanes keep their handshakes. Only a lane
 * that was refused repeatedly (about 4 s), a proof that failed, or the
 * deadline ends the attempt, and the error names the peer and the lane. */
int dt__tcp_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *peer, int64_t deadline,
                    struct dt_tp_ep **out, char *err) {
  pthread_mutex_lock(&x->mu);
  struct pend *p[MAX_LANES] = {0};
  double retry_at[MAX_LANES] = {0};
  int sheds[MAX_LANES] = {0};
  int rc = DT_OK;
  for (;;) {
    struct dt_tp_ep *h = x->ep[peer->rank];
    if (h) {
      if (!h->dead) break;
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
    if (peer->rank < x->rank) { /* we dial, once per lane */
      for (int i = 0; i < x->nconn && rc == DT_OK; i++) {
        struct dt_tp_ep **b = x->build[peer->rank];
        if (b && b[i]) continue; /* this lane is up */
        if (p[i] && !pend_alive(x, p[i])) p[i] = NULL; /* it became a lane */
        if (p[i] && p[i]->fail_rc) {
          if (p[i]->fail_rc != DT_EAGAIN) {
            rc = p[i]->fail_rc;
            snprintf(err, DT_TP_ERR_MAX, "%s (lane %d of %d)", p[i]->fail, i, x->nconn);
            break;
          }
          snprintf(err, DT_TP_ERR_MAX, "%s (%s, lane %d of %d)", p[i]->fail, peer->addr, i, x->nconn);
          bool shed = p[i]->shed;
          pend_remove(x, p[i], true);
          p[i] = NULL;
          retry_at[i] = dt_now() + 0.01;
          if (shed) {
            if (++sheds[i] > 12) { /* about 4 s: not a busy peer but a refusal */
              rc = DT_EAUTH;
              break;
            }
            retry_at[i] = dt_now() + (sheds[i] < 6 ? 0.01 * (1 << sheds[i]) : 0.5);
          }
        }
        if (!p[i] && dt_now() >= retry_at[i]) rc = dial_start(x, peer, i, &p[i], err);
      }
      if (rc < 0) break;
      if (x->ep[peer->rank]) continue; /* the last lane came up while dialing */
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
    dt__tcp_progress(x, ms > 10 ? 10 : ms);
  }
  for (int i = 0; i < MAX_LANES; i++)
    if (rc < 0 && p[i] && pend_alive(x, p[i])) pend_remove(x, p[i], true);
  if (rc == DT_OK) *out = x->ep[peer->rank];
  pthread_mutex_unlock(&x->mu);
  return rc;
}

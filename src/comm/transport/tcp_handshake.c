/*
 * tcp_handshake.c — how the tcp transport's lanes come to exist: dialing
 * (the higher rank dials, once per lane), accepting, the authenticated
 * handshake on every lane (frames and HMAC in tcp.c's header comment), the
 * socket options of every connection, and assembling a peer's endpoint once
 * its last lane is up. Strangers are turned away here with a logged reason.
 * Not here: moving data (tcp.c), the HMAC itself (auth.c).
 */
#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/transport/tcp_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

void dt__tcp_set_sock_opts(int fd, int bufsize) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* A host that vanishes without a FIN (power loss, partition) must still
   * become DT_EPEERLOST within seconds: keepalive probes after 2 s idle,
   * every second, 3 misses. TCP_USER_TIMEOUT (unacknowledged data) is off
   * by default: newer kernels also apply it to zero-window probing, which
   * would kill a healthy connection whose receiver computes for a while
   * without reading (large early frames deliberately wait in the socket). */
  int idle = (int)dt_param_int("DTRAIN_TCP_KEEPIDLE", 2), intvl = 1, cnt = 3;
  unsigned int uto = (unsigned int)dt_param_int("DTRAIN_TCP_USER_TIMEOUT_MS", 0);
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

void dt__tcp_pend_remove(struct dt_tp_ctx *x, struct pend *p, bool close_fd) {
  for (struct pend **pp = &x->pend; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  epoll_ctl(x->efd, EPOLL_CTL_DEL, p->fd, NULL);
  if (close_fd) close(p->fd);
  free(p);
}

void dt__tcp_pend_reject(struct dt_tp_ctx *x, struct pend *p, const char *why) {
  DT_LOG_WARN("tcp: rank %d: rejected connection from %s: %s", x->rank, p->who, why);
  dt__tcp_pend_remove(x, p, true);
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
 * then make the endpoint. */
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
    r = pend_read(p, DT_FRAME_HELLO, HELLO_A_LEN, why);
    if (r == 0) return;
    if (r < 0) {
      p->fail_rc = DT_EAUTH;
      snprintf(p->fail, sizeof p->fail, "rank %d refused the handshake (wrong job token or job?): %s", p->peer, why);
      return;
    }
    uint8_t *pl = p->in + DT_FRAME_HDR_LEN, mac[DT_AUTH_MAC_LEN];
    memcpy(p->nonce_peer, pl, DT_AUTH_NONCE_LEN);
    dt__auth_mac(x->token, x->token_len, "dt-tcp-acc", p->nonce_me, p->nonce_peer, mac);
    if (!dt__auth_equal(mac, pl + DT_AUTH_NONCE_LEN, DT_AUTH_MAC_LEN)) {
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
    int fd = p->fd, peer = p->peer, lane = p->lane, nl = p->nlanes;
    dt__tcp_pend_remove(x, p, false);
    if (lane_ready(x, fd, peer, lane, nl) < 0) close(fd);
    return;
  }
  case P_ACC_WAIT_HELLO: {
    r = pend_read(p, DT_FRAME_HELLO, HELLO_D_LEN, why);
    if (r == 0) return;
    if (r < 0) { dt__tcp_pend_reject(x, p, why); return; }
    uint8_t *pl = p->in + DT_FRAME_HDR_LEN;
    uint64_t jh;
    int32_t from, to;
    uint16_t lane, nl;
    memcpy(&jh, pl, 8);
    memcpy(&from, pl + 8, 4);
    memcpy(&to, pl + 12, 4);
    memcpy(&lane, pl + 16, 2);
    memcpy(&nl, pl + 18, 2);
    if (jh != x->job_hash) { dt__tcp_pend_reject(x, p, "different job"); return; }
    if (to != x->rank || from <= x->rank || from >= x->size) {
      snprintf(why, sizeof why, "bad ranks in hello (from %d to %d)", from, to);
      dt__tcp_pend_reject(x, p, why);
      return;
    }
    if (nl < 1 || nl > MAX_LANES || lane >= nl) {
      snprintf(why, sizeof why, "bad lane in hello (%u of %u)", lane, nl);
      dt__tcp_pend_reject(x, p, why);
      return;
    }
    p->peer = from;
    p->lane = lane;
    p->nlanes = nl;
    memcpy(p->nonce_peer, pl + 20, DT_AUTH_NONCE_LEN);
    uint8_t out[HELLO_A_LEN];
    memcpy(out, p->nonce_me, DT_AUTH_NONCE_LEN);
    dt__auth_mac(x->token, x->token_len, "dt-tcp-acc", p->nonce_peer, p->nonce_me, out + DT_AUTH_NONCE_LEN);
    if (!write_frame(p->fd, DT_FRAME_HELLO, out, sizeof out)) { dt__tcp_pend_reject(x, p, "write failed"); return; }
    p->st = P_ACC_WAIT_AUTH;
    return;
  }
  case P_ACC_WAIT_AUTH: {
    r = pend_read(p, DT_FRAME_AUTH, DT_AUTH_MAC_LEN, why);
    if (r == 0) return;
    if (r < 0) { dt__tcp_pend_reject(x, p, why); return; }
    uint8_t mac[DT_AUTH_MAC_LEN];
    dt__auth_mac(x->token, x->token_len, "dt-tcp-dial", p->nonce_me, p->nonce_peer, mac);
    if (!dt__auth_equal(mac, p->in + DT_FRAME_HDR_LEN, DT_AUTH_MAC_LEN)) {
      snprintf(why, sizeof why, "wrong job token (HMAC mismatch) claiming rank %d", p->peer);
      dt__tcp_pend_reject(x, p, why);
      return;
    }
    struct dt_tp_ep **b = x->build[p->peer];
    if (x->ep[p->peer] || (b && b[p->lane])) { /* live or lost: a rank connects once per communicator */
      snprintf(why, sizeof why, "rank %d is already connected (lane %d)", p->peer, p->lane);
      dt__tcp_pend_reject(x, p, why);
      return;
    }
    if (b && x->build_n[p->peer] != p->nlanes) {
      snprintf(why, sizeof why, "rank %d changed its lane count (%d, then %d)", p->peer,
               x->build_n[p->peer], p->nlanes);
      dt__tcp_pend_reject(x, p, why);
      return;
    }
    if (!write_frame(p->fd, DT_FRAME_AUTH_OK, NULL, 0)) { dt__tcp_pend_reject(x, p, "write failed"); return; }
    int fd = p->fd, peer = p->peer, lane = p->lane, nl = p->nlanes;
    dt__tcp_pend_remove(x, p, false);
    if (lane_ready(x, fd, peer, lane, nl) < 0) close(fd);
    return;
  }
  }
}

void dt__tcp_accept_all(struct dt_tp_ctx *x) {
  for (;;) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(x->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    struct pend *p = calloc(1, sizeof *p);
    if (!p) { close(fd); continue; }
    p->kind = K_PEND;
    p->fd = fd;
    p->st = P_ACC_WAIT_HELLO;
    p->peer = -1;
    p->deadline = dt_now() + 10.0;
    char ip[32] = "?";
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(p->who, sizeof p->who, "%s:%d", ip, ntohs(sa.sin_port));
    dt__auth_random(p->nonce_me, sizeof p->nonce_me);
    dt__tcp_set_sock_opts(fd, x->bufsize);
    struct epoll_event ev = {EPOLLIN | EPOLLRDHUP, {.ptr = p}};
    epoll_ctl(x->efd, EPOLL_CTL_ADD, fd, &ev);
    p->next = x->pend;
    x->pend = p;
  }
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
  dt__tcp_set_sock_opts(fd, x->bufsize);
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

int dt__tcp_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *peer, int64_t deadline,
                    struct dt_tp_ep **out, char *err) {
  pthread_mutex_lock(&x->mu);
  struct pend *p[MAX_LANES] = {0};
  double retry_at[MAX_LANES] = {0};
  int rc = DT_OK;
  for (;;) {
    if (x->ep[peer->rank] && !x->ep[peer->rank]->dead) break;
    if (atomic_load(&x->abort_rc)) {
      rc = atomic_load(&x->abort_rc);
      snprintf(err, DT_TP_ERR_MAX, "%s", x->abort_msg);
      break;
    }
    if (peer->rank < x->rank) { /* we dial, once per lane */
      for (int i = 0; i < x->nconn && rc == DT_OK; i++) {
        struct dt_tp_ep **b = x->build[peer->rank];
        if (b && b[i]) continue; /* this lane is up */
        if (p[i] && pend_alive(x, p[i]) && p[i]->fail_rc) {
          if (p[i]->fail_rc != DT_EAGAIN) {
            rc = p[i]->fail_rc;
            snprintf(err, DT_TP_ERR_MAX, "%s", p[i]->fail);
            break;
          }
          snprintf(err, DT_TP_ERR_MAX, "%s (%s)", p[i]->fail, peer->addr);
          dt__tcp_pend_remove(x, p[i], true);
          p[i] = NULL;
          retry_at[i] = dt_now() + 0.01;
        }
        if (p[i] && !pend_alive(x, p[i])) p[i] = NULL; /* it became a lane or died */
        if (!p[i] && !(x->ep[peer->rank] && !x->ep[peer->rank]->dead) && dt_now() >= retry_at[i])
          rc = dial_start(x, peer, i, &p[i], err);
      }
      if (rc < 0) break;
      if (x->ep[peer->rank] && !x->ep[peer->rank]->dead) break;
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
    if (rc < 0 && p[i] && pend_alive(x, p[i])) dt__tcp_pend_remove(x, p[i], true);
  if (rc == DT_OK) *out = x->ep[peer->rank];
  pthread_mutex_unlock(&x->mu);
  return rc;
}

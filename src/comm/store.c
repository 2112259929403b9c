/*
 * store.c — the store handle (a mutex around a backend table) and the TCP
 * store client: connects with retries until a deadline, authenticates with
 * the job token, then sends one request at a time and waits for its reply.
 * Waiting operations carry their timeout to the server, which answers
 * DT_ETIMEDOUT itself, so a reply is never left in flight; if the server
 * does not answer within the timeout plus a grace period the connection is
 * dropped and re-established on the next call.
 *
 * The wire codec is in wire.c, the server in store_server.c, the
 * file-backed store in store_file.c.
 */
#define _GNU_SOURCE
#include "comm/store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct dt_store {
  pthread_mutex_t mu;
  const struct dt_store_backend *be;
  void *self;
};

int dt__store_with(dt_store *s, const struct dt_store_backend *be, int (*fn)(void *self, void *arg),
                   void *arg) {
  if (!s || s->be != be) return DT_ENOTSUP;
  pthread_mutex_lock(&s->mu);
  int rc = fn(s->self, arg);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

bool dt__kv_cas_match(const void *cur, size_t curlen, bool exists, const void *exp, size_t elen) {
  if (!exp) return !exists;
  return exists && curlen == elen && (elen == 0 || memcmp(cur, exp, elen) == 0);
}

/* ---- handle ------------------------------------------------------------ */

int dt__store_wrap(dt_store **out, const struct dt_store_backend *be, void *self) {
  dt_store *s = calloc(1, sizeof *s);
  if (!s) {
    be->destroy(self);
    return dt__seterr(DT_ENOMEM, "store: out of memory");
  }
  pthread_mutex_init(&s->mu, NULL);
  s->be = be;
  s->self = self;
  *out = s;
  return DT_OK;
}

void dt_store_destroy(dt_store *s) {
  if (!s) return;
  s->be->destroy(s->self);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static int check_key(const char *key) {
  size_t n = key ? strlen(key) : 0;
  if (n == 0 || n > DT_STORE_KEY_MAX)
    return dt__seterr(DT_EINVAL, "store: key length %zu out of range 1..%d", n, DT_STORE_KEY_MAX);
  return DT_OK;
}

static double tmo(double t) { return t > 0 ? t : 60.0; }

#define LOCKED(call)                                                           \
  do {                                                                         \
    pthread_mutex_lock(&s->mu);                                                \
    int rc_ = (call);                                                          \
    pthread_mutex_unlock(&s->mu);                                              \
    return rc_;                                                                \
  } while (0)

int dt_store_set(dt_store *s, const char *key, const void *val, size_t len, double t) {
  if (!s) return dt__seterr(DT_EINVAL, "store set: store s is NULL");
  DT_CHECK(check_key(key));
  if (len > DT_STORE_VAL_MAX) return dt__seterr(DT_EINVAL, "store: value for %s too long (%zu)", key, len);
  LOCKED(s->be->set(s->self, key, val, len, tmo(t)));
}
int dt_store_get(dt_store *s, const char *key, void *buf, size_t cap, size_t *len, double t) {
  if (!s) return dt__seterr(DT_EINVAL, "store get: store s is NULL");
  DT_CHECK(check_key(key));
  size_t dummy;
  char b;
  LOCKED(s->be->get(s->self, key, buf ? buf : &b, buf ? cap : 0, len ? len : &dummy, tmo(t)));
}
int dt_store_wait(dt_store *s, const char *const *keys, int n, double t) {
  double end = dt_now() + tmo(t);
  for (int i = 0; i < n; i++) {
    DT_CHECK(check_key(keys[i]));
    double left = end - dt_now();
    if (left <= 0) left = 1e-3;
    pthread_mutex_lock(&s->mu);
    size_t len;
    int rc = s->be->get(s->self, keys[i], NULL, 0, &len, left);
    pthread_mutex_unlock(&s->mu);
    if (rc < 0 && rc != DT_ERANGE) return rc;
  }
  return DT_OK;
}
int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result, double t) {
  if (!s) return dt__seterr(DT_EINVAL, "store add: store s is NULL");
  DT_CHECK(check_key(key));
  int64_t dummy;
  LOCKED(s->be->add(s->self, key, delta, result ? result : &dummy, tmo(t)));
}
int dt_store_cas(dt_store *s, const char *key, const void *exp, size_t elen, const void *des,
                 size_t dlen, bool *swapped, void *cur, size_t cap, size_t *curlen, double t) {
  DT_CHECK(check_key(key));
  if (dlen > DT_STORE_VAL_MAX || elen > DT_STORE_VAL_MAX)
    return dt__seterr(DT_EINVAL, "store: cas value for %s too long", key);
  bool sw;
  size_t cl;
  LOCKED(s->be->cas(s->self, key, exp, elen, des, dlen, swapped ? swapped : &sw, cur, cur ? cap : 0,
                    curlen ? curlen : &cl, tmo(t)));
}
int dt_store_delete(dt_store *s, const char *key, bool *existed, double t) {
  DT_CHECK(check_key(key));
  bool e;
  LOCKED(s->be->del(s->self, key, existed ? existed : &e, tmo(t)));
}
void dt_store_interrupt(dt_store *s) {
  if (s && s->be->interrupt) s->be->interrupt(s->self); /* not under s->mu: a call holds it */
}

/* ---- TCP client -------------------------------------------------------- */

struct tcp_client {
  char host[256];
  int port;
  int fd;
  pthread_mutex_t fdmu; /* fd's changes against tc_interrupt (another thread) */
  _Atomic int intr;     /* interrupted: every call fails */
  uint8_t *token;
  size_t token_len;
  uint8_t *rbuf;
  size_t rcap;
};

/* Reads or writes exactly n bytes before deadline (dt_now seconds). */
static int io_full(int fd, void *buf, size_t n, bool wr, double deadline, const char *what) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = wr ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                   : recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0 && !wr) return dt__seterr(DT_EPEERLOST, "store: %s: server closed the connection", what);
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return dt__seterr(DT_EPEERLOST, "store: %s: %s", what, strerror(errno));
    double left = deadline - dt_now();
    if (left <= 0) return dt__seterr(DT_ETIMEDOUT, "store: %s: no answer from server", what);
    struct pollfd p = {fd, wr ? POLLOUT : POLLIN, 0};
    poll(&p, 1, (int)(left * 1000) + 1);
  }
  return DT_OK;
}

static int tcp_dial(const char *host, int port, double deadline, int *fdout) {
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int g = getaddrinfo(host, ps, &hints, &res);
  if (g) return dt__seterr(DT_EINVAL, "store: cannot resolve %s:%d: %s", host, port, gai_strerror(g));
  int rc = DT_ETIMEDOUT, err = 0;
  double wait = 0.005;
  while (1) {
    for (struct addrinfo *a = res; a; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      /* non-blocking, so the deadline holds: a blocking connect to a host
       * behind a cut link waits out every SYN retry (minutes) */
      int c = connect(fd, a->ai_addr, a->ai_addrlen);
      if (c < 0 && errno == EINPROGRESS) {
        double left = deadline - dt_now();
        struct pollfd p = {fd, POLLOUT, 0};
        int pr = poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
        socklen_t el = sizeof err;
        if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) c = 0;
        else if (pr == 0) errno = ETIMEDOUT;
        else errno = err ? err : errno;
      }
      if (c == 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        *fdout = fd;
        freeaddrinfo(res);
        return DT_OK;
      }
      err = errno;
      close(fd);
    }
    if (dt_now() + wait > deadline) break;
    struct timespec ts = {0, (long)(wait * 1e9)};
    nanosleep(&ts, NULL);
    if (wait < 0.1) wait *= 2;
  }
  freeaddrinfo(res);
  return dt__seterr(rc, "store: cannot connect to %s:%d: %s", host, port, strerror(err));
}

/* DT_EAGAIN: the server closed before its challenge (it was out of file
 * descriptors or shedding strangers, store_server.c): dial again. */
static int tcp_handshake(struct tcp_client *c, double deadline) {
  uint8_t ns[DT_AUTH_NONCE_LEN], msg[DT_AUTH_NONCE_LEN + DT_AUTH_MAC_LEN];
  int rc0 = io_full(c->fd, ns, sizeof ns, false, deadline, "auth");
  if (rc0 == DT_EPEERLOST) return DT_EAGAIN;
  DT_CHECK(rc0);
  DT_CHECK(dt__auth_random(msg, DT_AUTH_NONCE_LEN));
  DT_CHECK(dt__auth_mac(c->token, c->token_len, "dt-kv-client", ns, msg, msg + DT_AUTH_NONCE_LEN));
  DT_CHECK(io_full(c->fd, msg, sizeof msg, true, deadline, "auth"));
  uint8_t ans[DT_AUTH_MAC_LEN];
  int rc = io_full(c->fd, ans, sizeof ans, false, deadline, "auth");
  if (rc == DT_EPEERLOST)
    return dt__seterr(DT_EAUTH, "store %s:%d: server rejected our job token", c->host, c->port);
  DT_CHECK(rc);
  if (!dt__auth_verify(c->token, c->token_len, "dt-kv-server", msg, ns, ans))
    return dt__seterr(DT_EAUTH, "store %s:%d: server failed to prove the job token", c->host, c->port);
  return DT_OK;
}

/* Closes the connection (under fdmu: tc_interrupt may be shutting it down). */
static void tcp_drop(struct tcp_client *c) {
  pthread_mutex_lock(&c->fdmu);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  pthread_mutex_unlock(&c->fdmu);
}

static int tcp_ensure(struct tcp_client *c, double deadline) {
  if (c->fd >= 0) return DT_OK;
  double wait = 0.005;
  for (;;) {
    int fd = -1;
    DT_CHECK(tcp_dial(c->host, c->port, deadline, &fd));
    pthread_mutex_lock(&c->fdmu);
    int intr = c->intr;
    if (!intr) c->fd = fd;
    pthread_mutex_unlock(&c->fdmu);
    if (intr) {
      close(fd);
      return dt__seterr(DT_EABORTED, "store %s:%d: interrupted", c->host, c->port);
    }
    int rc = tcp_handshake(c, deadline);
    if (rc == DT_OK) return DT_OK;
    tcp_drop(c);
    if (rc != DT_EAGAIN) return rc;
    if (dt_now() + wait > deadline)
      return dt__seterr(DT_ETIMEDOUT, "store %s:%d: auth: the server kept closing the connection before "
                        "its challenge", c->host, c->port);
    struct timespec ts = {0, (long)(wait * 1e9)};
    nanosleep(&ts, NULL);
    if (wait < 0.1) wait *= 2;
  }
}

/* One request/reply. On success *rep points into c->rbuf. */
static int tcp_call(struct tcp_client *c, uint8_t op, const char *key, const void *v, size_t vl,
                    const void *v2, size_t v2l, double timeout_s, struct dt_kv_msg *rep) {
  double deadline = dt_now() + timeout_s;
  if (c->intr) return dt__seterr(DT_EABORTED, "store %s:%d: interrupted", c->host, c->port);
  DT_CHECK(tcp_ensure(c, deadline));
  size_t kl = strlen(key);
  /* a small request goes in one send: one segment, one wake-up of the server */
  uint8_t one[DT_KV_HDR + 1024], *hdr = one;
  uint32_t tms = timeout_s * 1000 > 0x7fffffff ? 0x7fffffff : (uint32_t)(timeout_s * 1000);
  dt__kv_encode_hdr(hdr, op, (uint32_t)kl, (uint32_t)vl, (uint32_t)v2l, tms);
  double io_deadline = deadline + 2.0; /* the server answers timeouts itself */
  int rc;
  if (kl + vl + v2l <= sizeof one - DT_KV_HDR) {
    size_t n = DT_KV_HDR;
    memcpy(one + n, key, kl), n += kl;
    if (vl) memcpy(one + n, v, vl), n += vl;
    if (v2l) memcpy(one + n, v2, v2l), n += v2l;
    rc = io_full(c->fd, one, n, true, io_deadline, key);
  } else {
    rc = io_full(c->fd, hdr, DT_KV_HDR, true, io_deadline, key);
    if (!rc) rc = io_full(c->fd, (void *)key, kl, true, io_deadline, key);
    if (!rc && vl) rc = io_full(c->fd, (void *)v, vl, true, io_deadline, key);
    if (!rc && v2l) rc = io_full(c->fd, (void *)v2, v2l, true, io_deadline, key);
  }
  if (!rc) rc = io_full(c->fd, c->rbuf, DT_KV_HDR, false, io_deadline, key);
  if (!rc) {
    char why[128];
    size_t used;
    rc = dt__kv_parse(c->rbuf, DT_KV_HDR, true, rep, &used, why);
    if (rc == DT_EAGAIN) {
      size_t total = DT_KV_HDR + (size_t)rep->vlen + rep->v2len;
      if (total > c->rcap) {
        uint8_t *nb = realloc(c->rbuf, total);
        if (!nb) rc = dt__seterr(DT_ENOMEM, "store: out of memory");
        else c->rbuf = nb, c->rcap = total;
      }
      if (rc == DT_EAGAIN) rc = io_full(c->fd, c->rbuf + DT_KV_HDR, total - DT_KV_HDR, false, io_deadline, key);
      if (!rc) rc = dt__kv_parse(c->rbuf, total, true, rep, &used, why);
    }
    if (rc == DT_EPROTO) dt__seterr(rc, "store %s:%d: bad reply: %s", c->host, c->port, why);
  }
  if (rc < 0) { /* connection state unknown: drop it */
    tcp_drop(c);
    if (c->intr) return dt__seterr(DT_EABORTED, "store %s:%d: interrupted", c->host, c->port);
    return rc;
  }
  int status = -(int)rep->op;
  if (status == DT_ETIMEDOUT) return dt__seterr(status, "store %s:%d: key '%s' not set before the deadline", c->host, c->port, key);
  if (status < 0 && status != DT_ERANGE) return dt__seterr(status, "store %s:%d: key '%s': %s", c->host, c->port, key, dt_strerror(status));
  return status;
}

static int tc_set(void *self, const char *key, const void *val, size_t len, double t) {
  struct dt_kv_msg r;
  return tcp_call(self, DT_KV_SET, key, val, len, NULL, 0, t, &r);
}
static int tc_get(void *self, const char *key, void *buf, size_t cap, size_t *len, double t) {
  struct dt_kv_msg r;
  DT_CHECK(tcp_call(self, buf && cap ? DT_KV_GET : DT_KV_CHECK, key, NULL, 0, NULL, 0, t, &r));
  *len = r.vlen;
  if (!buf || !cap) return r.vlen && buf ? DT_ERANGE : DT_OK;
  memcpy(buf, r.val, r.vlen < cap ? r.vlen : cap);
  return r.vlen > cap ? dt__seterr(DT_ERANGE, "store: value of '%s' is %u bytes, buffer %zu", key, r.vlen, cap) : DT_OK;
}
static int tc_add(void *self, const char *key, int64_t d, int64_t *res, double t) {
  struct dt_kv_msg r;
  char v[32];
  int n = snprintf(v, sizeof v, "%lld", (long long)d);
  DT_CHECK(tcp_call(self, DT_KV_ADD, key, v, (size_t)n, NULL, 0, t, &r));
  char out[32] = {0};
  memcpy(out, r.val, r.vlen < 31 ? r.vlen : 31);
  *res = strtoll(out, NULL, 10);
  return DT_OK;
}
static int tc_cas(void *self, const char *key, const void *exp, size_t elen, const void *des,
                  size_t dlen, bool *swapped, void *cur, size_t cap, size_t *curlen, double t) {
  struct dt_kv_msg r;
  /* flags in the value: a leading byte says whether expected is present */
  uint8_t *e = malloc(elen + 1);
  if (!e) return dt__seterr(DT_ENOMEM, "store: out of memory");
  e[0] = exp ? 1 : 0;
  if (elen && exp) memcpy(e + 1, exp, elen);
  int rc = tcp_call(self, DT_KV_CAS, key, e, exp ? elen + 1 : 1, des, dlen, t, &r);
  free(e);
  DT_CHECK(rc);
  /* reply: value = swapped byte, second value = the value now stored */
  if (r.vlen != 1) return dt__seterr(DT_EPROTO, "store: malformed cas reply");
  *swapped = r.val[0] != 0;
  *curlen = r.v2len;
  if (cur) memcpy(cur, r.val2, *curlen < cap ? *curlen : cap);
  return DT_OK;
}
static int tc_del(void *self, const char *key, bool *existed, double t) {
  struct dt_kv_msg r;
  DT_CHECK(tcp_call(self, DT_KV_DEL, key, NULL, 0, NULL, 0, t, &r));
  *existed = r.vlen == 1 && r.val[0] == 1;
  return DT_OK;
}
static void tc_destroy(void *self) {
  struct tcp_client *c = self;
  if (c->fd >= 0) close(c->fd);
  pthread_mutex_destroy(&c->fdmu);
  free(c->token);
  free(c->rbuf);
  free(c);
}
/* The blocked call's poll sees the shut-down socket at once; the fd is not
 * closed here (its owner does, under fdmu, so no other file gets hit). */
static void tc_interrupt(void *self) {
  struct tcp_client *c = self;
  pthread_mutex_lock(&c->fdmu);
  c->intr = 1;
  if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&c->fdmu);
}

static const struct dt_store_backend tcp_backend = {"tcp", tc_set, tc_get, tc_add, tc_cas, tc_del,
                                                    tc_destroy, tc_interrupt};

struct beat_call {
  const char *key, *hb, *report;
  double t;
  bool *found;
  int64_t *value;
};

static int tc_beat(void *self, void *arg) {
  struct beat_call *b = arg;
  struct dt_kv_msg r;
  DT_CHECK(tcp_call(self, DT_KV_BEAT, b->key, b->hb, strlen(b->hb), b->report, strlen(b->report),
                    b->t, &r));
  if (r.vlen != 1 || r.v2len > 30) return dt__seterr(DT_EPROTO, "store: malformed beat reply");
  char num[32] = {0};
  memcpy(num, r.val2, r.v2len);
  *b->found = r.val[0] != 0;
  *b->value = strtoll(num, NULL, 10);
  return DT_OK;
}

int dt__store_beat(dt_store *s, const char *key, const char *hb, const char *report, double t,
                   bool *found, int64_t *value) {
  DT_CHECK(check_key(key));
  DT_CHECK(check_key(hb));
  DT_CHECK(check_key(report));
  struct beat_call b = {key, hb, report, tmo(t), found, value};
  return dt__store_with(s, &tcp_backend, tc_beat, &b);
}

int dt_store_connect(dt_store **out, const char *host, int port, const char *token, double timeout_s) {
  if (!out) return dt__seterr(DT_EINVAL, "store connect: out is NULL");
  if (!host || port <= 0 || port > 65535)
    return dt__seterr(DT_EINVAL, "store: bad address %s:%d", host ? host : "(null)", port);
  struct tcp_client *c = calloc(1, sizeof *c);
  if (!c) return dt__seterr(DT_ENOMEM, "store: out of memory");
  snprintf(c->host, sizeof c->host, "%s", host);
  c->port = port;
  c->fd = -1;
  pthread_mutex_init(&c->fdmu, NULL);
  const uint8_t *tok;
  dt__auth_token(token, &tok, &c->token_len);
  c->token = malloc(c->token_len + 1);
  c->rcap = 4096;
  c->rbuf = malloc(c->rcap);
  if (!c->token || !c->rbuf) {
    tc_destroy(c);
    return dt__seterr(DT_ENOMEM, "store: out of memory");
  }
  memcpy(c->token, tok, c->token_len);
  int rc = tcp_ensure(c, dt_now() + tmo(timeout_s));
  if (rc < 0) {
    tc_destroy(c);
    return rc;
  }
  return dt__store_wrap(out, &tcp_backend, c);
}

int dt_store_connect_addr(dt_store **out, const char *hostport, const char *token, double timeout_s) {
  if (!out) return dt__seterr(DT_EINVAL, "store connect: out is NULL");
  const char *colon = hostport ? strrchr(hostport, ':') : NULL;
  if (!colon || colon == hostport || (size_t)(colon - hostport) >= 256)
    return dt__seterr(DT_EINVAL, "store: address '%s' is not HOST:PORT", hostport ? hostport : "(null)");
  char host[256];
  memcpy(host, hostport, (size_t)(colon - hostport));
  host[colon - hostport] = '\0';
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port <= 0 || port > 65535)
    return dt__seterr(DT_EINVAL, "store: bad port in '%s'", hostport);
  return dt_store_connect(out, host, (int)port, token, timeout_s);
}

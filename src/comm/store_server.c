/*
 * store_server.c — the TCP key-value store server: one background thread,
 * poll(2) over the listening socket and every client, an in-memory table.
 *
 * Each client first passes the job-token challenge (auth.c); a client that
 * fails it, or sends a malformed or oversized request, is disconnected with
 * a logged reason while every other client keeps being served. A GET or
 * WAIT for a missing key is parked until the key is set or the request's
 * own timeout passes (then it is answered DT_ETIMEDOUT). Strangers cannot
 * block it: a connection that has not authenticated within
 * DTRAIN_AUTH_TIMEOUT_MS is closed, at most DTRAIN_AUTH_PENDING_MAX may
 * wait longer than a second (the oldest is closed first), and running out
 * of file descriptors closes an idle stranger or the new connection
 * instead of spinning (accept_guard.c); each such close is logged with
 * the peer's address.
 * The table is a flat
 * array searched linearly: a rendezvous holds a few keys per rank. Not here:
 * persistence, replication.
 */
#define _GNU_SOURCE
#include "comm/store_int.h"
#include "comm/accept_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct kv {
  char *key;
  uint8_t *val;
  size_t len;
};

struct client {
  int fd;
  bool authed;
  uint8_t nonce[DT_AUTH_NONCE_LEN];
  uint8_t *in;
  size_t inlen, incap;
  uint8_t *out;
  size_t outlen, outoff, outcap;
  bool parked; /* waiting for key `pkey` */
  uint8_t pop;
  char pkey[DT_STORE_KEY_MAX + 1];
  char pkey2[DT_STORE_KEY_MAX + 1]; /* DT_KV_BEAT: the key whose value the reply holds */
  double pdeadline;
  bool dead;
  double since; /* accepted at (dt_now) */
  char peer[64];
};

struct dt_store_server {
  int lfd, port;
  struct dt_accept_guard guard;
  double auth_timeout;
  int pending_max;
  int wake[2];
  pthread_t th;
  bool started;
  uint8_t *token;
  size_t token_len;
  struct kv *kv;
  size_t nkv, capkv;
  struct client **cl;
  size_t ncl, capcl;
};

static struct kv *kv_find(dt_store_server *s, const char *key) {
  for (size_t i = 0; i < s->nkv; i++)
    if (!strcmp(s->kv[i].key, key)) return &s->kv[i];
  return NULL;
}

static int kv_put(dt_store_server *s, const char *key, const void *val, size_t len) {
  struct kv *e = kv_find(s, key);
  uint8_t *v = malloc(len ? len : 1);
  if (!v) return DT_ENOMEM;
  if (len) memcpy(v, val, len);
  if (!e) {
    if (s->nkv == s->capkv) {
      size_t nc = s->capkv ? 2 * s->capkv : 64;
      struct kv *n = realloc(s->kv, nc * sizeof *n);
      if (!n) { free(v); return DT_ENOMEM; }
      s->kv = n;
      s->capkv = nc;
    }
    e = &s->kv[s->nkv];
    e->key = strdup(key);
    if (!e->key) { free(v); return DT_ENOMEM; }
    s->nkv++;
  } else {
    free(e->val);
  }
  e->val = v;
  e->len = len;
  return DT_OK;
}

static void kv_del(dt_store_server *s, struct kv *e) {
  free(e->key);
  free(e->val);
  *e = s->kv[--s->nkv];
}

static int out_append(struct client *c, const void *p, size_t n) {
  if (c->outlen + n > c->outcap) {
    size_t nc = (c->outlen + n) * 2;
    uint8_t *b = realloc(c->out, nc);
    if (!b) return DT_ENOMEM;
    c->out = b;
    c->outcap = nc;
  }
  memcpy(c->out + c->outlen, p, n);
  c->outlen += n;
  return DT_OK;
}

static void reply(struct client *c, int status, const void *v, size_t vl, const void *v2, size_t v2l) {
  uint8_t h[DT_KV_HDR];
  dt__kv_encode_hdr(h, (uint8_t)(-status), 0, (uint32_t)vl, (uint32_t)v2l, 0);
  if (out_append(c, h, sizeof h) || (vl && out_append(c, v, vl)) || (v2l && out_append(c, v2, v2l)))
    c->dead = true;
}

static void drop(struct client *c, const char *why) {
  DT_LOG_WARN("store server: closing connection from %s: %s", c->peer, why);
  c->dead = true;
}

/* DT_KV_BEAT's answer: whether its key exists, and the value of pkey2. */
static void beat_reply(dt_store_server *s, struct client *c, bool found) {
  uint8_t f = found;
  struct kv *r = kv_find(s, c->pkey2);
  reply(c, DT_OK, &f, 1, r ? r->val : NULL, r ? r->len : 0);
}

/* Answers a parked or new GET/CHECK/BEAT if its key exists. */
static bool try_get(dt_store_server *s, struct client *c, uint8_t op, const char *key) {
  struct kv *e = kv_find(s, key);
  if (!e) return false;
  if (op == DT_KV_GET) reply(c, DT_OK, e->val, e->len, NULL, 0);
  else if (op == DT_KV_BEAT) beat_reply(s, c, true);
  else reply(c, DT_OK, NULL, 0, NULL, 0);
  return true;
}

static void serve_parked(dt_store_server *s, double now) {
  for (size_t i = 0; i < s->ncl; i++) {
    struct client *c = s->cl[i];
    if (!c->parked) continue;
    if (try_get(s, c, c->pop, c->pkey)) c->parked = false;
    else if (now >= c->pdeadline) {
      if (c->pop == DT_KV_BEAT) beat_reply(s, c, false); /* not an error: the beat counted */
      else reply(c, DT_ETIMEDOUT, NULL, 0, NULL, 0);
      c->parked = false;
    }
  }
}

/* Adds delta to the integer value of key (missing: 0); the new value's
 * text in num (32 bytes), its length returned, or -1 out of memory. */
static int kv_add(dt_store_server *s, const char *key, long long d, char *num) {
  long long cur = 0;
  struct kv *e = kv_find(s, key);
  if (e) {
    char tmp[32] = {0};
    memcpy(tmp, e->val, e->len < 31 ? e->len : 31);
    cur = strtoll(tmp, NULL, 10);
  }
  cur = (long long)((unsigned long long)cur + (unsigned long long)d);
  int n = snprintf(num, 32, "%lld", cur);
  return kv_put(s, key, num, (size_t)n) ? -1 : n;
}

/* A BEAT's second key (the counter to bump or the key to report): 1..KEY_MAX
 * bytes without NUL, copied to out. */
static bool beat_key(const uint8_t *p, uint32_t len, char *out) {
  if (len == 0 || len > DT_STORE_KEY_MAX || memchr(p, 0, len)) return false;
  memcpy(out, p, len);
  out[len] = '\0';
  return true;
}

/* A GET/CHECK/BEAT: answered now if its key exists, else parked until it
 * is set or the request's timeout passes. */
static void get_or_park(dt_store_server *s, struct client *c, const struct dt_kv_msg *m,
                        const char *key, double now) {
  if (try_get(s, c, m->op, key)) return;
  c->parked = true;
  c->pop = m->op;
  memcpy(c->pkey, key, m->klen + 1);
  c->pdeadline = now + m->timeout_ms / 1000.0;
}

static void handle(dt_store_server *s, struct client *c, const struct dt_kv_msg *m, double now) {
  char key[DT_STORE_KEY_MAX + 1];
  memcpy(key, m->key, m->klen);
  key[m->klen] = '\0';
  switch (m->op) {
  case DT_KV_SET:
    if (kv_put(s, key, m->val, m->vlen)) reply(c, DT_ENOMEM, NULL, 0, NULL, 0);
    else reply(c, DT_OK, NULL, 0, NULL, 0);
    break;
  case DT_KV_GET:
  case DT_KV_CHECK:
    get_or_park(s, c, m, key, now);
    break;
  case DT_KV_ADD: {
    char num[32] = {0};
    if (m->vlen == 0 || m->vlen > 30) { drop(c, "bad add operand"); return; }
    memcpy(num, m->val, m->vlen);
    char *end;
    long long d = strtoll(num, &end, 10);
    if (*end) { drop(c, "add operand is not an integer"); return; }
    int n = kv_add(s, key, d, num);
    if (n < 0) reply(c, DT_ENOMEM, NULL, 0, NULL, 0);
    else reply(c, DT_OK, num, (size_t)n, NULL, 0);
    break;
  }
  case DT_KV_BEAT: {
    char hb[DT_STORE_KEY_MAX + 1], num[32];
    if (!beat_key(m->val, m->vlen, hb) || !beat_key(m->val2, m->v2len, c->pkey2)) {
      drop(c, "bad beat request");
      return;
    }
    if (kv_add(s, hb, 1, num) < 0) { reply(c, DT_ENOMEM, NULL, 0, NULL, 0); break; }
    get_or_park(s, c, m, key, now);
    break;
  }
  case DT_KV_CAS: {
    if (m->vlen < 1) { drop(c, "bad cas request"); return; }
    struct kv *e = kv_find(s, key);
    bool has_exp = m->val[0] != 0;
    bool match = dt__kv_cas_match(e ? e->val : NULL, e ? e->len : 0, e != NULL,
                                  has_exp ? m->val + 1 : NULL, m->vlen - 1);
    uint8_t sw = 0;
    if (match) {
      if (kv_put(s, key, m->val2, m->v2len)) { reply(c, DT_ENOMEM, NULL, 0, NULL, 0); return; }
      sw = 1;
      e = kv_find(s, key);
    }
    reply(c, DT_OK, &sw, 1, e ? e->val : NULL, e ? e->len : 0);
    break;
  }
  case DT_KV_DEL: {
    struct kv *e = kv_find(s, key);
    uint8_t ex = e != NULL;
    if (e) kv_del(s, e);
    reply(c, DT_OK, &ex, 1, NULL, 0);
    break;
  }
  }
}

static void on_input(dt_store_server *s, struct client *c, double now) {
  size_t off = 0;
  while (!c->dead) {
    size_t avail = c->inlen - off;
    if (!c->authed) {
      if (avail < DT_AUTH_NONCE_LEN + DT_AUTH_MAC_LEN) break;
      const uint8_t *nc = c->in + off, *mac = nc + DT_AUTH_NONCE_LEN;
      uint8_t ans[DT_AUTH_MAC_LEN];
      if (!dt__auth_verify(s->token, s->token_len, "dt-kv-client", c->nonce, nc, mac)) {
        drop(c, "wrong job token (HMAC challenge failed)");
        return;
      }
      dt__auth_mac(s->token, s->token_len, "dt-kv-server", nc, c->nonce, ans);
      out_append(c, ans, sizeof ans);
      c->authed = true;
      off += DT_AUTH_NONCE_LEN + DT_AUTH_MAC_LEN;
      continue;
    }
    if (c->parked) break; /* one request at a time */
    struct dt_kv_msg m;
    size_t used;
    char why[128];
    int rc = dt__kv_parse(c->in + off, avail, false, &m, &used, why);
    if (rc == DT_EAGAIN) break;
    if (rc < 0) { drop(c, why); return; }
    handle(s, c, &m, now);
    off += used;
  }
  memmove(c->in, c->in + off, c->inlen - off);
  c->inlen -= off;
}

static void client_free(struct client *c) {
  if (c->fd >= 0) close(c->fd);
  free(c->in);
  free(c->out);
  free(c);
}

/* The oldest connection still owing its authentication (NULL if none). */
static struct client *oldest_stranger(dt_store_server *s) {
  struct client *o = NULL;
  for (size_t i = 0; i < s->ncl; i++) {
    struct client *c = s->cl[i];
    if (c->authed || c->dead) continue;
    if (!o || c->since < o->since) o = c;
  }
  return o;
}

/* Closes a stranger now (its descriptor is needed); freed with the dead. */
static void drop_now(struct client *c, const char *why) {
  drop(c, why);
  close(c->fd);
  c->fd = -1;
}

/* Out of descriptors: close the oldest stranger if it has idled a second
 * (a real client answers the challenge within a round trip). */
static int evict_idle(void *arg) {
  dt_store_server *s = arg;
  struct client *o = oldest_stranger(s);
  double idle = o ? dt_now() - o->since : 0;
  if (!o || idle < 1.0) return 0;
  char why[96];
  snprintf(why, sizeof why, "out of file descriptors; unauthenticated for %.1f s", idle);
  drop_now(o, why);
  return 1;
}

static void accept_some(dt_store_server *s) {
  for (int k = 0; k < 64; k++) {
    char who[64];
    int fd = dt__accept_guarded(&s->guard, s->lfd, who, sizeof who, evict_idle, s);
    if (fd < 0) return;
    struct client *c = calloc(1, sizeof *c);
    if (!c || s->ncl == s->capcl) {
      size_t nc = s->capcl ? 2 * s->capcl : 16;
      struct client **n = c ? realloc(s->cl, nc * sizeof *n) : NULL;
      if (!n) { free(c); close(fd); return; }
      s->cl = n;
      s->capcl = nc;
    }
    c->fd = fd;
    c->since = dt_now();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    snprintf(c->peer, sizeof c->peer, "%s", who);
    dt__auth_random(c->nonce, sizeof c->nonce);
    out_append(c, c->nonce, sizeof c->nonce);
    s->cl[s->ncl++] = c;
  }
}

static int by_since(const void *a, const void *b) {
  double x = (*(struct client *const *)a)->since, y = (*(struct client *const *)b)->since;
  return (x > y) - (x < y);
}

/* The cap on strangers as a standing bound: while more than
 * DTRAIN_AUTH_PENDING_MAX connections owe their authentication, the oldest
 * of those that have had a second to answer are closed, oldest first (a
 * burst of real clients, thousands of workers starting at once, is not cut
 * off mid-handshake; they answer within a round trip). Checked on every
 * pass of the loop, not only when a connection arrives: a flood that stops
 * was otherwise left holding its descriptors until DTRAIN_AUTH_TIMEOUT_MS,
 * and whether the cap fired at all depended on arrivals after the first
 * second (test_store_flood saw none in one CI run). Returns when it must
 * look again (or `next` if sooner). */
static double trim_strangers(dt_store_server *s, double now, double next) {
  size_t n = 0, nold = 0;
  double young = 0; /* the oldest arrival among those under a second */
  for (size_t i = 0; i < s->ncl; i++) {
    struct client *c = s->cl[i];
    if (c->authed || c->dead) continue;
    n++;
    if (now - c->since >= 1.0) nold++;
    else if (!young || c->since < young) young = c->since;
  }
  if (n <= (size_t)s->pending_max) return next;
  size_t excess = n - (size_t)s->pending_max;
  if (nold) {
    struct client **old = malloc(nold * sizeof *old);
    if (!old) return next;
    size_t k = 0;
    for (size_t i = 0; i < s->ncl; i++) {
      struct client *c = s->cl[i];
      if (!c->authed && !c->dead && now - c->since >= 1.0) old[k++] = c;
    }
    if (nold > excess) qsort(old, nold, sizeof *old, by_since);
    char why[96];
    snprintf(why, sizeof why, "more than %d unauthenticated connections (DTRAIN_AUTH_PENDING_MAX); oldest first",
             s->pending_max);
    for (k = 0; k < nold && k < excess; k++) drop_now(old[k], why);
    free(old);
  }
  if (nold < excess && young > 0 && young + 1.0 < next) next = young + 1.0;
  return next;
}

/* Closes strangers past their authentication deadline; returns the next
 * deadline (or `next` if sooner). */
static double expire_strangers(dt_store_server *s, double now, double next) {
  for (size_t i = 0; i < s->ncl; i++) {
    struct client *c = s->cl[i];
    if (c->authed || c->dead) continue;
    double due = c->since + s->auth_timeout;
    if (now >= due) {
      char why[96];
      snprintf(why, sizeof why, "did not authenticate within %.1f s (DTRAIN_AUTH_TIMEOUT_MS)", s->auth_timeout);
      drop(c, why);
    } else if (due < next) {
      next = due;
    }
  }
  return next;
}

static void *server_main(void *arg) {
  dt_store_server *s = arg;
  prctl(PR_SET_NAME, "dt-store"); /* its CPU and wake-ups by name (bench/elastic_cost.sh, top -H) */
  struct pollfd *pf = NULL;
  size_t pcap = 0;
  for (;;) {
    if (s->ncl + 2 > pcap) {
      pcap = (s->ncl + 2) * 2;
      struct pollfd *n = realloc(pf, pcap * sizeof *n);
      if (!n) break;
      pf = n;
    }
    double now = dt_now(), next = now + 1.0;
    bool paused = dt__accept_paused(&s->guard, now);
    pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
    pf[1] = (struct pollfd){paused ? -1 : s->lfd, POLLIN, 0};
    if (paused && s->guard.paused_until < next) next = s->guard.paused_until;
    next = expire_strangers(s, now, next);
    next = trim_strangers(s, now, next);
    for (size_t i = 0; i < s->ncl; i++) {
      struct client *c = s->cl[i];
      pf[i + 2] = (struct pollfd){c->fd, (short)(POLLIN | (c->outlen > c->outoff ? POLLOUT : 0)), 0};
      if (c->parked && c->pdeadline < next) next = c->pdeadline;
    }
    int ms = (int)((next - now) * 1000) + 1;
    int n = poll(pf, s->ncl + 2, ms < 0 ? 0 : ms);
    if (n < 0 && errno != EINTR) break;
    if (pf[0].revents) break; /* stop requested */
    now = dt_now();
    size_t ncl0 = s->ncl;
    for (size_t i = 0; i < ncl0; i++) {
      struct client *c = s->cl[i];
      short re = pf[i + 2].revents;
      if (re & (POLLIN | POLLHUP | POLLERR)) {
        for (;;) {
          if (c->incap - c->inlen < 65536) {
            size_t nc = c->incap ? c->incap * 2 : 65536;
            if (nc > 4 * (DT_STORE_VAL_MAX + DT_STORE_KEY_MAX + 1024)) { drop(c, "request too large"); break; }
            uint8_t *b = realloc(c->in, nc);
            if (!b) { drop(c, "out of memory"); break; }
            c->in = b;
            c->incap = nc;
          }
          ssize_t r = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, MSG_DONTWAIT);
          if (r > 0) { c->inlen += (size_t)r; continue; }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c->dead = true;
          break;
        }
        if (!c->dead || c->inlen) on_input(s, c, now);
      }
    }
    serve_parked(s, now);
    for (size_t i = 0; i < s->ncl; i++) {
      struct client *c = s->cl[i];
      while (!c->dead && c->outlen > c->outoff) {
        ssize_t w = send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) c->outoff += (size_t)w;
        else {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c->dead = true;
          break;
        }
      }
      if (c->outoff == c->outlen) c->outoff = c->outlen = 0;
    }
    if (pf[1].revents & POLLIN) accept_some(s);
    expire_strangers(s, now, now);
    for (size_t i = 0; i < s->ncl;) {
      if (s->cl[i]->dead) {
        client_free(s->cl[i]);
        s->cl[i] = s->cl[--s->ncl];
      } else {
        i++;
      }
    }
  }
  free(pf);
  return NULL;
}

int dt_store_server_start(dt_store_server **out, const char *bind_addr, int port, const char *token) {
  if (!out) return dt__seterr(DT_EINVAL, "store server: out is NULL");
  if (port < 0 || port > 65535) return dt__seterr(DT_EINVAL, "store server: port %d out of range", port);
  dt_store_server *s = calloc(1, sizeof *s);
  if (!s) return dt__seterr(DT_ENOMEM, "store server: out of memory");
  s->lfd = -1;
  s->wake[0] = s->wake[1] = -1;
  dt__accept_guard_init(&s->guard, "store server");
  s->auth_timeout = dt__auth_timeout_s();
  s->pending_max = dt__auth_pending_max();
  const uint8_t *tok;
  dt__auth_token(token, &tok, &s->token_len);
  s->token = malloc(s->token_len + 1);
  if (!s->token) goto nomem;
  memcpy(s->token, tok, s->token_len);
  const char *addr = bind_addr ? bind_addr : "127.0.0.1";
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
    dt_store_server_stop(s);
    return dt__seterr(DT_EINVAL, "store server: bad bind address '%s' (IPv4 expected)", addr);
  }
  s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(s->lfd, 1024)) {
    int e = errno;
    dt_store_server_stop(s);
    return dt__seterr(DT_EIO, "store server: cannot listen on %s:%d: %s", addr, port, strerror(e));
  }
  socklen_t sl = sizeof sa;
  getsockname(s->lfd, (struct sockaddr *)&sa, &sl);
  s->port = ntohs(sa.sin_port);
  if (pipe2(s->wake, O_CLOEXEC)) goto nomem;
  if (pthread_create(&s->th, NULL, server_main, s) == 0) s->started = true;
  else {
    dt_store_server_stop(s);
    return dt__seterr(DT_EIO, "store server: cannot start thread");
  }
  *out = s;
  return DT_OK;
nomem:
  dt_store_server_stop(s);
  return dt__seterr(DT_ENOMEM, "store server: out of resources");
}

int dt_store_server_port(const dt_store_server *s) { return s ? s->port : -1; }

void dt_store_server_stop(dt_store_server *s) {
  if (!s) return;
  if (s->started) {
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->th, NULL);
  }
  for (size_t i = 0; i < s->ncl; i++) client_free(s->cl[i]);
  for (size_t i = 0; i < s->nkv; i++) free(s->kv[i].key), free(s->kv[i].val);
  if (s->lfd >= 0) close(s->lfd);
  if (s->wake[0] >= 0) close(s->wake[0]), close(s->wake[1]);
  dt__accept_guard_close(&s->guard);
  free(s->cl);
  free(s->kv);
  free(s->token);
  free(s);
}

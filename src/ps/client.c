/*
 * client.c — a worker's side of the parameter server. During backward the
 * model reports each layer's gradient span as final (reverse layer order);
 * every key whose floats are all final is pushed at once (scaled by the
 * worker's share of the global batch), with the receive of its next
 * parameters posted straight into the model's parameter buffer, so pushes
 * overlap the rest of backward as DDP's buckets do. The end of a step pushes
 * what is left and waits for every key's parameters. A key of the worker's
 * own colocated server goes through memory (dt_ps_server_local); while it
 * waits, a colocated worker keeps its server going.
 *
 * Clocks: a worker's clock is the number of steps it pushed; a push of
 * clock c asks for the parameters readable at clock c + 1 (the server's
 * controller decides when that is). sync() pulls with every worker's
 * pushes up to the current clock (the same parameters everywhere).
 *
 * Keys of rows (an embedding's): dt_ps_client_rows names the rows a step's
 * batch reads; dt_ps_client_pull_rows fetches just those before forward,
 * and backward pushes just their gradients (row numbers, then values), with
 * no reply: the next step pulls its own rows. Only those rows travel.
 *
 * Server thread (colocated asp and ssp, dt_ps_opts.server_thread): the
 * colocated server runs on a thread of its own, so it answers the other
 * workers while this one computes (in forward, where nothing polls it),
 * instead of only when this worker waits. The communicator is
 * single-threaded: one mutex serialises it — the worker holds it inside
 * every client call and gives it up only while it waits; the thread
 * holds it while it polls. At a mark (before every collective) the thread
 * parks, so the collective has the communicator alone; the next client
 * call wakes it.
 *
 * It does not apply any optimizer: the parameters come from the servers.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obs/obs.h"
#include "ps/ps.h"

int64_t dt__ps_server_min_mark(const dt_ps_server *s);

enum { K_PUSHED = 1, K_WAIT = 2, K_DONE = 4, K_LOST = 8, K_STAGED = 16 };

struct dt_ps_client {
  dt_obs *obs;         /* pushes and the pull wait as spans and histograms */
  dt_obs_metric *m_push, *m_pull;
  const dt_ps_map *map;
  dt_ps_opts o;
  int me;
  dt_comm *comm;
  float *params, *grads;
  dt_ps_server *local;
  int local_idx;
  int64_t clock, marks;
  float weight, lr;
  int nk;
  int R, nslot;        /* replicas of each key range; request slots per key (2 + 2R) */
  uint8_t *hout, *hin; /* per key: R 64-byte request headers (one per replica), a reply header */
  dt_comm_req *kreq;   /* per key: recv hdr, recv payload, then send hdr + payload per replica */
  int *kpeer;          /* per key and slot: the server of that request */
  uint8_t *kst;        /* K_* */
  uint8_t *nreq;       /* per key: requests in kreq in use */
  /* replicas: the read each key waits for, to ask the next replica for it */
  int64_t *rclock;
  uint32_t *rflags;
  int *rfrom;          /* per key: the server its reply comes from */
  uint8_t *sdead;      /* per server: lost */
  int64_t lost_ns;     /* when the last loss was seen (0: no fail-over pending) */
  int lost_srv;
  int64_t *kver;       /* per key: version of the parameters held */
  /* lazy replies (colocated asp): a push's reply lands in stage and is
   * copied into the parameters at the next step's begin, or before the
   * key's next push, never while forward or backward may read them */
  int lazy;
  float *stage;        /* nparams floats */
  int64_t *kfwd;       /* per key: the version this step's forward read */
  float *resid;        /* significance filter: the update not pushed yet (nparams) */
  float *pairs;        /* significance filter: (index, value) pairs (2 x nparams) */
  /* keys of rows */
  int64_t *knrows;     /* per key: rows named this step, -1 none (whole key) */
  uint32_t *rows;      /* the row numbers, key by key (krow0[k]) */
  size_t *krow0, *kbuf0;
  float *rbuf;         /* per key (kbuf0[k]): pulled rows, or a push's numbers + values */
  /* a checkpoint export in progress */
  float *xbuf;
  size_t *xoff;        /* per key: its record's place in xbuf (nk + 1) */
  int64_t *xsteps;
  size_t ready_lo;
  int next_key;        /* pushes go from the last key down */
  dt_ps_client_stats st;
  /* the server thread (colocated, server_thread) */
  int threaded;
  pthread_t thr;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int park, quit, spin;
  int err;             /* a push or a poll failed during backward (reported by finish) */
  char errmsg[512];
};

static int srv_rank(const dt_ps_client *c, int s) { return dt_ps_server_rank(&c->o, s); }

/* Rows of key k pulled into src (in the order they were named) go to
 * their places in the parameters. */
static void scatter_rows(dt_ps_client *c, int k, const float *src, uint64_t n) {
  const dt_ps_key *K = &c->map->keys[k];
  const uint32_t *rows = c->rows + c->krow0[k];
  const size_t rl = K->rowlen;
  for (uint64_t j = 0; j < n; j++)
    memcpy(c->params + K->off + (size_t)rows[j] * rl, src + j * rl, rl * sizeof(float));
  c->st.pulled_floats += (int64_t)(n * rl);
}

static void local_reply(void *ud, const dt_ps_msg *m, const float *payload) {
  dt_ps_client *c = ud;
  const dt_ps_key *K = &c->map->keys[m->key];
  if (m->flags & DT_PS_F_STATE) {
    memcpy(c->xbuf + c->xoff[m->key], payload, m->count * sizeof(float));
    c->xsteps[m->key] = (int64_t)m->aux;
    c->kst[m->key] = (uint8_t)((c->kst[m->key] & ~K_WAIT) | K_DONE);
    return;
  }
  if (m->flags & DT_PS_F_ROWS) {
    scatter_rows(c, m->key, payload, m->count);
    c->kver[m->key] = m->clock;
    c->kst[m->key] = (uint8_t)((c->kst[m->key] & ~K_WAIT) | K_DONE);
    return;
  }
  /* zero copy: the server's parameters are these already */
  if (payload != c->params + K->off) memcpy(c->params + K->off, payload, K->len * sizeof(float));
  c->kver[m->key] = m->clock;
  c->kst[m->key] = (uint8_t)((c->kst[m->key] & ~K_WAIT) | K_DONE);
  c->st.pulled_floats += (int64_t)K->len;
}

int dt_ps_client_create(dt_ps_client **out, const dt_ps_map *map, const dt_ps_opts *opts,
                        int worker, dt_comm *comm, float *params, float *grads,
                        dt_ps_server *local) {
  if (!out || !map || !opts || !comm || !params || !grads)
    return dt__seterr(DT_EINVAL, "ps client: NULL argument");
  *out = NULL;
  dt_ps_client *c = calloc(1, sizeof *c);
  if (!c) return dt__seterr(DT_ENOMEM, "ps client: out of memory");
  c->obs = dt_comm_obs(comm);
  c->m_push = dt_obs_histogram(c->obs, "dtrain_ps_push_seconds",
                               "Time to push one key's gradients to its server", NULL, 0);
  c->m_pull = dt_obs_histogram(c->obs, "dtrain_ps_pull_wait_seconds",
                               "Time a worker waited at a step's end for every key's parameters", NULL, 0);
  c->map = map;
  c->o = *opts;
  c->me = worker;
  c->comm = comm;
  c->params = params;
  c->grads = grads;
  c->local = local;
  c->local_idx = local ? worker : -1;
  c->nk = map->nkeys;
  c->R = map->replicas > 1 ? map->replicas : 1;
  c->nslot = 2 + 2 * c->R;
  c->hout = calloc((size_t)c->nk * (size_t)c->R, DT_PS_HDR_BYTES);
  c->hin = calloc((size_t)c->nk, DT_PS_HDR_BYTES);
  c->kreq = calloc((size_t)c->nk * (size_t)c->nslot, sizeof *c->kreq);
  c->kpeer = calloc((size_t)c->nk * (size_t)c->nslot, sizeof *c->kpeer);
  c->rclock = calloc((size_t)c->nk, sizeof *c->rclock);
  c->rflags = calloc((size_t)c->nk, sizeof *c->rflags);
  c->rfrom = calloc((size_t)c->nk, sizeof *c->rfrom);
  c->sdead = calloc((size_t)map->nservers, 1);
  c->kst = calloc((size_t)c->nk, 1);
  c->nreq = calloc((size_t)c->nk, 1);
  c->kver = calloc((size_t)c->nk, sizeof *c->kver);
  c->kfwd = calloc((size_t)c->nk, sizeof *c->kfwd);
  c->lazy = local && opts->consistency == DT_PS_ASP && c->R == 1;
  if (c->lazy) c->stage = dt_alloc(map->nparams * sizeof(float));
  if (opts->significance > 0) {
    c->resid = dt_alloc(map->nparams * sizeof(float));
    c->pairs = dt_alloc(2 * map->nparams * sizeof(float));
    if (c->resid) memset(c->resid, 0, map->nparams * sizeof(float));
  }
  c->knrows = malloc((size_t)c->nk * sizeof *c->knrows);
  c->krow0 = calloc((size_t)c->nk + 1, sizeof *c->krow0);
  c->kbuf0 = calloc((size_t)c->nk + 1, sizeof *c->kbuf0);
  if (c->knrows && c->krow0 && c->kbuf0) {
    for (int k = 0; k < c->nk; k++) {
      const dt_ps_key *K = &map->keys[k];
      size_t nr = K->rowlen > 1 ? K->len / K->rowlen : 0;
      c->knrows[k] = -1;
      c->krow0[k + 1] = c->krow0[k] + nr;
      c->kbuf0[k + 1] = c->kbuf0[k] + (nr ? K->len + nr : 0);
    }
    c->rows = malloc((c->krow0[c->nk] ? c->krow0[c->nk] : 1) * sizeof *c->rows);
    c->rbuf = dt_alloc((c->kbuf0[c->nk] ? c->kbuf0[c->nk] : 1) * sizeof(float));
  }
  if (!c->hout || !c->hin || !c->kreq || !c->kpeer || !c->rclock || !c->rflags || !c->rfrom ||
      !c->sdead || !c->kst || !c->nreq || !c->kver || !c->kfwd || (c->lazy && !c->stage) ||
      !c->knrows ||
      !c->krow0 || !c->kbuf0 || !c->rows || !c->rbuf ||
      (opts->significance > 0 && (!c->resid || !c->pairs))) {
    dt_ps_client_destroy(c);
    return dt__seterr(DT_ENOMEM, "ps client: out of memory");
  }
  if (local) dt_ps_server_set_local(local, worker, local_reply, c);
  /* bsp in the worker's own thread: the server works in the model's
   * parameter buffer and sums this worker's pushes where they are */
  if (local && opts->consistency == DT_PS_BSP && !opts->server_thread &&
      dt__ps_server_zero_copy(local, params) < 0) {
    dt_ps_client_destroy(c);
    return dt__preerr(DT_EINVAL, "ps worker %d", worker);
  }
  *out = c;
  return DT_OK;
}

static void stop_thread(dt_ps_client *c);
static int start_thread(dt_ps_client *c);
static int mark(dt_ps_client *c, uint32_t flags);

void dt_ps_client_destroy(dt_ps_client *c) {
  if (!c) return;
  stop_thread(c);
  free(c->hout);
  free(c->hin);
  free(c->kreq);
  free(c->kpeer);
  free(c->rclock);
  free(c->rflags);
  free(c->rfrom);
  free(c->sdead);
  free(c->kst);
  free(c->nreq);
  free(c->kver);
  free(c->kfwd);
  dt_free(c->stage);
  dt_free(c->resid);
  dt_free(c->pairs);
  free(c->knrows);
  free(c->rows);
  free(c->krow0);
  free(c->kbuf0);
  dt_free(c->rbuf);
  free(c);
}

static int comm_fail(dt_ps_client *c, int rc, const char *what) {
  const char *m = dt_comm_errmsg(c->comm);
  return dt__seterr(rc, "ps worker %d: %s: %s", c->me, what, m && *m ? m : dt_errmsg());
}

/* Names the server a failed wait was for, with what it held. */
static int server_fail(dt_ps_client *c, int rc, int srv) {
  const dt_ps_map *m = c->map;
  const char *cm = dt_comm_errmsg(c->comm);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", cm && *cm ? cm : dt_errmsg());
  return dt__seterr(rc, "ps worker %d: waiting for server %d (rank %d, keys %d-%d, floats "
                    "[%llu, %llu)): %s", c->me, srv, srv_rank(c, srv), m->srv_key0[srv],
                    m->srv_key0[srv + 1] - 1, (unsigned long long)m->srv_lo[srv],
                    (unsigned long long)m->srv_lo[srv + 1], msg);
}

/* Lets this worker's colocated server make progress while the worker
 * waits: polls it, or with a server thread gives the thread the
 * communicator for a moment (and reports as busy, so the caller does not
 * sleep holding it). */
static int poll_local(dt_ps_client *c, int *busy) {
  if (!c->threaded) return dt_ps_server_poll(c->local, busy);
  *busy = 1;
  pthread_mutex_unlock(&c->mu);
  if (c->spin++ < 16) {
    sched_yield();
  } else {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&c->mu);
  if (c->err) return dt__seterr(c->err, "%s", c->errmsg);
  return DT_OK;
}

/* The server that answers reads of key k: the first live one of its
 * range's holders; -1 when every one is lost. */
static int holder(const dt_ps_client *c, int k) {
  const int S = c->map->nservers, r = c->map->keys[k].server;
  for (int j = 0; j < c->R; j++)
    if (!c->sdead[(r + j) % S]) return (r + j) % S;
  return -1;
}

/* Server srv is lost (replicas): later requests go to the next holders. */
static void lose(dt_ps_client *c, int srv) {
  if (c->sdead[srv]) return;
  c->sdead[srv] = 1;
  c->lost_ns = dt_now_ns();
  c->lost_srv = srv;
  c->st.failovers++;
  const dt_ps_map *m = c->map;
  DT_LOG_WARN("ps worker %d: server %d (rank %d) lost at clock %lld: %s", c->me, srv,
              srv_rank(c, srv), (long long)c->clock, dt_errmsg());
  for (int g = 0; g < m->nservers; g++) {
    if (m->srv_key0[g] == m->srv_key0[g + 1] || holder(c, m->srv_key0[g]) == g) continue;
    int h = holder(c, m->srv_key0[g]);
    if (h >= 0 && !c->sdead[g]) continue;
    if (h >= 0)
      DT_LOG_WARN("ps worker %d: keys %d-%d (server %d's range) are now read from server %d",
                  c->me, m->srv_key0[g], m->srv_key0[g + 1] - 1, g, h);
  }
}

/* A failed request to srv: with replicas, a lost server is survivable. */
static int survivable(dt_ps_client *c, int rc, int srv) {
  if (c->R < 2 || rc != DT_EPEERLOST || srv < 0) return 0;
  lose(c, srv);
  return 1;
}

/* Sends request m for key k (to its range's holder; a push to every live
 * holder, the reply asked of the first); a reply is expected when expect
 * is set (posted first, into the parameters). */
static int request(dt_ps_client *c, const dt_ps_msg *m, const float *payload, int expect) {
  int k = m->key;
  const dt_ps_key *K = &c->map->keys[k];
  if (expect) c->kst[k] = (uint8_t)((c->kst[k] & ~K_DONE) | K_WAIT);
  if (K->server == c->local_idx) {
    int rc = dt_ps_server_local(c->local, m, payload);
    return rc < 0 ? dt__preerr(rc, "ps worker %d", c->me) : DT_OK;
  }
  const int h = holder(c, k);
  if (h < 0)
    return dt__seterr(DT_EPEERLOST, "ps worker %d: every server holding key %d (server %d's "
                      "range and its %d replica%s) is lost", c->me, k, K->server, c->R - 1,
                      c->R == 2 ? "" : "s");
  int rc = DT_OK, n = 0;
  dt_comm_req *r = &c->kreq[(size_t)c->nslot * (size_t)k];
  int *who = &c->kpeer[(size_t)c->nslot * (size_t)k];
  const int rows = (m->flags & DT_PS_F_ROWS) != 0;
  if (expect) {
    /* the read this key now waits for (a push's pull is of the next clock) */
    c->rclock[k] = m->type == DT_PS_PUSH ? m->clock + 1 : m->clock;
    c->rflags[k] = m->type == DT_PS_PUSH ? 0 : m->flags;
    c->rfrom[k] = h;
    int peer = srv_rank(c, h);
    void *dst = NULL;
    size_t len = 0;
    /* rows come into the key's staging buffer, then go to their places */
    if (m->flags & DT_PS_F_STATE)
      dst = c->xbuf + c->xoff[k], len = (c->xoff[k + 1] - c->xoff[k]) * sizeof(float);
    else if (rows && m->count)
      dst = c->rbuf + c->kbuf0[k], len = m->count * K->rowlen * sizeof(float);
    else if (!rows && c->lazy && m->type == DT_PS_PUSH)
      dst = c->stage + K->off, len = K->len * sizeof(float), c->kst[k] |= K_STAGED;
    else if (!rows)
      dst = c->params + K->off, len = K->len * sizeof(float);
    /* receives are marked -1 - server in kpeer */
    rc = dt_comm_irecv(c->comm, peer, DT_PS_TAG_KEY(k), c->hin + (size_t)k * DT_PS_HDR_BYTES,
                       DT_PS_HDR_BYTES, &r[n]);
    if (rc == DT_OK) who[n++] = -1 - h;
    if (rc == DT_OK && dst) {
      rc = dt_comm_irecv(c->comm, peer, DT_PS_TAG_KEY(k) + 1, dst, len, &r[n]);
      if (rc == DT_OK) who[n++] = -1 - h;
    }
    /* lost before the receive was posted: the wait asks the next holder
     * (only posted requests are in the list) */
    if (rc < 0 && !survivable(c, rc, h)) {
      c->nreq[k] = (uint8_t)n;
      return comm_fail(c, rc, "posting a receive from a server");
    }
    if (rc < 0) c->kst[k] |= K_LOST;
    rc = DT_OK;
  }
  size_t bytes = (m->flags & DT_PS_F_SPARSE ? 2 : 1) * m->count * sizeof(float);
  if (rows) bytes = m->count * (m->type == DT_PS_PUSH ? 1 + K->rowlen : 1) * sizeof(float);
  /* a push goes to every live holder (each applies it); a read to one */
  const int fan = m->type == DT_PS_PUSH ? c->R : 1;
  for (int j = 0; j < fan; j++) {
    int t = (K->server + j) % c->map->nservers;
    if (fan == 1) t = h;
    if (c->sdead[t]) continue;
    dt_ps_msg mm = *m;
    if (t != h) mm.flags &= ~DT_PS_F_PULL;
    uint8_t *hd = c->hout + ((size_t)k * (size_t)c->R + (size_t)j) * DT_PS_HDR_BYTES;
    dt_ps_msg_encode(&mm, hd);
    int peer = srv_rank(c, t);
    rc = dt_comm_isend(c->comm, peer, DT_PS_TAG_REQ, hd, DT_PS_HDR_BYTES, &r[n]);
    if (rc == DT_OK) who[n++] = t;
    if (rc == DT_OK && payload && bytes) {
      rc = dt_comm_isend(c->comm, peer, DT_PS_TAG_REQ_DATA, payload, bytes, &r[n]);
      if (rc == DT_OK) who[n++] = t;
    }
    if (rc < 0) {
      if (!survivable(c, rc, t)) {
        c->nreq[k] = (uint8_t)n;
        return comm_fail(c, rc, "sending to a server");
      }
      /* a header posted before the payload failed fails in the wait */
      rc = DT_OK;
    }
  }
  c->nreq[k] = (uint8_t)n;
  return DT_OK;
}

static void backoff(int idle) {
  if (idle < 64) return;
  if (idle < 256) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, idle < 2048 ? 20000 : 100000};
  nanosleep(&ts, NULL);
}

/* Key k's reply was to come from a server now lost: the same read (clock,
 * flags, rows) from the next holder, which has every push the lost one had
 * (each push went to both). */
static int reread(dt_ps_client *c, int k) {
  dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .flags = c->rflags[k],
                 .clock = c->rclock[k]};
  const float *rows = NULL;
  if (m.flags & DT_PS_F_ROWS) {
    m.count = (uint64_t)c->knrows[k];
    rows = (const float *)(const void *)(c->rows + c->krow0[k]);
  }
  return request(c, &m, rows, 1);
}

/* Key k's reply is in (its requests complete): checks its header and takes
 * it (a staged one into the parameters). */
static int settle(dt_ps_client *c, int k) {
  if (!(c->kst[k] & K_WAIT)) return DT_OK;
  const dt_ps_key *K = &c->map->keys[k];
  dt_ps_msg m;
  const int from = K->server == c->local_idx ? K->server : c->rfrom[k];
  int rc = dt_ps_msg_parse(c->hin + (size_t)k * DT_PS_HDR_BYTES, DT_PS_HDR_BYTES, c->map,
                           c->o.nworkers, -1, from, &m);
  if (rc == DT_OK && (m.type != DT_PS_PARAMS || m.key != k))
    rc = dt__seterr(DT_EPROTO, "ps: server %d answered key %d with %s for key %d", from, k,
                    dt_ps_type_name(m.type), m.key);
  if (rc == DT_OK && (m.flags & DT_PS_F_ROWS) && (int64_t)m.count != c->knrows[k])
    rc = dt__seterr(DT_EPROTO, "ps: server %d answered a pull of %lld rows of key %d with "
                    "%llu", K->server, (long long)c->knrows[k], k, (unsigned long long)m.count);
  if (rc == DT_OK && (m.flags & DT_PS_F_STATE) &&
      (!c->xbuf || m.count != c->xoff[k + 1] - c->xoff[k]))
    rc = dt__seterr(DT_EPROTO, "ps: server %d sent an unasked or misfit record of key %d",
                    K->server, k);
  if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
  c->kst[k] = (uint8_t)((c->kst[k] & ~K_WAIT) | K_DONE);
  if (m.flags & DT_PS_F_STATE) {
    c->xsteps[k] = (int64_t)m.aux;
    return DT_OK;
  }
  c->kver[k] = m.clock;
  if (m.flags & DT_PS_F_ROWS)
    scatter_rows(c, k, c->rbuf + c->kbuf0[k], m.count);
  else
    c->st.pulled_floats += (int64_t)K->len;
  if (c->kst[k] & K_STAGED) {
    memcpy(c->params + K->off, c->stage + K->off, K->len * sizeof(float));
    c->kst[k] &= (uint8_t)~K_STAGED;
  }
  return DT_OK;
}

/* Lazy replies: takes every key's reply that is in, without waiting
 * (block = 0), or key k's alone, waiting for it (block = 1). */
static int reap(dt_ps_client *c, int k0, int block) {
  int idle = 0;
  for (int k = k0 < 0 ? 0 : k0; k < (k0 < 0 ? c->nk : k0 + 1); k++) {
    for (;;) {
      int pending = 0;
      for (int i = 0; i < c->nreq[k]; i++) {
        bool done = false;
        int rc = dt_comm_test(c->comm, &c->kreq[(size_t)c->nslot * (size_t)k + i], &done);
        if (rc < 0) return comm_fail(c, rc, "waiting for parameters");
        if (!done) pending = 1;
      }
      if (!pending) {
        c->nreq[k] = 0;
        DT_CHECK(settle(c, k));
        break;
      }
      if (!block) break;
      int busy = 0;
      DT_CHECK(poll_local(c, &busy));
      idle = busy ? 0 : idle + 1;
      backoff(idle);
    }
  }
  return DT_OK;
}

/* Waits for every outstanding request and reply; checks reply headers. */
static int wait_all(dt_ps_client *c) {
  int64_t t0 = dt_now_ns();
  int rc = DT_OK;
  if (!c->local) {
    /* each request alone: a failed one (a lost server) cancels no other */
    for (;;) {
      int again = 0;
      for (int k = 0; k < c->nk; k++) {
        dt_comm_req *r = &c->kreq[(size_t)c->nslot * (size_t)k];
        const int *who = &c->kpeer[(size_t)c->nslot * (size_t)k];
        int n = c->nreq[k];
        c->nreq[k] = 0;
        for (int i = 0; i < n; i++) {
          int srv = who[i] < 0 ? -who[i] - 1 : who[i];
          int r1 = dt_comm_waitall(c->comm, &r[i], 1);
          if (r1 == DT_OK) continue;
          if (!survivable(c, r1, srv)) return server_fail(c, r1, srv);
          /* the reply's server was lost: ask the next holder (below) */
          if (who[i] < 0 && (c->kst[k] & K_WAIT)) c->kst[k] |= K_LOST;
        }
        if (c->kst[k] & K_LOST) again = 1;
      }
      if (!again) break;
      for (int k = 0; k < c->nk; k++)
        if (c->kst[k] & K_LOST) {
          c->kst[k] &= (uint8_t)~K_LOST;
          DT_CHECK(reread(c, k));
        }
    }
  } else {
    int idle = 0;
    for (;;) {
      int pending = 0, progressed = 0;
      for (int k = 0; k < c->nk; k++) {
        for (int i = 0; i < c->nreq[k]; i++) {
          bool done = false;
          rc = dt_comm_test(c->comm, &c->kreq[(size_t)c->nslot * (size_t)k + i], &done);
          if (rc < 0) return comm_fail(c, rc, "waiting for parameters");
          if (!done) pending = 1;
        }
        if ((c->kst[k] & K_WAIT) && c->map->keys[k].server == c->local_idx) pending = 1;
      }
      if (!pending) break;
      int busy = 0;
      rc = poll_local(c, &busy);
      if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
      progressed |= busy;
      idle = progressed ? 0 : idle + 1;
      backoff(idle);
    }
    for (int k = 0; k < c->nk; k++) c->nreq[k] = 0;
  }
  /* the remote replies' headers */
  for (int k = 0; k < c->nk; k++) DT_CHECK(settle(c, k));
  c->st.wait_seconds += dt_obs_lap(c->obs, c->m_pull, "pull", 0, t0, -1);
  return DT_OK;
}

int dt_ps_client_start(dt_ps_client *c) {
  uint64_t digest = 0;
  for (int i = 0; i < 8; i++) digest |= (uint64_t)c->map->sha[i] << (8 * i);
  dt_ps_msg h = {.type = DT_PS_HELLO, .sender = c->me, .key = c->map->nkeys,
                 .count = c->map->nparams, .aux = digest, .clock = c->R};
  uint8_t out[DT_PS_HDR_BYTES], in[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&h, out);
  for (int s = 0; s < c->map->nservers; s++) {
    if (s == c->local_idx) {
      int rc = dt_ps_server_local(c->local, &h, NULL);
      if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
      continue;
    }
    int peer = srv_rank(c, s);
    dt_comm_req r[2];
    int rc = dt_comm_irecv(c->comm, peer, DT_PS_TAG_CTL, in, sizeof in, &r[0]);
    if (rc == DT_OK) rc = dt_comm_isend(c->comm, peer, DT_PS_TAG_REQ, out, sizeof out, &r[1]);
    if (c->local) {
      /* keep this worker's own server going while the others say hello */
      int idle = 0;
      for (int i = 0; i < 2 && rc == DT_OK;) {
        bool done = false;
        rc = dt_comm_test(c->comm, &r[i], &done);
        if (rc < 0) break;
        if (done) {
          i++;
          continue;
        }
        int busy = 0;
        rc = poll_local(c, &busy);
        idle = busy ? 0 : idle + 1;
        backoff(idle);
      }
    } else if (rc == DT_OK) {
      rc = dt_comm_waitall(c->comm, r, 2);
    }
    if (rc < 0) return comm_fail(c, rc, "greeting the servers");
    dt_ps_msg w;
    rc = dt_ps_msg_parse(in, sizeof in, c->map, c->o.nworkers, -1, s, &w);
    if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
    if (w.type != DT_PS_WELCOME || w.aux != digest || w.key != c->map->nkeys ||
        w.count != c->map->nparams || w.clock != c->R)
      return dt__seterr(DT_EMISMATCH, "ps worker %d: server %d (rank %d) holds another key-range "
                        "map (%d keys over %llu parameters, digest %016llx; this worker: %d keys "
                        "over %llu, digest %016llx; replicas %lld there, %d here)", c->me, s, peer,
                        w.key, (unsigned long long)w.count, (unsigned long long)w.aux,
                        c->map->nkeys, (unsigned long long)c->map->nparams,
                        (unsigned long long)digest, (long long)w.clock, c->R);
  }
  for (int k = 0; k < c->nk; k++) {
    dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .clock = 0};
    DT_CHECK(request(c, &m, NULL, 1));
  }
  int rc = wait_all(c);
  /* colocated: a worker whose own pulls are answered may go on to a
   * collective (the trace's barrier) while another still waits for this
   * worker's server: nobody leaves before every server answered */
  if (rc == DT_OK && c->local) rc = mark(c, 0);
  /* the server thread starts parked: the first step wakes it */
  if (rc == DT_OK && c->local && c->o.server_thread) {
    c->park = 1;
    rc = start_thread(c);
  }
  return rc;
}

static void begin_impl(dt_ps_client *c, float weight, float lr) {
  if (c->local && !c->threaded) {
    int busy = 0, rc = poll_local(c, &busy);
    if (rc < 0) {
      c->err = rc;
      snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
    }
  }
  /* lazy replies: what came in since the last step goes in before forward */
  if (c->lazy && !c->err) {
    int rc = reap(c, -1, 0);
    if (rc < 0) {
      c->err = rc;
      snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
    }
    for (int k = 0; k < c->nk; k++) c->kfwd[k] = c->kver[k];
  }
  c->weight = weight;
  c->lr = lr;
  c->ready_lo = c->map->nparams;
  c->next_key = c->nk - 1;
  for (int k = 0; k < c->nk; k++) {
    c->kst[k] &= (uint8_t)~K_PUSHED;
    c->knrows[k] = -1;
  }
}

static int rows_impl(dt_ps_client *c, int layer, const int32_t *rows, int n) {
  int k = 0;
  while (k < c->nk && c->map->keys[k].layer != layer) k++;
  if (k == c->nk || c->map->keys[k].rowlen < 2)
    return dt__seterr(DT_EINVAL, "ps worker %d: layer %d is not a layer of rows", c->me, layer + 1);
  const uint64_t base = c->map->keys[k].off, rl = c->map->keys[k].rowlen;
  for (int j = k; j < c->nk && c->map->keys[j].layer == layer; j++) c->knrows[j] = 0;
  for (int i = 0; i < n; i++) {
    uint64_t at = base + (uint64_t)rows[i] * rl;
    while (k < c->nk && c->map->keys[k].layer == layer &&
           at >= c->map->keys[k].off + c->map->keys[k].len)
      k++;
    if (k == c->nk || c->map->keys[k].layer != layer || at < c->map->keys[k].off ||
        (i && rows[i] <= rows[i - 1]))
      return dt__seterr(DT_EINVAL, "ps worker %d: row %d of layer %d is outside it or not in "
                        "increasing order", c->me, (int)rows[i], layer + 1);
    const dt_ps_key *K = &c->map->keys[k];
    c->rows[c->krow0[k] + (size_t)c->knrows[k]++] = (uint32_t)((at - K->off) / rl);
  }
  return DT_OK;
}

static int export_impl(dt_ps_client *c, float *buf, int64_t *steps) {
  size_t *off = malloc(((size_t)c->nk + 1) * sizeof *off);
  if (!off) return dt__seterr(DT_ENOMEM, "ps worker %d: out of memory", c->me);
  off[0] = 0;
  for (int k = 0; k < c->nk; k++)
    off[k + 1] = off[k] + dt_ps_key_state_floats(&c->o, &c->map->keys[k]);
  c->xbuf = buf, c->xoff = off, c->xsteps = steps;
  int rc = DT_OK;
  for (int k = 0; k < c->nk && rc == DT_OK; k++) {
    dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .flags = DT_PS_F_STATE,
                   .clock = c->clock};
    rc = request(c, &m, NULL, 1);
  }
  if (rc == DT_OK) rc = wait_all(c);
  c->xbuf = NULL, c->xoff = NULL, c->xsteps = NULL;
  free(off);
  return rc;
}

static int pull_rows_impl(dt_ps_client *c) {
  if (c->err) return dt__seterr(c->err, "ps worker %d: %s", c->me, c->errmsg);
  for (int k = 0; k < c->nk; k++) {
    if (c->knrows[k] < 0) continue;
    dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .flags = DT_PS_F_ROWS,
                   .clock = c->clock, .count = (uint64_t)c->knrows[k]};
    DT_CHECK(request(c, &m, (const float *)(const void *)(c->rows + c->krow0[k]), 1));
  }
  return wait_all(c);
}

static int push_key(dt_ps_client *c, int k) {
  const dt_ps_key *K = &c->map->keys[k];
  float *g = c->grads + K->off;
  const float w = c->weight;
  if (c->knrows[k] >= 0) {
    /* the named rows only: their numbers, then their scaled gradients */
    const size_t n = (size_t)c->knrows[k], rl = K->rowlen;
    float *buf = c->rbuf + c->kbuf0[k], *vals = buf + n;
    const uint32_t *rows = c->rows + c->krow0[k];
    memcpy(buf, rows, n * sizeof(uint32_t));
    for (size_t j = 0; j < n; j++) {
      const float *src = g + (size_t)rows[j] * rl;
      for (size_t d = 0; d < rl; d++) vals[j * rl + d] = src[d] * w;
    }
    dt_ps_msg m = {.type = DT_PS_PUSH, .sender = c->me, .key = k, .flags = DT_PS_F_ROWS,
                   .clock = c->clock, .count = n, .lr = c->lr, .weight = c->weight,
                   .aux = (uint64_t)c->kver[k]};
    c->kst[k] |= K_PUSHED;
    c->st.pushed_floats += (int64_t)(n * rl);
    return request(c, &m, buf, 0);
  }
  /* lazy: the key's last reply (and its sends) complete before the slot is
   * reused; its parameters go in now (backward is done with this key) */
  if (c->lazy && c->nreq[k]) DT_CHECK(reap(c, k, 1));
  for (size_t i = 0; i < K->len; i++) g[i] *= w;
  dt_ps_msg m = {.type = DT_PS_PUSH, .sender = c->me, .key = k, .flags = DT_PS_F_PULL,
                 .clock = c->clock, .count = K->len, .lr = c->lr, .weight = c->weight,
                 .aux = (uint64_t)(c->lazy ? c->kfwd[k] : c->kver[k])};
  c->kst[k] |= K_PUSHED;
  if (c->resid) {
    /* significance filter (Gaia): accumulate, push the entries whose update
     * would move their parameter by more than `significance` of its size,
     * keep the rest for later steps (error feedback) */
    float *r = c->resid + K->off, *pr = c->pairs + 2 * K->off;
    const float *p = c->params + K->off;
    const float thr = c->o.significance, lr = c->lr;
    uint64_t cnt = 0;
    for (size_t i = 0; i < K->len; i++) {
      float v = r[i] + g[i];
      float pa = p[i] < 0 ? -p[i] : p[i], va = v < 0 ? -v : v;
      if (va * lr > thr * pa && v != 0) {
        uint32_t ix = (uint32_t)i;
        memcpy(&pr[2 * cnt], &ix, sizeof ix);
        pr[2 * cnt + 1] = v;
        cnt++;
        r[i] = 0;
      } else {
        r[i] = v;
      }
    }
    m.flags |= DT_PS_F_SPARSE;
    m.count = cnt;
    c->st.pushed_floats += (int64_t)cnt;
    c->st.skipped_floats += (int64_t)(K->len - cnt);
    return request(c, &m, pr, 1);
  }
  c->st.pushed_floats += (int64_t)K->len;
  return request(c, &m, g, 1);
}

/* push_key, timed (span "push", argument the key) */
static int push_timed(dt_ps_client *c, int k) {
  int64_t t0 = dt_now_ns();
  int rc = push_key(c, k);
  dt_obs_lap(c->obs, c->m_push, "push", 0, t0, k);
  return rc;
}

static void ready_impl(dt_ps_client *c, size_t off, size_t n) {
  if (c->err) return;
  if (c->local && !c->threaded) {
    /* a colocated server answers the other workers while this one is in
     * backward too (its replies to this worker only ever concern keys this
     * worker already pushed, whose layers backward is done with) */
    int busy = 0, rc = poll_local(c, &busy);
    if (rc < 0) {
      c->err = rc;
      snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
      return;
    }
  }
  if (off < c->ready_lo && off + n >= c->ready_lo) c->ready_lo = off;
  while (c->next_key >= 0 && c->map->keys[c->next_key].off >= c->ready_lo) {
    int rc = push_timed(c, c->next_key);
    if (rc < 0) {
      c->err = rc; /* reported by finish */
      snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
      return;
    }
    c->next_key--;
  }
}

static int finish_impl(dt_ps_client *c) {
  if (c->err) return dt__seterr(c->err, "ps worker %d: during backward: %s", c->me, c->errmsg);
  for (; c->next_key >= 0; c->next_key--) DT_CHECK(push_timed(c, c->next_key));
  /* lazy (asp): the replies are taken at the next step's begin */
  if (!c->lazy) DT_CHECK(wait_all(c));
  c->clock++;
  if (c->lost_ns) {
    /* the first clock completed since a server was lost */
    int64_t now = dt_now_ns();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->st.failover_seconds = (double)(now - c->lost_ns) / 1e9;
    c->lost_ns = 0;
    DT_LOG_WARN("ps worker %d: clock %lld completed %.3f s after server %d was lost (at unix "
                "time %.6f)", c->me, (long long)c->clock, c->st.failover_seconds, c->lost_srv,
                (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
  }
  return DT_OK;
}

/* Colocated: tell every server this worker reached mark n (a bye with the
 * final flag ends it), then serve until every worker reached it here. */
static int mark(dt_ps_client *c, uint32_t flags) {
  if (c->lazy) DT_CHECK(wait_all(c));
  c->marks++;
  dt_ps_msg m = {.type = DT_PS_BYE, .sender = c->me, .flags = flags, .clock = c->marks};
  for (int s = 0; s < c->map->nservers; s++) {
    if (s == c->local_idx) {
      int rc = dt_ps_server_local(c->local, &m, NULL);
      if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
      continue;
    }
    if (c->sdead[s]) continue;
    uint8_t h[DT_PS_HDR_BYTES];
    dt_ps_msg_encode(&m, h);
    dt_comm_req r;
    int rc = dt_comm_isend(c->comm, srv_rank(c, s), DT_PS_TAG_REQ, h, sizeof h, &r);
    /* the header is small: sent eagerly, but keep the server going anyway */
    int idle = 0;
    for (bool done = false; rc == DT_OK && !done;) {
      rc = dt_comm_test(c->comm, &r, &done);
      if (rc == DT_OK && !done && c->local) {
        int busy = 0;
        rc = poll_local(c, &busy);
        idle = busy ? 0 : idle + 1;
        backoff(idle);
      } else if (rc == DT_OK && !done) {
        rc = dt_comm_waitall(c->comm, &r, 1);
        done = rc == DT_OK;
      }
    }
    if (rc < 0 && survivable(c, rc, s)) continue;
    if (rc < 0) return comm_fail(c, rc, "telling the servers");
  }
  if (!c->local) return DT_OK;
  int idle = 0;
  while (dt__ps_server_min_mark(c->local) < c->marks) {
    int busy = 0;
    int rc = poll_local(c, &busy);
    if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
    idle = busy ? 0 : idle + 1;
    backoff(idle);
  }
  /* a server thread parks now: a collective on the communicator follows */
  c->park = c->threaded;
  return DT_OK;
}

static int sync_impl(dt_ps_client *c) {
  for (int k = 0; k < c->nk; k++) {
    dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .flags = DT_PS_F_FINAL,
                   .clock = c->clock};
    DT_CHECK(request(c, &m, NULL, 1));
  }
  DT_CHECK(wait_all(c));
  /* colocated: nobody leaves to evaluate while another still waits for
   * this worker's server */
  return c->local ? mark(c, 0) : DT_OK;
}

/* ---- the public calls: with a server thread, each holds the communicator
 * (and wakes the thread, which a mark parked) ---------------------------------- */

static void enter(dt_ps_client *c) {
  if (!c->threaded) return;
  pthread_mutex_lock(&c->mu);
  c->spin = 0;
  if (c->park) {
    c->park = 0;
    pthread_cond_signal(&c->cv);
  }
}
static void leave(dt_ps_client *c) {
  if (c->threaded) pthread_mutex_unlock(&c->mu);
}

void dt_ps_client_begin(dt_ps_client *c, float weight, float lr) {
  enter(c);
  begin_impl(c, weight, lr);
  leave(c);
}
void dt_ps_client_ready(dt_ps_client *c, size_t off, size_t n) {
  enter(c);
  ready_impl(c, off, n);
  leave(c);
}
#define LOCKED(call)    \
  do {                  \
    enter(c);           \
    int rc_ = (call);   \
    leave(c);           \
    return rc_;         \
  } while (0)
int dt_ps_client_rows(dt_ps_client *c, int layer, const int32_t *rows, int n) {
  LOCKED(rows_impl(c, layer, rows, n));
}
int dt_ps_client_pull_rows(dt_ps_client *c) { LOCKED(pull_rows_impl(c)); }
int dt_ps_client_export(dt_ps_client *c, float *buf, int64_t *steps) {
  LOCKED(export_impl(c, buf, steps));
}
int dt_ps_client_finish(dt_ps_client *c) { LOCKED(finish_impl(c)); }
int dt_ps_client_sync(dt_ps_client *c) { LOCKED(sync_impl(c)); }
int dt_ps_client_stop(dt_ps_client *c) { LOCKED(mark(c, DT_PS_F_FINAL)); }
int dt_ps_client_quiesce(dt_ps_client *c) { LOCKED(c->local ? mark(c, 0) : DT_OK); }
#undef LOCKED

void dt_ps_client_stats_get(const dt_ps_client *c, dt_ps_client_stats *out) {
  enter((dt_ps_client *)c);
  *out = c->st;
  leave((dt_ps_client *)c);
}
int64_t dt_ps_client_clock(const dt_ps_client *c) { return c->clock; }

/* The server thread: polls the colocated server whenever the worker is not
 * inside a client call; parks at marks; records a failure for the worker. */
static void *serve_main(void *arg) {
  dt_ps_client *c = arg;
  int idle = 0;
  pthread_mutex_lock(&c->mu);
  while (!c->quit) {
    if (c->park || c->err) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    int busy = 0, rc = dt_ps_server_poll(c->local, &busy);
    if (rc < 0) {
      c->err = rc;
      snprintf(c->errmsg, sizeof c->errmsg, "ps worker %d's server thread: %s", c->me,
               dt_errmsg());
      continue;
    }
    pthread_mutex_unlock(&c->mu);
    idle = busy ? 0 : idle + 1;
    if (idle > 4) {
      struct timespec ts = {0, idle < 64 ? 10000 : 50000};
      nanosleep(&ts, NULL);
    } else if (idle) {
      sched_yield();
    }
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static int start_thread(dt_ps_client *c) {
  if (pthread_mutex_init(&c->mu, NULL)) return dt__seterr(DT_ENOMEM, "ps worker %d: mutex", c->me);
  if (pthread_cond_init(&c->cv, NULL)) {
    pthread_mutex_destroy(&c->mu);
    return dt__seterr(DT_ENOMEM, "ps worker %d: condition variable", c->me);
  }
  c->threaded = 1;
  if (pthread_create(&c->thr, NULL, serve_main, c)) {
    c->threaded = 0;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    return dt__seterr(DT_ENOMEM, "ps worker %d: cannot start the server thread", c->me);
  }
  return DT_OK;
}

static void stop_thread(dt_ps_client *c) {
  if (!c->threaded) return;
  pthread_mutex_lock(&c->mu);
  c->quit = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thr, NULL);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  c->threaded = 0;
}

/*
 * client_wait.c — the worker client's waiting half (client.c sends): the
 * replies that come back (checked, and for lazy asp replies staged until
 * the next step's begin), the waits for them — keeping a colocated server
 * going meanwhile —, the fail-over to a replica when a server is lost,
 * marks (every worker's server has seen every worker reach a point before
 * a collective) and the colocated asp/ssp server thread with the mutex
 * that serialises the communicator between it and the worker.
 *
 * It sends nothing of its own but re-reads after a loss and mark messages.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps/client_int.h"

int64_t dt__ps_server_min_mark(const dt_ps_server *s);

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

void dt__psc_local_reply(void *ud, const dt_ps_msg *m, const float *payload) {
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

int dt__psc_comm_fail(dt_ps_client *c, int rc, const char *what) {
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
                    "[%llu, %llu)): %s", c->me, srv, dt__psc_srv_rank(c, srv), m->srv_key0[srv],
                    m->srv_key0[srv + 1] - 1, (unsigned long long)m->srv_lo[srv],
                    (unsigned long long)m->srv_lo[srv + 1], msg);
}

/* 1 while this process's cgroup allows it less than one core (read every
 * 100 ms: the straggler bench moves a running worker into its cgroup).
 * Polling there is paid for with compute: a throttled worker's spinning in
 * its waits took ~16-20% of its CPU (perf, MLP, 50% quota, 2026-11-28). */
static int quota_check(int64_t *next, int *bound) {
  int64_t now = dt_now_ns();
  if (now >= *next) {
    double q = dt_cpu_quota();
    *bound = q > 0 && q < 1.0;
    *next = now + 100000000;
  }
  return *bound;
}
int dt__psc_quota_bound(dt_ps_client *c) {
  if (!c->qsleep || !quota_check(&c->quota_next, &c->quota_bound)) return 0;
  if (c->qsleep == 1) {
    c->qsleep = 2;
    DT_LOG_INFO("ps worker %d: under a CPU quota of %.2f cores: waits for parameters sleep "
                "between polls (DTRAIN_PS_QUOTA_SLEEP)", c->me, dt_cpu_quota());
  }
  return 1;
}
/* Not with a server thread (colocated ssp/asp): the thread and its worker
 * hand the communicator to each other; sleeping there instead of yielding
 * made colocated ssp under the quota slower (18.7 / 18.4 s to 0.88 against
 * 11.5 / 16.8 s polling, 2026-11-28, load ~25 with boosted cgroups). */

/* One request, sleeping 20 us between tests (under a quota): after a
 * second, the transport's own wait (its deadline and liveness checks). */
static int wait_sleeping(dt_ps_client *c, dt_comm_req *r) {
  const int64_t end = dt_now_ns() + 1000000000;
  for (int n = 0;; n++) {
    bool done = false;
    int rc = dt_comm_test(c->comm, r, &done);
    if (rc < 0 || done) return rc;
    if ((n & 15) == 15 && dt_now_ns() > end) break;
    dt__ps_sleep_ns(20000);
  }
  return dt_comm_waitall(c->comm, r, 1);
}

/* Lets this worker's colocated server make progress while the worker
 * waits: polls it, or with a server thread gives the thread the
 * communicator for a moment (and reports as busy, so the caller does not
 * sleep holding it). */
int dt__psc_poll_local(dt_ps_client *c, int *busy) {
  if (!c->threaded) return dt_ps_server_poll(c->local, busy);
  *busy = 1;
  pthread_mutex_unlock(&c->mu);
  if (c->spin++ < 16) {
    sched_yield();
  } else {
    dt__ps_sleep_ns(20000);
  }
  pthread_mutex_lock(&c->mu);
  if (c->err) return dt__seterr(c->err, "%s", c->errmsg);
  return DT_OK;
}

/* The server that answers reads of key k: the first live one of its
 * range's holders (dt_ps_holders); -1 when every one is lost. */
int dt__psc_holder(const dt_ps_client *c, int k) {
  int hl[DT_PS_MAX_REPLICAS];
  const int r = c->map->keys[k].server;
  if (c->R < 2) return c->sdead[r] ? -1 : r;
  /* a range's first holders are the only ones with its state from the
   * start: if all R of them are lost before a copy was made, the range is */
  int n = dt_ps_holders_late(c->map, r, c->sdead, c->late, hl);
  return n ? hl[0] : -1;
}

/* Server srv is lost (replicas): later requests go to the next holders;
 * the servers hear of it before this worker's next request. */
static void lose(dt_ps_client *c, int srv) {
  if (c->sdead[srv]) return;
  const dt_ps_map *m = c->map;
  int before[DT_PS_MAX_REPLICAS], after[DT_PS_MAX_REPLICAS];
  c->sdead[srv] = 1;
  c->untold = 1;
  c->lost_ns = dt_now_ns();
  c->lost_srv = srv;
  c->st.failovers++;
  DT_LOG_WARN("ps worker %d: server %d (rank %d) lost at clock %lld: %s", c->me, srv,
              dt__psc_srv_rank(c, srv), (long long)c->clock, dt_errmsg());
  for (int g = 0; g < m->nservers; g++) {
    if (m->srv_key0[g] == m->srv_key0[g + 1]) continue;
    c->sdead[srv] = 0;
    int nb = dt_ps_holders_late(m, g, c->sdead, c->late, before);
    c->sdead[srv] = 1;
    int na = dt_ps_holders_late(m, g, c->sdead, c->late, after);
    int had = 0;
    for (int j = 0; j < nb; j++) had |= before[j] == srv;
    if (!had || !na) continue;
    if (before[0] == srv)
      DT_LOG_WARN("ps worker %d: keys %d-%d (server %d's range) are now read from server %d",
                  c->me, m->srv_key0[g], m->srv_key0[g + 1] - 1, g, after[0]);
    if (na == nb)
      DT_LOG_WARN("ps worker %d: keys %d-%d (server %d's range) get a new copy on server %d",
                  c->me, m->srv_key0[g], m->srv_key0[g + 1] - 1, g, after[na - 1]);
    else
      DT_LOG_WARN("ps worker %d: keys %d-%d (server %d's range) now run on %d cop%s: no free "
                  "server for a new one (%d servers, %d replicas)", c->me, m->srv_key0[g],
                  m->srv_key0[g + 1] - 1, g, na, na == 1 ? "y" : "ies", m->nservers, c->R);
  }
}

/* Tells every live server of each loss not told yet (DT_PS_LOST), before
 * anything else is sent: a server that gets a later push of this worker
 * knows who else holds its range, and a range's primary knows from which
 * point on this worker's pushes reach a new holder too. */
int dt__psc_tell_losses(dt_ps_client *c) {
  while (c->untold) {
    c->untold = 0;
    for (int d = 0; d < c->map->nservers; d++) {
      if (!c->sdead[d] || c->stold[d]) continue;
      c->stold[d] = 1;
      dt_ps_msg m = {.type = DT_PS_LOST, .sender = c->me, .aux = (uint64_t)d};
      uint8_t h[DT_PS_HDR_BYTES];
      dt_ps_msg_encode(&m, h);
      for (int s = 0; s < c->map->nservers; s++) {
        if (c->sdead[s]) continue;
        dt_comm_req r;
        int rc = dt_comm_isend(c->comm, dt__psc_srv_rank(c, s), DT_PS_TAG_REQ, h, sizeof h, &r);
        if (rc == DT_OK) rc = dt_comm_waitall(c->comm, &r, 1);
        if (rc < 0 && !dt__psc_survivable(c, rc, s))
          return dt__psc_comm_fail(c, rc, "telling the servers of a lost one");
      }
    }
  }
  return DT_OK;
}

/* A failed request to srv: with replicas, a lost server is survivable. */
int dt__psc_survivable(dt_ps_client *c, int rc, int srv) {
  if (c->R < 2 || rc != DT_EPEERLOST || srv < 0) return 0;
  lose(c, srv);
  return 1;
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
  return dt__psc_request(c, &m, rows, 1);
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
  if (m.flags & DT_PS_F_WIN) c->st.win_received += (int64_t)(K->len * sizeof(float));
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
int dt__psc_reap(dt_ps_client *c, int k0, int block) {
  int idle = 0;
  for (int k = k0 < 0 ? 0 : k0; k < (k0 < 0 ? c->nk : k0 + 1); k++) {
    for (;;) {
      int pending = 0;
      for (int i = 0; i < c->nreq[k]; i++) {
        bool done = false;
        int rc = dt_comm_test(c->comm, &c->kreq[(size_t)c->nslot * (size_t)k + i], &done);
        if (rc < 0) return dt__psc_comm_fail(c, rc, "waiting for parameters");
        if (!done) pending = 1;
      }
      if (!pending) {
        c->nreq[k] = 0;
        DT_CHECK(settle(c, k));
        break;
      }
      if (!block) break;
      int busy = 0;
      DT_CHECK(dt__psc_poll_local(c, &busy));
      idle = busy ? 0 : idle + 1;
      dt__ps_backoff(idle);
    }
  }
  return DT_OK;
}

/* Waits for every outstanding request and reply; checks reply headers. */
int dt__psc_wait_all(dt_ps_client *c) {
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
          int r1 = dt__psc_quota_bound(c) ? wait_sleeping(c, &r[i])
                                          : dt_comm_waitall(c->comm, &r[i], 1);
          if (r1 == DT_OK) continue;
          if (!dt__psc_survivable(c, r1, srv)) return server_fail(c, r1, srv);
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
          if (rc < 0) return dt__psc_comm_fail(c, rc, "waiting for parameters");
          if (!done) pending = 1;
        }
        if ((c->kst[k] & K_WAIT) && c->map->keys[k].server == c->local_idx) pending = 1;
      }
      if (!pending) break;
      int busy = 0;
      rc = dt__psc_poll_local(c, &busy);
      if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
      progressed |= busy;
      idle = progressed ? 0 : idle + 1;
      if (idle && !c->threaded && dt__psc_quota_bound(c)) dt__ps_sleep_ns(20000);
      else dt__ps_backoff(idle);
    }
    for (int k = 0; k < c->nk; k++) c->nreq[k] = 0;
  }
  /* the remote replies' headers */
  for (int k = 0; k < c->nk; k++) DT_CHECK(settle(c, k));
  c->st.wait_seconds += dt_obs_lap(c->obs, c->m_pull, "pull", 0, t0, -1);
  return DT_OK;
}

int dt_ps_client_probe(dt_ps_client *c) {
  if (c->local) return DT_OK;
  dt_ps_msg h = dt__psc_hello(c);
  uint8_t out[DT_PS_HDR_BYTES], in[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&h, out);
  for (int s = 0; s < c->map->nservers; s++) {
    if (c->sdead[s]) continue;
    const int peer = dt__psc_srv_rank(c, s);
    dt_comm_req r[2];
    int n = 0;
    int rc = dt_comm_irecv(c->comm, peer, DT_PS_TAG_CTL, in, sizeof in, &r[n]);
    if (rc == DT_OK) n++, rc = dt_comm_isend(c->comm, peer, DT_PS_TAG_REQ, out, sizeof out, &r[n]);
    if (rc == DT_OK) n++;
    /* the transport's own wait: its liveness checks, its deadline */
    if (n) {
      int r2 = dt_comm_waitall(c->comm, r, n);
      if (rc == DT_OK) rc = r2;
    }
    if (rc < 0 && dt__psc_survivable(c, rc, s)) continue;
    if (rc < 0) return server_fail(c, rc, s);
  }
  return DT_OK;
}

/* Colocated: tell every server this worker reached mark n (a bye with the
 * final flag ends it), then serve until every worker reached it here. */
int dt__psc_mark(dt_ps_client *c, uint32_t flags) {
  if (c->lazy) DT_CHECK(dt__psc_wait_all(c));
  if (c->untold) DT_CHECK(dt__psc_tell_losses(c));
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
    int rc = dt_comm_isend(c->comm, dt__psc_srv_rank(c, s), DT_PS_TAG_REQ, h, sizeof h, &r);
    /* the header is small: sent eagerly, but keep the server going anyway */
    int idle = 0;
    for (bool done = false; rc == DT_OK && !done;) {
      rc = dt_comm_test(c->comm, &r, &done);
      if (rc == DT_OK && !done && c->local) {
        int busy = 0;
        rc = dt__psc_poll_local(c, &busy);
        idle = busy ? 0 : idle + 1;
        dt__ps_backoff(idle);
      } else if (rc == DT_OK && !done) {
        rc = dt_comm_waitall(c->comm, &r, 1);
        done = rc == DT_OK;
      }
    }
    if (rc < 0 && dt__psc_survivable(c, rc, s)) continue;
    if (rc < 0) return dt__psc_comm_fail(c, rc, "telling the servers");
  }
  if (!c->local) return DT_OK;
  int idle = 0;
  while (dt__ps_server_min_mark(c->local) < c->marks) {
    int busy = 0;
    int rc = dt__psc_poll_local(c, &busy);
    if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
    idle = busy ? 0 : idle + 1;
    dt__ps_backoff(idle);
  }
  /* a server thread parks now: a collective on the communicator follows */
  c->park = c->threaded;
  return DT_OK;
}

void dt__psc_enter(dt_ps_client *c) {
  if (!c->threaded) return;
  pthread_mutex_lock(&c->mu);
  c->spin = 0;
  if (c->park) {
    c->park = 0;
    pthread_cond_signal(&c->cv);
  }
}
void dt__psc_leave(dt_ps_client *c) {
  if (c->threaded) pthread_mutex_unlock(&c->mu);
}

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
      dt__ps_sleep_ns(idle < 64 ? 10000 : 50000);
    } else if (idle) {
      sched_yield();
    }
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

int dt__psc_start_thread(dt_ps_client *c) {
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

void dt__psc_stop_thread(dt_ps_client *c) {
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

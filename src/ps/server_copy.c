/*
 * server_copy.c — re-replication (docs/ps.md "Replicated shards"): when a
 * server is lost, each key range it held gets a new holder if a live
 * server outside the range's holders is left (dt_ps_holders: the first R
 * live servers of g, g+1, ..., g+S-1). The range's primary sends the new
 * holder a copy of every key — parameters, optimizer state and step
 * count, version, each worker's push clock — taken once every worker has
 * told it of the loss (DT_PS_LOST, which a worker sends before its next
 * push, so every later push of the range goes to the new holder too) and,
 * in bsp, at a clock boundary (no push of the open clock in). The new
 * holder keeps the messages of the range that reach it before its copy
 * (queued, payload and all), installs the copy, drops the pushes the copy
 * already holds (a clock below the copy's clock of that worker) and then
 * goes on as a replica. In bsp its state is the primary's bit for bit, so
 * the job survives the loss of that primary too with the same
 * params_sha256.
 *
 * It does not detect losses (the workers' requests fail and they say so),
 * and nothing here stalls a worker: the primary serves on while its copy
 * is on its way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/server_int.h"

static int nrep(const dt_ps_server *s) { return s->map->replicas > 1 ? s->map->replicas : 1; }
static int empty(const dt_ps_map *m, int g) { return m->srv_key0[g] == m->srv_key0[g + 1]; }
static int in(const int *l, int n, int x) {
  for (int i = 0; i < n; i++)
    if (l[i] == x) return 1;
  return 0;
}
static size_t rec_floats(const dt_ps_server *s, const skey *k) {
  return dt_ps_key_state_floats(&s->o, k->K) + 2 * (size_t)s->N; /* + N int64 clocks */
}

int dt__pss_copy_init(dt_ps_server *s) {
  const int S = s->map->nservers, R = nrep(s), N = s->N;
  s->dead = calloc((size_t)S, 1);
  s->told = calloc((size_t)N * (size_t)S, 1);
  s->hold = malloc((size_t)(S + 1) * (size_t)R * sizeof *s->hold); /* + a scratch row */
  s->nhold = malloc((size_t)S * sizeof *s->nhold);
  s->cp_want = calloc((size_t)S * (size_t)S, 1);
  s->cp_from = malloc((size_t)S * sizeof *s->cp_from);
  s->cp_left = calloc((size_t)S, sizeof *s->cp_left);
  s->late = calloc((size_t)S, 1);
  s->rj_told = calloc((size_t)N, sizeof *s->rj_told);
  if (!s->late || !s->rj_told || !s->dead || !s->told || !s->hold || !s->nhold || !s->cp_want || !s->cp_from || !s->cp_left)
    return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
  for (int g = 0; g < S; g++) {
    s->nhold[g] = dt_ps_holders(s->map, g, NULL, s->hold + (size_t)g * R);
    s->cp_from[g] = -1;
  }
  s->cp = 1;
  return DT_OK;
}

void dt__pss_copy_free(dt_ps_server *s) {
  free(s->dead);
  free(s->told);
  free(s->hold);
  free(s->nhold);
  free(s->cp_want);
  free(s->cp_from);
  free(s->cp_left);
  free(s->late);
  free(s->rj_told);
  for (int i = 0; i < s->nq; i++) dt_free(s->q[i].data);
  free(s->q);
}

static int rank_of(const dt_ps_server *s, int srv) { return dt_ps_server_rank(&s->o, srv); }

/* Range g's keys, now held here, never get their copy: a push is dropped,
 * a read ends the job (server.c). */
static void range_lost(dt_ps_server *s, int g, const char *why) {
  const dt_ps_map *m = s->map;
  for (int key = m->srv_key0[g]; key < m->srv_key0[g + 1]; key++) {
    skey *k = dt__pss_key(s, key);
    if (k->live == 0) k->live = -1, k->cbusy = 0;
  }
  s->cp_from[g] = -1;
  DT_LOG_ERR("ps server %d: keys %d-%d (server %d's range) have no copy here: %s", s->index,
               m->srv_key0[g], m->srv_key0[g + 1] - 1, g, why);
}

/* This server is a new holder of range g: its keys, waiting for their
 * copies from server src (posted now; a push that comes first is queued). */
int dt__pss_take_range(dt_ps_server *s, int g, int src, int src_has_it) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers;
  for (int key = m->srv_key0[g]; key < m->srv_key0[g + 1]; key++) {
    skey *k = &s->keys[s->nk];
    k->own = dt_alloc(m->keys[key].len * sizeof(float));
    if (!k->own) return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
    k->p = k->own;
    DT_CHECK(dt__pss_key_init(s, k, key));
    s->kpos[key] = s->nk++;
    k->live = 0;
    k->cbuf = dt_alloc(rec_floats(s, k) * sizeof(float));
    k->creq = calloc(2 * (size_t)S, sizeof *k->creq);
    k->cpend = calloc(2 * (size_t)S, 1);
    if (!k->cbuf || !k->creq || !k->cpend)
      return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
    if (!src_has_it) continue;
    int rc = dt_comm_irecv(s->comm, rank_of(s, src), DT_PS_TAG_KEY(key), k->chdr,
                           DT_PS_HDR_BYTES, &k->creq[0]);
    if (rc == DT_OK)
      rc = dt_comm_irecv(s->comm, rank_of(s, src), DT_PS_TAG_KEY(key) + 1, k->cbuf,
                         rec_floats(s, k) * sizeof(float), &k->creq[1]);
    if (rc < 0 && rc != DT_EPEERLOST)
      return dt__seterr(rc, "ps server %d: waiting for a copy from server %d: %s", s->index, src,
                        dt_comm_errmsg(s->comm));
    k->cpend[0] = k->cpend[1] = 1;
    k->cbusy = 2;
  }
  s->cp_from[g] = src;
  s->cp_left[g] = m->srv_key0[g + 1] - m->srv_key0[g];
  if (!src_has_it) {
    range_lost(s, g, "every server that held it is lost");
    return DT_OK;
  }
  DT_LOG_WARN("ps server %d: takes a copy of keys %d-%d (server %d's range) from server %d",
              s->index, m->srv_key0[g], m->srv_key0[g + 1] - 1, g, src);
  return DT_OK;
}

int dt__pss_lost(dt_ps_server *s, int w, int d) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers, R = nrep(s), me = s->index;
  if (d == me) {
    DT_LOG_WARN("ps server %d: worker %d counts this server as lost", me, w);
    return DT_OK;
  }
  s->told[(size_t)w * S + d] = 1;
  if (s->dead[d]) return DT_OK;
  s->dead[d] = 1;
  s->cp_t0 = dt_now_ns();
  int *nw = s->hold + (size_t)S * R;
  for (int g = 0; g < S; g++) {
    if (empty(m, g)) continue;
    int *old = s->hold + (size_t)g * R, no = s->nhold[g];
    int nn = dt_ps_holders_late(m, g, s->dead, s->late, nw);
    const int was = in(old, no, me), is = in(nw, nn, me);
    s->cp_want[(size_t)g * S + d] = 0;
    if (is && nw[0] == me && in(old, no, d)) {
      int added = 0;
      for (int j = 0; j < nn; j++)
        if (!in(old, no, nw[j])) {
          s->cp_want[(size_t)g * S + nw[j]] = 1;
          added = 1;
          DT_LOG_WARN("ps server %d: server %d is lost; keys %d-%d (server %d's range) get a "
                      "new copy on server %d once every worker knows", me, d, m->srv_key0[g],
                      m->srv_key0[g + 1] - 1, g, nw[j]);
        }
      if (!added)
        DT_LOG_WARN("ps server %d: server %d is lost; keys %d-%d (server %d's range) now run on "
                    "%d cop%s: no free server for a new one (%d servers, %d replicas)", me, d,
                    m->srv_key0[g], m->srv_key0[g + 1] - 1, g, nn, nn == 1 ? "y" : "ies", S, R);
    }
    if (is && !was) {
      DT_CHECK(dt__pss_take_range(s, g, nw[0], in(old, no, nw[0])));
    } else if (is && s->cp_from[g] == d) {
      range_lost(s, g, "the server sending its copy is lost");
    }
    memcpy(old, nw, (size_t)nn * sizeof *nw);
    s->nhold[g] = nn;
  }
  return DT_OK;
}

/* Range g may be copied now: every worker has told of every loss this
 * server knows (or is done), no earlier copy is on its way, and in bsp no
 * push of the open clock is in. */
static int copy_ready(const dt_ps_server *s, int g) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers;
  for (int key = m->srv_key0[g]; key < m->srv_key0[g + 1]; key++) {
    const skey *k = &s->keys[s->kpos[key]];
    if (k->live != 1 || k->cbusy || (s->o.consistency == DT_PS_BSP && k->narr)) return 0;
  }
  for (int w = 0; w < s->N; w++) {
    if (s->bye[w]) continue;
    for (int d = 0; d < S; d++)
      if (s->dead[d] && !s->told[(size_t)w * S + d]) return 0;
  }
  return 1;
}

/* The copy of range g, as it is now, to every server waiting for it. */
static int send_copy(dt_ps_server *s, int g) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers, N = s->N;
  int to[64], nt = 0;
  for (int t = 0; t < S && nt < 64; t++)
    if (s->cp_want[(size_t)g * S + t]) to[nt++] = t, s->cp_want[(size_t)g * S + t] = 0;
  uint64_t floats = 0;
  int64_t clock = 0;
  for (int key = m->srv_key0[g]; key < m->srv_key0[g + 1]; key++) {
    skey *k = dt__pss_key(s, key);
    const size_t len = k->K->len, n = dt_ps_key_state_floats(&s->o, k->K);
    if (dt_optim_state_floats(k->opt) != n - len)
      return dt__seterr(DT_EINVAL, "ps server %d: key %d holds %zu optimizer floats, not %zu",
                        s->index, key, dt_optim_state_floats(k->opt), n - len);
    if (!k->cbuf) k->cbuf = dt_alloc(rec_floats(s, k) * sizeof(float));
    if (!k->creq) k->creq = calloc(2 * (size_t)S, sizeof *k->creq);
    if (!k->cpend) k->cpend = calloc(2 * (size_t)S, 1);
    if (!k->cbuf || !k->creq || !k->cpend)
      return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
    DT_CHECK(dt__pss_settle(s, k)); /* (replies sent from the parameters) */
    memcpy(k->cbuf, k->p, len * sizeof(float));
    if (n > len) memcpy(k->cbuf + len, dt_optim_state(k->opt), (n - len) * sizeof(float));
    memcpy(k->cbuf + n, k->wclock, (size_t)N * sizeof(int64_t));
    dt_ps_msg h = {.type = DT_PS_COPY, .sender = s->index, .key = key, .clock = k->version,
                   .count = n, .aux = (uint64_t)*dt_optim_step_count(k->opt),
                   .flags = (uint32_t)(k->rowmode + 1)};
    dt_ps_msg_encode(&h, k->chdr);
    for (int j = 0; j < nt; j++) {
      int rc = dt_comm_isend(s->comm, rank_of(s, to[j]), DT_PS_TAG_KEY(key), k->chdr,
                             DT_PS_HDR_BYTES, &k->creq[2 * j]);
      if (rc == DT_OK) {
        k->cpend[2 * j] = 1, k->cbusy++;
        rc = dt_comm_isend(s->comm, rank_of(s, to[j]), DT_PS_TAG_KEY(key) + 1, k->cbuf,
                           rec_floats(s, k) * sizeof(float), &k->creq[2 * j + 1]);
        if (rc == DT_OK) k->cpend[2 * j + 1] = 1, k->cbusy++;
      }
      if (rc < 0 && rc != DT_EPEERLOST)
        return dt__seterr(rc, "ps server %d: sending a copy to server %d: %s", s->index, to[j],
                          dt_comm_errmsg(s->comm));
    }
    floats += n;
    clock = k->version;
  }
  for (int j = 0; j < nt; j++)
    DT_LOG_WARN("ps server %d: copies keys %d-%d (server %d's range: %llu floats with the "
                "optimizer state) to server %d at clock %lld, %.3f s after the loss was reported",
                s->index, m->srv_key0[g], m->srv_key0[g + 1] - 1, g, (unsigned long long)floats,
                to[j], (long long)clock, (double)(dt_now_ns() - s->cp_t0) / 1e9);
  return DT_OK;
}

/* Key k's copy is in (from server src): it becomes what src had. */
static int install(dt_ps_server *s, skey *k, int src) {
  dt_ps_msg h;
  DT_CHECK(dt_ps_msg_parse_copy(k->chdr, DT_PS_HDR_BYTES, s->map, src, &h));
  const size_t len = k->K->len, n = dt_ps_key_state_floats(&s->o, k->K);
  if (h.key != k->idx || h.count != n || dt_optim_state_floats(k->opt) != n - len)
    return dt__seterr(DT_EPROTO, "ps server %d: server %d sent a copy of key %d with %llu floats "
                      "for key %d of %zu", s->index, src, h.key, (unsigned long long)h.count,
                      k->idx, n);
  memcpy(k->p, k->cbuf, len * sizeof(float));
  if (n > len) memcpy(dt_optim_state(k->opt), k->cbuf + len, (n - len) * sizeof(float));
  *dt_optim_step_count(k->opt) = (int64_t)h.aux;
  memcpy(k->wclock, k->cbuf + n, (size_t)s->N * sizeof(int64_t));
  k->version = h.clock;
  k->rowmode = (int)h.flags - 1;
  k->live = 1;
  k->copied = 1;
  return DT_OK;
}

/* Requests of key k's copy: tested; *failed set when a peer was lost. */
static int test_copy(dt_ps_server *s, skey *k, int *failed) {
  for (int i = 0; i < 2 * s->map->nservers && k->cbusy; i++) {
    if (!k->cpend[i]) continue;
    bool done = false;
    int rc = dt_comm_test(s->comm, &k->creq[i], &done);
    if (rc == DT_EPEERLOST) *failed = 1, done = true;
    else if (rc < 0)
      return dt__seterr(rc, "ps server %d: copying key %d: %s", s->index, k->idx,
                        dt_comm_errmsg(s->comm));
    if (done) k->cpend[i] = 0, k->cbusy--;
  }
  return DT_OK;
}

/* Queued messages whose key is in now, in arrival order (per worker and
 * key), a bsp push only once its clock is open. */
static int drain(dt_ps_server *s, int *busy) {
  for (int again = 1; again;) {
    again = 0;
    for (int i = 0; i < s->nq; i++) {
      pss_queued *e = &s->q[i];
      int blocked = 0;
      for (int j = 0; j < i && !blocked; j++)
        blocked = s->q[j].w == e->w && s->q[j].m.key == e->m.key;
      const skey *k = dt__pss_key(s, e->m.key);
      if (blocked || k->live == 0) continue;
      if (k->live == 1 && s->o.consistency == DT_PS_BSP && e->m.type == DT_PS_PUSH &&
          e->m.clock >= k->wclock[e->w] && e->m.clock > k->version)
        continue;
      pss_queued x = *e;
      memmove(e, e + 1, (size_t)(s->nq - i - 1) * sizeof *e);
      s->nq--;
      i--;
      int rc = dt__pss_handle(s, x.w, &x.m, x.data);
      dt_free(x.data);
      if (rc < 0) return rc;
      *busy = again = 1;
    }
  }
  return DT_OK;
}

int dt__pss_copy_poll(dt_ps_server *s, int *busy) {
  const dt_ps_map *m = s->map;
  const int S = m->nservers;
  for (int g = 0; g < S; g++) {
    if (empty(m, g) || s->kpos[m->srv_key0[g]] < 0) continue;
    int want = 0;
    for (int t = 0; t < S; t++) want |= s->cp_want[(size_t)g * S + t];
    for (int key = m->srv_key0[g]; key < m->srv_key0[g + 1]; key++) {
      skey *k = dt__pss_key(s, key);
      if (!k->cbusy) continue;
      int failed = 0, was = k->live;
      DT_CHECK(test_copy(s, k, &failed));
      if (was != 0) continue; /* a copy sent: a lost target is the workers' news */
      if (failed) {
        range_lost(s, g, "the server sending its copy is lost");
        *busy = 1;
        break;
      }
      if (k->cbusy) continue;
      DT_CHECK(install(s, k, s->cp_from[g]));
      *busy = 1;
      if (--s->cp_left[g] == 0) {
        DT_LOG_WARN("ps server %d: holds its copy of keys %d-%d (server %d's range) from clock "
                    "%lld on, from server %d, %.3f s after the loss was reported", s->index,
                    m->srv_key0[g], m->srv_key0[g + 1] - 1, g, (long long)k->version,
                    s->cp_from[g], (double)(dt_now_ns() - s->cp_t0) / 1e9);
        s->cp_from[g] = -1;
      }
    }
    if (want && copy_ready(s, g)) {
      DT_CHECK(send_copy(s, g));
      *busy = 1;
    }
  }
  return s->nq ? drain(s, busy) : DT_OK;
}

int dt__pss_must_queue(const dt_ps_server *s, int w, const dt_ps_msg *m) {
  if (m->type != DT_PS_PUSH && m->type != DT_PS_PULL) return 0;
  const int i = s->kpos[m->key];
  if (i < 0) return 0;
  if (s->keys[i].live == 0) return 1;
  for (int j = 0; j < s->nq; j++)
    if (s->q[j].w == w && s->q[j].m.key == m->key) return 1;
  return 0;
}

int dt__pss_enqueue(dt_ps_server *s, int w, const dt_ps_msg *m, float *data) {
  if (s->nq == s->capq) {
    int cap = s->capq ? 2 * s->capq : 16;
    pss_queued *q = realloc(s->q, (size_t)cap * sizeof *q);
    if (!q) {
      dt_free(data);
      return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
    }
    s->q = q, s->capq = cap;
  }
  s->q[s->nq++] = (pss_queued){.w = w, .m = *m, .data = data};
  return DT_OK;
}

void dt__pss_copy_finish(dt_ps_server *s) {
  /* copies still on their way: their buffers stay until the transport is
   * done with them (a lost target fails them) */
  for (int i = 0; i < s->nk; i++) {
    skey *k = &s->keys[i];
    if (k->live != 1) continue;
    for (int j = 0; j < 2 * s->map->nservers && k->cbusy; j++)
      if (k->cpend[j]) {
        (void)dt_comm_waitall(s->comm, &k->creq[j], 1);
        k->cpend[j] = 0, k->cbusy--;
      }
  }
}

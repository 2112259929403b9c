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
 * Lazy replies (colocated asp): a push's reply is staged and taken at the
 * next step's begin (or before the key's next push), so the end of a step
 * waits for nothing; the version the forward read travels with the push.
 *
 * Direct asp (dt_ps_opts.direct, colocated asp with windows): a push is
 * applied by this thread to the key's master copy in the shared table
 * (direct.c) and its new parameters taken at once; a key another worker
 * holds is put off and tried again later in backward. No server thread,
 * no messages during steps.
 *
 * Windows (dt_ps_opts.win_params): this worker's parameters and gradients
 * are in shared memory every server maps; dense pushes and their replies
 * then send headers only (flag WIN): the server reads the gradient where
 * backward left it and writes the parameters where forward reads them.
 *
 * This file sends (requests, pushes, pulls, the steps, the public calls);
 * client_wait.c takes replies, waits, fails over, marks and runs the
 * server thread. It does not apply any optimizer: the parameters come
 * from the servers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps/client_int.h"

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
  c->stold = calloc((size_t)map->nservers, 1);
  c->late = calloc((size_t)map->nservers, 1);
  c->kst = calloc((size_t)c->nk, 1);
  c->nreq = calloc((size_t)c->nk, 1);
  c->kver = calloc((size_t)c->nk, sizeof *c->kver);
  c->kfwd = calloc((size_t)c->nk, sizeof *c->kfwd);
  c->lazy = local && opts->consistency == DT_PS_ASP && c->R == 1 && !opts->direct &&
            dt_param(DT_PARAM_PS_LAZY);
  c->qsleep = dt_param(DT_PARAM_PS_QUOTA_SLEEP) != 0;
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
      !c->sdead || !c->stold || !c->late || !c->kst || !c->nreq || !c->kver || !c->kfwd || (c->lazy && !c->stage) ||
      !c->knrows ||
      !c->krow0 || !c->kbuf0 || !c->rows || !c->rbuf ||
      (opts->significance > 0 && (!c->resid || !c->pairs))) {
    dt_ps_client_destroy(c);
    return dt__seterr(DT_ENOMEM, "ps client: out of memory");
  }
  if (local) dt_ps_server_set_local(local, worker, dt__psc_local_reply, c);
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

void dt_ps_client_destroy(dt_ps_client *c) {
  if (!c) return;
  dt__psc_stop_thread(c);
  free(c->hout);
  free(c->hin);
  free(c->kreq);
  free(c->kpeer);
  free(c->rclock);
  free(c->rflags);
  free(c->rfrom);
  free(c->sdead);
  free(c->stold);
  free(c->late);
  for (int i = 0; i < c->rj_n; i++) dt_comm_destroy(c->rj_comms[i]);
  free(c->rj_comms);
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

/* Sends request m for key k (to its range's holder; a push to every live
 * holder, the reply asked of the first); a reply is expected when expect
 * is set (posted first, into the parameters). */
int dt__psc_request(dt_ps_client *c, const dt_ps_msg *m, const float *payload, int expect) {
  if (c->untold) DT_CHECK(dt__psc_tell_losses(c));
  int k = m->key;
  const dt_ps_key *K = &c->map->keys[k];
  if (expect) c->kst[k] = (uint8_t)((c->kst[k] & ~K_DONE) | K_WAIT);
  if (K->server == c->local_idx) {
    int rc = dt_ps_server_local(c->local, m, payload);
    return rc < 0 ? dt__preerr(rc, "ps worker %d", c->me) : DT_OK;
  }
  /* windows: a dense push stays in this worker's gradients and a dense
   * reply is written into its parameters by the server; only the headers
   * travel (a lazy push's reply goes to the staging buffer: the transport) */
  dt_ps_msg mw;
  if (c->o.win_params && !(m->flags & (DT_PS_F_SPARSE | DT_PS_F_ROWS | DT_PS_F_STATE)) &&
      !(c->lazy && m->type == DT_PS_PUSH)) {
    mw = *m;
    mw.flags |= DT_PS_F_WIN;
    m = &mw;
    payload = NULL;
  }
  const int win = (m->flags & DT_PS_F_WIN) != 0;
  if (win && m->type == DT_PS_PUSH) c->st.win_sent += (int64_t)(K->len * sizeof(float));
  const int h = dt__psc_holder(c, k);
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
    int peer = dt__psc_srv_rank(c, h);
    void *dst = NULL;
    size_t len = 0;
    /* rows come into the key's staging buffer, then go to their places */
    if (m->flags & DT_PS_F_STATE)
      dst = c->xbuf + c->xoff[k], len = (c->xoff[k + 1] - c->xoff[k]) * sizeof(float);
    else if (rows && m->count)
      dst = c->rbuf + c->kbuf0[k], len = m->count * K->rowlen * sizeof(float);
    else if (!rows && c->lazy && m->type == DT_PS_PUSH)
      dst = c->stage + K->off, len = K->len * sizeof(float), c->kst[k] |= K_STAGED;
    else if (!rows && !win)
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
    if (rc < 0 && !dt__psc_survivable(c, rc, h)) {
      c->nreq[k] = (uint8_t)n;
      return dt__psc_comm_fail(c, rc, "posting a receive from a server");
    }
    if (rc < 0) c->kst[k] |= K_LOST;
    rc = DT_OK;
  }
  size_t bytes = (m->flags & DT_PS_F_SPARSE ? 2 : 1) * m->count * sizeof(float);
  if (rows) bytes = m->count * (m->type == DT_PS_PUSH ? 1 + K->rowlen : 1) * sizeof(float);
  /* a push goes to every live holder (each applies it); a read to one */
  /* (the holders as this worker sees them: a loss adds a new one,
   * dt_ps_holders; every loss is told to the servers before this) */
  int hl[DT_PS_MAX_REPLICAS];
  const int nh = dt_ps_holders_late(c->map, K->server, c->sdead, c->late, hl);
  const int fan = m->type == DT_PS_PUSH ? nh : 1;
  for (int j = 0; j < fan; j++) {
    int t = hl[j];
    if (fan == 1) t = h;
    if (c->sdead[t]) continue;
    dt_ps_msg mm = *m;
    if (t != h) mm.flags &= ~DT_PS_F_PULL;
    uint8_t *hd = c->hout + ((size_t)k * (size_t)c->R + (size_t)j) * DT_PS_HDR_BYTES;
    dt_ps_msg_encode(&mm, hd);
    int peer = dt__psc_srv_rank(c, t);
    rc = dt_comm_isend(c->comm, peer, DT_PS_TAG_REQ, hd, DT_PS_HDR_BYTES, &r[n]);
    if (rc == DT_OK) who[n++] = t;
    if (rc == DT_OK && payload && bytes) {
      rc = dt_comm_isend(c->comm, peer, DT_PS_TAG_REQ_DATA, payload, bytes, &r[n]);
      if (rc == DT_OK) who[n++] = t;
    }
    if (rc < 0) {
      if (!dt__psc_survivable(c, rc, t)) {
        c->nreq[k] = (uint8_t)n;
        return dt__psc_comm_fail(c, rc, "sending to a server");
      }
      /* a header posted before the payload failed fails in the wait */
      rc = DT_OK;
    }
  }
  c->nreq[k] = (uint8_t)n;
  return DT_OK;
}

dt_ps_msg dt__psc_hello(const dt_ps_client *c) {
  uint64_t digest = 0;
  for (int i = 0; i < 8; i++) digest |= (uint64_t)c->map->sha[i] << (8 * i);
  return (dt_ps_msg){.type = DT_PS_HELLO, .sender = c->me, .key = c->map->nkeys,
                     .count = c->map->nparams, .aux = digest, .clock = c->R};
}

int dt_ps_client_start(dt_ps_client *c) {
  dt_ps_msg h = dt__psc_hello(c);
  uint8_t out[DT_PS_HDR_BYTES], in[DT_PS_HDR_BYTES];
  dt_ps_msg_encode(&h, out);
  for (int s = 0; s < c->map->nservers; s++) {
    if (s == c->local_idx) {
      int rc = dt_ps_server_local(c->local, &h, NULL);
      if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
      continue;
    }
    int peer = dt__psc_srv_rank(c, s);
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
        rc = dt__psc_poll_local(c, &busy);
        idle = busy ? 0 : idle + 1;
        dt__ps_backoff(idle);
      }
    } else if (rc == DT_OK) {
      rc = dt_comm_waitall(c->comm, r, 2);
    }
    if (rc < 0) return dt__psc_comm_fail(c, rc, "greeting the servers");
    dt_ps_msg w;
    rc = dt_ps_msg_parse(in, sizeof in, c->map, c->o.nworkers, -1, s, &w);
    if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
    if (w.type != DT_PS_WELCOME || w.aux != h.aux || w.key != c->map->nkeys ||
        w.count != c->map->nparams || w.clock != c->R)
      return dt__seterr(DT_EMISMATCH, "ps worker %d: server %d (rank %d) holds another key-range "
                        "map (%d keys over %llu parameters, digest %016llx; this worker: %d keys "
                        "over %llu, digest %016llx; replicas %lld there, %d here)", c->me, s, peer,
                        w.key, (unsigned long long)w.count, (unsigned long long)w.aux,
                        c->map->nkeys, (unsigned long long)c->map->nparams,
                        (unsigned long long)h.aux, (long long)w.clock, c->R);
  }
  for (int k = 0; k < c->nk; k++) {
    dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .clock = 0};
    DT_CHECK(dt__psc_request(c, &m, NULL, 1));
  }
  int rc = dt__psc_wait_all(c);
  /* colocated: a worker whose own pulls are answered may go on to a
   * collective (the trace's barrier) while another still waits for this
   * worker's server: nobody leaves before every server answered */
  if (rc == DT_OK && c->local) rc = dt__psc_mark(c, 0);
  /* the server thread starts parked: the first step wakes it */
  if (rc == DT_OK && c->local && c->o.server_thread) {
    c->park = 1;
    rc = dt__psc_start_thread(c);
  }
  return rc;
}

static void begin_impl(dt_ps_client *c, float weight, float lr) {
  /* (direct asp: no messages come during steps) */
  if (c->local && !c->threaded && !c->o.direct) {
    int busy = 0, rc = dt__psc_poll_local(c, &busy);
    if (rc < 0) {
      c->err = rc;
      snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
    }
  }
  /* lazy replies: what came in since the last step goes in before forward */
  if (c->lazy && !c->err) {
    int rc = dt__psc_reap(c, -1, 0);
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

/* Direct asp: the records straight out of the shared table. */
static int export_direct(dt_ps_client *c, float *buf, int64_t *steps) {
  size_t off = 0;
  for (int k = 0; k < c->nk; k++) {
    DT_CHECK(dt_ps_direct_record(c->o.direct, k, buf + off, &steps[k]));
    off += dt_ps_key_state_floats(&c->o, &c->map->keys[k]);
  }
  return DT_OK;
}

static int export_impl(dt_ps_client *c, float *buf, int64_t *steps) {
  if (c->o.direct) return export_direct(c, buf, steps);
  /* lazy: the last pushes' replies first (their request slots are reused) */
  if (c->lazy) DT_CHECK(dt__psc_wait_all(c));
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
    rc = dt__psc_request(c, &m, NULL, 1);
  }
  if (rc == DT_OK) rc = dt__psc_wait_all(c);
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
    DT_CHECK(dt__psc_request(c, &m, (const float *)(const void *)(c->rows + c->krow0[k]), 1));
  }
  return dt__psc_wait_all(c);
}

/* Direct asp: this thread applies key k's (scaled) push to the key's
 * master copy and takes its new parameters, under the key's lock. try:
 * when another worker holds the key, the push is put off (K_DEFER) and
 * tried again later in backward, so a short hold costs no wait. */
static int push_direct(dt_ps_client *c, int k, int try) {
  const dt_ps_key *K = &c->map->keys[k];
  int rc = dt_ps_direct_push(c->o.direct, k, c->grads + K->off, c->weight, c->lr, c->kver[k],
                             c->params + K->off, &c->kver[k], try);
  if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
  if (rc == 1) {
    if (!(c->kst[k] & K_DEFER)) c->kst[k] |= K_DEFER, c->ndefer++;
    return DT_OK;
  }
  if (c->kst[k] & K_DEFER) c->kst[k] &= (uint8_t)~K_DEFER, c->ndefer--;
  c->kst[k] |= K_DONE;
  c->st.pushed_floats += (int64_t)K->len;
  c->st.pulled_floats += (int64_t)K->len;
  if (K->server != c->local_idx) {
    c->st.win_sent += (int64_t)(K->len * sizeof(float));
    c->st.win_received += (int64_t)(K->len * sizeof(float));
  }
  return DT_OK;
}

/* Direct asp: the pushes put off, tried again (try) or waited for. */
static int push_deferred(dt_ps_client *c, int try) {
  for (int k = c->nk - 1; k >= 0 && c->ndefer; k--)
    if (c->kst[k] & K_DEFER) DT_CHECK(push_direct(c, k, try));
  return DT_OK;
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
    return dt__psc_request(c, &m, buf, 0);
  }
  /* lazy: the key's last reply (and its sends) complete before the slot is
   * reused; its parameters go in now (backward is done with this key) */
  if (c->lazy && c->nreq[k]) DT_CHECK(dt__psc_reap(c, k, 1));
  if (c->o.direct) {
    /* scaled by the weight inside the push's one pass (direct.c) */
    c->kst[k] = (uint8_t)((c->kst[k] & ~K_WAIT) | K_PUSHED);
    return push_direct(c, k, 1);
  }
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
    return dt__psc_request(c, &m, pr, 1);
  }
  c->st.pushed_floats += (int64_t)K->len;
  return dt__psc_request(c, &m, g, 1);
}

/* push_key, timed (span "push", argument the key) */
static int push_timed(dt_ps_client *c, int k) {
  int64_t t0 = dt_now_ns();
  int rc = push_key(c, k);
  dt_obs_lap(c->obs, c->m_push, "push", 0, t0, k);
  return rc;
}

/* Pushes the keys (lo, next_key], all final now: those of other servers
 * first, then this worker's own server's (whose push, in bsp, may close the
 * clock and step the optimizer right here), so the others' servers get
 * their work as early as possible. */
static int push_ready(dt_ps_client *c, int lo) {
  for (int pass = 0; pass < 2; pass++)
    for (int k = c->next_key; k > lo; k--)
      if ((c->map->keys[k].server == c->local_idx) == pass) DT_CHECK(push_timed(c, k));
  c->next_key = lo;
  return DT_OK;
}

static void ready_impl(dt_ps_client *c, size_t off, size_t n) {
  if (c->err) return;
  if (c->local && !c->threaded && !c->o.direct) {
    /* a colocated server answers the other workers while this one is in
     * backward too (its replies to this worker only ever concern keys this
     * worker already pushed, whose layers backward is done with) */
    int busy = 0, rc = dt__psc_poll_local(c, &busy);
    if (rc < 0) {
      c->err = rc;
      snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
      return;
    }
  }
  if (off < c->ready_lo && off + n >= c->ready_lo) c->ready_lo = off;
  int lo = c->next_key;
  while (lo >= 0 && c->map->keys[lo].off >= c->ready_lo) lo--;
  int rc = c->ndefer ? push_deferred(c, 1) : DT_OK;
  if (rc == DT_OK) rc = push_ready(c, lo);
  if (rc < 0) {
    c->err = rc; /* reported by finish */
    snprintf(c->errmsg, sizeof c->errmsg, "%s", dt_errmsg());
  }
}

static int finish_impl(dt_ps_client *c) {
  if (c->err) return dt__seterr(c->err, "ps worker %d: during backward: %s", c->me, c->errmsg);
  DT_CHECK(push_ready(c, -1));
  if (c->ndefer) DT_CHECK(push_deferred(c, 1));
  if (c->ndefer) DT_CHECK(push_deferred(c, 0));
  /* lazy (asp): the replies are taken at the next step's begin */
  if (!c->lazy) DT_CHECK(dt__psc_wait_all(c));
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

/* Direct asp: waits until every worker's pushes of this clock are in
 * (serving meanwhile: the communicator notices a lost peer), then reads
 * every key. */
static int sync_direct(dt_ps_client *c) {
  int idle = 0;
  while (!dt_ps_direct_all_in(c->o.direct, c->clock)) {
    int busy = 0;
    int rc = dt__psc_poll_local(c, &busy);
    if (rc < 0) return dt__preerr(rc, "ps worker %d", c->me);
    idle = busy ? 0 : idle + 1;
    dt__ps_backoff(idle);
  }
  for (int k = 0; k < c->nk; k++)
    DT_CHECK(dt_ps_direct_read(c->o.direct, k, c->params + c->map->keys[k].off, &c->kver[k]));
  return dt__psc_mark(c, 0);
}

static int sync_impl(dt_ps_client *c) {
  if (c->o.direct) return sync_direct(c);
  if (c->lazy) DT_CHECK(dt__psc_wait_all(c));
  for (int k = 0; k < c->nk; k++) {
    dt_ps_msg m = {.type = DT_PS_PULL, .sender = c->me, .key = k, .flags = DT_PS_F_FINAL,
                   .clock = c->clock};
    DT_CHECK(dt__psc_request(c, &m, NULL, 1));
  }
  DT_CHECK(dt__psc_wait_all(c));
  /* colocated: nobody leaves to evaluate while another still waits for
   * this worker's server */
  return c->local ? dt__psc_mark(c, 0) : DT_OK;
}

/* ---- the public calls: with a server thread, each holds the communicator
 * (and wakes the thread, which a mark parked) ---------------------------------- */

void dt_ps_client_begin(dt_ps_client *c, float weight, float lr) {
  dt__psc_enter(c);
  begin_impl(c, weight, lr);
  dt__psc_leave(c);
}
void dt_ps_client_ready(dt_ps_client *c, size_t off, size_t n) {
  dt__psc_enter(c);
  ready_impl(c, off, n);
  dt__psc_leave(c);
}
#define LOCKED(call)    \
  do {                  \
    dt__psc_enter(c);           \
    int rc_ = (call);   \
    dt__psc_leave(c);           \
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
int dt_ps_client_stop(dt_ps_client *c) { LOCKED(dt__psc_mark(c, DT_PS_F_FINAL)); }
int dt_ps_client_quiesce(dt_ps_client *c) { LOCKED(c->local ? dt__psc_mark(c, 0) : DT_OK); }
#undef LOCKED

void dt_ps_client_stats_get(const dt_ps_client *c, dt_ps_client_stats *out) {
  dt__psc_enter((dt_ps_client *)c);
  *out = c->st;
  if (c->local) {
    /* the colocated server's window traffic is this process's too */
    dt_ps_server_stats ss;
    dt_ps_server_stats_get(c->local, &ss);
    out->win_sent += ss.win_sent;
    out->win_received += ss.win_received;
  }
  dt__psc_leave((dt_ps_client *)c);
}
int64_t dt_ps_client_clock(const dt_ps_client *c) { return c->clock; }
void dt_ps_client_set_clock(dt_ps_client *c, int64_t clock) { c->clock = clock; }


/*
 * server.c — one parameter server: its key range of the parameters, the
 * optimizer state for it (only here, never on workers), and the consistency
 * controller that decides when a push is applied and when a pull may be
 * answered (docs/ps.md):
 *
 *  - bsp: a key's clock c closes when every worker's clock-c push is in (the
 *    first N - b with ps.backup_workers = b; later ones are dropped and
 *    counted); the pushes are summed in rank order, so the result does not
 *    depend on arrival order, then the optimizer steps once. A read at
 *    clock c waits for version c.
 *  - ssp: pushes are applied on arrival (the optimizer steps per push); a
 *    read at clock c waits until every worker's pushes up to clock c - s - 1
 *    are in. A worker's own pushes precede its reads on one ordered
 *    channel, so it always reads its own writes.
 *  - asp: pushes applied on arrival with the learning rate divided by the
 *    push's staleness (versions applied since the worker read the key);
 *    reads are answered at once.
 *
 * Remote workers' headers are received on one posted receive per worker;
 * separate bsp servers without backups wait on them in rank order (blocking,
 * no spinning), the others poll. A colocated server is driven by its
 * worker's waits (dt_ps_server_poll) and takes its own worker's messages
 * through dt_ps_server_local. A protocol error ends the server and aborts
 * the communicator with the message, so every worker learns why.
 *
 * Keys of rows (an embedding's, rowlen > 1) also take pushes and pulls of
 * some rows (DT_PS_F_ROWS): a bsp clock sums each row over the workers that
 * pushed it, in rank order, and steps the optimizer on those rows only
 * (lazily: other rows and their state stay); async modes step the pushed
 * rows on arrival. A pull of rows is answered with just those rows.
 *
 * Replicas (ps.replicas): a server also holds the key ranges of the R - 1
 * servers before it and takes their pushes, so it holds exactly what
 * their primaries hold (bsp) and answers reads once a worker fails over
 * to it. It then polls every worker (the workers' messages no longer
 * alternate in step after a fail-over), never blocks on one.
 *
 * Windows (dt_ps_opts.win_params): a push flagged WIN carries no payload
 * (its gradient is read in the worker's shared-memory window, in place) and
 * a read flagged WIN is answered by writing the parameters into the
 * worker's window, then sending the header alone.
 *
 * This file holds the state, takes and parses messages, answers reads and
 * runs the serving loops; server_apply.c aggregates and applies pushes.
 *
 * Elastic workers (dist.min_workers, o.elastic): a worker whose requests
 * fail with a lost or closed peer is taken out of every clock at the next
 * poll (bsp closes with the live workers' pushes, ssp's bound and FINAL
 * reads count the live ones); a joiner takes a lost worker's slot over a
 * communicator of its own (server_join.c), so each worker's endpoint is
 * (wcm(s, w), srank(s, w)).
 *
 * After a loss (replicas), a range's new holder takes a copy of it from
 * its primary (server_copy.c); otherwise servers exchange nothing, the
 * workers send each push to every holder.
 *
 * It does not pick learning rates (they come with the pushes) or know
 * about models beyond the key-range map.
 */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "ps/server_int.h"

/* Worker w's endpoint: rank w of the job's communicator, or rank 0 of the
 * communicator a worker that joined later came in on (server_join.c). */
static int srank(const dt_ps_server *s, int w) { return s->wc && s->wc[w] ? 0 : w; }
static dt_comm *wcm(const dt_ps_server *s, int w) {
  return s->wc && s->wc[w] ? s->wc[w] : s->comm;
}

/* Key k (index `key` of the map; its parameters k->p set by the caller)
 * gets its optimizer and the per-worker state. */
int dt__pss_key_init(dt_ps_server *s, skey *k, int key) {
  const int N = s->N;
  k->K = &s->map->keys[key];
  k->idx = key;
  size_t len = k->K->len;
  if (dt_optim_create(&k->opt, &s->o.optim, len) < 0) return DT_ENOMEM;
  k->wclock = calloc((size_t)N, sizeof *k->wclock);
  k->arr = calloc((size_t)N, 1);
  k->wweight = calloc((size_t)N, sizeof(float));
  k->wlr = calloc((size_t)N, sizeof(float));
  k->wsrc = calloc((size_t)N, sizeof *k->wsrc);
  k->nrows = k->K->rowlen > 1 ? len / k->K->rowlen : 0;
  k->stride = len + k->nrows;
  k->rowmode = -1;
  k->pb = dt_alloc((size_t)N * k->stride * sizeof(float));
  if (k->nrows) {
    k->pcount = calloc((size_t)N, sizeof *k->pcount);
    k->wrows = malloc((size_t)N * k->nrows * sizeof *k->wrows);
    k->wnrows = calloc((size_t)N, sizeof *k->wnrows);
    k->mark = calloc(k->nrows, 1);
    k->pos = malloc(k->nrows * sizeof *k->pos);
    k->touched = malloc(k->nrows * sizeof *k->touched);
    if (!k->pcount || !k->wrows || !k->wnrows || !k->mark || !k->pos || !k->touched) goto oom;
  }
  k->sum = dt_alloc(len * sizeof(float));
  k->want = malloc((size_t)N * sizeof *k->want);
  k->wflags = calloc((size_t)N, sizeof *k->wflags);
  k->sreq = calloc((size_t)N * 2, sizeof *k->sreq);
  k->sent = calloc((size_t)N, 1);
  k->shdr = calloc((size_t)N, DT_PS_HDR_BYTES);
  k->snap = dt_alloc((size_t)N * len * sizeof(float));
  k->pairs = dt_alloc(2 * len * sizeof(float));
  if (!k->pairs || !k->wsrc || !k->wclock || !k->arr || !k->wweight || !k->wlr || !k->pb || !k->sum || !k->want ||
      !k->wflags || !k->sreq || !k->sent || !k->shdr || !k->snap)
    goto oom;
  for (int w = 0; w < N; w++) k->want[w] = -1;
  k->prever = -1;
  k->live = 1;
  return DT_OK;
oom:
  return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
}

int dt_ps_server_create(dt_ps_server **out, const dt_ps_map *map, const dt_ps_opts *opts,
                        int index, dt_comm *comm, const float *init) {
  if (!out || !map || !opts || !init)
    return dt__seterr(DT_EINVAL, "ps server: NULL argument");
  *out = NULL;
  if (index < 0 || index >= map->nservers)
    return dt__seterr(DT_EINVAL, "ps server: index %d of %d servers", index, map->nservers);
  if (opts->nworkers < 1) return dt__seterr(DT_EINVAL, "ps server: %d workers", opts->nworkers);
  dt_ps_server *s = calloc(1, sizeof *s);
  if (!s) return dt__seterr(DT_ENOMEM, "ps server: out of memory");
  s->map = map;
  s->o = *opts;
  s->index = index;
  s->N = opts->nworkers;
  s->comm = comm;
  s->local = -1;
  s->fused = dt_param(DT_PARAM_PS_FUSED) != 0;
  int N = s->N;
  s->die_at = -1;
  const char *die = dt_param_s(DT_PARAM_TEST_PS_DIE);
  if (die && *die) {
    char *end = NULL;
    long long at = strtoll(die, &end, 10);
    if (end != die && at >= 0) {
      s->die_at = at;
      s->die_final = !strcmp(end, ":final");
      if (!(s->die_n = calloc((size_t)N, sizeof *s->die_n))) goto oom;
    }
  }
  /* the ranges held: this server's own, then those it is a replica of */
  const int S = map->nservers, R = map->replicas > 1 ? map->replicas : 1;
  uint64_t floats = 0;
  s->nk = 0;
  for (int r = 0; r < R; r++) {
    int g = ((index - r) % S + S) % S;
    floats += map->srv_lo[g + 1] - map->srv_lo[g];
    s->nk += map->srv_key0[g + 1] - map->srv_key0[g];
  }
  s->params = dt_alloc((floats ? floats : 1) * sizeof(float));
  /* room for every key: a loss may give this server more ranges */
  s->keys = calloc((size_t)map->nkeys, sizeof *s->keys);
  s->kpos = malloc((size_t)map->nkeys * sizeof *s->kpos);
  s->hdr = calloc((size_t)N, DT_PS_HDR_BYTES);
  s->req = calloc((size_t)N, sizeof *s->req);
  s->posted = calloc((size_t)N, 1);
  s->bye = calloc((size_t)N, sizeof *s->bye);
  s->marks = calloc((size_t)N, sizeof *s->marks);
  s->parked = calloc((size_t)N, 1);
  s->pmsg = calloc((size_t)N, sizeof *s->pmsg);
  s->gone = calloc((size_t)N, 1);
  s->losing = calloc((size_t)N, 1);
  if (!s->gone || !s->losing) goto oom;
  if (!s->params || !s->keys || !s->kpos || !s->hdr || !s->req || !s->posted || !s->bye ||
      !s->marks || !s->parked || !s->pmsg)
    goto oom;
  for (int k = 0; k < map->nkeys; k++) s->kpos[k] = -1;
  int i = 0;
  float *at = s->params;
  for (int r = 0; r < R; r++) {
    int g = ((index - r) % S + S) % S;
    uint64_t lo = map->srv_lo[g], hi = map->srv_lo[g + 1];
    memcpy(at, init + lo, (hi - lo) * sizeof(float));
    for (int key = map->srv_key0[g]; key < map->srv_key0[g + 1]; key++, i++) {
      s->keys[i].idx = key;
      s->keys[i].p = at + (map->keys[key].off - lo);
      s->kpos[key] = i;
    }
    at += hi - lo;
  }
  for (int i = 0; i < s->nk; i++)
    if (dt__pss_key_init(s, &s->keys[i], s->keys[i].idx) < 0) goto fail;
  if (map->replicas > 1 && dt__pss_copy_init(s) < 0) goto fail;
  *out = s;
  return DT_OK;
oom:
  dt__seterr(DT_ENOMEM, "ps server %d: out of memory", index);
fail:
  dt_ps_server_destroy(s);
  return DT_ENOMEM;
}

void dt__pss_key_free(skey *k) {
  dt_optim_destroy(k->opt);
  free(k->wclock);
  free(k->arr);
  free(k->wweight);
  free(k->wlr);
  free(k->wsrc);
  dt_free(k->pb);
  dt_free(k->sum);
  free(k->want);
  free(k->wflags);
  free(k->sreq);
  free(k->sent);
  free(k->shdr);
  dt_free(k->snap);
  dt_free(k->pairs);
  free(k->pcount);
  free(k->wrows);
  free(k->wnrows);
  free(k->mark);
  free(k->pos);
  free(k->touched);
  dt_free(k->rec);
  dt_free(k->own);
  dt_free(k->cbuf);
  free(k->creq);
  free(k->cpend);
}

void dt_ps_server_destroy(dt_ps_server *s) {
  if (!s) return;
  for (int i = 0; s->keys && i < s->nk; i++) dt__pss_key_free(&s->keys[i]);
  dt__pss_copy_free(s);
  free(s->keys);
  dt__pss_rejoin_free(s);
  free(s->kpos);
  dt_free(s->params);
  free(s->hdr);
  free(s->req);
  free(s->posted);
  free(s->bye);
  free(s->marks);
  free(s->parked);
  free(s->pmsg);
  free(s->gone);
  free(s->die_n);
  free(s->losing);
  dt__pss_join_free(s);
  free(s);
}

void dt_ps_server_set_local(dt_ps_server *s, int worker, dt_ps_local_reply fn, void *ud) {
  s->local = worker;
  s->local_fn = fn;
  s->local_ud = ud;
}

int dt_ps_server_done(const dt_ps_server *s) { return s->nbye == s->N; }

int64_t dt__ps_server_min_mark(const dt_ps_server *s);
int64_t dt__ps_server_min_mark(const dt_ps_server *s) {
  int64_t m = INT64_MAX;
  for (int w = 0; w < s->N; w++)
    if (!s->gone[w] && s->marks[w] < m) m = s->marks[w];
  return m;
}

void dt_ps_server_stats_get(const dt_ps_server *s, dt_ps_server_stats *out) { *out = s->st; }

const float *dt__ps_server_params(const dt_ps_server *s) {
  return s->alias ? s->alias + s->map->srv_lo[s->index] : s->params;
}

int dt__ps_server_zero_copy(dt_ps_server *s, float *params) {
  if (!s || !params || s->local < 0 || s->o.consistency != DT_PS_BSP || s->o.server_thread ||
      s->map->replicas > 1)
    return dt__seterr(DT_EINVAL, "ps server: zero copy needs a colocated bsp server in its "
                      "worker's thread");
  for (int i = 0; i < s->nk; i++) {
    skey *k = &s->keys[i];
    float *to = params + k->K->off;
    if (to != k->p) memcpy(to, k->p, k->K->len * sizeof(float));
    k->p = to;
  }
  s->alias = params;
  return DT_OK;
}

static int comm_fail(dt_ps_server *s, int rc, const char *what) {
  const char *m = s->comm ? dt_comm_errmsg(s->comm) : NULL;
  return dt__seterr(rc, "ps server %d: %s: %s", s->index, what, m && *m ? m : dt_errmsg());
}

/* ---- replies ---------------------------------------------------------------- */

/* The lowest clock of the live workers' pushes (lost ones are out of
 * every bound: elastic workers). */
static int64_t min_clock(const dt_ps_server *s, const skey *k) {
  int64_t m = INT64_MAX;
  for (int w = 0; w < s->N; w++)
    if (!s->gone[w] && k->wclock[w] < m) m = k->wclock[w];
  return m;
}

int64_t dt__pss_min_clock(const dt_ps_server *s, const skey *k) { return min_clock(s, k); }

/* Elastic workers: a send to worker w failed or its receive did. A lost
 * worker is removed at the next poll (dt_ps_server_poll), not inside the
 * handling of another worker's message. Returns 1 when that is the case
 * (the caller goes on), 0 when the failure ends the server. */
static int worker_failing(dt_ps_server *s, int w, int rc) {
  if (!s->o.elastic || (rc != DT_EPEERLOST && rc != DT_ECLOSED) || w == s->local) return 0;
  s->losing[w] = 1;
  return 1;
}

static int readable(const dt_ps_server *s, const skey *k, int w) {
  int64_t c = k->want[w];
  if (c < 0) return 0;
  int64_t mc = min_clock(s, k);
  if (k->wflags[w] & DT_PS_F_FINAL)
    return s->o.consistency == DT_PS_BSP ? k->version >= c : mc >= c;
  switch (s->o.consistency) {
  case DT_PS_BSP: return k->version >= c;
  case DT_PS_SSP: return mc >= c - s->o.staleness;
  default: return 1;
  }
}

int dt__pss_wait_sent(dt_ps_server *s, skey *k, int w) {
  if (!k->sent[w]) return DT_OK;
  const int n = k->sent[w];
  k->sent[w] = 0;
  if (s->gone[w]) return DT_OK;
  int rc = dt_comm_waitall(wcm(s, w), &k->sreq[2 * w], n);
  if (rc < 0 && worker_failing(s, w, rc)) return DT_OK;
  return rc < 0 ? comm_fail(s, rc, "sending parameters") : DT_OK;
}

/* Before key k's parameters change (ssp/asp): the replies still being sent
 * from them finish first. */
int dt__pss_settle(dt_ps_server *s, skey *k) {
  for (int w = 0; w < s->N; w++)
    if (k->sent[w]) DT_CHECK(dt__pss_wait_sent(s, k, w));
  return DT_OK;
}

static int reply_send(dt_ps_server *s, skey *k, int w) {
  int64_t c = k->want[w], mc = min_clock(s, k);
  k->want[w] = -1;
  s->st.reads++;
  int64_t missing = c - mc; /* clocks of some worker's pushes this read lacks */
  if (missing > s->st.max_missing) s->st.max_missing = missing;
  if (s->o.consistency == DT_PS_SSP && missing > s->o.staleness &&
      !(k->wflags[w] & DT_PS_F_FINAL))
    s->st.violations++;
  dt_ps_msg m = {.type = DT_PS_PARAMS, .sender = s->index, .key = k->idx, .clock = k->version,
                 .count = k->K->len, .aux = (uint64_t)(mc < 0 ? 0 : mc)};
  size_t len = k->K->len;
  if (k->wflags[w] & DT_PS_F_ROWS) {
    /* just the rows asked for, gathered in the pull's order */
    DT_CHECK(dt__pss_wait_sent(s, k, w));
    const size_t rl = k->K->rowlen, n = k->wnrows[w];
    const uint32_t *rows = k->wrows + (size_t)w * k->nrows;
    float *dst = k->snap + (size_t)w * len;
    for (size_t j = 0; j < n; j++)
      memcpy(dst + j * rl, k->p + (size_t)rows[j] * rl, rl * sizeof(float));
    m.flags = DT_PS_F_ROWS;
    m.count = n;
    if (w == s->local) {
      s->local_fn(s->local_ud, &m, dst);
      return DT_OK;
    }
    uint8_t *h = k->shdr + (size_t)w * DT_PS_HDR_BYTES;
    dt_ps_msg_encode(&m, h);
    int rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                           &k->sreq[2 * w]);
    if (rc == DT_OK)
      rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx) + 1, dst,
                         n * rl * sizeof(float), &k->sreq[2 * w + 1]);
    if (rc < 0 && worker_failing(s, w, rc)) return DT_OK;
    if (rc < 0) return comm_fail(s, rc, "sending rows");
    k->sent[w] = 2;
    return DT_OK;
  }
  if (w == s->local) {
    s->local_fn(s->local_ud, &m, k->p);
    return DT_OK;
  }
  DT_CHECK(dt__pss_wait_sent(s, k, w));
  if (k->wflags[w] & DT_PS_F_WIN) {
    /* the window: the parameters go straight into the worker's own (it
     * reads none of this key's until this header is in), one copy; the
     * header follows them, in order */
    if (k->prever != k->version) memcpy(s->o.win_params[w] + k->K->off, k->p, len * sizeof(float));
    s->st.win_sent += (int64_t)(len * sizeof(float));
    m.flags = DT_PS_F_WIN;
    uint8_t *h = k->shdr + (size_t)w * DT_PS_HDR_BYTES;
    dt_ps_msg_encode(&m, h);
    int rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                           &k->sreq[2 * w]);
    if (rc < 0 && worker_failing(s, w, rc)) return DT_OK;
    if (rc < 0) return comm_fail(s, rc, "sending parameters");
    k->sent[w] = 1;
    return DT_OK;
  }
  const float *src = k->p;
  /* Sent straight from the parameters. bsp without backups: no update of
   * this key before every worker has pushed again, i.e. received this.
   * ssp/asp: an update first waits for the key's pending sends
   * (dt__pss_settle), which the ring has taken at once unless it is full.
   * bsp with backups (a clock may close before a late worker has taken
   * its reply): a snapshot. */
  if (s->o.consistency == DT_PS_BSP && s->o.backup_workers) {
    memcpy(k->snap + (size_t)w * len, k->p, len * sizeof(float));
    src = k->snap + (size_t)w * len;
  }
  uint8_t *h = k->shdr + (size_t)w * DT_PS_HDR_BYTES;
  dt_ps_msg_encode(&m, h);
  int rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                         &k->sreq[2 * w]);
  if (rc == DT_OK)
    rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx) + 1, src, len * sizeof(float),
                       &k->sreq[2 * w + 1]);
  if (rc < 0 && worker_failing(s, w, rc)) return DT_OK;
  if (rc < 0) return comm_fail(s, rc, "sending parameters");
  k->sent[w] = 2;
  return DT_OK;
}

/* DTRAIN_TEST_PS_DIE=CLOCK[:final] (tests only): a separate server
 * SIGKILLs itself right after the reply that completes one worker's reads
 * of every key it holds at clock CLOCK or later (its step reads, or with
 * ":final" its FINAL reads: evaluation, the end): that worker goes on past
 * its wait while the others are still in theirs, the window in which a
 * server lost between two workers' replies leaves one worker in a
 * collective of the workers (tests/ps/test_ps_workers_leave.sh). */
static void test_die(dt_ps_server *s, skey *k, int w, int64_t c, uint32_t flags) {
  if (s->die_at < 0 || s->local >= 0 || c < s->die_at ||
      ((flags & DT_PS_F_FINAL) != 0) != s->die_final || ++s->die_n[w] < s->nk)
    return;
  dt__pss_wait_sent(s, k, w); /* the reply is out */
  DT_LOG_WARN("ps server %d: DTRAIN_TEST_PS_DIE: SIGKILL after worker %d's reads of clock "
              "%lld", s->index, w, (long long)c);
  fflush(NULL);
  raise(SIGKILL);
}

static int reply(dt_ps_server *s, skey *k, int w) {
  const uint32_t rflags = k->wflags[w];
  int rc = reply_send(s, k, w);
  if (rc == DT_OK) test_die(s, k, w, k->version, rflags);
  return rc;
}

size_t dt_ps_key_state_floats(const dt_ps_opts *o, const dt_ps_key *K) {
  size_t per = o->optim.kind == DT_OPT_ADAMW ? 3 : o->optim.momentum != 0.0f ? 2 : 1;
  return per * K->len;
}

/* A checkpoint record of key k to worker w, at once (in bsp the worker asks
 * at a step boundary, when the key does not change until it pushes). */
static int send_record(dt_ps_server *s, skey *k, int w) {
  const size_t len = k->K->len, n = dt_ps_key_state_floats(&s->o, k->K);
  if (dt_optim_state_floats(k->opt) != n - len)
    return dt__seterr(DT_EINVAL, "ps server %d: key %d holds %zu optimizer floats, not %zu",
                      s->index, k->idx, dt_optim_state_floats(k->opt), n - len);
  DT_CHECK(dt__pss_wait_sent(s, k, w));
  if (!k->rec && !(k->rec = dt_alloc(n * sizeof(float))))
    return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
  memcpy(k->rec, k->p, len * sizeof(float));
  if (n > len) memcpy(k->rec + len, dt_optim_state(k->opt), (n - len) * sizeof(float));
  dt_ps_msg m = {.type = DT_PS_PARAMS, .sender = s->index, .key = k->idx,
                 .flags = DT_PS_F_STATE, .clock = k->version, .count = n,
                 .aux = (uint64_t)*dt_optim_step_count(k->opt)};
  if (w == s->local) {
    s->local_fn(s->local_ud, &m, k->rec);
    return DT_OK;
  }
  uint8_t *h = k->shdr + (size_t)w * DT_PS_HDR_BYTES;
  dt_ps_msg_encode(&m, h);
  int rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                         &k->sreq[2 * w]);
  if (rc == DT_OK)
    rc = dt_comm_isend(wcm(s, w), srank(s, w), DT_PS_TAG_KEY(k->idx) + 1, k->rec,
                       n * sizeof(float), &k->sreq[2 * w + 1]);
  if (rc < 0) return comm_fail(s, rc, "sending a checkpoint record");
  k->sent[w] = 2;
  /* the record buffer is shared by the workers: only one asks (rank 0) */
  return dt__pss_wait_sent(s, k, w);
}

int dt_ps_server_restore(dt_ps_server *s, int key, const float *src, int64_t step) {
  if (key < 0 || key >= s->map->nkeys || s->kpos[key] < 0)
    return dt__seterr(DT_EINVAL, "ps server %d: key %d is not held here", s->index, key);
  skey *k = dt__pss_key(s, key);
  const size_t len = k->K->len, n = dt_ps_key_state_floats(&s->o, k->K);
  if (dt_optim_state_floats(k->opt) != n - len || step < 0)
    return dt__seterr(DT_EINVAL, "ps server %d: key %d's record does not fit its optimizer",
                      s->index, key);
  memcpy(k->p, src, len * sizeof(float));
  if (n > len) memcpy(dt_optim_state(k->opt), src + len, (n - len) * sizeof(float));
  *dt_optim_step_count(k->opt) = step;
  return DT_OK;
}

/* Remote workers first: their replies travel while the local one is
 * handed over. */
int dt__pss_try_replies(dt_ps_server *s, skey *k) {
  for (int w = 0; w < s->N; w++)
    if (w != s->local && readable(s, k, w)) DT_CHECK(reply(s, k, w));
  if (s->local >= 0 && readable(s, k, s->local)) DT_CHECK(reply(s, k, s->local));
  return DT_OK;
}

/* A key whose copy never came (its holders died first): a push to it is
 * dropped, a read of it ends the job naming the range. A push that asks
 * for the parameters back (DT_PS_F_PULL, every bsp push) is a read: its
 * worker waits for the answer, and would wait until its deadline. */
static int key_lost(dt_ps_server *s, int w, const dt_ps_msg *m) {
  const dt_ps_key *K = &s->map->keys[m->key];
  if (m->type == DT_PS_PUSH && !(m->flags & DT_PS_F_PULL)) return DT_OK;
  return dt__seterr(DT_EPEERLOST, "ps server %d: worker %d read key %d (server %d's range), "
                    "but every server holding that range died before this one had its copy",
                    s->index, w, m->key, K->server);
}

int dt__pss_handle(dt_ps_server *s, int w, const dt_ps_msg *m, const float *data) {
  if ((m->type == DT_PS_PUSH || m->type == DT_PS_PULL) && dt__pss_key(s, m->key)->live < 0)
    return key_lost(s, w, m);
  switch (m->type) {
  case DT_PS_LOST:
    return dt__pss_lost(s, w, (int)m->aux);
  case DT_PS_REJOIN:
    return dt__pss_rejoin_told(s, w, m);
  case DT_PS_HELLO: {
    uint64_t mine = 0;
    const int R = s->map->replicas > 1 ? s->map->replicas : 1;
    for (int i = 0; i < 8; i++) mine |= (uint64_t)s->map->sha[i] << (8 * i);
    if (w != s->local) {
      dt_ps_msg r = {.type = DT_PS_WELCOME, .sender = s->index, .key = s->map->nkeys,
                     .count = s->map->nparams, .aux = mine, .clock = R};
      dt_ps_msg_encode(&r, s->welcome);
      int rc = dt_comm_send(wcm(s, w), srank(s, w), DT_PS_TAG_CTL, s->welcome, DT_PS_HDR_BYTES);
      if (rc < 0) return comm_fail(s, rc, "welcome");
    }
    if (m->aux != mine || m->key != s->map->nkeys || m->count != s->map->nparams ||
        (m->clock ? m->clock : 1) != R)
      return dt__seterr(DT_EMISMATCH, "ps server %d: worker %d has another key-range map (%d "
                        "keys over %llu parameters, digest %016llx, replicas %lld; this server: "
                        "%d keys over %llu, digest %016llx, replicas %d)", s->index, w, m->key,
                        (unsigned long long)m->count, (unsigned long long)m->aux,
                        (long long)(m->clock ? m->clock : 1), s->map->nkeys,
                        (unsigned long long)s->map->nparams, (unsigned long long)mine, R);
    return DT_OK;
  }
  case DT_PS_PUSH:
    return dt__pss_on_push(s, dt__pss_key(s, m->key), w, m, data);
  case DT_PS_PULL: {
    skey *k = dt__pss_key(s, m->key);
    s->st.pulls++;
    if (m->flags & DT_PS_F_STATE) {
      s->extra = 1;
      return send_record(s, k, w);
    }
    if (m->flags & DT_PS_F_ROWS) {
      for (uint64_t j = 0; j < m->count; j++) {
        uint32_t r;
        memcpy(&r, &data[j], sizeof r);
        if (r >= k->nrows)
          return dt__seterr(DT_EPROTO, "ps server %d: worker %d pulled row %u of key %d (the "
                            "key has %zu rows)", s->index, w, r, m->key, k->nrows);
        k->wrows[(size_t)w * k->nrows + j] = r;
      }
      k->wnrows[w] = m->count;
    }
    k->want[w] = m->clock;
    k->wflags[w] = m->flags;
    return dt__pss_try_replies(s, k);
  }
  case DT_PS_BYE:
    if (m->clock > s->marks[w]) s->marks[w] = m->clock;
    if ((m->flags & DT_PS_F_FINAL) && !s->bye[w]) {
      s->bye[w] = 1;
      s->nbye++;
    }
    return DT_OK;
  default:
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d sent %s", s->index, w,
                      dt_ps_type_name(m->type));
  }
}

/* A protocol error ends this server; the communicator is aborted with the
 * message so every worker stops with it instead of waiting. */
static int fail(dt_ps_server *s, int rc) {
  if (!s->failed && s->comm) {
    char why[600];
    snprintf(why, sizeof why, "%s", dt_errmsg());
    dt_comm_abort(s->comm, rc, why);
    dt__seterr(rc, "%s", why);
  }
  s->failed = 1;
  return rc;
}

int dt_ps_server_local(dt_ps_server *s, const dt_ps_msg *m, const float *payload) {
  if (s->failed) return dt__seterr(DT_EABORTED, "ps server %d: failed earlier", s->index);
  int rc = dt__pss_handle(s, m->sender, m, payload);
  return rc < 0 ? fail(s, rc) : DT_OK;
}

static int post(dt_ps_server *s, int w) {
  int rc = dt_comm_irecv(wcm(s, w), srank(s, w), DT_PS_TAG_REQ, s->hdr + (size_t)w * DT_PS_HDR_BYTES,
                         DT_PS_HDR_BYTES, &s->req[w]);
  if (rc < 0 && worker_failing(s, w, rc)) return DT_OK;
  if (rc < 0) return comm_fail(s, rc, "posting a receive");
  s->posted[w] = 1;
  return DT_OK;
}

/* Worker w's header arrived: parse, take its payload, handle, repost. */
/* Worker w's message m is taken: its payload, then handled, then the next
 * header's receive. */
static int take(dt_ps_server *s, int w, const dt_ps_msg *mp) {
  dt_ps_msg m = *mp;
  int rc = DT_OK;
  const float *data = NULL;
  if ((m.flags & DT_PS_F_WIN) && !s->o.win_params)
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d sent %s for key %d through a "
                      "shared-memory window, but this server has none (DTRAIN_PS_WINDOW must "
                      "be the same everywhere)", s->index, w, dt_ps_type_name(m.type), m.key);
  /* a key whose copy has not come yet: the message waits, payload and all */
  const int queue = s->cp && dt__pss_must_queue(s, w, &m);
  if (m.type == DT_PS_PUSH && (m.flags & DT_PS_F_WIN)) {
    /* the gradient stays in the worker's window: read in place (the worker
     * leaves it alone until the key's reply) */
    data = s->o.win_grads[w] + dt__pss_key(s, m.key)->K->off;
    s->st.win_received += (int64_t)(m.count * sizeof(float));
  } else if (m.type == DT_PS_PUSH || (m.type == DT_PS_PULL && (m.flags & DT_PS_F_ROWS))) {
    skey *k = dt__pss_key(s, m.key);
    int sparse = (m.flags & DT_PS_F_SPARSE) != 0, rows = (m.flags & DT_PS_F_ROWS) != 0;
    size_t bytes = (sparse ? 2 : 1) * m.count * sizeof(float);
    if (rows) bytes = m.count * (m.type == DT_PS_PUSH ? 1 + k->K->rowlen : 1) * sizeof(float);
    float *dst = queue ? (bytes ? dt_alloc(bytes) : NULL)
                 : sparse || rows ? k->pairs : dt__pss_push_dest(s, k, w, &m);
    if (queue && bytes && !dst) return dt__seterr(DT_ENOMEM, "ps server %d: out of memory", s->index);
    if (bytes) rc = dt_comm_recv(wcm(s, w), srank(s, w), DT_PS_TAG_REQ_DATA, dst, bytes);
    if (rc < 0) {
      if (queue) dt_free(dst);
      if (worker_failing(s, w, rc)) return DT_OK; /* its header came, its payload did not */
      return comm_fail(s, rc, "receiving a push");
    }
    data = dst;
  }
  if (queue) {
    DT_CHECK(dt__pss_enqueue(s, w, &m, (float *)data));
  } else {
    DT_CHECK(dt__pss_handle(s, w, &m, data));
  }
  if (!s->bye[w] && !dt__pss_rj_hold(s, w)) DT_CHECK(post(s, w));
  return DT_OK;
}

/* A replica in bsp may get a worker's push of clock c + 1 before another
 * worker's push of clock c (that worker's primary closed clock c and
 * answered; the other's messages to the replica are still on their way):
 * it waits, parked, with that worker's later messages behind it. */
static int must_park(dt_ps_server *s, int w, const dt_ps_msg *m) {
  if (s->map->replicas < 2 || s->o.consistency != DT_PS_BSP || m->type != DT_PS_PUSH) return 0;
  const skey *k = dt__pss_key(s, m->key);
  /* (a key waiting for its copy queues its messages instead) */
  return k->live == 1 && !dt__pss_must_queue(s, w, m) && m->clock > k->version;
}

static int arrived(dt_ps_server *s, int w) {
  s->posted[w] = 0;
  dt_ps_msg m;
  int rc = dt_ps_msg_parse(s->hdr + (size_t)w * DT_PS_HDR_BYTES, DT_PS_HDR_BYTES, s->map, s->N,
                           s->index, w, &m);
  if (rc < 0) return dt__preerr(rc, "ps server %d refused a message", s->index);
  if ((m.type == DT_PS_PUSH || m.type == DT_PS_PULL) && s->kpos[m.key] < 0)
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d sent %s for key %d, which this server "
                      "does not hold", s->index, w, dt_ps_type_name(m.type), m.key);
  if (must_park(s, w, &m)) {
    s->parked[w] = 1;
    s->pmsg[w] = m;
    return DT_OK;
  }
  return take(s, w, &m);
}

/* Elastic workers (docs/ps.md "Workers leaving"): worker w is lost. It is
 * out of every clock from now on: its push to a bsp clock still open is
 * dropped (the clock closes with the live workers' pushes, scaled by their
 * weight as with backup workers), ssp's bound and every FINAL read count
 * the live workers only, and its pending reads are forgotten. */
int dt__pss_worker_lost(dt_ps_server *s, int w, const char *how) {
  s->gone[w] = 1;
  s->losing[w] = 0;
  s->ngone++;
  s->st.workers_lost++;
  s->lost_t = dt_now();
  s->lost_w = w;
  s->parked[w] = 0;
  if (!s->bye[w]) s->bye[w] = 1, s->nbye++;
  int64_t c = 0;
  int open = 0;
  for (int i = 0; i < s->nk; i++) {
    skey *k = &s->keys[i];
    k->want[w] = -1;
    k->sent[w] = 0;
    if (k->wclock[w] > c) c = k->wclock[w];
    if (s->o.consistency == DT_PS_BSP && k->arr[w]) {
      k->arr[w] = 0;
      k->narr--;
      s->st.dropped++;
      open++;
    }
  }
  DT_LOG_WARN("ps server %d: worker %d (rank %d) %s after %lld pushed clocks: removed from "
              "the clocks%s; %d of %d workers go on", s->index, w, srank(s, w), how, (long long)c,
              open ? " (its push to the open clock dropped)" : "", s->N - s->ngone, s->N);
  for (int i = 0; i < s->nk; i++) DT_CHECK(dt__pss_recheck(s, &s->keys[i]));
  return DT_OK;
}

int dt_ps_server_poll(dt_ps_server *s, int *busy) {
  *busy = 0;
  if (s->failed) return dt__seterr(DT_EABORTED, "ps server %d: failed earlier", s->index);
  int rc = DT_OK;
  for (int w = 0; w < s->N && rc == DT_OK; w++) {
    if (w == s->local || s->bye[w] || dt__pss_rj_hold(s, w)) continue;
    if (s->parked[w]) {
      if (must_park(s, w, &s->pmsg[w])) continue;
      s->parked[w] = 0;
      *busy = 1;
      rc = take(s, w, &s->pmsg[w]);
      continue;
    }
    if (!s->posted[w]) {
      rc = post(s, w);
      if (rc < 0) break;
    }
    bool done = false;
    rc = dt_comm_test(wcm(s, w), &s->req[w], &done);
    if (rc < 0 && worker_failing(s, w, rc)) {
      rc = DT_OK;
      continue;
    }
    if (rc < 0) {
      rc = comm_fail(s, rc, "waiting for workers");
      break;
    }
    if (done) {
      *busy = 1;
      rc = arrived(s, w);
    }
  }
  /* elastic workers: the lost ones out of the clocks, then joiners in */
  for (int w = 0; w < s->N && rc == DT_OK; w++)
    if (s->losing[w] && !s->gone[w]) {
      *busy = 1;
      rc = dt__pss_worker_lost(s, w, "lost");
    }
  if (rc == DT_OK && s->jst) {
    int b = 0;
    rc = dt__pss_join_poll(s, &b);
    *busy |= b;
  }
  /* re-replication: copies to send, copies coming in, messages they held */
  if (rc == DT_OK && s->cp) {
    int b = 0;
    rc = dt__pss_copy_poll(s, &b);
    *busy |= b;
  }
  return rc < 0 ? fail(s, rc) : DT_OK;
}

/* How a poll loop that found nothing to do waits (client and server). */
void dt__ps_sleep_ns(long ns) {
  /* a thread's sleeps end up to its timer slack (50 us by default) late:
   * more than the 10-20 us asked for, on a step of well under a millisecond
   * (MLP bsp colocated: p10 step 857 -> 799 us with 1 us, 6 rounds at load 6) */
  static _Thread_local int slack;
  if (!slack) slack = 1, prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

void dt__ps_backoff(int idle) {
  if (idle < 64) return;
  if (idle < 256) {
    sched_yield();
    return;
  }
  dt__ps_sleep_ns(idle < 2048 ? 20000 : 100000);
}

static int finish_sends(dt_ps_server *s) {
  for (int i = 0; i < s->nk; i++)
    for (int w = 0; w < s->N; w++) DT_CHECK(dt__pss_wait_sent(s, &s->keys[i], w));
  if (s->st.workers_lost)
    DT_LOG_INFO("ps server %d: done; %lld workers lost and removed from the clocks, %lld joiners "
                "admitted; %d of %d slots served at the end", s->index,
                (long long)s->st.workers_lost, (long long)s->st.workers_joined, s->N - s->ngone,
                s->N);
  return DT_OK;
}

int dt_ps_server_run(dt_ps_server *s) {
  int rc = DT_OK;
  /* bsp without backups needs every worker's messages anyway: wait on them
   * in rank order (the transport blocks, nothing spins) */
  int blocking = s->o.consistency == DT_PS_BSP && s->o.backup_workers == 0 && s->local < 0 &&
                 s->map->replicas < 2 && !s->o.elastic;
  int idle = 0;
  while (!dt_ps_server_done(s)) {
    if (blocking) {
      int w = s->rr;
      s->rr = (s->rr + 1) % s->N;
      if (s->bye[w]) continue;
      if (!s->posted[w] && (rc = post(s, w)) < 0) break;
      rc = dt_comm_waitall(wcm(s, w), &s->req[w], 1);
      if (rc < 0) {
        rc = comm_fail(s, rc, "waiting for a worker");
        break;
      }
      s->extra = 0;
      if ((rc = arrived(s, w)) < 0) break;
      /* the workers' messages alternate in step; a checkpoint pull (rank 0
       * only) is outside that: wait on the same worker again */
      if (s->extra) s->rr = w;
      continue;
    }
    int busy = 0;
    if ((rc = dt_ps_server_poll(s, &busy)) < 0) return rc;
    idle = busy ? 0 : idle + 1;
    dt__ps_backoff(idle);
  }
  if (rc == DT_OK) rc = finish_sends(s);
  if (s->cp) dt__pss_copy_finish(s);
  return rc < 0 ? fail(s, rc) : DT_OK;
}

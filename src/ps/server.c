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
 * It does not pick learning rates (they come with the pushes), copy state
 * to other servers (workers send it to every replica), or know about
 * models beyond the key-range map.
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps/ps.h"

typedef struct skey {
  const dt_ps_key *K;
  int idx;
  float *p;          /* the key's parameters (into s->params) */
  dt_optim *opt;
  int64_t version;   /* bsp: clocks closed; ssp/asp: pushes applied */
  int64_t *wclock;   /* per worker: pushes received (its next clock) */
  /* bsp */
  int narr;
  uint8_t *arr;      /* per worker: clock `version` push is in */
  float *wweight, *wlr;
  float *pb;         /* per worker: its push (N x len) */
  const float **wsrc; /* per worker: where its push of this clock is (its pb slot,
                       * or the colocated worker's own gradients: zero copy) */
  float *sum;        /* len; also the scratch for async pushes */
  /* replies */
  int64_t *want;     /* per worker: clock of a pending read, -1 none */
  uint32_t *wflags;
  dt_comm_req *sreq; /* per worker: header + payload sends */
  uint8_t *sent;     /* per worker: sreq in flight */
  uint8_t *shdr;     /* per worker: 64-byte header */
  float *snap;       /* per worker: payload copy (async, backups) */
  float *pairs;      /* 2 x len: a sparse push or a push/pull of rows as it arrived */
  /* keys of rows (K->rowlen > 1) */
  size_t nrows;      /* len / rowlen; 0: a dense key */
  size_t stride;     /* floats of a worker's bsp slot in pb: len (+ nrows) */
  int64_t *pcount;   /* per worker: rows in its bsp slot, -1 dense */
  uint32_t *wrows;   /* per worker: the rows of its pending pull (N x nrows) */
  uint64_t *wnrows;
  uint8_t *mark;     /* per row: in this clock's sum */
  uint32_t *pos, *touched; /* per row: its place in sum; the rows summed */
  int rowmode;       /* -1 not yet, 0 dense pushes, 1 row pushes (never mixed) */
  float *rec;        /* a checkpoint record (parameters + optimizer state), on demand */
} skey;

struct dt_ps_server {
  const dt_ps_map *map;
  dt_ps_opts o;
  int index, N;
  dt_comm *comm;
  float *params;     /* the server's range */
  float *alias;      /* zero copy: the colocated worker's parameters (whole model) */
  int nk;
  skey *keys;        /* the keys held: its own range's, then its replicas' */
  int *kpos;         /* per key of the map: its place in keys, -1 not held */
  /* remote workers */
  uint8_t *hdr;      /* N x 64 */
  dt_comm_req *req;  /* N */
  uint8_t *posted;
  int rr;            /* blocking mode: the worker waited on next */
  int *bye;          /* per worker: final bye */
  uint8_t *parked;   /* per worker: a push waiting for its clock (replicas, bsp) */
  dt_ps_msg *pmsg;   /* ... that push */
  int64_t *marks;    /* per worker: marks seen */
  int nbye;
  uint8_t welcome[DT_PS_HDR_BYTES];
  dt_comm_req wreq[1];
  /* the colocated worker */
  int local;         /* its index, -1 none */
  dt_ps_local_reply local_fn;
  void *local_ud;
  dt_ps_server_stats st;
  int failed;
  int extra;         /* the last message was a checkpoint pull: not a turn of its worker */
};

static skey *key_of(dt_ps_server *s, int idx) { return &s->keys[s->kpos[idx]]; }

static int srank(const dt_ps_server *s, int w) { (void)s; return w; } /* workers are ranks 0..N-1 */

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
  int N = s->N;
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
  s->keys = calloc((size_t)(s->nk ? s->nk : 1), sizeof *s->keys);
  s->kpos = malloc((size_t)map->nkeys * sizeof *s->kpos);
  s->hdr = calloc((size_t)N, DT_PS_HDR_BYTES);
  s->req = calloc((size_t)N, sizeof *s->req);
  s->posted = calloc((size_t)N, 1);
  s->bye = calloc((size_t)N, sizeof *s->bye);
  s->marks = calloc((size_t)N, sizeof *s->marks);
  s->parked = calloc((size_t)N, 1);
  s->pmsg = calloc((size_t)N, sizeof *s->pmsg);
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
  for (int i = 0; i < s->nk; i++) {
    skey *k = &s->keys[i];
    k->K = &map->keys[k->idx];
    size_t len = k->K->len;
    if (dt_optim_create(&k->opt, &opts->optim, len) < 0) goto fail;
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
  }
  *out = s;
  return DT_OK;
oom:
  dt__seterr(DT_ENOMEM, "ps server %d: out of memory", index);
fail:
  dt_ps_server_destroy(s);
  return DT_ENOMEM;
}

void dt_ps_server_destroy(dt_ps_server *s) {
  if (!s) return;
  for (int i = 0; s->keys && i < s->nk; i++) {
    skey *k = &s->keys[i];
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
  }
  free(s->keys);
  free(s->kpos);
  dt_free(s->params);
  free(s->hdr);
  free(s->req);
  free(s->posted);
  free(s->bye);
  free(s->marks);
  free(s->parked);
  free(s->pmsg);
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
    if (s->marks[w] < m) m = s->marks[w];
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

static int64_t min_clock(const skey *k, int N) {
  int64_t m = INT64_MAX;
  for (int w = 0; w < N; w++)
    if (k->wclock[w] < m) m = k->wclock[w];
  return m;
}

static int readable(const dt_ps_server *s, const skey *k, int w) {
  int64_t c = k->want[w];
  if (c < 0) return 0;
  int64_t mc = min_clock(k, s->N);
  if (k->wflags[w] & DT_PS_F_FINAL)
    return s->o.consistency == DT_PS_BSP ? k->version >= c : mc >= c;
  switch (s->o.consistency) {
  case DT_PS_BSP: return k->version >= c;
  case DT_PS_SSP: return mc >= c - s->o.staleness;
  default: return 1;
  }
}

static int wait_sent(dt_ps_server *s, skey *k, int w) {
  if (!k->sent[w]) return DT_OK;
  k->sent[w] = 0;
  int rc = dt_comm_waitall(s->comm, &k->sreq[2 * w], 2);
  return rc < 0 ? comm_fail(s, rc, "sending parameters") : DT_OK;
}

static int reply(dt_ps_server *s, skey *k, int w) {
  int64_t c = k->want[w], mc = min_clock(k, s->N);
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
    DT_CHECK(wait_sent(s, k, w));
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
    int rc = dt_comm_isend(s->comm, srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                           &k->sreq[2 * w]);
    if (rc == DT_OK)
      rc = dt_comm_isend(s->comm, srank(s, w), DT_PS_TAG_KEY(k->idx) + 1, dst,
                         n * rl * sizeof(float), &k->sreq[2 * w + 1]);
    if (rc < 0) return comm_fail(s, rc, "sending rows");
    k->sent[w] = 1;
    return DT_OK;
  }
  if (w == s->local) {
    s->local_fn(s->local_ud, &m, k->p);
    return DT_OK;
  }
  DT_CHECK(wait_sent(s, k, w));
  const float *src = k->p;
  /* bsp without backups: no update of this key before every worker has
   * pushed again, i.e. received this: send straight from the parameters */
  if (!(s->o.consistency == DT_PS_BSP && s->o.backup_workers == 0)) {
    memcpy(k->snap + (size_t)w * len, k->p, len * sizeof(float));
    src = k->snap + (size_t)w * len;
  }
  uint8_t *h = k->shdr + (size_t)w * DT_PS_HDR_BYTES;
  dt_ps_msg_encode(&m, h);
  int rc = dt_comm_isend(s->comm, srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                         &k->sreq[2 * w]);
  if (rc == DT_OK)
    rc = dt_comm_isend(s->comm, srank(s, w), DT_PS_TAG_KEY(k->idx) + 1, src, len * sizeof(float),
                       &k->sreq[2 * w + 1]);
  if (rc < 0) return comm_fail(s, rc, "sending parameters");
  k->sent[w] = 1;
  return DT_OK;
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
  DT_CHECK(wait_sent(s, k, w));
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
  int rc = dt_comm_isend(s->comm, srank(s, w), DT_PS_TAG_KEY(k->idx), h, DT_PS_HDR_BYTES,
                         &k->sreq[2 * w]);
  if (rc == DT_OK)
    rc = dt_comm_isend(s->comm, srank(s, w), DT_PS_TAG_KEY(k->idx) + 1, k->rec,
                       n * sizeof(float), &k->sreq[2 * w + 1]);
  if (rc < 0) return comm_fail(s, rc, "sending a checkpoint record");
  k->sent[w] = 1;
  /* the record buffer is shared by the workers: only one asks (rank 0) */
  return wait_sent(s, k, w);
}

int dt_ps_server_restore(dt_ps_server *s, int key, const float *src, int64_t step) {
  if (key < 0 || key >= s->map->nkeys || s->kpos[key] < 0)
    return dt__seterr(DT_EINVAL, "ps server %d: key %d is not held here", s->index, key);
  skey *k = key_of(s, key);
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
static int try_replies(dt_ps_server *s, skey *k) {
  for (int w = 0; w < s->N; w++)
    if (w != s->local && readable(s, k, w)) DT_CHECK(reply(s, k, w));
  if (s->local >= 0 && readable(s, k, s->local)) DT_CHECK(reply(s, k, s->local));
  return DT_OK;
}

/* g = a + b, one pass (the same bits as copying a, then adding b). */
static void add2(float *restrict g, const float *restrict a, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) g[i] = a[i] + b[i];
}
static void add1(float *restrict g, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) g[i] += x[i];
}

/* ---- applying pushes ---------------------------------------------------------- */

/* bsp_close of a key of rows: each row summed over the workers that pushed
 * it, in rank order, then the optimizer steps those rows only. */
static int bsp_close_rows(dt_ps_server *s, skey *k) {
  const size_t rl = k->K->rowlen;
  size_t nt = 0;
  float wsum = 0, lr = 0;
  int first = 1;
  for (int w = 0; w < s->N; w++) {
    if (!k->arr[w]) continue;
    const float *slot = k->pb + (size_t)w * k->stride;
    const size_t n = (size_t)k->pcount[w];
    const float *vals = slot + n;
    for (size_t j = 0; j < n; j++) {
      uint32_t r;
      memcpy(&r, &slot[j], sizeof r);
      float *dst = k->sum + (size_t)(k->mark[r] ? k->pos[r] : (k->pos[r] = (uint32_t)nt)) * rl;
      if (!k->mark[r]) {
        k->mark[r] = 1;
        k->touched[nt++] = r;
        memcpy(dst, vals + j * rl, rl * sizeof(float));
      } else {
        for (size_t d = 0; d < rl; d++) dst[d] += vals[j * rl + d];
      }
    }
    if (first) lr = k->wlr[w], first = 0;
    wsum += k->wweight[w];
  }
  if (k->narr < s->N && wsum > 0) {
    float sc = 1.0f / wsum;
    for (size_t i = 0; i < nt * rl; i++) k->sum[i] *= sc;
  }
  int rc = dt__optim_step_rows(k->opt, k->p, k->sum, lr, k->touched, nt, rl);
  for (size_t j = 0; j < nt; j++) k->mark[k->touched[j]] = 0;
  if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
  memset(k->arr, 0, (size_t)s->N);
  k->narr = 0;
  k->version++;
  s->st.clocks++;
  return try_replies(s, k);
}

static int bsp_close(dt_ps_server *s, skey *k) {
  if (k->rowmode == 1) return bsp_close_rows(s, k);
  size_t len = k->K->len;
  int N = s->N;
  /* direct sends of the last version must be done before it changes */
  if (s->o.backup_workers == 0)
    for (int w = 0; w < N; w++) DT_CHECK(wait_sent(s, k, w));
  float *g = k->sum;
  const float *a = NULL;
  int n = 0;
  float lr = 0, wsum = 0;
  /* in rank order: ((x0 + x1) + x2) + ... */
  for (int w = 0; w < N; w++) {
    if (!k->arr[w]) continue;
    const float *x = k->wsrc[w];
    if (n == 0) {
      a = x;
      lr = k->wlr[w];
    } else if (n == 1) {
      add2(g, a, x, len);
    } else {
      add1(g, x, len);
    }
    n++;
    wsum += k->wweight[w];
  }
  if (n == 1) memcpy(g, a, len * sizeof(float));
  /* backup workers: the pushes that came in stand for the whole batch */
  if (k->narr < N && wsum > 0) {
    float sc = 1.0f / wsum;
    for (size_t i = 0; i < len; i++) g[i] *= sc;
  }
  int rc = dt_optim_step(k->opt, k->p, g, lr);
  if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
  memset(k->arr, 0, (size_t)N);
  k->narr = 0;
  k->version++;
  s->st.clocks++;
  return try_replies(s, k);
}

/* Where the payload of push m from worker w goes: bsp's per-worker slot, or
 * the scratch (async, and late pushes that are dropped). */
static float *push_dest(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m) {
  if (s->o.consistency == DT_PS_BSP && m->clock == k->version && !k->arr[w])
    return k->pb + (size_t)w * k->stride;
  return k->sum;
}

/* A sparse push (significance filter): count (index, value) pairs become a
 * dense gradient with zeros elsewhere, in dst. */
static int scatter(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m, const float *pairs,
                   float *dst) {
  size_t len = k->K->len;
  memset(dst, 0, len * sizeof(float));
  for (uint64_t j = 0; j < m->count; j++) {
    uint32_t i;
    memcpy(&i, &pairs[2 * j], sizeof i);
    if (i >= len)
      return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed index %u of key %d (the key "
                        "has %zu floats)", s->index, w, i, m->key, len);
    dst[i] += pairs[2 * j + 1];
  }
  return DT_OK;
}

/* A push of rows (DT_PS_F_ROWS): data = count row numbers, then their
 * values. */
static int on_push_rows(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m, const float *data) {
  const size_t n = m->count, rl = k->K->rowlen;
  for (size_t j = 0; j < n; j++) {
    uint32_t r;
    memcpy(&r, &data[j], sizeof r);
    if (r >= k->nrows)
      return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed row %u of key %d (the key "
                        "has %zu rows)", s->index, w, r, m->key, k->nrows);
  }
  if (s->o.consistency == DT_PS_BSP) {
    if (m->clock > k->version)
      return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed clock %lld of key %d before "
                        "clock %lld closed", s->index, w, (long long)m->clock, m->key,
                        (long long)k->version);
    if (m->clock < k->version) {
      s->st.dropped++;
    } else {
      float *slot = k->pb + (size_t)w * k->stride;
      if (data != slot) memcpy(slot, data, n * (1 + rl) * sizeof(float));
      k->pcount[w] = (int64_t)n;
      k->arr[w] = 1;
      k->wweight[w] = m->weight;
      k->wlr[w] = m->lr;
      k->narr++;
    }
    if (k->narr >= s->N - s->o.backup_workers) return bsp_close_rows(s, k);
    return try_replies(s, k);
  }
  float lr = m->lr;
  if (s->o.consistency == DT_PS_ASP) {
    int64_t stale = k->version - (int64_t)m->aux;
    if (stale > 1) lr /= (float)stale;
  }
  int rc = dt__optim_step_rows(k->opt, k->p, data + n, lr, (const uint32_t *)(const void *)data,
                               n, rl);
  if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
  k->version++;
  return try_replies(s, k);
}

static int on_push(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m, const float *data) {
  size_t len = k->K->len;
  s->st.pushes++;
  if (k->nrows) {
    int rows = (m->flags & DT_PS_F_ROWS) != 0;
    if (k->rowmode >= 0 && k->rowmode != rows)
      return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed key %d %s, but it has been "
                        "pushed %s", s->index, w, m->key, rows ? "by rows" : "whole",
                        rows ? "whole" : "by rows");
    k->rowmode = rows;
  }
  if (m->flags & DT_PS_F_ROWS) {
    if (m->clock != k->wclock[w])
      return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed clock %lld of key %d, "
                        "expected clock %lld", s->index, w, (long long)m->clock, m->key,
                        (long long)k->wclock[w]);
    k->wclock[w]++;
    return on_push_rows(s, k, w, m, data);
  }
  if (m->flags & DT_PS_F_SPARSE) {
    float *dst = push_dest(s, k, w, m);
    DT_CHECK(scatter(s, k, w, m, data, dst));
    data = dst;
  }
  if (m->clock != k->wclock[w])
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed clock %lld of key %d, "
                      "expected clock %lld", s->index, w, (long long)m->clock, m->key,
                      (long long)k->wclock[w]);
  k->wclock[w]++;
  if (s->o.consistency == DT_PS_BSP) {
    if (m->clock > k->version)
      return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed clock %lld of key %d before "
                        "clock %lld closed", s->index, w, (long long)m->clock, m->key,
                        (long long)k->version);
    if (m->clock < k->version) {
      s->st.dropped++; /* a backup worker's late push */
    } else {
      float *dst = k->pb + (size_t)w * k->stride;
      if (s->alias && w == s->local) {
        /* the colocated worker's gradients stay put until this clock
         * closes: it waits for the key's reply */
        k->wsrc[w] = data;
      } else {
        if (data != dst) memcpy(dst, data, len * sizeof(float));
        k->wsrc[w] = dst;
      }
      k->arr[w] = 1;
      k->wweight[w] = m->weight;
      k->wlr[w] = m->lr;
      k->narr++;
    }
  } else {
    /* applied on arrival; asp divides the rate by the staleness */
    float lr = m->lr;
    if (s->o.consistency == DT_PS_ASP) {
      int64_t stale = k->version - (int64_t)m->aux;
      if (stale > 1) lr /= (float)stale;
    }
    int rc = dt_optim_step(k->opt, k->p, data, lr);
    if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
    k->version++;
  }
  if (m->flags & DT_PS_F_PULL) {
    k->want[w] = m->clock + 1;
    k->wflags[w] = 0;
  }
  if (s->o.consistency == DT_PS_BSP && k->narr >= s->N - s->o.backup_workers)
    return bsp_close(s, k);
  return try_replies(s, k);
}


static int handle(dt_ps_server *s, int w, const dt_ps_msg *m, const float *data) {
  switch (m->type) {
  case DT_PS_HELLO: {
    uint64_t mine = 0;
    const int R = s->map->replicas > 1 ? s->map->replicas : 1;
    for (int i = 0; i < 8; i++) mine |= (uint64_t)s->map->sha[i] << (8 * i);
    if (w != s->local) {
      dt_ps_msg r = {.type = DT_PS_WELCOME, .sender = s->index, .key = s->map->nkeys,
                     .count = s->map->nparams, .aux = mine, .clock = R};
      dt_ps_msg_encode(&r, s->welcome);
      int rc = dt_comm_send(s->comm, srank(s, w), DT_PS_TAG_CTL, s->welcome, DT_PS_HDR_BYTES);
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
    return on_push(s, key_of(s, m->key), w, m, data);
  case DT_PS_PULL: {
    skey *k = key_of(s, m->key);
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
    return try_replies(s, k);
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
  int rc = handle(s, m->sender, m, payload);
  return rc < 0 ? fail(s, rc) : DT_OK;
}

static int post(dt_ps_server *s, int w) {
  int rc = dt_comm_irecv(s->comm, srank(s, w), DT_PS_TAG_REQ, s->hdr + (size_t)w * DT_PS_HDR_BYTES,
                         DT_PS_HDR_BYTES, &s->req[w]);
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
  if (m.type == DT_PS_PUSH || (m.type == DT_PS_PULL && (m.flags & DT_PS_F_ROWS))) {
    skey *k = key_of(s, m.key);
    int sparse = (m.flags & DT_PS_F_SPARSE) != 0, rows = (m.flags & DT_PS_F_ROWS) != 0;
    float *dst = sparse || rows ? k->pairs : push_dest(s, k, w, &m);
    size_t bytes = (sparse ? 2 : 1) * m.count * sizeof(float);
    if (rows) bytes = m.count * (m.type == DT_PS_PUSH ? 1 + k->K->rowlen : 1) * sizeof(float);
    if (bytes) rc = dt_comm_recv(s->comm, srank(s, w), DT_PS_TAG_REQ_DATA, dst, bytes);
    if (rc < 0) return comm_fail(s, rc, "receiving a push");
    data = dst;
  }
  DT_CHECK(handle(s, w, &m, data));
  if (!s->bye[w]) DT_CHECK(post(s, w));
  return DT_OK;
}

/* A replica in bsp may get a worker's push of clock c + 1 before another
 * worker's push of clock c (that worker's primary closed clock c and
 * answered; the other's messages to the replica are still on their way):
 * it waits, parked, with that worker's later messages behind it. */
static int must_park(dt_ps_server *s, const dt_ps_msg *m) {
  return s->map->replicas > 1 && s->o.consistency == DT_PS_BSP && m->type == DT_PS_PUSH &&
         m->clock > key_of(s, m->key)->version;
}

static int arrived(dt_ps_server *s, int w) {
  s->posted[w] = 0;
  dt_ps_msg m;
  int rc = dt_ps_msg_parse(s->hdr + (size_t)w * DT_PS_HDR_BYTES, DT_PS_HDR_BYTES, s->map, s->N,
                           s->index, w, &m);
  if (rc < 0) return dt__preerr(rc, "ps server %d refused a message", s->index);
  if (must_park(s, &m)) {
    s->parked[w] = 1;
    s->pmsg[w] = m;
    return DT_OK;
  }
  return take(s, w, &m);
}

int dt_ps_server_poll(dt_ps_server *s, int *busy) {
  *busy = 0;
  if (s->failed) return dt__seterr(DT_EABORTED, "ps server %d: failed earlier", s->index);
  int rc = DT_OK;
  for (int w = 0; w < s->N && rc == DT_OK; w++) {
    if (w == s->local || s->bye[w]) continue;
    if (s->parked[w]) {
      if (must_park(s, &s->pmsg[w])) continue;
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
    rc = dt_comm_test(s->comm, &s->req[w], &done);
    if (rc < 0) {
      rc = comm_fail(s, rc, "waiting for workers");
      break;
    }
    if (done) {
      *busy = 1;
      rc = arrived(s, w);
    }
  }
  return rc < 0 ? fail(s, rc) : DT_OK;
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

static int finish_sends(dt_ps_server *s) {
  for (int i = 0; i < s->nk; i++)
    for (int w = 0; w < s->N; w++) DT_CHECK(wait_sent(s, &s->keys[i], w));
  return DT_OK;
}

int dt_ps_server_run(dt_ps_server *s) {
  int rc = DT_OK;
  /* bsp without backups needs every worker's messages anyway: wait on them
   * in rank order (the transport blocks, nothing spins) */
  int blocking = s->o.consistency == DT_PS_BSP && s->o.backup_workers == 0 && s->local < 0 &&
                 s->map->replicas < 2;
  int idle = 0;
  while (!dt_ps_server_done(s)) {
    if (blocking) {
      int w = s->rr;
      s->rr = (s->rr + 1) % s->N;
      if (s->bye[w]) continue;
      if (!s->posted[w] && (rc = post(s, w)) < 0) break;
      rc = dt_comm_waitall(s->comm, &s->req[w], 1);
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
    backoff(idle);
  }
  if (rc == DT_OK) rc = finish_sends(s);
  return rc < 0 ? fail(s, rc) : DT_OK;
}

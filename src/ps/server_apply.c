/*
 * server_apply.c — how a server applies pushes (server.c receives them and
 * answers): bsp sums a clock's pushes in rank order (the colocated
 * worker's straight from its gradients: zero copy) then steps the
 * optimizer once; keys of rows sum and step just the rows pushed;
 * significance-filtered pushes are scattered into a dense gradient; ssp
 * and asp step on arrival (asp with the rate divided by the staleness).
 * Replies go out through dt__pss_try_replies once a read is allowed.
 *
 * It does not receive, send or parse messages.
 */
#include <string.h>

#include "ps/server_int.h"

/* g = a + b, one pass (the same bits as copying a, then adding b). */
static void add2(float *restrict g, const float *restrict a, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) g[i] = a[i] + b[i];
}
static void add1(float *restrict g, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) g[i] += x[i];
}

/* ---- applying pushes ---------------------------------------------------------- */

/* The first bsp clock closed after a worker was lost: when (the bench's
 * measure of how long the loss held the job up). */
static void clock_after_loss(dt_ps_server *s, const skey *k) {
  if (!(s->lost_t > 0)) return;
  const double now = dt_now();
  DT_LOG_INFO("ps server %d: key %d closed clock %lld %.3f s after worker %d was lost",
              s->index, k->idx, (long long)k->version - 1, now - s->lost_t, s->lost_w);
  s->lost_t = 0;
}

/* bsp: pushes that close a clock: every live worker's (N - b without
 * lost workers; docs/ps.md "Workers leaving"). */
int dt__pss_need(const dt_ps_server *s) {
  int n = s->N - s->ngone - s->o.backup_workers;
  return n < 1 ? 1 : n;
}

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
  clock_after_loss(s, k);
  return dt__pss_try_replies(s, k);
}

static int bsp_close(dt_ps_server *s, skey *k) {
  if (k->rowmode == 1) return bsp_close_rows(s, k);
  size_t len = k->K->len;
  int N = s->N;
  /* direct sends of the last version must be done before it changes */
  if (s->o.backup_workers == 0)
    for (int w = 0; w < N; w++) DT_CHECK(dt__pss_wait_sent(s, k, w));
  float *g = k->sum;
  const float *a = NULL;
  int n = 0;
  float lr = 0, wsum = 0;
  int rc;
  /* two pushes, SGD: the sum and the step in one pass (fused.c, the same
   * bits; DTRAIN_PS_FUSED=0 for the two passes) */
  if (N == 2 && k->narr == 2 && k->arr[0] && k->arr[1] && s->fused) {
    /* both workers remote, through windows, reading this very version:
     * the same pass writes their parameters (reply() then sends headers) */
    float *o0 = NULL, *o1 = NULL;
    if (s->local < 0 && s->o.win_params && !s->gone[0] && !s->gone[1] &&
        k->want[0] == k->version + 1 && k->want[1] == k->version + 1 &&
        k->wflags[0] == DT_PS_F_WIN && k->wflags[1] == DT_PS_F_WIN) {
      o0 = s->o.win_params[0] + k->K->off;
      o1 = s->o.win_params[1] + k->K->off;
    }
    if (dt__pss_fused_sum2_step(&s->o.optim, k->opt, len, k->p, k->wsrc[0], k->wsrc[1],
                                k->wlr[0], o0, o1)) {
      k->prever = o0 ? k->version + 1 : -1;
      n = 2;
      goto stepped;
    }
  }
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
  rc = dt_optim_step(k->opt, k->p, g, lr);
  if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
stepped:
  memset(k->arr, 0, (size_t)N);
  k->narr = 0;
  k->version++;
  s->st.clocks++;
  clock_after_loss(s, k);
  /* the windows written by the fused pass serve these replies only */
  rc = dt__pss_try_replies(s, k);
  k->prever = -1;
  return rc;
}

/* Where the payload of push m from worker w goes: bsp's per-worker slot, or
 * the scratch (async, and late pushes that are dropped). */
float *dt__pss_push_dest(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m) {
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

/* bsp: a push of a clock after the one open (a protocol error). */
static int ahead(const dt_ps_server *s, const skey *k, int w, const dt_ps_msg *m) {
  return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed clock %lld of key %d before clock "
                    "%lld closed", s->index, w, (long long)m->clock, m->key, (long long)k->version);
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
    if (m->clock > k->version) return ahead(s, k, w, m);
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
    if (k->narr >= dt__pss_need(s)) return bsp_close_rows(s, k);
    return dt__pss_try_replies(s, k);
  }
  float lr = m->lr;
  if (s->o.consistency == DT_PS_ASP) {
    int64_t stale = k->version - (int64_t)m->aux;
    if (stale > 1) lr /= (float)stale;
  }
  DT_CHECK(dt__pss_settle(s, k));
  int rc = dt__optim_step_rows(k->opt, k->p, data + n, lr, (const uint32_t *)(const void *)data,
                               n, rl);
  if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
  k->version++;
  return dt__pss_try_replies(s, k);
}

int dt__pss_on_push(dt_ps_server *s, skey *k, int w, const dt_ps_msg *m, const float *data) {
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
  if (k->copied && m->clock < k->wclock[w]) {
    /* re-replication: the copy this key was installed from holds this push
     * already (the worker sent it to the copy's source too) */
    if (m->flags & DT_PS_F_PULL) {
      k->want[w] = m->clock + 1;
      k->wflags[w] = m->flags & DT_PS_F_WIN;
      return dt__pss_try_replies(s, k);
    }
    return DT_OK;
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
    float *dst = dt__pss_push_dest(s, k, w, m);
    DT_CHECK(scatter(s, k, w, m, data, dst));
    data = dst;
  }
  if (m->clock != k->wclock[w])
    return dt__seterr(DT_EPROTO, "ps server %d: worker %d pushed clock %lld of key %d, "
                      "expected clock %lld", s->index, w, (long long)m->clock, m->key,
                      (long long)k->wclock[w]);
  k->wclock[w]++;
  if (s->o.consistency == DT_PS_BSP) {
    if (m->clock > k->version) return ahead(s, k, w, m);
    if (m->clock < k->version) {
      s->st.dropped++; /* a backup worker's late push */
    } else {
      float *dst = k->pb + (size_t)w * k->stride;
      if ((s->alias && w == s->local) || (m->flags & DT_PS_F_WIN)) {
        /* the colocated worker's gradients, or a worker's in its window,
         * stay put until this clock closes: it waits for the key's reply */
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
    DT_CHECK(dt__pss_settle(s, k));
    int rc = dt_optim_step(k->opt, k->p, data, lr);
    if (rc < 0) return dt__preerr(rc, "ps server %d: key %d", s->index, k->idx);
    k->version++;
  }
  if (m->flags & DT_PS_F_PULL) {
    k->want[w] = m->clock + 1;
    k->wflags[w] = m->flags & DT_PS_F_WIN;
  }
  if (s->o.consistency == DT_PS_BSP && k->narr >= dt__pss_need(s))
    return bsp_close(s, k);
  return dt__pss_try_replies(s, k);
}



/* After a worker was removed (elastic): a bsp clock that now has every
 * live worker's push closes; reads that waited for the lost worker's
 * clocks (ssp) may go. */
int dt__pss_recheck(dt_ps_server *s, skey *k) {
  if (k->live != 1) return DT_OK;
  if (s->o.consistency == DT_PS_BSP && k->narr > 0 && k->narr >= dt__pss_need(s))
    return k->rowmode == 1 ? bsp_close_rows(s, k) : bsp_close(s, k);
  return dt__pss_try_replies(s, k);
}

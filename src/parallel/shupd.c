/*
 * shupd.c — the optimizer step split over the ranks of one host by speed
 * (shupd.h has the contract; docs/ddp.md "The shared update" the why and
 * the measurements). Every rank's window segment starts with a header: the
 * largest |gradient| of its slices this step, and the list of the slices
 * it stepped (element ranges); then its parameter copy (pull mode; in
 * shared mode only rank 0's is used, by everyone); then the optimizer
 * state, in the whole model's layout, used in rank 0's segment only. The
 * other segments' unused parts are never touched (shm pages are only
 * backed once written).
 *
 * Why every rank sees the whole update when the reduction returns: a rank
 * steps its slice after summing it and before posting `done`, and the
 * reduction returns only after every rank posted `done`; in pull mode it
 * then copies the other ranks' slices out of their copies. Why no rank
 * reads what another is writing: the slices are disjoint; a rank steps a
 * bucket's parameters only after every rank has joined that bucket's
 * reduction, i.e. finished the backward that reads them (and, in pull
 * mode, the copy of the step before, which precedes its next forward);
 * and a rank rewrites its header only inside the next step's reduction,
 * which no rank joins before it has read the headers of this one.
 */
#include "parallel/shupd.h"

#include <stdlib.h>
#include <string.h>

#include "comm/window.h"
#include "core/core.h"

struct seg_hdr {
  uint32_t maxbits; /* this step's largest |gradient| bits over the rank's slices */
  uint32_t nspans;  /* the slices it stepped this step */
  uint64_t span[];  /* [first, end) pairs */
};

struct dt_shupd {
  dt_comm_window *win;
  dt_optim_cfg cfg;
  int pull;                       /* 1: a copy per rank, pulled; 0: one shared copy */
  size_t n, nstate, maxspans;
  float *params, *state;          /* this rank's copy (pull) or rank 0's; rank 0's state */
  float **peer_params;            /* pull: every rank's copy */
  struct seg_hdr **hdr;           /* per rank */
  const float *grads;             /* this rank's gradient window (summed slices) */
  uint32_t big;                   /* this step's largest |gradient| bits, this rank */
  int fresh;                      /* no slice stepped yet this step */
  float lr;
  int64_t t;                      /* the step number being applied */
  int nranks, rank;
};

#define LINE 64
static size_t up(size_t b) { return (b + LINE - 1) & ~(size_t)(LINE - 1); }

static void free_u(dt_shupd *u) {
  dt_comm_window_destroy(u->win);
  free(u->peer_params);
  free(u->hdr);
  free(u);
}

int dt_shupd_create(dt_shupd **out, dt_model *m, dt_optim *o, const dt_optim_cfg *cfg,
                    dt_comm *c, int pull, size_t maxspans) {
  *out = NULL;
  const size_t n = dt_model_nparams(m), ns = dt_optim_state_floats(o);
  const int N = dt_comm_size(c), r = dt_comm_rank(c);
  if (!n || N < 2) return dt__seterr(DT_ENOTSUP, "shared update: nothing to share");
  dt_shupd *u = calloc(1, sizeof *u);
  if (u) u->hdr = calloc((size_t)N, sizeof *u->hdr);
  if (u) u->peer_params = calloc((size_t)N, sizeof *u->peer_params);
  if (!u || !u->hdr || !u->peer_params) {
    if (u) free_u(u);
    return dt__seterr(DT_ENOMEM, "shared update: out of memory");
  }
  const size_t poff = up(sizeof(struct seg_hdr) + 2 * maxspans * sizeof(uint64_t));
  const size_t soff = poff + up(n * sizeof(float));
  int rc = dt_comm_window_create(c, soff + up((ns ? ns : 1) * sizeof(float)), &u->win);
  if (rc < 0) {
    u->win = NULL;
    free_u(u);
    return rc;
  }
  u->cfg = *cfg;
  u->pull = pull;
  u->n = n;
  u->nstate = ns;
  u->maxspans = maxspans;
  u->nranks = N;
  u->rank = r;
  for (int q = 0; q < N; q++) {
    char *b = dt_comm_window_peer(u->win, q);
    u->hdr[q] = (struct seg_hdr *)b;
    u->peer_params[q] = (float *)(b + poff);
  }
  u->params = u->peer_params[pull ? r : 0];
  u->state = (float *)((char *)u->hdr[0] + soff);
  /* rank 0 fills the state (and the one copy); the others start once it
   * is there (their parameters equal rank 0's after the start-up
   * broadcast); in pull mode every rank fills its own copy */
  if (r == 0) {
    if (ns) memcpy(u->state, dt_optim_state(o), ns * sizeof(float));
    rc = dt__model_point_params(m, u->params);
  } else if (pull) {
    rc = dt__model_point_params(m, u->params);
  }
  int rb = dt_comm_barrier(c);
  if (rc == DT_OK && rb < 0) rc = rb;
  if (rc == DT_OK && r != 0 && !pull) {
    /* dt__model_point_params copies the model's parameters in: the same
     * bits rank 0 wrote, while every rank waits at the barrier below */
    rc = dt__model_point_params(m, u->params);
  }
  rb = dt_comm_barrier(c);
  if (rc == DT_OK && rb < 0) rc = rb;
  if (rc < 0) {
    dt_shupd_destroy(u, m, o);
    return rc;
  }
  *out = u;
  return DT_OK;
}

void dt_shupd_destroy(dt_shupd *u, dt_model *m, dt_optim *o) {
  if (!u) return;
  if (dt_model_params(m) == u->params) dt__model_point_params(m, NULL); /* copies back */
  dt_shupd_state_out(u, o);
  free_u(u);
}

void dt_shupd_begin(dt_shupd *u, dt_optim *o, float lr) {
  u->lr = lr;
  u->big = 0;
  u->fresh = 1;
  u->t = *dt_optim_step_count(o) + 1;
}

void dt_shupd_set_grads(dt_shupd *u, const float *g) { u->grads = g; }

int dt_shupd_apply(void *ud, size_t first, size_t end) {
  dt_shupd *u = ud;
  if (end > u->n || first > end)
    return dt__seterr(DT_EINVAL, "shared update: slice [%zu, %zu) outside %zu parameters", first,
                      end, u->n);
  struct seg_hdr *h = u->hdr[u->rank];
  if (u->fresh) { /* inside the reduction: every peer has read last step's */
    h->nspans = 0;
    u->fresh = 0;
  }
  uint32_t b = 0;
  DT_CHECK(dt__optim_step_span(&u->cfg, u->n, first, end, u->params, u->grads, u->lr, u->state,
                               u->t, &b));
  if (b > u->big) u->big = b;
  /* published before `done` */
  h->maxbits = u->big;
  if (end > first) {
    if (h->nspans >= u->maxspans)
      return dt__seterr(DT_EINVAL, "shared update: more than %zu slices in a step", u->maxspans);
    h->span[2 * h->nspans] = first;
    h->span[2 * h->nspans + 1] = end;
    h->nspans++;
  }
  return DT_OK;
}

void dt_shupd_end(dt_shupd *u, dt_optim *o) {
  uint32_t big = 0;
  for (int q = 0; q < u->nranks; q++) {
    const struct seg_hdr *h = u->hdr[q];
    big = h->maxbits > big ? h->maxbits : big;
    if (!u->pull || q == u->rank) continue;
    /* the slices rank q stepped, out of its copy into this rank's */
    const float *src = u->peer_params[q];
    uint32_t k = h->nspans < u->maxspans ? h->nspans : (uint32_t)u->maxspans;
    for (uint32_t i = 0; i < k; i++) {
      uint64_t a = h->span[2 * i], e = h->span[2 * i + 1];
      if (a < e && e <= u->n) memcpy(u->params + a, src + a, (size_t)(e - a) * sizeof(float));
    }
  }
  *dt_optim_step_count(o) = u->t;
  dt__optim_set_grad_maxbits(o, big);
}

void dt_shupd_state_out(dt_shupd *u, dt_optim *o) {
  if (u && o && u->nstate == dt_optim_state_floats(o) && u->nstate)
    memcpy(dt_optim_state(o), u->state, u->nstate * sizeof(float));
}

void dt_shupd_state_in(dt_shupd *u, dt_optim *o) {
  if (u && o && u->nstate == dt_optim_state_floats(o) && u->nstate)
    memcpy(u->state, dt_optim_state(o), u->nstate * sizeof(float));
}

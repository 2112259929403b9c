/*
 * shupd.c — one parameter copy per host, updated in slices (shupd.h has
 * the contract; docs/ddp.md "The shared update" the why and the
 * measurements). Every rank's window segment starts with one cache line
 * that holds its slice's largest |gradient| of the step; rank 0's segment
 * then holds the parameters (n floats) and the optimizer state (in the
 * whole model's layout), each on a 64-byte boundary. The other ranks'
 * segments are never touched past their first line (shm pages are only
 * backed once written).
 *
 * Why every rank sees the whole update when the reduction returns: a rank
 * applies the optimizer to its slice after summing it and before posting
 * `done`, and the reduction returns only after every rank posted `done`.
 * Why no rank reads a parameter another is writing: the slices are
 * disjoint, and a rank updates only after every rank has joined the
 * bucket's reduction, i.e. finished the backward that reads those
 * parameters; the next forward starts after the last bucket returned.
 * The same holds for the step maxima: a rank rewrites its line only in
 * the next step's reduction, which no rank joins before reading them.
 */
#include "parallel/shupd.h"

#include <stdlib.h>
#include <string.h>

#include "comm/window.h"
#include "core/core.h"

struct dt_shupd {
  dt_comm_window *win;
  dt_optim_cfg cfg;
  size_t n, nstate;
  float *params, *state;          /* in rank 0's segment */
  const float *grads;             /* this rank's gradient window (summed slices) */
  volatile uint32_t **maxbits;    /* per rank: the first word of its segment */
  uint32_t big;                   /* this step's largest |gradient| bits, this rank */
  float lr;
  int64_t t;                      /* the step number being applied */
  int nranks, rank;
};

#define LINE 64
static size_t up(size_t b) { return (b + LINE - 1) & ~(size_t)(LINE - 1); }

int dt_shupd_create(dt_shupd **out, dt_model *m, dt_optim *o, const dt_optim_cfg *cfg,
                    dt_comm *c) {
  *out = NULL;
  const size_t n = dt_model_nparams(m), ns = dt_optim_state_floats(o);
  const int N = dt_comm_size(c), r = dt_comm_rank(c);
  if (!n || N < 2) return dt__seterr(DT_ENOTSUP, "shared update: nothing to share");
  dt_shupd *u = calloc(1, sizeof *u);
  if (u) u->maxbits = calloc((size_t)N, sizeof *u->maxbits);
  if (!u || !u->maxbits) {
    if (u) free(u);
    return dt__seterr(DT_ENOMEM, "shared update: out of memory");
  }
  const size_t poff = LINE, soff = poff + up(n * sizeof(float));
  int rc = dt_comm_window_create(c, soff + up((ns ? ns : 1) * sizeof(float)), &u->win);
  if (rc < 0) {
    free(u->maxbits);
    free(u);
    return rc;
  }
  u->cfg = *cfg;
  u->n = n;
  u->nstate = ns;
  u->nranks = N;
  u->rank = r;
  char *base0 = dt_comm_window_peer(u->win, 0);
  u->params = (float *)(base0 + poff);
  u->state = (float *)(base0 + soff);
  for (int q = 0; q < N; q++) u->maxbits[q] = (volatile uint32_t *)dt_comm_window_peer(u->win, q);
  /* rank 0 fills the copy; the others point at it once it is there (their
   * own parameters are equal to rank 0's after the start-up broadcast) */
  if (r == 0) {
    if (ns) memcpy(u->state, dt_optim_state(o), ns * sizeof(float));
    rc = dt__model_point_params(m, u->params);
  }
  int rb = dt_comm_barrier(c);
  if (rc == DT_OK && rb < 0) rc = rb;
  if (rc == DT_OK && r != 0) {
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
  dt_comm_window_destroy(u->win);
  free(u->maxbits);
  free(u);
}

void dt_shupd_begin(dt_shupd *u, dt_optim *o, float lr) {
  u->lr = lr;
  u->big = 0;
  u->t = *dt_optim_step_count(o) + 1;
}

void dt_shupd_set_grads(dt_shupd *u, const float *g) { u->grads = g; }

int dt_shupd_apply(void *ud, size_t first, size_t end) {
  dt_shupd *u = ud;
  if (end > u->n || first > end)
    return dt__seterr(DT_EINVAL, "shared update: slice [%zu, %zu) outside %zu parameters", first,
                      end, u->n);
  uint32_t b = 0;
  DT_CHECK(dt__optim_step_span(&u->cfg, u->n, first, end, u->params, u->grads, u->lr, u->state,
                               u->t, &b));
  if (b > u->big) u->big = b;
  /* published before `done` (every slice's call has one, empty or not) */
  *u->maxbits[u->rank] = u->big;
  return DT_OK;
}

void dt_shupd_end(dt_shupd *u, dt_optim *o) {
  uint32_t big = 0;
  for (int q = 0; q < u->nranks; q++) {
    uint32_t b = *u->maxbits[q];
    big = b > big ? b : big;
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

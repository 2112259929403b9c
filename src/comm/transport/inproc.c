/*
 * inproc.c — the in-process transport: ranks are threads of one process,
 * each with its own communicator; a send copies straight into the matching
 * posted receive, or into a queued copy if the receive is not posted yet
 * (matching: the shared match.c, one queue per context keyed by source).
 *
 * Contexts find each other through the address published in the store
 * ("pid:pointer"); can_connect refuses a different pid. Each context is
 * reference-counted so a peer's late send or abort never touches freed
 * memory: it starts with one reference per rank of the world (its own plus
 * one reserved for each peer's endpoint, since a peer may connect after the
 * owner has already finished and finalized), finalize marks it closed and
 * drops its own, closing a peer's endpoint drops that peer's. A peer that
 * never connects leaks its reservation (only after a failed rendezvous). Sends
 * complete immediately (eager copy). Locking: a sender takes only the
 * receiver's mutex; a waiter only its own. Not for production traffic.
 */
#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/transport/match.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct umsg { /* a message that arrived before its receive */
  struct dt_match_msg m; /* src, tag, len */
  uint8_t data[];
};

struct dt_tp_ctx {
  _Atomic int refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int rank, size;
  bool closed;
  int abort_rc;
  char abort_msg[DT_TP_ERR_MAX + 64];
  struct dt_match mt;                     /* posted receives, early messages (any source) */
  struct dt_tp_ep **eps;                  /* per peer, for abort propagation */
};

struct dt_tp_ep {
  struct dt_tp_ctx *self, *peer;
  int peer_rank;
};

static void free_umsg(struct dt_match_msg *u) { free(u); }

static void ctx_unref(struct dt_tp_ctx *x) {
  if (atomic_fetch_sub(&x->refs, 1) != 1) return;
  dt__match_drain(&x->mt, free_umsg);
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->cv);
  free(x->eps);
  free(x);
}

static int ip_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr) {
  struct dt_tp_ctx *x = calloc(1, sizeof *x);
  if (!x) return dt__seterr(DT_ENOMEM, "inproc: out of memory");
  x->eps = calloc((size_t)in->size, sizeof *x->eps);
  if (!x->eps) { free(x); return dt__seterr(DT_ENOMEM, "inproc: out of memory"); }
  atomic_init(&x->refs, in->size);
  pthread_mutex_init(&x->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&x->cv, &ca);
  pthread_condattr_destroy(&ca);
  x->rank = in->rank;
  x->size = in->size;
  dt__match_init(&x->mt, 0);
  snprintf(addr, DT_TP_ADDR_MAX, "%d:%p", (int)getpid(), (void *)x);
  *out = x;
  return DT_OK;
}

static bool ip_can_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *p) {
  int pid;
  void *ptr;
  return sscanf(p->addr, "%d:%p", &pid, &ptr) == 2 && pid == (int)getpid() && ptr;
}

static int ip_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *p, int64_t deadline,
                      struct dt_tp_ep **out, char *err) {
  int pid;
  void *ptr;
  if (sscanf(p->addr, "%d:%p", &pid, &ptr) != 2 || pid != (int)getpid()) {
    snprintf(err, DT_TP_ERR_MAX, "inproc address '%s' is not in this process", p->addr);
    return DT_EINVAL;
  }
  struct dt_tp_ep *e = calloc(1, sizeof *e);
  if (!e) return DT_ENOMEM;
  e->self = x;
  e->peer = ptr;
  e->peer_rank = p->rank; /* the reference to e->peer was reserved at its init */
  pthread_mutex_lock(&x->mu);
  x->eps[p->rank] = e;
  pthread_mutex_unlock(&x->mu);
  *out = e;
  return DT_OK;
}

static bool abort_local(struct dt_tp_ctx *x, int rc, const char *why);

static void complete(struct dt_tp_req *r, int status) {
  r->done = status == 1 ? r->len : r->done;
  r->status = status;
}

static int ip_isend(struct dt_tp_ep *e, struct dt_tp_req *r) {
  struct dt_tp_ctx *d = e->peer;
  int me = e->self->rank;
  r->ep = e;
  pthread_mutex_lock(&e->self->mu);
  int arc = e->self->abort_rc;
  pthread_mutex_unlock(&e->self->mu);
  if (arc) return complete(r, arc), arc;
  pthread_mutex_lock(&d->mu);
  if (d->closed || d->abort_rc) {
    int rc = d->closed ? DT_EPEERLOST : d->abort_rc;
    char why[sizeof d->abort_msg];
    snprintf(why, sizeof why, "%s", d->abort_msg);
    pthread_mutex_unlock(&d->mu);
    complete(r, rc);
    /* The peer aborted and we have not heard yet (its abort is still on its
     * way round): take its reason now, as a tcp ABORT frame would bring it. */
    if (rc != DT_EPEERLOST) abort_local(e->self, rc, why);
    return dt__seterr(rc, "inproc: rank %d is gone", e->peer_rank);
  }
  struct dt_tp_req *q = dt__match_posted(&d->mt, me, r->tag);
  if (q) {
    if (q->len != r->len) {
      complete(q, DT_EPROTO);
    } else {
      if (r->len) memcpy(q->buf, r->buf, r->len);
      complete(q, 1);
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    complete(r, 1);
    return DT_OK;
  }
  struct umsg *m = malloc(sizeof *m + r->len);
  int rc = m ? dt__match_ux_add(&d->mt, &m->m, me, r->tag, r->len)
             : dt__seterr(DT_ENOMEM, "inproc: out of memory buffering %zu bytes for rank %d", r->len,
                          e->peer_rank);
  if (rc < 0) { /* the receiver's early-message bound or memory: this send fails */
    pthread_mutex_unlock(&d->mu);
    free(m);
    complete(r, rc);
    return rc;
  }
  if (r->len) memcpy(m->data, r->buf, r->len);
  pthread_mutex_unlock(&d->mu);
  complete(r, 1);
  return DT_OK;
}

static int ip_irecv(struct dt_tp_ep *e, struct dt_tp_req *r) {
  struct dt_tp_ctx *x = e->self;
  r->ep = e;
  r->next = NULL;
  pthread_mutex_lock(&x->mu);
  if (x->abort_rc) {
    int rc = x->abort_rc;
    pthread_mutex_unlock(&x->mu);
    complete(r, rc);
    return rc;
  }
  struct umsg *m = (struct umsg *)dt__match_ux_take(&x->mt, r->peer, r->tag);
  if (m) {
    pthread_mutex_unlock(&x->mu);
    if (m->m.len != r->len) complete(r, DT_EPROTO);
    else {
      if (m->m.len) memcpy(r->buf, m->data, m->m.len);
      complete(r, 1);
    }
    free(m);
    return DT_OK;
  }
  dt__match_post(&x->mt, r);
  pthread_mutex_unlock(&x->mu);
  return DT_OK;
}

static int ip_test(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  int s = r->status;
  pthread_mutex_unlock(&x->mu);
  return s;
}

static void describe(struct dt_tp_req *r, char *err, int rc) {
  if (rc == DT_EPROTO)
    snprintf(err, DT_TP_ERR_MAX, "rank %d sent a message of a different length than the %zu bytes expected (tag 0x%llx)",
             r->peer, r->len, (unsigned long long)r->tag);
  else
    snprintf(err, DT_TP_ERR_MAX, "%s with rank %d failed: %s", r->kind == DT_TP_SEND ? "send" : "receive",
             r->peer, dt_strerror(rc));
}

static int ip_wait(struct dt_tp_ctx *x, struct dt_tp_req **v, int n, int64_t deadline, char *err) {
  pthread_mutex_lock(&x->mu);
  for (;;) {
    int pending = -1;
    for (int i = 0; i < n; i++) {
      if (v[i]->status < 0) {
        int rc = v[i]->status;
        if (x->abort_rc && rc == x->abort_rc) snprintf(err, DT_TP_ERR_MAX, "%s", x->abort_msg);
        else describe(v[i], err, rc);
        pthread_mutex_unlock(&x->mu);
        return rc;
      }
      if (v[i]->status == 0 && pending < 0) pending = i;
    }
    if (pending < 0) break;
    if (x->abort_rc) {
      int rc = x->abort_rc;
      snprintf(err, DT_TP_ERR_MAX, "%s", x->abort_msg);
      pthread_mutex_unlock(&x->mu);
      return rc;
    }
    int64_t now = dt_now_ns();
    if (now >= deadline) {
      snprintf(err, DT_TP_ERR_MAX, "rank %d did not %s before the deadline", v[pending]->peer,
               v[pending]->kind == DT_TP_RECV ? "send" : "receive");
      pthread_mutex_unlock(&x->mu);
      return DT_ETIMEDOUT;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (deadline - now);
    ts.tv_sec = t / 1000000000;
    ts.tv_nsec = t % 1000000000;
    pthread_cond_timedwait(&x->cv, &x->mu, &ts);
  }
  pthread_mutex_unlock(&x->mu);
  return DT_OK;
}

static void ip_cancel(struct dt_tp_ctx *x, struct dt_tp_req *r) {
  pthread_mutex_lock(&x->mu);
  dt__match_cancel(&x->mt, r);
  if (r->status == 0) r->status = DT_EABORTED;
  pthread_mutex_unlock(&x->mu);
}

/* Sets the abort state of x; returns true if this call did it. */
static bool abort_local(struct dt_tp_ctx *x, int rc, const char *why) {
  pthread_mutex_lock(&x->mu);
  bool first = x->abort_rc == 0;
  if (first) {
    x->abort_rc = rc < 0 ? rc : DT_EABORTED;
    snprintf(x->abort_msg, sizeof x->abort_msg, "%s", why);
    dt__match_fail(&x->mt, x->abort_rc);
    pthread_cond_broadcast(&x->cv);
  }
  pthread_mutex_unlock(&x->mu);
  return first;
}

static void ip_abort(struct dt_tp_ctx *x, int rc, const char *why) {
  if (!abort_local(x, rc, why)) return;
  char m[DT_TP_ERR_MAX + 64];
  if (strstr(why, "(reported by rank")) snprintf(m, sizeof m, "%s", why);
  else snprintf(m, sizeof m, "%s (reported by rank %d)", why, x->rank);
  for (int p = 0; p < x->size; p++) {
    pthread_mutex_lock(&x->mu);
    struct dt_tp_ep *e = x->eps[p];
    pthread_mutex_unlock(&x->mu);
    if (e) abort_local(e->peer, rc, m);
  }
}

static void ip_close(struct dt_tp_ep *e) {
  struct dt_tp_ctx *x = e->self;
  pthread_mutex_lock(&x->mu);
  x->eps[e->peer_rank] = NULL;
  pthread_mutex_unlock(&x->mu);
  ctx_unref(e->peer);
  free(e);
}

static void ip_finalize(struct dt_tp_ctx *x) {
  if (!x) return;
  pthread_mutex_lock(&x->mu);
  x->closed = true;
  pthread_mutex_unlock(&x->mu);
  ctx_unref(x);
}

/* Ranks of one process are threads: none dies alone, nothing to change. */
static void ip_tolerate_loss(struct dt_tp_ctx *x) { (void)x; }

static const char *ip_abort_reason(struct dt_tp_ctx *x, int *rc) {
  pthread_mutex_lock(&x->mu);
  *rc = x->abort_rc;
  pthread_mutex_unlock(&x->mu);
  return *rc ? x->abort_msg : "";
}

const struct dt_transport_ops dt__transport_inproc = {
    "inproc", ip_init, ip_can_connect, ip_connect, ip_isend, ip_irecv, ip_test,
    ip_wait, ip_cancel, ip_abort, ip_close, ip_finalize, ip_abort_reason, NULL,
    ip_tolerate_loss};

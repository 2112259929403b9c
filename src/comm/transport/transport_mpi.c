/*
 * transport_mpi.c — the MPI transport: dtrain's point-to-point messages over
 * Open MPI (MPI_Isend / MPI_Irecv / MPI_Test), so a job runs under mpirun or
 * srun on the cluster's own launcher and fabric. Built only when CMake finds
 * MPI (the file name ends in _mpi.c).
 *
 * Matching. dtrain tags are 64 bits (context id << 32 | tag); MPI tags are
 * only guaranteed 15 bits. So every message travels as a header message on
 * MPI tag TAG_HDR (the 64-bit tag, the length and, up to INLINE_MAX bytes,
 * the payload inline) and, if longer, as payload messages on TAG_DATA. MPI
 * keeps each (source, tag) stream in order, so headers and payloads pair up,
 * and this file matches headers to receives by full tag, per peer, FIFO,
 * buffering what arrives early — the same contract as every transport,
 * through the shared match.c.
 * Each context runs on its own MPI_Comm_dup of MPI_COMM_WORLD, so every MPI
 * process must create the communicator (collective), as under mpirun.
 *
 * It does not detect dead peers itself: Open MPI tears the whole job down
 * when a process dies. abort() sends an ABORT header to every peer, which
 * aborts its own context on its next progress. MPI is initialised here
 * (MPI_THREAD_SERIALIZED) if the program did not, and finalised at exit.
 */
#include "comm/transport.h"
#include "comm/transport/match.h"

#include <mpi.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_HDR 1
#define TAG_DATA 2
#define INLINE_MAX 4096
#define CHUNK_MAX (1u << 30) /* payload split so counts fit an int */

enum { K_DATA = 1, K_ABORT = 2 };

struct mhdr {
  uint64_t tag;
  uint64_t len;
  uint32_t kind;
  int32_t code;
};

struct unexp {
  struct dt_match_msg m; /* tag, len; m.req: a receive that matched while the payload is in flight */
  uint8_t *data;
  int nreq;              /* payload receives still pending */
};

struct dt_tp_ep {
  struct dt_tp_ctx *ctx;
  int peer, mrank;
  struct dt_match mt; /* posted receives, early messages */
};

/* An MPI operation in flight, owned by a dt_tp_req (priv[0] points here). */
struct op {
  struct op *next, *prev;
  struct dt_tp_req *req;   /* NULL once cancelled */
  struct unexp *ux;        /* payload receive into a buffered message */
  int nreq, ndone;
  MPI_Request *reqs;
  uint8_t *hbuf;           /* header (+ inline payload) of a send */
};

struct dt_tp_ctx {
  int rank, size, mrank;
  MPI_Comm comm;
  char jobid[64];
  struct dt_tp_ep **eps;
  int *dt_of_mrank;
  struct op *ops;
  uint8_t *rbuf;
  _Atomic int abort_rc;
  _Atomic int aborting;
  bool abort_sent;
  char abort_msg[DT_TP_ERR_MAX];
  bool failed_all;
};

static bool we_initialised;

static void finalize_mpi(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

static void set_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(char *err, const char *fmt, ...) {
  if (!err) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, DT_TP_ERR_MAX, fmt, ap);
  va_end(ap);
}

static void req_finish(struct dt_tp_req *r, int rc) {
  r->next = NULL;
  r->status = rc < 0 ? rc : 1;
}

static void op_link(struct dt_tp_ctx *ctx, struct op *o) {
  o->prev = NULL;
  o->next = ctx->ops;
  if (ctx->ops) ctx->ops->prev = o;
  ctx->ops = o;
}

static void op_unlink(struct dt_tp_ctx *ctx, struct op *o) {
  if (o->prev) o->prev->next = o->next;
  else ctx->ops = o->next;
  if (o->next) o->next->prev = o->prev;
}

static void op_free(struct op *o) {
  free(o->reqs);
  free(o->hbuf);
  free(o);
}

/* Posts the payload of len bytes at buf as chunks on TAG_DATA. */
static int post_payload(struct dt_tp_ctx *ctx, int mrank, void *buf, uint64_t len, bool send,
                        MPI_Request **reqs, int *nreq) {
  int n = (int)((len + CHUNK_MAX - 1) / CHUNK_MAX);
  MPI_Request *r = calloc((size_t)n, sizeof *r);
  if (!r) return DT_ENOMEM;
  for (int i = 0; i < n; i++) {
    uint64_t off = (uint64_t)i * CHUNK_MAX, m = len - off < CHUNK_MAX ? len - off : CHUNK_MAX;
    int e = send ? MPI_Isend((uint8_t *)buf + off, (int)m, MPI_BYTE, mrank, TAG_DATA, ctx->comm, &r[i])
                 : MPI_Irecv((uint8_t *)buf + off, (int)m, MPI_BYTE, mrank, TAG_DATA, ctx->comm, &r[i]);
    if (e != MPI_SUCCESS) {
      free(r);
      return DT_EIO;
    }
  }
  *reqs = r;
  *nreq = n;
  return DT_OK;
}

static void mpi_abort(struct dt_tp_ctx *ctx, int rc, const char *why) {
  if (!ctx) return;
  int zero = 0;
  if (!atomic_compare_exchange_strong(&ctx->aborting, &zero, 1)) return;
  snprintf(ctx->abort_msg, sizeof ctx->abort_msg, "%s", why ? why : "aborted");
  atomic_store(&ctx->abort_rc, rc < 0 ? rc : DT_EABORTED);
  /* Peers are told by the driving thread (MPI is serialised), see check_abort. */
}

static const char *mpi_abort_reason(struct dt_tp_ctx *ctx, int *rc) {
  int r = ctx ? atomic_load(&ctx->abort_rc) : 0;
  if (rc) *rc = r;
  return r ? ctx->abort_msg : "";
}

static int check_abort(struct dt_tp_ctx *ctx) {
  int rc = atomic_load(&ctx->abort_rc);
  if (!rc) return 0;
  if (!ctx->abort_sent) {
    ctx->abort_sent = true;
    /* Tell every peer; buffered sends so nothing waits on them. */
    for (int p = 0; p < ctx->size; p++) {
      struct dt_tp_ep *ep = ctx->eps[p];
      if (!ep || ctx->abort_msg[0] == 'r') continue; /* "reported by": do not echo */
      struct op *o = calloc(1, sizeof *o);
      if (!o) break;
      o->hbuf = calloc(1, sizeof(struct mhdr) + 256);
      o->reqs = calloc(1, sizeof *o->reqs);
      if (!o->hbuf || !o->reqs) { op_free(o); break; }
      struct mhdr h = {0, 0, K_ABORT, rc};
      memcpy(o->hbuf, &h, sizeof h);
      snprintf((char *)o->hbuf + sizeof h, 256, "%.255s", ctx->abort_msg);
      MPI_Isend(o->hbuf, (int)sizeof h + 256, MPI_BYTE, ep->mrank, TAG_HDR, ctx->comm, &o->reqs[0]);
      o->nreq = 1;
      op_link(ctx, o); /* completes (or is freed at finalize) on its own */
    }
  }
  if (!ctx->failed_all) {
    ctx->failed_all = true;
    for (struct op *o = ctx->ops; o; o = o->next)
      if (o->req) { req_finish(o->req, rc); o->req = NULL; }
    for (int p = 0; p < ctx->size; p++) {
      struct dt_tp_ep *ep = ctx->eps[p];
      if (!ep) continue;
      dt__match_fail(&ep->mt, rc);
    }
  }
  return rc;
}

static void ux_deliver(struct dt_tp_ep *ep, struct unexp *u, struct dt_tp_req *r) {
  if (u->m.len != r->len) {
    DT_LOG_WARN("mpi: rank %d sent %zu bytes with tag 0x%llx, receive expects %zu", ep->peer,
                u->m.len, (unsigned long long)r->tag, r->len);
    req_finish(r, DT_EPROTO);
  } else {
    if (u->m.len) memcpy(r->buf, u->data, u->m.len);
    r->done = u->m.len;
    req_finish(r, 1);
  }
}

static void ux_free(struct dt_match_msg *m) {
  struct unexp *u = (struct unexp *)m;
  free(u->data);
  free(u);
}

static void ux_remove(struct dt_tp_ep *ep, struct unexp *u) {
  dt__match_ux_remove(&ep->mt, &u->m);
  ux_free(&u->m);
}

/* Handles one header message from peer ep. */
static void on_header(struct dt_tp_ctx *ctx, struct dt_tp_ep *ep, const uint8_t *msg, int n) {
  struct mhdr h;
  if (n < (int)sizeof h) return;
  memcpy(&h, msg, sizeof h);
  if (h.kind == K_ABORT) {
    char why[DT_TP_ERR_MAX];
    snprintf(why, sizeof why, "reported by rank %d: %.*s", ep->peer,
             n - (int)sizeof h < 255 ? n - (int)sizeof h : 255, (const char *)msg + sizeof h);
    mpi_abort(ctx, h.code < 0 ? h.code : DT_EABORTED, why);
    return;
  }
  bool inl = h.len <= INLINE_MAX;
  struct dt_tp_req *r = dt__match_posted(&ep->mt, ep->peer, h.tag);
  if (r && r->len != h.len) {
    DT_LOG_WARN("mpi: rank %d sent %llu bytes with tag 0x%llx, receive expects %zu", ep->peer,
                (unsigned long long)h.len, (unsigned long long)h.tag, r->len);
    req_finish(r, DT_EPROTO);
    if (inl) return;
    /* The payload still has to be drained: receive it into scratch, drop it. */
    struct op *o = calloc(1, sizeof *o);
    if (o) o->hbuf = malloc(h.len);
    if (!o || !o->hbuf || post_payload(ctx, ep->mrank, o->hbuf, h.len, false, &o->reqs, &o->nreq) < 0) {
      if (o) op_free(o);
      mpi_abort(ctx, DT_ENOMEM, "mpi: out of memory draining a message");
      return;
    }
    op_link(ctx, o);
    return;
  }
  if (r && inl) {
    if (h.len) memcpy(r->buf, msg + sizeof h, h.len);
    r->done = h.len;
    req_finish(r, 1);
    return;
  }
  if (r) {
    struct op *o = calloc(1, sizeof *o);
    if (!o || post_payload(ctx, ep->mrank, r->buf, h.len, false, &o->reqs, &o->nreq) < 0) {
      free(o);
      req_finish(r, DT_ENOMEM);
      mpi_abort(ctx, DT_ENOMEM, "mpi: out of memory receiving a message");
      return;
    }
    o->req = r;
    r->priv[0] = (uint64_t)(uintptr_t)o;
    op_link(ctx, o);
    return;
  }
  struct unexp *u = calloc(1, sizeof *u);
  if (u) u->data = malloc(h.len ? h.len : 1);
  if (!u || !u->data) {
    free(u);
    mpi_abort(ctx, DT_ENOMEM, "mpi: out of memory buffering a message");
    return;
  }
  if (dt__match_ux_add(&ep->mt, &u->m, ep->peer, h.tag, h.len) < 0) {
    char why[DT_TP_ERR_MAX];
    snprintf(why, sizeof why, "mpi: %s", dt_errmsg());
    ux_free(&u->m);
    mpi_abort(ctx, DT_ENOMEM, why);
    return;
  }
  if (inl) {
    if (h.len) memcpy(u->data, msg + sizeof h, h.len);
  } else {
    struct op *o = calloc(1, sizeof *o);
    if (!o || post_payload(ctx, ep->mrank, u->data, h.len, false, &o->reqs, &o->nreq) < 0) {
      free(o);
      ux_remove(ep, u);
      mpi_abort(ctx, DT_ENOMEM, "mpi: out of memory buffering a message");
      return;
    }
    o->ux = u;
    u->nreq = o->nreq;
    op_link(ctx, o);
  }
}

static bool progress(struct dt_tp_ctx *ctx) {
  bool moved = false;
  for (;;) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_Improbe(MPI_ANY_SOURCE, TAG_HDR, ctx->comm, &flag, &m, &st);
    if (!flag) break;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    uint8_t *buf = n <= (int)(sizeof(struct mhdr) + INLINE_MAX) ? ctx->rbuf : malloc((size_t)n);
    if (!buf) { mpi_abort(ctx, DT_ENOMEM, "mpi: out of memory"); return true; }
    MPI_Mrecv(buf, n, MPI_BYTE, &m, MPI_STATUS_IGNORE);
    int src = st.MPI_SOURCE;
    int dr = src >= 0 ? ctx->dt_of_mrank[src] : -1;
    if (dr >= 0 && ctx->eps[dr]) on_header(ctx, ctx->eps[dr], buf, n);
    if (buf != ctx->rbuf) free(buf);
    moved = true;
  }
  for (struct op *o = ctx->ops, *next; o; o = next) {
    next = o->next;
    int flag = 1;
    while (o->ndone < o->nreq && flag) {
      MPI_Test(&o->reqs[o->ndone], &flag, MPI_STATUS_IGNORE);
      if (flag) o->ndone++;
    }
    if (o->ndone < o->nreq) continue;
    moved = true;
    op_unlink(ctx, o);
    if (o->req) {
      o->req->done = o->req->len;
      req_finish(o->req, 1);
    }
    if (o->ux) {
      struct unexp *u = o->ux;
      u->nreq = 0;
      if (u->m.req) {
        struct dt_tp_ep *ep = u->m.req->ep;
        ux_deliver(ep, u, u->m.req);
        ux_remove(ep, u);
      }
    }
    op_free(o);
  }
  return moved;
}

static int mpi_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr) {
  *out = NULL;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int prov;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
      return dt__seterr(DT_EIO, "mpi: MPI_Init_thread failed");
    if (!we_initialised) atexit(finalize_mpi);
    we_initialised = true;
  }
  struct dt_tp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return DT_ENOMEM;
  ctx->rank = in->rank;
  ctx->size = in->size;
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx->mrank);
  int msize;
  MPI_Comm_size(MPI_COMM_WORLD, &msize);
  ctx->eps = calloc((size_t)in->size, sizeof *ctx->eps);
  ctx->dt_of_mrank = malloc((size_t)msize * sizeof *ctx->dt_of_mrank);
  ctx->rbuf = malloc(sizeof(struct mhdr) + INLINE_MAX);
  if (!ctx->eps || !ctx->dt_of_mrank || !ctx->rbuf) {
    free(ctx->eps); free(ctx->dt_of_mrank); free(ctx->rbuf); free(ctx);
    return DT_ENOMEM;
  }
  for (int i = 0; i < msize; i++) ctx->dt_of_mrank[i] = -1;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &ctx->comm) != MPI_SUCCESS) {
    free(ctx->eps); free(ctx->dt_of_mrank); free(ctx->rbuf); free(ctx);
    return dt__seterr(DT_EIO, "mpi: MPI_Comm_dup failed");
  }
  /* A job identity so that only processes of one mpirun connect: the
   * launcher's namespace if known, else the world size. */
  const char *ns = getenv("PMIX_NAMESPACE");
  if (!ns) ns = getenv("OMPI_MCA_ess_base_jobid");
  snprintf(ctx->jobid, sizeof ctx->jobid, "%.40s/%d", ns ? ns : "mpi", msize);
  snprintf(addr, DT_TP_ADDR_MAX, "mpi:%d:%s", ctx->mrank, ctx->jobid);
  *out = ctx;
  return DT_OK;
}

static bool parse_addr(const char *addr, int *mrank, const char **jobid) {
  if (!addr || strncmp(addr, "mpi:", 4)) return false;
  char *end;
  long v = strtol(addr + 4, &end, 10);
  if (end == addr + 4 || *end != ':' || v < 0 || v > 1 << 30) return false;
  *mrank = (int)v;
  *jobid = end + 1;
  return true;
}

static bool mpi_can_connect(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer) {
  int mr, msize;
  const char *jid;
  if (!parse_addr(peer->addr, &mr, &jid) || strcmp(jid, ctx->jobid)) return false;
  MPI_Comm_size(MPI_COMM_WORLD, &msize);
  return mr < msize && mr != ctx->mrank && peer->rank >= 0 && peer->rank < ctx->size;
}

static int mpi_connect(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer, int64_t deadline_ns,
                       struct dt_tp_ep **out, char *err) {
  (void)deadline_ns;
  int mr;
  const char *jid;
  if (!mpi_can_connect(ctx, peer) || !parse_addr(peer->addr, &mr, &jid)) {
    set_err(err, "mpi: rank %d's address '%.100s' is not in this MPI job", peer->rank, peer->addr);
    return DT_EPROTO;
  }
  struct dt_tp_ep *ep = calloc(1, sizeof *ep);
  if (!ep) return DT_ENOMEM;
  ep->ctx = ctx;
  ep->peer = peer->rank;
  ep->mrank = mr;
  dt__match_init(&ep->mt, 0);
  ctx->eps[peer->rank] = ep;
  ctx->dt_of_mrank[mr] = peer->rank;
  *out = ep;
  return DT_OK;
}

static int mpi_isend(struct dt_tp_ep *ep, struct dt_tp_req *r) {
  struct dt_tp_ctx *ctx = ep->ctx;
  r->status = 0;
  r->done = 0;
  r->ep = ep;
  r->next = NULL;
  int rc = check_abort(ctx);
  if (rc) return rc;
  struct op *o = calloc(1, sizeof *o);
  if (!o) return DT_ENOMEM;
  bool inl = r->len <= INLINE_MAX;
  size_t hl = sizeof(struct mhdr) + (inl ? r->len : 0);
  o->hbuf = malloc(hl);
  int np = 0;
  MPI_Request *pr = NULL;
  if (!o->hbuf) { free(o); return DT_ENOMEM; }
  struct mhdr h = {r->tag, r->len, K_DATA, 0};
  memcpy(o->hbuf, &h, sizeof h);
  if (inl && r->len) memcpy(o->hbuf + sizeof h, r->buf, r->len);
  MPI_Request hr;
  if (MPI_Isend(o->hbuf, (int)hl, MPI_BYTE, ep->mrank, TAG_HDR, ctx->comm, &hr) != MPI_SUCCESS) {
    op_free(o);
    return DT_EIO;
  }
  if (!inl && (rc = post_payload(ctx, ep->mrank, r->buf, r->len, true, &pr, &np)) < 0) {
    MPI_Wait(&hr, MPI_STATUS_IGNORE);
    op_free(o);
    return rc;
  }
  o->reqs = malloc((size_t)(np + 1) * sizeof *o->reqs);
  if (!o->reqs) {
    MPI_Wait(&hr, MPI_STATUS_IGNORE);
    for (int i = 0; i < np; i++) MPI_Wait(&pr[i], MPI_STATUS_IGNORE);
    free(pr);
    op_free(o);
    return DT_ENOMEM;
  }
  o->reqs[0] = hr;
  if (np) memcpy(o->reqs + 1, pr, (size_t)np * sizeof *pr);
  free(pr);
  o->nreq = np + 1;
  o->req = r;
  r->priv[0] = (uint64_t)(uintptr_t)o;
  op_link(ctx, o);
  return DT_OK;
}

static int mpi_irecv(struct dt_tp_ep *ep, struct dt_tp_req *r) {
  struct dt_tp_ctx *ctx = ep->ctx;
  r->status = 0;
  r->done = 0;
  r->ep = ep;
  r->next = NULL;
  r->priv[0] = 0;
  int rc = check_abort(ctx);
  if (rc) return rc;
  struct unexp *u = (struct unexp *)dt__match_ux_find(&ep->mt, ep->peer, r->tag);
  if (u) {
    if (u->nreq) {
      u->m.req = r; /* delivered when its payload is in */
    } else {
      ux_deliver(ep, u, r);
      ux_remove(ep, u);
    }
    return DT_OK;
  }
  dt__match_post(&ep->mt, r);
  return DT_OK;
}

static int mpi_test(struct dt_tp_ctx *ctx, struct dt_tp_req *r) {
  if (!r->status) progress(ctx);
  int rc = check_abort(ctx);
  if (r->status) return r->status < 0 ? r->status : 1;
  return rc;
}

static int mpi_wait(struct dt_tp_ctx *ctx, struct dt_tp_req **reqs, int n, int64_t deadline_ns,
                    char *err) {
  int idle = 0;
  for (;;) {
    bool all = true;
    for (int i = 0; i < n; i++) {
      int s = reqs[i]->status;
      if (s < 0) {
        int arc;
        const char *why = mpi_abort_reason(ctx, &arc);
        if (arc) set_err(err, "%s", why);
        else set_err(err, "mpi: %s with rank %d failed (tag 0x%llx): %s",
                     reqs[i]->kind == DT_TP_SEND ? "send" : "receive", reqs[i]->peer,
                     (unsigned long long)reqs[i]->tag, dt_strerror(s));
        return s;
      }
      if (!s) all = false;
    }
    if (all) return DT_OK;
    int arc = check_abort(ctx);
    if (arc) {
      set_err(err, "%s", ctx->abort_msg);
      return arc;
    }
    if (progress(ctx)) { idle = 0; continue; }
    if (++idle > 1000) {
      if (dt_now_ns() >= deadline_ns) {
        for (int i = 0; i < n; i++)
          if (!reqs[i]->status) {
            set_err(err, "mpi: deadline expired waiting for rank %d (%s of %zu bytes, tag 0x%llx)",
                    reqs[i]->peer, reqs[i]->kind == DT_TP_SEND ? "send" : "receive", reqs[i]->len,
                    (unsigned long long)reqs[i]->tag);
            break;
          }
        return DT_ETIMEDOUT;
      }
      sched_yield();
    }
  }
}

static void mpi_cancel(struct dt_tp_ctx *ctx, struct dt_tp_req *r) {
  struct dt_tp_ep *ep = r->ep;
  if (!ep || r->status) return;
  /* A posted receive not yet matched, or one waiting for a buffered
   * message's payload: just forget it. */
  if (dt__match_cancel(&ep->mt, r)) {
    r->status = DT_EABORTED;
    return;
  }
  /* In flight in MPI: the buffer may still be touched until MPI lets go, so
   * cancel and wait for the MPI requests (bounded by MPI itself). */
  for (struct op *o = ctx->ops; o; o = o->next) {
    if (o->req != r) continue;
    for (int i = o->ndone; i < o->nreq; i++) {
      MPI_Cancel(&o->reqs[i]);
      MPI_Wait(&o->reqs[i], MPI_STATUS_IGNORE);
    }
    o->ndone = o->nreq;
    o->req = NULL;
    break;
  }
  r->status = DT_EABORTED;
}

static void mpi_close(struct dt_tp_ep *ep) {
  if (!ep) return;
  struct dt_tp_ctx *ctx = ep->ctx;
  for (struct unexp *u = (struct unexp *)ep->mt.ux; u; u = (struct unexp *)u->m.next) {
    if (u->nreq) {
      /* still receiving into u->data: detach; freed with its op */
      for (struct op *o = ctx->ops; o; o = o->next)
        if (o->ux == u) {
          for (int i = o->ndone; i < o->nreq; i++) {
            MPI_Cancel(&o->reqs[i]);
            MPI_Wait(&o->reqs[i], MPI_STATUS_IGNORE);
          }
          o->ndone = o->nreq;
          o->ux = NULL;
        }
    }
  }
  dt__match_drain(&ep->mt, ux_free);
  if (ctx->eps[ep->peer] == ep) ctx->eps[ep->peer] = NULL;
  ctx->dt_of_mrank[ep->mrank] = -1;
  free(ep);
}

static void mpi_finalize_ctx(struct dt_tp_ctx *ctx) {
  if (!ctx) return;
  /* Let sends finish briefly (peers may be gone after an abort), then drop. */
  int64_t until = dt_now_ns() + 1000000000ll;
  while (ctx->ops && dt_now_ns() < until) {
    bool pending = false;
    for (struct op *o = ctx->ops; o; o = o->next)
      if (o->ndone < o->nreq) pending = true;
    if (!pending) break;
    progress(ctx);
  }
  for (struct op *o = ctx->ops, *n; o; o = n) {
    n = o->next;
    for (int i = o->ndone; i < o->nreq; i++) MPI_Request_free(&o->reqs[i]);
    op_free(o);
  }
  for (int p = 0; p < ctx->size; p++)
    if (ctx->eps[p]) mpi_close(ctx->eps[p]);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&ctx->comm);
  free(ctx->eps);
  free(ctx->dt_of_mrank);
  free(ctx->rbuf);
  free(ctx);
}

const struct dt_transport_ops dt__transport_mpi = {
    .name = "mpi",
    .init = mpi_init,
    .can_connect = mpi_can_connect,
    .connect = mpi_connect,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .wait = mpi_wait,
    .cancel = mpi_cancel,
    .abort = mpi_abort,
    .close = mpi_close,
    .finalize = mpi_finalize_ctx,
    .abort_reason = mpi_abort_reason,
};

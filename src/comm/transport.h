/*
 * transport.h — the contract between the communicator (comm.c) and a
 * transport (tcp, shm, mpi, inproc): one `const struct dt_transport_ops`
 * table per transport, in the NCCL `ncclTransport` / Redis `ConnectionType`
 * manner.
 *
 * Only comm.c and files under src/comm/transport/ include this header;
 * algorithms never do (they see dt_comm_isend/irecv/waitall).
 *
 * Model. For every communicator created from a store, comm.c calls each
 * candidate transport's init() once: it gets a per-communicator context
 * (struct dt_tp_ctx, transport-private) and writes an address string that
 * comm.c publishes through the store. Then, for every peer, comm.c asks the
 * transports in preference order (shm before tcp for same-host peers)
 * whether they can_connect() to it and calls connect() on the first that
 * can; the result is a per-peer endpoint (struct dt_tp_ep, transport-private)
 * that comm.c keeps in `ep[peer]` with `ops[peer]` beside it. Both sides call
 * connect() for each other: the transport decides who dials and who accepts
 * (tcp: the higher rank dials) and must keep serving the other side of any
 * pending handshake while it waits, so connecting to peers in increasing
 * rank order cannot deadlock. Sub-communicators (split) reuse the parent's
 * endpoints; their messages are told apart by the 64-bit tag, whose high 32
 * bits comm.c fills with a context id.
 *
 * Requests are caller-allocated (struct dt_tp_req, embedded in dt_comm_req)
 * and must not move while pending. Matching is per (peer, tag) FIFO: the
 * k-th send with tag T from A to B matches B's k-th receive from A with tag
 * T. A receive names the exact length; a frame of another length completes
 * the receive with DT_EPROTO naming the peer and tag. Messages that arrive
 * before their receive is posted are buffered by the transport.
 *
 * Failures. A peer that disappears (EOF, reset, or a transport-specific
 * liveness check) fails every request on that endpoint with DT_EPEERLOST and
 * the transport then calls abort() on its own context with DT_EPEERLOST and
 * a message naming the lost rank, so every peer learns of it promptly (a
 * survivor waiting on a third rank must not wait for its deadline). abort()
 * may be called from any thread; it fails every pending request of the
 * context with the given code, wakes every waiter, tells every connected
 * peer (which then aborts its own context with the same code and message,
 * prefixed "reported by rank R"), and makes later calls fail at once.
 */
#ifndef DT_COMM_TRANSPORT_H
#define DT_COMM_TRANSPORT_H

#include "comm/comm.h"
#include "comm/wire.h" /* frame header and auth, shared with the store */

struct dt_tp_ctx; /* per communicator, transport-private */
struct dt_tp_ep;  /* per (communicator, peer), transport-private */

#define DT_TP_ADDR_MAX 256
#define DT_TP_ERR_MAX 512

/* What init() needs to know. Strings are valid during init() only. */
struct dt_tp_init {
  int rank, size;          /* world rank and size of the new communicator */
  const char *job;         /* job name (store prefix) */
  const char *bind_addr;   /* tcp: listen address ("127.0.0.1") */
  const char *host_id;     /* this rank's host identity */
  const uint8_t *token;    /* job token bytes (may be NULL = no auth) */
  size_t token_len;
  int nconn;               /* tcp: connections per peer */
  double timeout_s;        /* default deadline */
};

/* A peer as published through the store. */
struct dt_tp_peer {
  int rank;
  const char *host_id;
  const char *addr; /* this transport's address string of the peer ("" if none) */
};

enum dt_tp_req_kind { DT_TP_SEND = 1, DT_TP_RECV = 2 };

/* One pending send or receive. comm.c fills the public part before
 * isend/irecv; the transport owns the request until `status` != 0. */
struct dt_tp_req {
  /* filled by comm.c */
  void *buf;                 /* send: data (const in practice); recv: destination */
  size_t len;                /* exact byte length */
  uint64_t tag;              /* (context id << 32) | tag */
  int peer;                  /* world rank of the peer */
  int kind;                  /* enum dt_tp_req_kind */
  /* set by the transport */
  _Atomic int status;        /* 0 pending, 1 done, < 0 failed with that DT_E* */
  size_t done;               /* bytes moved so far */
  struct dt_tp_ep *ep;
  struct dt_tp_req *next;    /* transport-owned queue link */
  uint64_t priv[6];          /* transport-owned scratch */
};

struct dt_transport_ops {
  const char *name;
  /* Creates the per-communicator context and writes the address peers use
   * to reach it (NUL-terminated, < DT_TP_ADDR_MAX) into addr. */
  int (*init)(const struct dt_tp_init *in, struct dt_tp_ctx **ctx, char *addr);
  /* True if this transport can reach peer from here (e.g. shm: same host
   * and the segment named in peer->addr can be opened; inproc: same pid). */
  bool (*can_connect)(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer);
  /* Establishes (authenticated) the endpoint to peer, by deadline_ns
   * (dt_now_ns() clock). On failure returns DT_ETIMEDOUT / DT_EAUTH / ... and
   * writes the reason into err (< DT_TP_ERR_MAX). */
  int (*connect)(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer, int64_t deadline_ns,
                 struct dt_tp_ep **ep, char *err);
  /* Post a send / receive. Returns DT_OK when posted (completion is reported
   * through req->status) or an error if the endpoint is already dead. */
  int (*isend)(struct dt_tp_ep *ep, struct dt_tp_req *req);
  int (*irecv)(struct dt_tp_ep *ep, struct dt_tp_req *req);
  /* Makes progress without blocking; returns 1 if req is complete, 0 if not,
   * or req's error. */
  int (*test)(struct dt_tp_ctx *ctx, struct dt_tp_req *req);
  /* Makes progress until every one of the n requests (all of this context)
   * is complete, one fails, the context is aborted, or deadline_ns passes
   * (DT_ETIMEDOUT; requests stay pending). Returns DT_OK or the first error;
   * err (< DT_TP_ERR_MAX) gets a message naming the peer. */
  int (*wait)(struct dt_tp_ctx *ctx, struct dt_tp_req **reqs, int n, int64_t deadline_ns,
              char *err);
  /* Cancels a pending request (after an error or timeout): the transport
   * forgets it; its buffer is no longer touched once this returns. */
  void (*cancel)(struct dt_tp_ctx *ctx, struct dt_tp_req *req);
  /* See the header comment. Thread-safe; idempotent (the first call wins). */
  void (*abort)(struct dt_tp_ctx *ctx, int rc, const char *why);
  /* Closes one endpoint (after telling the peer this is a clean close). */
  void (*close)(struct dt_tp_ep *ep);
  /* Frees the context (all endpoints closed first). NULL is a no-op. */
  void (*finalize)(struct dt_tp_ctx *ctx);
  /* The abort message (empty if not aborted); used to name the lost rank. */
  const char *(*abort_reason)(struct dt_tp_ctx *ctx, int *rc);
  /* Optional (NULL: nothing to do). Called once the communicator has tried
   * every peer, so the context knows which peers it connected to: shm
   * unlinks its segment once all of them have mapped it. */
  void (*setup_done)(struct dt_tp_ctx *ctx);
  /* Optional (NULL: not supported). From now on a lost peer fails only the
   * requests with that peer (DT_EPEERLOST, and at once for later ones)
   * instead of aborting the context: for jobs whose members may die without
   * ending it (parameter-server replicas, docs/ps.md). Aborts from peers
   * still propagate. Thread-safe. */
  void (*tolerate_loss)(struct dt_tp_ctx *ctx);
};

/* Transports built into the library; mpi only when DT_WITH_MPI. */
extern const struct dt_transport_ops dt__transport_tcp;
extern const struct dt_transport_ops dt__transport_inproc;
extern const struct dt_transport_ops dt__transport_shm;
#ifdef DT_WITH_MPI
extern const struct dt_transport_ops dt__transport_mpi;
#endif

/* /dev/shm bytes the shm transport uses for nlocal ranks on one host:
 * dt__shm_bytes_estimate counts every rank's inbox header plus the rings of
 * the peers a training job's collectives speak to (ring neighbours and the
 * log2(nlocal) partners of halving-doubling, trees and the barrier; a ring
 * is allocated on first use of that pair); dt__shm_bytes_max is the bound
 * when every rank speaks to every other (alltoall). The launcher checks the
 * estimate against the free space before it starts workers. Shared-memory
 * windows (window.c) come on top. */
size_t dt__shm_bytes_estimate(int nlocal);
size_t dt__shm_bytes_max(int nlocal);

/* Looks a transport up by name (NULL if unknown or not built). */
const struct dt_transport_ops *dt__transport_find(const char *name);

#endif /* DT_COMM_TRANSPORT_H */

/*
 * comm.h — the communication layer's interface for the rest of the library:
 * the rendezvous store, communicators (rank, size, split, host topology,
 * deadlines, abort), point-to-point messages and every collective with its
 * reduction op and dtype, plus the allreduce benchmark the CLI exposes.
 *
 * It does not expose transports: those sit behind `struct dt_transport_ops`
 * (transport.h), which only comm.c and the transports themselves include.
 * Algorithms (src/comm/algo/) see only the point-to-point calls declared
 * here plus coll.h, never a transport; dispatch.c runs them.
 *
 * Threading: a dt_comm is used by one thread at a time; dt_comm_abort() is
 * the one call that may come from any thread at any time. Several
 * communicators may live in one process (tests run ranks as threads).
 * Errors: every fallible call returns DT_OK or a negative DT_E*; the message
 * (naming the peer rank, the key or the calls involved) is in dt_errmsg() of
 * the calling thread and in dt_comm_errmsg(comm).
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- element types and reduction ops ----------------------------------- */

typedef enum dt_dtype {
  DT_F32 = 0,
  DT_F64 = 1,
  DT_BF16 = 2, /* stored as uint16_t; reduced in f32, rounded to nearest even */
  DT_F16 = 3,  /* IEEE half stored as uint16_t; reduced in f32 */
  DT_I32 = 4,
  DT_I64 = 5,
  DT_U8 = 6,   /* raw bytes: valid for data movement, not for reductions */
  DT_DTYPE_COUNT
} dt_dtype;

typedef enum dt_redop {
  DT_OP_SUM = 0,
  DT_OP_AVG = 1, /* sum then divide by the communicator size (integers: truncating) */
  DT_OP_MIN = 2,
  DT_OP_MAX = 3,
  DT_OP_COUNT
} dt_redop;

size_t dt_dtype_size(dt_dtype t);        /* 0 for an invalid type */
const char *dt_dtype_name(dt_dtype t);   /* "f32", ...; "?" if invalid */
const char *dt_redop_name(dt_redop op);  /* "sum", ...; "?" if invalid */
/* Parses "f32"/"float32", "sum", ... Returns DT_EINVAL for unknown names. */
int dt_dtype_parse(const char *s, dt_dtype *out);
int dt_redop_parse(const char *s, dt_redop *out);

/* inout[i] = inout[i] (op) in[i] for i < count. AVG accumulates like SUM (the
 * division happens once, in dt__reduce_finish). Buffers may not overlap
 * unless equal. Plain vectorisable loops; see reduce_ops.c. */
int dt__reduce(void *inout, const void *in, size_t count, dt_dtype t, dt_redop op);
/* Applies the final step of op to a fully reduced buffer: for AVG divides by
 * n; a no-op for the other ops. */
int dt__reduce_finish(void *buf, size_t count, dt_dtype t, dt_redop op, int n);
/* bf16 / f16 conversion helpers (round to nearest even). */
float dt_bf16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);

/* ---- collectives and algorithms ---------------------------------------- */

typedef enum dt_coll {
  DT_COLL_ALLREDUCE = 1,
  DT_COLL_BROADCAST,
  DT_COLL_REDUCE,
  DT_COLL_ALLGATHER,
  DT_COLL_REDUCE_SCATTER,
  DT_COLL_ALLTOALL,
  DT_COLL_BARRIER,
  DT_COLL_COUNT
} dt_coll;

typedef enum dt_algo {
  DT_ALGO_AUTO = 0, /* tuning.c chooses by size, world size and topology */
  DT_ALGO_RING,     /* pipelined, chunked ring (bandwidth-optimal) */
  DT_ALGO_RHD,      /* recursive halving-doubling (Rabenseifner) */
  DT_ALGO_TREE,     /* binomial tree / recursive doubling (latency-optimal) */
  DT_ALGO_HIER,     /* reduce within each host, allreduce across hosts, bcast within */
  DT_ALGO_DIRECT,   /* every rank talks to every rank (alltoall; small allgather) */
  DT_ALGO_COUNT
} dt_algo;

const char *dt_coll_name(dt_coll c);   /* "allreduce", ... */
const char *dt_algo_name(dt_algo a);   /* "auto", "ring", "rhd", "tree", "hier", "direct" */
int dt_algo_parse(const char *s, dt_algo *out); /* DT_EINVAL for unknown names */

/* ---- store (rendezvous key-value service) ------------------------------ */

/* A store handle is a client of one key-value namespace. Keys are strings of
 * 1..DT_STORE_KEY_MAX bytes; values are bytes, at most DT_STORE_VAL_MAX.
 * Every call takes a timeout in seconds (<= 0 means the store's default);
 * calls that wait (get, wait) return DT_ETIMEDOUT naming the key when it
 * expires. A store handle is thread-safe, but calls on one handle are
 * serialised (a TCP client has one request in flight), so threads that wait
 * for each other's keys need a handle each. */
#define DT_STORE_KEY_MAX 512
#define DT_STORE_VAL_MAX (1u << 20)

typedef struct dt_store dt_store;
typedef struct dt_store_server dt_store_server;

/* Starts a TCP store server on a background thread, listening on bind_addr
 * (NULL = "127.0.0.1") and port (0 = ephemeral; read it back with
 * dt_store_server_port). token (may be NULL = no authentication) is the job
 * token every client must prove by HMAC-SHA256 challenge-response. The
 * server owns nothing of the caller's; stop it with dt_store_server_stop
 * (NULL is a no-op), which closes every client connection. */
int dt_store_server_start(dt_store_server **out, const char *bind_addr, int port,
                          const char *token);
int dt_store_server_port(const dt_store_server *srv);
void dt_store_server_stop(dt_store_server *srv);

/* Connects to a TCP store at host:port, retrying until timeout_s (the server
 * may start later). token as for the server. */
int dt_store_connect(dt_store **out, const char *host, int port, const char *token,
                     double timeout_s);
/* "host:port" form of dt_store_connect. */
int dt_store_connect_addr(dt_store **out, const char *hostport, const char *token,
                          double timeout_s);
/* A store kept in files under dir (created if missing): one file per key,
 * written atomically; waits poll. For tests and single-host jobs. */
int dt_store_open_file(dt_store **out, const char *dir);
void dt_store_destroy(dt_store *s); /* NULL is a no-op */

int dt_store_set(dt_store *s, const char *key, const void *val, size_t len, double timeout_s);
/* Waits until key exists, then copies up to cap bytes into buf and stores the
 * full length in *len (DT_ERANGE if it did not fit; *len still set). */
int dt_store_get(dt_store *s, const char *key, void *buf, size_t cap, size_t *len,
                 double timeout_s);
/* Waits until every key exists. */
int dt_store_wait(dt_store *s, const char *const *keys, int nkeys, double timeout_s);
/* Atomically adds delta to the decimal integer stored at key (missing = 0)
 * and returns the new value in *result (may be NULL). */
int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result, double timeout_s);
/* Compare-and-set: if the key's value equals expected (expected == NULL: the
 * key must be missing) it becomes desired and *swapped = true. The value
 * found (after the call) is copied to cur (cap bytes, may be NULL) with its
 * length in *curlen (may be NULL). */
int dt_store_cas(dt_store *s, const char *key, const void *expected, size_t elen,
                 const void *desired, size_t dlen, bool *swapped, void *cur, size_t cap,
                 size_t *curlen, double timeout_s);
/* Deletes key; DT_OK even if it was missing (*existed tells, may be NULL). */
int dt_store_delete(dt_store *s, const char *key, bool *existed, double timeout_s);

/* ---- communicator ------------------------------------------------------ */

typedef struct dt_comm dt_comm;

struct dt_comm_config {
  /* "tcp", "inproc", "shm", "mpi" or "auto" (shm for same-host peers when
   * built, tcp otherwise). "inproc" requires every rank in this process. */
  const char *transport;
  int rank;               /* -1: get one assigned through the store */
  int size;               /* 0: read the key "<job>/size" from the store */
  const char *job;        /* store key prefix; different jobs may share a store */
  const char *bind_addr;  /* tcp: address to listen on; NULL = "127.0.0.1" */
  const char *token;      /* job token; NULL = DTRAIN_JOB_TOKEN or none */
  const char *host_id;    /* topology override (tests); NULL = hostname+boot id */
  double timeout_s;       /* deadline of every blocking call; default 60 */
  dt_algo algo;           /* force an algorithm for every collective; DTRAIN_ALGO env too */
  int nconn;              /* tcp connections per peer; reserved: one is used today
                           * (a striped version was withdrawn, docs/comm.md) */
};
#define DT_COMM_CONFIG_INIT                                                    \
  { "tcp", -1, 0, "dtrain", NULL, NULL, NULL, 60.0, DT_ALGO_AUTO, 0 }

/* Joins the job described by cfg through the store: publishes this rank's
 * transport addresses, reads everyone else's and connects to every peer
 * (each pair authenticated with the job token). Blocks until all ranks have
 * joined or cfg->timeout_s expires (DT_ETIMEDOUT naming the missing ranks).
 * The store must outlive the call only (not the communicator). */
int dt_comm_create(dt_comm **out, dt_store *store, const struct dt_comm_config *cfg);
/* Frees the communicator; tells peers this rank left cleanly. Sub-
 * communicators must be destroyed before their parent. NULL is a no-op. */
void dt_comm_destroy(dt_comm *c);

int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
/* The rank of c's member r in the world communicator c derives from. */
int dt_comm_world_rank(const dt_comm *c, int r);
const char *dt_comm_transport_name(const dt_comm *c, int peer); /* "self" for own rank */

/* Host topology: ranks with the same host_id share a host. */
struct dt_comm_topo {
  int nhosts;       /* distinct hosts among members */
  int host;         /* index of this rank's host, 0..nhosts-1 (in order of first rank) */
  int local_rank;   /* index among the members on this host */
  int local_size;   /* members on this host */
  bool one_per_host_leader; /* true for local_rank 0 */
};
int dt_comm_topology(const dt_comm *c, struct dt_comm_topo *out);
/* Host index (as in dt_comm_topo.host) of member r. */
int dt_comm_host_of(const dt_comm *c, int r);

/* Collective: members passing the same color form a sub-communicator,
 * ranked by (key, parent rank). color < 0 gets *out = NULL. The child shares
 * the parent's connections; the parent must outlive it. */
int dt_comm_split(dt_comm *c, int color, int key, dt_comm **out);
/* Split by host: the members on this rank's host (color = host index). */
int dt_comm_split_host(dt_comm *c, dt_comm **out);
/* Split of the local_rank==0 members of every host (others get NULL). */
int dt_comm_split_leaders(dt_comm *c, dt_comm **out);

/* Deadline of each blocking call, in seconds (> 0). */
void dt_comm_set_timeout(dt_comm *c, double seconds);
double dt_comm_timeout(const dt_comm *c);
/* Forces an algorithm (DT_ALGO_AUTO restores automatic choice). An
 * algorithm that cannot serve a call (e.g. HIER on one host) falls back to
 * the automatic choice for that call. */
void dt_comm_set_algo(dt_comm *c, dt_algo a);
dt_algo dt_comm_algo(const dt_comm *c);
/* Aborts the communicator from any thread: every waiter in any call on it
 * (and, through the transport, on every peer) returns DT_EABORTED (or rc if
 * rc < 0) with `why` in its message. Later calls fail at once. */
void dt_comm_abort(dt_comm *c, int rc, const char *why);
/* The last error of this communicator: one line naming the peer rank(s) and
 * the call. Empty if none. Valid until the next failing call on c. */
const char *dt_comm_errmsg(const dt_comm *c);
/* Bytes this rank sent and received through the communicator (and its
 * sub-communicators' shared connections). */
void dt_comm_bytes(const dt_comm *c, uint64_t *sent, uint64_t *received);

/* ---- point-to-point ---------------------------------------------------- */

/* User tags are 0..DT_COMM_TAG_MAX; the library uses tags above for
 * collectives. Messages between a pair with the same tag arrive in order. A
 * receive must name the exact byte length the sender sends (a different
 * length is DT_EPROTO naming the peer). */
#define DT_COMM_TAG_MAX 0xffffff

typedef struct dt_comm_req {
  uint64_t opaque[24]; /* caller-allocated; transport-owned while pending */
} dt_comm_req;

int dt_comm_send(dt_comm *c, int peer, int tag, const void *buf, size_t bytes);
int dt_comm_recv(dt_comm *c, int peer, int tag, void *buf, size_t bytes);
/* Non-blocking: buf must stay valid and req must not move until the request
 * completes in dt_comm_wait / dt_comm_test. */
int dt_comm_isend(dt_comm *c, int peer, int tag, const void *buf, size_t bytes, dt_comm_req *req);
int dt_comm_irecv(dt_comm *c, int peer, int tag, void *buf, size_t bytes, dt_comm_req *req);
/* *done = true if complete (req may then be reused). Drives progress. */
int dt_comm_test(dt_comm *c, dt_comm_req *req, bool *done);
/* Waits for all n requests or the communicator's deadline (DT_ETIMEDOUT
 * naming the first peer still owing data). On any error every request is
 * finished (cancelled) before return. */
int dt_comm_waitall(dt_comm *c, dt_comm_req *reqs, int n);

/* ---- collectives ------------------------------------------------------- */

/* In-place is allowed wherever sendbuf == recvbuf. count is in elements. Each
 * call's first message to every peer carries a fingerprint (sequence, coll,
 * op, dtype, count, root); different calls on different ranks give
 * DT_EMISMATCH naming both calls and both ranks on every rank. */
int dt_comm_allreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                      dt_dtype t, dt_redop op);
int dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
/* recvbuf is used only on root (may be NULL elsewhere). */
int dt_comm_reduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t,
                   dt_redop op, int root);
/* recvbuf holds size*count elements, rank r's block at r*count. */
int dt_comm_allgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t);
/* sendbuf holds size*count elements; rank r gets the reduction of block r. */
int dt_comm_reduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                           dt_dtype t, dt_redop op);
/* Block j of sendbuf (count elements) goes to rank j; block i of recvbuf comes
 * from rank i. Not in place. */
int dt_comm_alltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t);
int dt_comm_barrier(dt_comm *c);

/* Same calls with an explicit algorithm for this call only (tests, bench). */
int dt_comm_allreduce_algo(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                           dt_dtype t, dt_redop op, dt_algo a);

/* ---- benchmark --------------------------------------------------------- */

struct dt_comm_bench_config {
  size_t min_bytes, max_bytes; /* sizes doubling from min to max */
  int iters, warmup;           /* per size; 0 = automatic by size */
  dt_dtype dtype;
  dt_redop op;
  dt_algo algo;
  bool check;                  /* verify results once per size */
};
#define DT_COMM_BENCH_CONFIG_INIT { 8, 64u << 20, 0, 0, DT_F32, DT_OP_SUM, DT_ALGO_AUTO, true }

/* Runs allreduce over sizes on communicator c (collective: every rank calls
 * it). Rank 0 prints an nccl-tests style table to out (other ranks print
 * nothing): bytes, count, type, redop, time_us, algbw GB/s, busbw GB/s
 * (busbw = algbw * 2(n-1)/n), #wrong. out may be NULL (no printing). */
int dt_comm_bench_allreduce(dt_comm *c, const struct dt_comm_bench_config *cfg, void *out_file);

#endif /* DT_COMM_H */

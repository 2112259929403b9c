/*
 * dtrain/comm.h — communication between the workers of a job: a small
 * rendezvous key-value store, communicators (rank, size, deadlines, abort)
 * and collectives (allreduce, broadcast, reduce, allgather, reduce-scatter,
 * alltoall, barrier) plus point-to-point messages.
 *
 * How a job meets: one process serves a store (dt_store_server_start) or
 * all share a directory (dt_store_open_file); every worker connects to it
 * and calls dt_comm_create with its rank and the world size (or lets the
 * store assign ranks). A worker started by a job (dtrain/job.h) needs none
 * of this: it is handed a joined communicator (struct dt_job_worker.comm). Transports (tcp between hosts, shared memory inside
 * one, MPI under mpirun, in-process for tests) are chosen by name and
 * hidden behind the communicator; collective algorithms are chosen by
 * message size and topology. Every connection is authenticated with the
 * job token (HMAC-SHA256 challenge-response) when one is given.
 *
 * Failure is loud and bounded: every blocking call has a deadline (default
 * 60 s) and returns DT_ETIMEDOUT naming the peer that owes data; a dead
 * peer gives DT_EPEERLOST naming its rank; ranks that call different
 * collectives get DT_EMISMATCH naming both calls. Errors name the argument,
 * peer or key in dt_errmsg() and in dt_comm_errmsg(comm).
 *
 * Threading: a dt_comm is used by one thread at a time; dt_comm_abort() may
 * be called from any thread at any time. Several communicators may live in
 * one process.
 */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Collective algorithms. AUTO lets the library choose by size and topology;
 * the others force one (for tests and measurements). */
typedef enum dt_algo {
  DT_ALGO_AUTO = 0,
  DT_ALGO_RING,     /* pipelined, chunked ring (bandwidth-optimal) */
  DT_ALGO_RHD,      /* recursive halving-doubling (Rabenseifner) */
  DT_ALGO_TREE,     /* binomial tree / recursive doubling (latency-optimal) */
  DT_ALGO_HIER,     /* reduce within each host, allreduce across hosts, bcast within */
  DT_ALGO_DIRECT,   /* every rank talks to every rank (alltoall; small allgather) */
  DT_ALGO_COUNT
} dt_algo;

/* Bytes per element; 0 for an invalid type. */
DT_API size_t dt_dtype_size(dt_dtype t);
/* Static names ("f32", "sum", "ring"); "?" if invalid. */
DT_API const char *dt_dtype_name(dt_dtype t);
DT_API const char *dt_redop_name(dt_redop op);
DT_API const char *dt_algo_name(dt_algo a);
/* Parse "f32"/"float32", "sum", "ring", ... into *out. DT_EINVAL for NULL
 * arguments or unknown names (named in the message). */
DT_API int dt_dtype_parse(const char *s, dt_dtype *out);
DT_API int dt_redop_parse(const char *s, dt_redop *out);
DT_API int dt_algo_parse(const char *s, dt_algo *out);

/* ---- store (rendezvous key-value service) ------------------------------ */

/* A store handle is a client of one key-value namespace. Keys are strings
 * of 1..DT_STORE_KEY_MAX bytes; values are bytes, at most
 * DT_STORE_VAL_MAX. Every call takes a timeout in seconds (<= 0 means the
 * store's default); calls that wait (get) return DT_ETIMEDOUT naming the key
 * when it expires. A handle is thread-safe but serialises calls, so threads
 * that wait for each other's keys need a handle each. */
#define DT_STORE_KEY_MAX 512
#define DT_STORE_VAL_MAX (1u << 20)

typedef struct dt_store dt_store;
typedef struct dt_store_server dt_store_server;

/* Starts a TCP store server on a background thread, listening on bind_addr
 * (NULL = "127.0.0.1") and port (0 = ephemeral; read it back with
 * dt_store_server_port). token (NULL = no authentication) is the job token
 * every client must prove. On success *out is the caller's; stop it with
 * dt_store_server_stop. DT_EINVAL for a NULL out or a bad port, DT_EIO if
 * it cannot listen (the message names the address). */
DT_API int dt_store_server_start(dt_store_server **out, const char *bind_addr, int port,
                                 const char *token);
/* The port the server listens on; -1 for NULL. */
DT_API int dt_store_server_port(const dt_store_server *srv);
/* Stops the server, closes every client connection and frees it. NULL is a
 * no-op. */
DT_API void dt_store_server_stop(dt_store_server *srv);

/* Connects to a TCP store at host:port, retrying until timeout_s (the
 * server may start later). token as for the server. On success *out is the
 * caller's (free with dt_store_destroy). DT_EINVAL for NULL out or host or
 * a bad port, DT_ETIMEDOUT, DT_EAUTH for a wrong token. */
DT_API int dt_store_connect(dt_store **out, const char *host, int port, const char *token,
                            double timeout_s);
/* dt_store_connect with the address as "host:port". */
DT_API int dt_store_connect_addr(dt_store **out, const char *hostport, const char *token,
                                 double timeout_s);
/* A store kept in files under dir (created if missing): one file per key,
 * written atomically; waits poll. For jobs on one host and tests. DT_EINVAL
 * for NULL or empty arguments, DT_EIO if dir cannot be created. */
DT_API int dt_store_open_file(dt_store **out, const char *dir);
/* Closes the client (the keys stay in the store). NULL is a no-op. */
DT_API void dt_store_destroy(dt_store *s);

/* Sets key to the len bytes at val (copied). DT_EINVAL for a NULL store,
 * a bad key or a value longer than DT_STORE_VAL_MAX. */
DT_API int dt_store_set(dt_store *s, const char *key, const void *val, size_t len,
                        double timeout_s);
/* Waits until key exists, then copies up to cap bytes into buf and stores
 * the full length in *len (may be NULL); DT_ERANGE if it did not fit (*len
 * still set). DT_EINVAL for a NULL store or a bad key. */
DT_API int dt_store_get(dt_store *s, const char *key, void *buf, size_t cap, size_t *len,
                        double timeout_s);
/* Atomically adds delta to the decimal integer stored at key (missing = 0)
 * and returns the new value in *result (may be NULL). DT_EINVAL for a NULL
 * store or a bad key. */
DT_API int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result,
                        double timeout_s);

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
  int nconn;              /* tcp connections per peer (1..16; messages from
                           * DTRAIN_TCP_STRIPE_MIN up are striped over them);
                           * 0: DTRAIN_TCP_NCONN, default 1 */
};
#define DT_COMM_CONFIG_INIT                                                    \
  { "tcp", -1, 0, "dtrain", NULL, NULL, NULL, 60.0, DT_ALGO_AUTO, 0 }

/* Joins the job described by cfg (NULL = DT_COMM_CONFIG_INIT) through the
 * store: publishes this rank's transport addresses, reads everyone else's
 * and connects to every peer. Blocks until all ranks have joined or
 * cfg->timeout_s expires (DT_ETIMEDOUT naming the missing ranks). The
 * store is borrowed for the call only. On success *out is the caller's
 * (free with dt_comm_destroy). DT_EINVAL for a NULL out or store, a rank
 * outside 0..size-1; DT_ENOTSUP for an unknown transport. */
DT_API int dt_comm_create(dt_comm **out, dt_store *store, const struct dt_comm_config *cfg);
/* Frees the communicator and tells peers this rank left cleanly. NULL is a
 * no-op. */
DT_API void dt_comm_destroy(dt_comm *c);

/* This rank and the number of ranks; -1 and 0 for a NULL communicator. */
DT_API int dt_comm_rank(const dt_comm *c);
DT_API int dt_comm_size(const dt_comm *c);

/* Deadline of each blocking call, in seconds (> 0; other values are
 * ignored). */
DT_API void dt_comm_set_timeout(dt_comm *c, double seconds);
/* Aborts the communicator from any thread: every waiter in any call on it
 * (and, through the transport, on every peer) returns DT_EABORTED (or rc if
 * rc < 0) with `why` in its message. Later calls fail at once. NULL c is a
 * no-op. */
DT_API void dt_comm_abort(dt_comm *c, int rc, const char *why);
/* The last error of this communicator: one line naming the peer rank(s)
 * and the call; "" if none. Owned by c, valid until its next failing call. */
DT_API const char *dt_comm_errmsg(const dt_comm *c);

/* ---- point-to-point ---------------------------------------------------- */

#define DT_COMM_TAG_MAX 0xffffff

/* Blocking send and receive. User tags are 0..DT_COMM_TAG_MAX. Messages
 * between a pair with the same tag arrive in order. A receive must name the
 * exact byte length the sender sends (another length is DT_EPROTO naming
 * the peer). DT_EINVAL for a NULL communicator or buffer, a peer outside
 * 0..size-1 or this rank itself, or a bad tag. */
DT_API int dt_comm_send(dt_comm *c, int peer, int tag, const void *buf, size_t bytes);
DT_API int dt_comm_recv(dt_comm *c, int peer, int tag, void *buf, size_t bytes);

/* ---- collectives ------------------------------------------------------- */

/* Every rank of c must make the same calls in the same order with the same
 * count, dtype, op and root. count is in elements; sendbuf == recvbuf runs
 * in place (except alltoall). DT_EINVAL (naming the argument) for a NULL
 * communicator or buffer, an invalid dtype or op, a reduction of DT_U8, or
 * a root outside 0..size-1; on DT_EINVAL nothing was sent. */
DT_API int dt_comm_allreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             dt_dtype t, dt_redop op);
DT_API int dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
/* recvbuf is used only on root (may be NULL elsewhere). */
DT_API int dt_comm_reduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                          dt_dtype t, dt_redop op, int root);
/* recvbuf holds size*count elements, rank r's block at r*count. */
DT_API int dt_comm_allgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             dt_dtype t);
/* sendbuf holds size*count elements; rank r gets the reduction of block r
 * (count elements) in recvbuf. In place (recvbuf == sendbuf): the buffer's
 * other blocks are overwritten and rank r's result is in ITS block r (not
 * at the start, unlike MPI_IN_PLACE), with no buffer-sized scratch (ZeRO-1
 * uses it on the gradient buffer). */
DT_API int dt_comm_reduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                  dt_dtype t, dt_redop op);
/* Block j of sendbuf (count elements) goes to rank j; block i of recvbuf
 * comes from rank i. Not in place. */
DT_API int dt_comm_alltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                            dt_dtype t);
/* Returns once every rank has entered it. */
DT_API int dt_comm_barrier(dt_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMM_H */

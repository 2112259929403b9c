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
#include "dtrain/comm.h"
#include "obs/obs.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- element types and reduction ops (the public part: dtrain/comm.h) -- */

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

const char *dt_coll_name(dt_coll c);   /* "allreduce", ... */

/* ---- store (rendezvous key-value service) ------------------------------ */

/* The public part (server, clients, set/get/add): dtrain/comm.h. */

/* Waits until every key exists. */
int dt_store_wait(dt_store *s, const char *const *keys, int nkeys, double timeout_s);
/* Compare-and-set: if the key's value equals expected (expected == NULL: the
 * key must be missing) it becomes desired and *swapped = true. The value
 * found (after the call) is copied to cur (cap bytes, may be NULL) with its
 * length in *curlen (may be NULL). */
int dt_store_cas(dt_store *s, const char *key, const void *expected, size_t elen,
                 const void *desired, size_t dlen, bool *swapped, void *cur, size_t cap,
                 size_t *curlen, double timeout_s);
/* Deletes key; DT_OK even if it was missing (*existed tells, may be NULL). */
int dt_store_delete(dt_store *s, const char *key, bool *existed, double timeout_s);
/* From any thread: a call another thread is blocked in on s (a GET parked
 * on a missing key, say) returns at once with an error, and so does every
 * later call; only dt_store_destroy is left to do. A no-op for stores that
 * cannot (the file store, etcd: their calls end by their timeouts). */
void dt_store_interrupt(dt_store *s);
/* One heartbeat of elastic's watcher in one round trip (the built-in TCP
 * store only; DT_ENOTSUP from the others): adds 1 to counter hb, then waits
 * up to timeout_s for key to exist. DT_OK either way: *found says whether
 * key exists, *value is counter report's value when answered (0: missing).
 * Errors as the other calls (the store not reached, interrupted). */
int dt__store_beat(dt_store *s, const char *key, const char *hb, const char *report,
                   double timeout_s, bool *found, int64_t *value);

/* ---- communicator (create, destroy, rank, size, abort: dtrain/comm.h) -- */

/* Whether c's world was aborted (dt_comm_abort here, or a peer's abort
 * seen): one atomic load, for waits outside the communicator (window.c). */
int dt__comm_aborted(const dt_comm *c);
/* From now on a peer of c's world that dies fails only the requests with
 * it (DT_EPEERLOST, naming it) instead of aborting the world, so the others
 * can go on without it (parameter-server replicas). Collectives still abort
 * the world on a loss. DT_ENOTSUP naming a transport that cannot (mpi).
 * Call on every rank before the first loss that is to be survived. */
int dt__comm_tolerate_loss(dt_comm *c);
/* Tests only (DTRAIN_TEST_KILL phase lastsend): hook(ud) is called on the
 * sending thread before every point-to-point send a collective of c posts,
 * so a test can kill a rank at an exact message of an allreduce. NULL: none.
 * Not inherited by splits. */
void dt__comm_set_send_hook(dt_comm *c, void (*hook)(void *ud), void *ud);
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

/* The deadline of each blocking call, in seconds. */
double dt_comm_timeout(const dt_comm *c);
/* Forces an algorithm (DT_ALGO_AUTO restores automatic choice). An
 * algorithm that cannot serve a call (e.g. HIER on one host) falls back to
 * the automatic choice for that call. */
void dt_comm_set_algo(dt_comm *c, dt_algo a);
dt_algo dt_comm_algo(const dt_comm *c);
/* Bytes this rank sent and received through the communicator (and its
 * sub-communicators' shared connections). */
void dt_comm_bytes(const dt_comm *c, uint64_t *sent, uint64_t *received);
/* The flight recorder every collective and blocking point-to-point call of
 * c's world (c and its splits) records into (src/obs; borrowed, it must
 * outlive the calls; NULL: none). */
void dt_comm_set_obs(dt_comm *c, dt_obs *o);
dt_obs *dt_comm_obs(const dt_comm *c);

/* ---- point-to-point ---------------------------------------------------- */

/* Send and receive: dtrain/comm.h. */

typedef struct dt_comm_req {
  uint64_t opaque[24]; /* caller-allocated; transport-owned while pending */
} dt_comm_req;

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

/* The collectives are public (dtrain/comm.h). Each call's first message to
 * every peer carries a fingerprint (sequence, coll, op, dtype, count, root);
 * different calls on different ranks give DT_EMISMATCH naming both calls and
 * both ranks on every rank. */

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
  bool median;                 /* time = median of calls timed one by one, not the mean */
};
#define DT_COMM_BENCH_CONFIG_INIT { 8, 64u << 20, 0, 0, DT_F32, DT_OP_SUM, DT_ALGO_AUTO, true, false }

/* Runs allreduce over sizes on communicator c (collective: every rank calls
 * it). Rank 0 prints an nccl-tests style table to out (other ranks print
 * nothing): bytes, count, type, redop, time_us, algbw GB/s, busbw GB/s
 * (busbw = algbw * 2(n-1)/n), #wrong. out may be NULL (no printing).
 * With cfg->median the time is the median of the calls timed one by one
 * (max over ranks): a busy host's preemptions then move it less. */
int dt_comm_bench_allreduce(dt_comm *c, const struct dt_comm_bench_config *cfg, void *out_file);

/* ---- host resources, for launchers (src/launch) ------------------------- */

/* Unlinks the shm inboxes of job (token, job name) created by one of pids
 * (all of the job's if pids is NULL); returns how many. Call after the
 * creators have been reaped. */
int dt__shm_sweep_job(const char *token, const char *job, const int *pids, int npids);
/* Unlinks the shared-memory window segments created by one of pids
 * (window.c); returns how many. */
int dt__window_sweep_pids(const int *pids, int npids);

/* The transports a job may name, index = enum dt_dist_transport (auto, shm,
 * tcp, mpi), NULL-terminated: the one table the config parser, the launcher
 * and DTRAIN_TRANSPORT all check against. */
extern const char *const dt__transport_names[];

#endif /* DT_COMM_H */

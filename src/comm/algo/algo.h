/*
 * algo.h — what a collective algorithm may use and what each provides.
 *
 * An algorithm is a function over one communicator that moves data only
 * through the collective point-to-point calls below (dt__coll_isend /
 * dt__coll_irecv + dt_comm_waitall), which put the call's fingerprint on the
 * first message to each peer and check it on the first message from each
 * peer. comm.c starts the call (dt__coll_begin: sequence number, fingerprint,
 * deadline) and ends it; tuning.c picks the algorithm. Algorithms never see
 * a transport. Every algorithm works for any world size (non-powers of two
 * included) and any count, including 0; in-place when sendbuf == recvbuf.
 */
#ifndef DT_COMM_ALGO_H
#define DT_COMM_ALGO_H

#include "comm/comm.h"

/* Non-blocking collective-tagged messages inside the current collective. */
int dt__coll_isend(dt_comm *c, int peer, const void *buf, size_t bytes, dt_comm_req *req);
int dt__coll_irecv(dt_comm *c, int peer, void *buf, size_t bytes, dt_comm_req *req);
/* Blocking conveniences: one send and/or one receive in flight together
 * (either peer may be -1 to skip that side). */
int dt__coll_sendrecv(dt_comm *c, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                      size_t rbytes);
/* Scratch memory owned by the communicator, valid until the call ends
 * (grown as needed, 64-byte aligned; index 0..3 are independent buffers). */
void *dt__coll_scratch(dt_comm *c, int index, size_t bytes);
/* Cached sub-communicators for hierarchical algorithms (created on first
 * use with a collective split; NULL out for ranks that are not leaders). */
int dt__comm_host_comm(dt_comm *c, dt_comm **host, dt_comm **leaders);

/* Chunk size (bytes) of pipelined algorithms: DTRAIN_CHUNK_BYTES, default
 * 2 MiB (fewer, larger syscalls measured faster on a loaded 2-core host). */
size_t dt__algo_chunk_bytes(void);

/* allreduce */
int dt__allreduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);
int dt__allreduce_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);
int dt__allreduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);
/* Provided by algo/hier.c (owner: the shm work); DT_ENOTSUP if absent. */
int dt__allreduce_hier(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);

/* broadcast / reduce: binomial tree (small), scatter + ring allgather (large) */
int dt__broadcast_tree(dt_comm *c, void *buf, size_t bytes, int root);
int dt__broadcast_ring(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
int dt__reduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op, int root);
int dt__reduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op, int root);

/* allgather / reduce-scatter / alltoall / barrier */
int dt__allgather_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes_per_rank);
int dt__allgather_direct(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes_per_rank);
int dt__reduce_scatter_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);
int dt__alltoall_direct(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes_per_rank);
int dt__barrier_dissemination(dt_comm *c);

/* Ring building blocks on an arbitrary partition of a buffer into size
 * blocks (offsets/counts in elements), reused by allreduce and broadcast. */
int dt__ring_reduce_scatter_blocks(dt_comm *c, void *buf, const size_t *off, const size_t *cnt,
                                   dt_dtype t, dt_redop op);
int dt__ring_allgather_blocks(dt_comm *c, void *buf, const size_t *off, const size_t *cnt,
                              size_t esize);

/* tuning.c: the one place that picks an algorithm. `forced` is the call's or
 * communicator's choice (AUTO = decide). */
dt_algo dt__tune_allreduce(const dt_comm *c, size_t bytes, dt_algo forced);
dt_algo dt__tune_broadcast(const dt_comm *c, size_t bytes, dt_algo forced);
dt_algo dt__tune_allgather(const dt_comm *c, size_t bytes, dt_algo forced);

#endif /* DT_COMM_ALGO_H */

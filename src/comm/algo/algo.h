/*
 * algo.h — the collective algorithms and what each provides, for
 * dispatch.c (which frames the call and picks one through tuning.c).
 *
 * An algorithm is a function over one communicator that moves data only
 * through the point-to-point calls of coll.h (dt__coll_isend /
 * dt__coll_irecv + dt_comm_waitall), which put the call's fingerprint on the
 * first message to each peer and check it on the first message from each
 * peer. Algorithms never see a transport, the communicator's internals or
 * another collective. Every algorithm works for any world size (non-powers
 * of two included) and any count, including 0; in-place when sendbuf ==
 * recvbuf. (The hierarchical allreduce composes collectives on
 * sub-communicators, so it lives in dispatch.c.)
 */
#ifndef DT_COMM_ALGO_H
#define DT_COMM_ALGO_H

#include "comm/coll.h"

/* allreduce */
int dt__allreduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);
int dt__allreduce_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);
int dt__allreduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op);

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

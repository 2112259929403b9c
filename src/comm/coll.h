/*
 * coll.h — the narrow internal header collective algorithms (algo/) see:
 * point-to-point messages inside the current collective, scratch memory and
 * the pipelining chunk size. Implemented by comm.c (messages, scratch) and
 * tuning.c (chunk size).
 *
 * dt__coll_isend / dt__coll_irecv put the call's fingerprint on the first
 * message to each peer and check it on the first message from each peer;
 * the call itself is framed by dispatch.c (dt__coll_begin / dt__coll_end),
 * never by an algorithm. Algorithms finish requests with the public
 * dt_comm_waitall. Nothing here reaches a transport, the world or another
 * collective: algo/ depends on the communicator through this header alone.
 */
#ifndef DT_COMM_COLL_H
#define DT_COMM_COLL_H

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

/* Chunk size (bytes) of pipelined algorithms: DTRAIN_CHUNK_BYTES, default
 * 2 MiB (fewer, larger syscalls measured faster on a loaded 2-core host). */
size_t dt__algo_chunk_bytes(void);

#endif /* DT_COMM_COLL_H */

/*
 * match.h — posted/unexpected receive matching, shared by every transport
 * (tcp, shm, mpi, inproc). A transport keeps one struct dt_match per place
 * messages arrive (tcp, shm, mpi: per endpoint; inproc: per context) and
 * asks it two questions: "a message from src with tag T has arrived: which
 * posted receive takes it?" and "a receive for (src, T) is posted: has its
 * message already arrived?".
 *
 * Rules it implements (the contract of transport.h):
 *  - FIFO per (source, tag): the k-th message from A with tag T matches the
 *    k-th receive from A with tag T; messages of other tags or sources
 *    overtake freely.
 *  - A receive whose peer is DT_MATCH_ANY_SRC matches a message from any
 *    source (no transport posts one today; the module supports it so a
 *    later "receive from anyone" needs no second copy).
 *  - Unexpected messages are queued in arrival order with their byte count;
 *    the queue is bounded (DTRAIN_UNEXPECTED_MAX_MB per dt_match, default
 *    4096): a message that would exceed the bound is refused with DT_ENOMEM
 *    and a message naming the source, and the transport treats the sender
 *    as misbehaving.
 *  - A queued message may be claimed by a receive while its payload is
 *    still arriving (msg->req); claimed messages are skipped by later
 *    receives, so ordering holds.
 *  - Cancel and abort: dt__match_cancel forgets one receive (its buffer is
 *    never touched again); dt__match_fail completes every posted and
 *    claiming receive with an error code.
 *
 * What it does not do: copy payloads, allocate or free messages (the
 * transport embeds struct dt_match_msg in its own buffered-message struct
 * and frees it), check lengths, or lock: the caller holds whatever lock
 * guards the queue. Requests are linked through dt_tp_req.next.
 */
#ifndef DT_COMM_TRANSPORT_MATCH_H
#define DT_COMM_TRANSPORT_MATCH_H

#include "comm/transport.h"

#define DT_MATCH_ANY_SRC (-1)

/* A message that arrived before its receive; embedded by the transport. */
struct dt_match_msg {
  struct dt_match_msg *next;
  int src;
  uint64_t tag;
  size_t len;             /* payload bytes (counted against the bound) */
  struct dt_tp_req *req;  /* a receive that claimed it while arriving, or NULL */
};

struct dt_match {
  struct dt_tp_req *posted, *posted_tail;
  struct dt_match_msg *ux, *ux_tail;
  size_t ux_bytes, ux_count;
  size_t ux_cap; /* bytes */
};

/* Empties m; cap_bytes 0 takes DTRAIN_UNEXPECTED_MAX_MB. */
void dt__match_init(struct dt_match *m, size_t cap_bytes);

/* Appends a receive to the posted queue (r->peer is its source). */
void dt__match_post(struct dt_match *m, struct dt_tp_req *r);
/* A message (src, tag) arrived: removes and returns the first posted
 * receive that takes it, or NULL. */
struct dt_tp_req *dt__match_posted(struct dt_match *m, int src, uint64_t tag);
static inline bool dt__match_has_posted(const struct dt_match *m) { return m->posted != NULL; }

/* Queues an unexpected message u (fills src, tag, len; req = NULL).
 * DT_ENOMEM if it would exceed the bound (u is not queued; message set). */
int dt__match_ux_add(struct dt_match *m, struct dt_match_msg *u, int src, uint64_t tag, size_t len);
/* The first unclaimed queued message a receive from src with tag takes
 * (left in the queue), or NULL. */
struct dt_match_msg *dt__match_ux_find(struct dt_match *m, int src, uint64_t tag);
/* Unlinks u from the queue (no-op if absent). */
void dt__match_ux_remove(struct dt_match *m, struct dt_match_msg *u);
/* find + remove. */
struct dt_match_msg *dt__match_ux_take(struct dt_match *m, int src, uint64_t tag);

/* Forgets r: removes it from the posted queue, or unclaims the message it
 * claimed. True if r was known here. Does not touch r->status. */
bool dt__match_cancel(struct dt_match *m, struct dt_tp_req *r);
/* Completes every posted receive and every claiming receive with rc (< 0)
 * and empties the posted queue; queued messages stay (unclaimed). */
void dt__match_fail(struct dt_match *m, int rc);
/* Unlinks every queued message, passing each to free_msg (may be NULL). */
void dt__match_drain(struct dt_match *m, void (*free_msg)(struct dt_match_msg *u));

#endif /* DT_COMM_TRANSPORT_MATCH_H */

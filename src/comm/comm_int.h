/*
 * comm_int.h — private to the communicator (comm.c, comm_create.c): the
 * world (transport contexts and per-peer endpoints, shared by a
 * communicator and its splits), the communicator struct, the collective
 * fingerprint layout, and the constructors both files use; dispatch.c
 * uses the collective framing. Nothing else includes this (algorithms see
 * coll.h only).
 */
#ifndef DT_COMM_COMM_INT_H
#define DT_COMM_COMM_INT_H

#include "comm/comm.h"
#include "comm/transport.h"
#include "obs/obs.h"

#include <pthread.h>
#include <stdatomic.h>

#define MAX_TP 4
#define FP_LEN 32
#define FP_INL 256                /* data bytes carried with the fingerprint */
#define FP_MSG (FP_LEN + FP_INL) /* length of every first message */
#define FP_MAGIC 0x50465444u /* "DTFP" */
#define TAG_COLL 0xc0000001u /* library tag for collective traffic */

struct comm_req {
  struct dt_tp_req tp;
  int peer;         /* member rank */
  int fp_check;     /* member whose fingerprint recv must be checked, or -1 */
  int fp_send;      /* member whose fingerprint send must complete, or -1 */
  int used;
  void *inl_dst;    /* receive: where the data inside the fingerprint message goes */
  size_t inl_len;
};
_Static_assert(sizeof(struct comm_req) <= sizeof(dt_comm_req), "dt_comm_req too small");

struct world {
  int refs;
  int rank, size;
  int ntp;
  const struct dt_transport_ops *tops[MAX_TP];
  struct dt_tp_ctx *tctx[MAX_TP];
  int *tp_of;               /* transport index per peer (-1 self) */
  struct dt_tp_ep **ep;     /* per peer */
  char **host_id;           /* per rank */
  _Atomic int aborted;
  pthread_mutex_t amu; /* guards abort_msg / abort_rc */
  char abort_msg[512];
  int abort_rc;
  _Atomic uint64_t sent, recvd;
  dt_obs *obs;              /* flight recorder (borrowed; NULL: none) */
};

struct fp {
  uint64_t seq, count;
  int32_t root, rank;
  uint8_t coll, op, dtype;
};

struct dt_comm {
  struct world *w;
  dt_comm *parent;
  int rank, size;
  int *wr;                  /* member -> world rank */
  int *host;                /* member -> host index */
  int nhosts;
  uint32_t ctxid;
  uint32_t nsplit;
  double timeout;
  dt_algo algo;
  /* current collective */
  bool in_coll;
  int64_t fr_ticket;        /* the current collective's flight-recorder entry */
  int64_t deadline_ns;
  uint64_t seq;
  struct fp cur;
  uint8_t fp_out[FP_LEN];
  uint8_t *fp_sent, *fp_posted; /* per member */
  uint8_t (*fp_in)[FP_MSG];
  uint8_t (*fp_obuf)[FP_MSG];   /* per member: fingerprint + inline data sent */
  struct comm_req *fp_sreq, *fp_rreq;
  void *scratch[4];
  size_t scratch_cap[4];
  dt_comm *host_comm, *leader_comm;
  bool host_built;
  char err[512];
  void (*send_hook)(void *ud); /* tests: called before each collective send (dt__comm_set_send_hook) */
  void *send_hook_ud;
};

/* comm.c: collective framing for dispatch.c. dt__coll_begin checks the
 * world is not aborted, numbers the call and sets its deadline and
 * fingerprint; dt__coll_end waits for fingerprint sends still in flight
 * and, if rc < 0, aborts the world with the message. dt__comm_err records
 * a message on c (and dt_errmsg) and returns rc. */
int dt__coll_begin(dt_comm *c, dt_coll coll, dt_redop op, dt_dtype t, size_t count, int root);
int dt__coll_end(dt_comm *c, int rc);
int dt__comm_err(dt_comm *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* comm_create.c */
dt_comm *dt__comm_alloc(struct world *w, int size); /* members, fingerprint buffers; NULL: no memory */
void dt__comm_compute_hosts(dt_comm *c);           /* host[] and nhosts from the world's host ids */
void dt__world_release(struct world *w);           /* drops a reference; the last closes everything */

#endif /* DT_COMM_COMM_INT_H */

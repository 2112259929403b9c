/*
 * tcp_int.h — private structures of the TCP transport, shared by tcp.c
 * (data path, progress engine, ops table) and tcp_conn.c (listener, dialing,
 * handshake, context creation). Nothing outside src/comm/transport/tcp*.c
 * includes this. Every function here is called with the context's mutex
 * held unless it says otherwise.
 */
#ifndef DT_COMM_TCP_INT_H
#define DT_COMM_TCP_INT_H

#include "comm/transport.h"
#include "comm/accept_guard.h"
#include "comm/transport/match.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { K_LISTEN = 1, K_WAKE, K_EP, K_PEND };

#define DEFER_MIN (64 * 1024) /* early frames at least this large wait in the socket */
#define MAX_LANES 16           /* connections per peer, at most */
#define PART_MIN (64 * 1024)   /* smallest part of a striped message */

/* A striped message: the user's request and one internal request per part.
 * A part's priv[4] points back here; the parent's priv[5] points here (0
 * for a message sent whole). */
struct stripe {
  struct stripe *next, *prev; /* the endpoint's list of live stripes */
  struct dt_tp_req *parent;
  int nparts, left, rc;
  bool posting;               /* parts are being posted: do not finish yet */
  struct dt_tp_req part[];
};

struct umsg { /* a frame that arrived before its receive was posted */
  struct dt_match_msg m; /* tag, len */
  size_t got;
  bool complete;
  uint8_t *data;
};

/* One connection ("lane") to a peer. The endpoint handed to comm.c is
 * lane 0 (the head), which also owns the lane array and the live stripes;
 * with one lane the head is the whole endpoint. */
struct dt_tp_ep {
  int kind; /* K_EP */
  struct dt_tp_ctx *x;
  int fd, peer;
  int lane, nlanes;
  struct dt_tp_ep *head;          /* lane 0 */
  struct dt_tp_ep **lanes;        /* head only: [nlanes] */
  struct stripe *stripes;         /* head only */
  bool dead, bye, want_out;
  bool deferred;                  /* a large early frame waits in the socket */
  /* send side */
  struct dt_tp_req *sq, *sq_tail;
  size_t s_hdr_done; /* bytes of the head request's header already sent */
  /* receive side */
  struct dt_match mt;             /* posted receives, early frames */
  uint8_t hdr[DT_FRAME_HDR_LEN];
  size_t hdr_got;
  struct dt_frame_hdr cur;        /* frame being read (hdr complete) */
  bool in_payload;
  uint8_t *target;                /* where payload goes */
  size_t got;
  struct dt_tp_req *cur_req;      /* matched receive, or NULL */
  struct umsg *cur_u;             /* buffered frame, or NULL */
  uint8_t *ctrl;                  /* control payload */
  bool discard;                   /* payload for a failed receive: drop it */
};

enum pstate { P_DIAL_CONNECTING, P_DIAL_WAIT_HELLO, P_DIAL_WAIT_OK, P_ACC_WAIT_HELLO, P_ACC_WAIT_AUTH };

struct pend {
  int kind; /* K_PEND */
  struct pend *next;
  int fd;
  enum pstate st;
  int peer;           /* dialer: target; acceptor: claimed rank once known */
  int lane, nlanes;   /* which connection of how many (the dialer's count) */
  uint8_t nonce_me[DT_AUTH_NONCE_LEN], nonce_peer[DT_AUTH_NONCE_LEN];
  uint8_t in[DT_FRAME_HDR_LEN + 128];
  size_t in_got;
  double deadline;
  double since;       /* acceptor: accepted at (dt_now) */
  char who[64];
  int fail_rc;        /* dialer: error to report */
  bool shed;          /* dialer: closed before the acceptor's greeting */
  char fail[200];
};

struct dt_tp_ctx {
  int kind_listen, kind_wake; /* epoll tags (K_LISTEN, K_WAKE) */
  pthread_mutex_t mu;
  int rank, size;
  int lfd, efd, wfd;
  uint64_t job_hash;
  uint8_t *token;
  size_t token_len;
  int bufsize;
  int64_t spin_ns;      /* DTRAIN_TCP_SPIN_US */
  struct dt_tp_ep **ep; /* per peer: the head lane, once every lane is up */
  struct dt_tp_ep ***build; /* per peer: lanes that passed the handshake so far */
  int *build_n;         /* per peer: lane count of build[peer] */
  int nconn;            /* lanes this rank dials (dist.tcp_connections, DTRAIN_TCP_NCONN) */
  size_t stripe_min;    /* DTRAIN_TCP_STRIPE_MIN */
  int shed_left;        /* tests: DTRAIN_TEST_TCP_SHED connections still to shed */
  struct pend *pend;
  struct dt_accept_guard guard; /* spare descriptor for EMFILE */
  char guard_name[32];
  bool listen_off;              /* listener out of epoll while paused */
  double auth_timeout;
  int pending_max;
  _Atomic int abort_rc;
  char abort_msg[DT_TP_ERR_MAX];
  _Atomic int tolerate; /* a lost peer fails its own requests only (tolerate_loss) */
  char err_last[DT_TP_ERR_MAX];
  uint8_t *discard_buf;
};

/* tcp_conn.c */
int dt__tcp_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr); /* unlocked */
bool dt__tcp_can_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *p);
int dt__tcp_connect(struct dt_tp_ctx *x, const struct dt_tp_peer *peer, int64_t deadline,
                    struct dt_tp_ep **out, char *err); /* takes the mutex */
void dt__tcp_ctx_free(struct dt_tp_ctx *x); /* unlocked: the context is no longer shared */
void dt__tcp_accept_all(struct dt_tp_ctx *x);
void dt__tcp_relisten(struct dt_tp_ctx *x);
void dt__tcp_pend_event(struct dt_tp_ctx *x, struct pend *p);
void dt__tcp_pend_expire(struct dt_tp_ctx *x);

/* tcp.c: one round of the epoll engine (drops the mutex while blocked). */
void dt__tcp_progress(struct dt_tp_ctx *x, int timeout_ms);

#endif /* DT_COMM_TCP_INT_H */

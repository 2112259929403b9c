/*
 * shm_int.h — private layout of the shared-memory transport (shm.c): the
 * per-rank inbox segment, its rings and the records that travel in them.
 * Nothing outside src/comm/transport/shm*.c includes this.
 *
 * Layout. Every rank creates one inbox segment (shm_open, name derived from a
 * hash of the job token and job name, the rank, the creator's pid and a
 * random nonce; mode 0600) holding a header and one single-producer /
 * single-consumer byte ring per possible sender. Rank p sends to rank q by
 * writing into ring p of q's inbox; q reads it. A rank sleeps on one futex
 * word (`bell`) in its own header, so one wait covers every peer. The
 * segment is unlinked as soon as every peer has mapped it, so a killed job
 * leaves nothing behind in /dev/shm; leftovers of killed creators from
 * before that point are swept at the next init by pid. "Every peer": once
 * the owner's communicator has tried all ranks it writes `expected` (how
 * many peers it connected to over shm; connections are symmetric); each
 * peer adds 1 to `attached` after mapping; whichever of the two sees
 * attached == expected second unlinks the name (`unlinked` makes it once).
 *
 * Records are 32-byte aligned (so a header never wraps): a header, then for
 * EAGER the payload padded to 32 bytes. A small message is written whole
 * before its header's sequence word, so the receiver sees header and data
 * in the same cache lines; a large one streams, and the ring's head counter
 * says how much of it has arrived. CMA records carry the sender's buffer
 * address instead of the payload; the receiver copies with
 * process_vm_readv straight into the destination (single copy) and answers
 * with an ACK record carrying the sender's cookie.
 */
#ifndef DT_COMM_SHM_INT_H
#define DT_COMM_SHM_INT_H

#include <stdatomic.h>
#include <stdint.h>

#define DT_SHM_MAGIC 0x445453484d310001ull
#define DT_SHM_VERSION 3
#define DT_SHM_LINE 64
#define DT_SHM_REC 32 /* record header size and alignment */

enum dt_shm_rec_kind {
  DT_SHM_EAGER = 1, /* payload follows in the ring */
  DT_SHM_CMA = 2,   /* payload at `addr` in the sender; answer with ACK */
  DT_SHM_ACK = 3    /* the CMA record with `cookie` was consumed; a nonzero
                     * high half of aux: the receiver failed (-DT_E* code) */
};

/* A record header. The consumer polls `seq` at its tail: the record is
 * there when seq == tail + 1 (positions only grow, so a header left from an
 * earlier lap never matches), and a small message is then read from the same
 * cache lines without touching the ring's head counter. `seq` is stored last,
 * with release order. */
struct dt_shm_rec {
  _Atomic uint64_t seq;
  uint64_t tag;
  uint64_t lenk; /* payload length | kind << 56 | DT_SHM_COMPLETE */
  uint64_t aux;  /* CMA: sender address; ACK: cookie | (uint64_t)(-rc) << 32;
                  * EAGER with DT_SHM_ZTAIL: payload bytes present */
};
#define DT_SHM_KIND_SHIFT 56
#define DT_SHM_COMPLETE (1ull << 55) /* the whole payload was written with the header */
/* EAGER + COMPLETE only: the payload's trailing zero bytes were left out;
 * aux holds how many bytes are present (< the length), the receiver fills
 * the rest with zeros. Small collectives send a fixed-length first message
 * (fingerprint + inline data, zero-padded), so this saves most of its
 * cache lines. */
#define DT_SHM_ZTAIL (1ull << 54)
#define DT_SHM_ZTAIL_MAX 512        /* only messages up to this long are trimmed */
#define DT_SHM_LEN_MASK ((1ull << 54) - 1)
/* A CMA record is followed by 32 bytes whose first 4 hold the cookie. */
_Static_assert(sizeof(struct dt_shm_rec) == DT_SHM_REC, "record header is 32 bytes");

/* One SPSC ring; head and tail are byte counters that only grow. */
struct dt_shm_ring {
  _Alignas(DT_SHM_LINE) _Atomic uint64_t head; /* written by the producer */
  _Atomic uint32_t closed;                     /* producer closed cleanly */
  uint32_t pad0;
  uint64_t cookie_hint;                        /* CMA: producer's cookie (info only) */
  _Alignas(DT_SHM_LINE) _Atomic uint64_t tail; /* written by the consumer */
  _Alignas(DT_SHM_LINE) uint8_t data[];        /* ring_bytes follow */
};

struct dt_shm_hdr {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  int32_t pid;
  uint64_t nonce;
  uint64_t job_hash;     /* hash of (token, job): a peer of another job is refused */
  uint64_t ring_bytes;   /* data bytes per ring, a power of two */
  uint64_t ring_stride;  /* bytes from one ring to the next */
  uint64_t rings_off;    /* offset of ring 0 */
  uint64_t probe_addr;   /* address of a probe word in the creator (CMA check) */
  uint64_t probe_value;
  _Alignas(DT_SHM_LINE) _Atomic uint32_t attached; /* peers that mapped this inbox */
  _Atomic uint32_t expected;                       /* peers that will (0: not known yet) */
  _Atomic uint32_t unlinked;                       /* the name is gone */
  _Atomic int32_t abort_rc;                        /* != 0: the owner aborted */
  char abort_msg[192];
  _Alignas(DT_SHM_LINE) _Atomic uint32_t bell;     /* futex word: something changed */
  _Atomic uint32_t sleeping;                       /* owner is (about to be) asleep */
  /* 1: the owner calls membarrier(GLOBAL_EXPEDITED) between setting
   * `sleeping` and its last look at the rings, so a registered sender needs
   * only a compiler barrier, not a full fence, before it reads `sleeping`
   * (see ring_bell in shm.c). Set once at init. */
  _Atomic uint32_t asym;
  /* cma_ok[p] (set by the owner): process_vm_readv from peer p works, so p
   * may send CMA records into this inbox. Readers poll it once at connect. */
  _Alignas(DT_SHM_LINE) _Atomic uint8_t cma_ok[];
};

/* ---- the transport's own state (shm.c, shm_rx.c, shm_seg.c) ------------- */

#include "comm/transport.h"
#include "comm/proc_watch.h"
#include "comm/transport/match.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct unexp {
  struct dt_match_msg m; /* tag; m.len counts buffered bytes (0 for CMA);
                          * m.req: a receive that matched while still streaming */
  uint64_t len, cookie_or_addr; /* CMA: sender address */
  uint32_t cookie;              /* CMA: the sender's cookie for the ACK */
  int kind;             /* DT_SHM_EAGER or DT_SHM_CMA */
  bool complete;        /* EAGER: every byte arrived */
  uint8_t *data;        /* EAGER payload (len bytes) */
};

struct ack {
  uint64_t cookie;
  int32_t rc;
};

struct dt_tp_ep {
  struct dt_tp_ctx *ctx;
  int peer;
  pid_t pid;
  int pidfd;
  void *pbase;
  size_t plen;
  struct dt_shm_hdr *phdr;
  struct dt_shm_ring *tx, *rx; /* tx: ring[me] in the peer's inbox; rx: ring[peer] in mine */
  uint64_t mask;               /* ring_bytes - 1 (same for both: checked at connect) */
  uint64_t rx_mask;
  /* sending */
  struct dt_tp_req *sq_head, *sq_tail; /* queued sends; the head may be mid-record */
  uint64_t tx_head, tx_tail_seen;
  uint64_t tx_left;                    /* bytes of the head's record payload (padded) left */
  bool tx_in_rec;
  bool tx_zero;                        /* head was cancelled mid-record: fill with zeros */
  struct dt_tp_req *cma_wait;          /* CMA sends waiting for their ACK */
  uint32_t cma_seq;                    /* cookie of the last CMA record */
  struct ack *acks;
  int nacks, cap_acks;
  /* receiving */
  struct dt_match mt;                  /* posted receives, early messages (match.c) */
  struct dt_tp_req *pull_head, *pull_tail; /* matched CMA receives not yet copied */
  bool rx_in_rec;
  uint64_t rx_len, rx_off, rx_total;   /* current record: payload, consumed, padded */
  bool rx_complete;                    /* ... written whole before its header */
  struct dt_tp_req *rx_req;            /* destination of the current record, or */
  struct unexp *rx_ux;                 /* ... buffered, or neither (discard) */
  uint64_t rx_tag;
  bool dead;
  bool gone;                           /* exited after a clean close */
  bool tx_touched, rx_touched;         /* our rings with this peer prefaulted (first use) */
  bool fence;                          /* ring this peer's bell with a full fence (no asym pair) */
  struct dt_proc_watch pw;             /* is the peer stopped (SIGSTOP)? */
};

struct dt_tp_ctx {
  int rank, size;
  pid_t pid;
  char host_id[DT_TP_ADDR_MAX];
  char name[96];
  void *base;
  size_t map_len;
  struct dt_shm_hdr *hdr;
  uint64_t job_hash;
  uint64_t ring_bytes;
  struct dt_tp_ep **eps; /* [size], NULL where not connected through shm */
  int neps;
  size_t cma_min;
  int64_t spin_ns; /* poll this long before sleeping */
  bool oversub;
  int64_t yield_ns; /* poll without yielding this long first */
  int64_t live_ns, next_live;
  bool asym; /* this process is registered for membarrier(GLOBAL_EXPEDITED) and issues it before sleeping */
  volatile uint64_t probe; /* peers read this with process_vm_readv */
  _Atomic int aborting;
  _Atomic int abort_rc;
  char abort_msg[DT_TP_ERR_MAX];
  _Atomic int tolerate; /* a lost peer fails its own requests only (tolerate_loss) */
  bool failed_all; /* pending requests already failed after the abort */
};

/* shm_seg.c: segment life cycle. */
int dt__shm_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr);
bool dt__shm_can_connect(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer);
int dt__shm_connect(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer, int64_t deadline_ns,
                    struct dt_tp_ep **out, char *err);
/* Every peer that will map our inbox is connected: publish the count. */
void dt__shm_setup_done(struct dt_tp_ctx *ctx);
/* Unlinks inboxes whose creator is gone. */
void dt__shm_sweep_stale(void);
/* True if pid has exited (also as an unreaped zombie). */
bool dt__shm_pid_gone(pid_t pid);
/* Maps [p, p + n) now (we write it) / maps a ring a peer writes (we read). */
void dt__shm_prefault(void *p, size_t n);
void dt__shm_prefault_read(const void *p, size_t n);
/* Formats a one-line message into err (DT_TP_ERR_MAX bytes; NULL: nothing). */
void dt__shm_set_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- helpers of the data path (shm.c, shm_rx.c) ------------------------ */

#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline void futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wakes the owner of hdr if it sleeps (or is about to). Either the sleeper
 * sees our update or we see its `sleeping` flag: a store-load (Dekker)
 * pattern that needs a full barrier on both sides. With `fence` it is a
 * seq_cst fence here, paired with the one in wait_sleep(). Without, the
 * sleeper's membarrier(GLOBAL_EXPEDITED) runs a full barrier on our core
 * for us (both processes registered, hdr->asym), and a compiler barrier is
 * enough here: a fence per message costs a wait until the ring's cache line
 * has left for the peer, most of a small message's latency on this path. */
static inline void ring_bell(struct dt_shm_hdr *h, bool force, bool fence) {
  if (force || fence) atomic_thread_fence(memory_order_seq_cst);
  else atomic_signal_fence(memory_order_seq_cst);
  if (force || atomic_load_explicit(&h->sleeping, memory_order_relaxed)) {
    atomic_fetch_add(&h->bell, 1);
    futex_wake(&h->bell);
  }
}

static inline uint64_t round_rec(uint64_t n) { return (n + DT_SHM_REC - 1) & ~(uint64_t)(DT_SHM_REC - 1); }

/* Release, not seq_cst: a seq_cst store is a locked exchange on x86, which
 * waits for the record just written to reach the peer before the sender
 * may go on. Only the driving thread reads the status (after its own
 * progress), the release orders `done` and the payload before it. */
static inline void req_finish(struct dt_tp_req *r, int rc) {
  r->next = NULL;
  atomic_store_explicit(&r->status, rc < 0 ? rc : 1, memory_order_release);
}

static inline void list_append(struct dt_tp_req **head, struct dt_tp_req **tail, struct dt_tp_req *r) {
  r->next = NULL;
  if (*tail) (*tail)->next = r;
  else *head = r;
  *tail = r;
}

/* shm.c: losing a peer, acting on an abort. */
void dt__shm_ep_lost(struct dt_tp_ep *ep, const char *what);
/* After an abort, fails what is still pending; returns the abort's code or 0. */
int dt__shm_check_abort(struct dt_tp_ctx *ctx);
/* shm_rx.c: receiving. */
bool dt__shm_rx_progress(struct dt_tp_ep *ep);
int dt__shm_irecv(struct dt_tp_ep *ep, struct dt_tp_req *r);
int dt__shm_queue_ack(struct dt_tp_ep *ep, uint64_t cookie, int rc);
void dt__shm_ux_free(struct dt_match_msg *m);

/* The start of isend and irecv: r pending on ep, unless the context
 * aborted or the peer is lost. */
static inline int dt__shm_req_start(struct dt_tp_ep *ep, struct dt_tp_req *r) {
  atomic_store_explicit(&r->status, 0, memory_order_relaxed);
  r->done = 0;
  r->ep = ep;
  int rc = dt__shm_check_abort(ep->ctx);
  if (rc) return rc;
  return ep->dead ? DT_EPEERLOST : DT_OK;
}

#endif /* DT_COMM_SHM_INT_H */

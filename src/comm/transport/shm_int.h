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
#define DT_SHM_VERSION 2
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
  /* cma_ok[p] (set by the owner): process_vm_readv from peer p works, so p
   * may send CMA records into this inbox. Readers poll it once at connect. */
  _Alignas(DT_SHM_LINE) _Atomic uint8_t cma_ok[];
};

#endif /* DT_COMM_SHM_INT_H */

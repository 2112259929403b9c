/*
 * shm.c — the shared-memory transport: ranks on one host exchange messages
 * through lock-free single-producer/single-consumer rings in a shared inbox
 * segment per rank (layout in shm_int.h), sleep on one futex word after a
 * short spin, and move large messages with one copy (process_vm_readv from
 * the sender's buffer straight into the receiver's), falling back to the
 * ring when the kernel forbids it. A dead peer is noticed through a pidfd
 * polled while waiting (at most every DTRAIN_SHM_LIVE_MS, default 2 ms) and
 * fails the context with DT_EPEERLOST naming the rank; an abort is written
 * into the owner's header, where every peer sees it on its next progress.
 *
 * It does not authenticate beyond the job hash in the segment name and
 * header (a segment is mode 0600, so only the same user can open it, and
 * that user could ptrace us anyway), does not reduce (algorithms do that on
 * what they receive) and does not cross hosts. Threading: one thread drives
 * a context; abort() may come from any thread.
 *
 * Knobs: DTRAIN_SHM_RING_BYTES (per sender, default 1 MiB up to 16 ranks,
 * then smaller: ring_bytes_for),
 * DTRAIN_SHM_CMA_BYTES (smallest message sent single-copy, default 1 MiB:
 * below it the ring is faster here, process_vm_readv costing ~100 us a call;
 * 0 disables), DTRAIN_SHM_SPIN_US (how long a waiter polls before it
 * sleeps on the futex; default 2000, 200 when there are more ranks than
 * cores), DTRAIN_SHM_YIELD_US (after this long it yields the core between
 * polls, so a peer or a compute thread on the same core can run; default
 * 20, 0 when oversubscribed), DTRAIN_SHM_LIVE_MS (pidfd poll period, 2),
 * DTRAIN_SHM_BIND (bind the driving thread to core rank % ncpu when there
 * are no more ranks than cores and nothing pinned it yet, as mpirun does;
 * default 1), DTRAIN_SHM_PREFAULT (map a ring's pages when its peer is
 * first spoken to, 1).
 *
 * This file is the sending half of the data path, progress, waiting,
 * liveness, abort and the ops table; the receiving half (records into
 * receives or early buffers, CMA pulls and their ACKs, irecv) is in
 * shm_rx.c; the segments' life cycle (sizing, creating and mapping,
 * connecting to a peer's, unlinking, stale sweeps) in shm_seg.c; the
 * structures and small helpers they share in shm_int.h.
 */

#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/proc_watch.h"
#include "comm/transport/match.h"
#include "comm/transport/shm_int.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int futex_wait(_Atomic uint32_t *w, uint32_t val, int64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  return (int)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Length of p[0, n) without its trailing zero bytes. */
static uint64_t zero_trim(const uint8_t *p, uint64_t n) {
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p + n - 8, 8);
    if (w) break;
    n -= 8;
  }
  while (n && !p[n - 1]) n--;
  return n;
}

/* Removes r from a singly linked list; true if it was there. */
static bool list_remove(struct dt_tp_req **head, struct dt_tp_req **tail, struct dt_tp_req *r) {
  struct dt_tp_req *prev = NULL;
  for (struct dt_tp_req *q = *head; q; prev = q, q = q->next) {
    if (q != r) continue;
    if (prev) prev->next = q->next;
    else *head = q->next;
    if (tail && *tail == q) *tail = prev;
    q->next = NULL;
    return true;
  }
  return false;
}

/* ---- abort ------------------------------------------------------------ */

static void shm_abort(struct dt_tp_ctx *ctx, int rc, const char *why) {
  if (!ctx) return;
  int zero = 0;
  if (!atomic_compare_exchange_strong(&ctx->aborting, &zero, 1)) return;
  if (rc >= 0) rc = DT_EABORTED;
  snprintf(ctx->abort_msg, sizeof ctx->abort_msg, "%s", why ? why : "aborted");
  atomic_store(&ctx->abort_rc, rc);
  /* Tell every peer through our header, then wake them and ourselves. */
  snprintf(ctx->hdr->abort_msg, sizeof ctx->hdr->abort_msg, "%.191s", ctx->abort_msg);
  atomic_store(&ctx->hdr->abort_rc, rc);
  for (int p = 0; p < ctx->size; p++)
    if (ctx->eps && ctx->eps[p]) ring_bell(ctx->eps[p]->phdr, true, true);
  ring_bell(ctx->hdr, true, true);
}

static const char *shm_abort_reason(struct dt_tp_ctx *ctx, int *rc) {
  int r = ctx ? atomic_load(&ctx->abort_rc) : 0;
  if (rc) *rc = r;
  return r ? ctx->abort_msg : "";
}

/* Fails every pending request of one endpoint with rc. */
static void ep_fail_all(struct dt_tp_ep *ep, int rc) {
  struct dt_tp_req *r, *n;
  for (r = ep->sq_head; r; r = n) { n = r->next; req_finish(r, rc); }
  for (r = ep->cma_wait; r; r = n) { n = r->next; req_finish(r, rc); }
  for (r = ep->pull_head; r; r = n) { n = r->next; req_finish(r, rc); }
  ep->pull_head = ep->pull_tail = NULL;
  dt__match_fail(&ep->mt, rc);
  if (ep->rx_req) { req_finish(ep->rx_req, rc); ep->rx_req = NULL; }
  ep->sq_head = ep->sq_tail = ep->cma_wait = NULL;
  ep->tx_in_rec = false;
}

void dt__shm_ep_lost(struct dt_tp_ep *ep, const char *what) {
  struct dt_tp_ctx *ctx = ep->ctx;
  char why[DT_TP_ERR_MAX];
  /* A peer that aborted (say, because a third rank died) and then left
   * looks like a peer that vanished mid-message: its own reason wins, so
   * every survivor names the rank that was really lost. */
  int prc = atomic_load_explicit(&ep->phdr->abort_rc, memory_order_acquire);
  if (prc) {
    snprintf(why, sizeof why, "reported by rank %d: %.200s", ep->peer, ep->phdr->abort_msg);
    ep->dead = true;
    ep_fail_all(ep, prc);
    shm_abort(ctx, prc, why);
    return;
  }
  snprintf(why, sizeof why, "shm: rank %d (pid %d) %s", ep->peer, (int)ep->pid, what);
  ep->dead = true;
  ep_fail_all(ep, DT_EPEERLOST);
  if (atomic_load(&ctx->tolerate)) {
    DT_LOG_WARN("%s (the others go on)", why);
    return;
  }
  shm_abort(ctx, DT_EPEERLOST, why);
}

static void shm_tolerate_loss(struct dt_tp_ctx *ctx) {
  if (ctx) atomic_store(&ctx->tolerate, 1);
}

/* After an abort, the driving thread fails what is still pending. */
int dt__shm_check_abort(struct dt_tp_ctx *ctx) {
  int rc = atomic_load_explicit(&ctx->abort_rc, memory_order_acquire);
  if (!rc) return 0;
  if (!ctx->failed_all) {
    ctx->failed_all = true;
    for (int p = 0; p < ctx->size; p++)
      if (ctx->eps[p]) ep_fail_all(ctx->eps[p], rc);
  }
  return rc;
}

/* ---- sending ---------------------------------------------------------- */

static uint64_t tx_space(struct dt_tp_ep *ep) {
  uint64_t cap = ep->mask + 1;
  if (cap - (ep->tx_head - ep->tx_tail_seen) < cap / 2)
    ep->tx_tail_seen = atomic_load_explicit(&ep->tx->tail, memory_order_acquire);
  return cap - (ep->tx_head - ep->tx_tail_seen);
}

static void tx_put(struct dt_tp_ep *ep, const void *src, uint64_t n) {
  uint64_t pos = ep->tx_head & ep->mask, first = ep->mask + 1 - pos;
  if (first > n) first = n;
  if (src) {
    memcpy(ep->tx->data + pos, src, first);
    if (n > first) memcpy(ep->tx->data, (const uint8_t *)src + first, n - first);
  } else {
    memset(ep->tx->data + pos, 0, first);
    if (n > first) memset(ep->tx->data, 0, n - first);
  }
  ep->tx_head += n;
}

static void tx_publish(struct dt_tp_ep *ep) {
  atomic_store_explicit(&ep->tx->head, ep->tx_head, memory_order_release);
  ring_bell(ep->phdr, false, ep->fence);
}

/* Writes as much queued output as fits; returns true if anything moved. */
/* Room for the next record: the space minus one header slot, which stays
 * free for the "nothing here" mark below. */
static uint64_t tx_room(struct dt_tp_ep *ep) {
  uint64_t sp = tx_space(ep);
  return sp > DT_SHM_REC ? sp - DT_SHM_REC : 0;
}

/* Clears the sequence word of the slot after the last record, before that
 * record is published: that slot may hold an old payload that happens to
 * look like the header the consumer expects next. */
static void tx_mark_end(struct dt_tp_ep *ep) {
  struct dt_shm_rec *h = (struct dt_shm_rec *)(ep->tx->data + (ep->tx_head & ep->mask));
  atomic_store_explicit(&h->seq, 0, memory_order_relaxed);
}

/* Writes a record header at `at` (32-aligned, so never wrapped) and
 * publishes it by its sequence word last. The record's end is tx_head. */
static void tx_header(struct dt_tp_ep *ep, uint64_t at, uint64_t tag, uint64_t lenk, uint64_t aux) {
  tx_mark_end(ep);
  struct dt_shm_rec *h = (struct dt_shm_rec *)(ep->tx->data + (at & ep->mask));
  h->tag = tag;
  h->lenk = lenk;
  h->aux = aux;
  atomic_store_explicit(&h->seq, at + 1, memory_order_release);
}

/* Writes as much queued output as fits; returns true if anything moved. */
static bool tx_progress(struct dt_tp_ep *ep) {
  bool moved = false;
  const uint64_t chunk = 64u << 10;
  for (;;) {
    if (!ep->tx_in_rec) {
      /* Acknowledgements go first, at a record boundary. */
      while (ep->nacks && tx_room(ep) >= DT_SHM_REC) {
        struct ack a = ep->acks[--ep->nacks];
        uint64_t at = ep->tx_head;
        ep->tx_head += DT_SHM_REC;
        tx_header(ep, at, 0, (uint64_t)DT_SHM_ACK << DT_SHM_KIND_SHIFT | DT_SHM_COMPLETE,
                  (a.cookie & 0xffffffffu) | (uint64_t)(uint32_t)(-a.rc) << 32);
        moved = true;
      }
      if (ep->nacks) break;
      struct dt_tp_req *r = ep->sq_head;
      if (!r) break;
      uint64_t sp = tx_room(ep);
      bool cma = r->len >= ep->ctx->cma_min && ep->ctx->cma_min > 0 &&
                 atomic_load_explicit(&ep->phdr->cma_ok[ep->ctx->rank], memory_order_relaxed);
      r->done = 0;
      if (cma) {
        if (sp < 2 * DT_SHM_REC) break;
        uint32_t cookie = ++ep->cma_seq;
        uint8_t ext[DT_SHM_REC] = {0};
        memcpy(ext, &cookie, sizeof cookie);
        uint64_t at = ep->tx_head;
        ep->tx_head += DT_SHM_REC;
        tx_put(ep, ext, sizeof ext);
        tx_header(ep, at, r->tag,
                  r->len | (uint64_t)DT_SHM_CMA << DT_SHM_KIND_SHIFT | DT_SHM_COMPLETE,
                  (uint64_t)(uintptr_t)r->buf);
        moved = true;
        /* Off the queue, onto the list waiting for the receiver's ACK. */
        ep->sq_head = r->next;
        if (!ep->sq_head) ep->sq_tail = NULL;
        r->priv[0] = cookie;
        r->next = ep->cma_wait;
        ep->cma_wait = r;
        continue;
      }
      if (sp < DT_SHM_REC) break;
      /* A small message ending in zeros goes without them (DT_SHM_ZTAIL). */
      uint64_t keep = r->len <= DT_SHM_ZTAIL_MAX ? zero_trim(r->buf, r->len) : r->len;
      if (keep < r->len && sp - DT_SHM_REC >= round_rec(keep)) {
        uint64_t at = ep->tx_head;
        ep->tx_head += DT_SHM_REC;
        if (keep) tx_put(ep, r->buf, keep);
        ep->tx_head += round_rec(keep) - keep; /* padding: never read */
        tx_header(ep, at, r->tag,
                  r->len | (uint64_t)DT_SHM_EAGER << DT_SHM_KIND_SHIFT | DT_SHM_COMPLETE | DT_SHM_ZTAIL, keep);
        moved = true;
        ep->sq_head = r->next;
        if (!ep->sq_head) ep->sq_tail = NULL;
        r->done = r->len;
        req_finish(r, 1);
        continue;
      }
      /* EAGER: as much payload as fits goes in before the header; the rest
       * streams, counted by the head. */
      uint64_t total = round_rec(r->len), n = sp - DT_SHM_REC;
      if (n > total) n = total;
      if (n > chunk && n < total) n = chunk;
      uint64_t at = ep->tx_head, ncopy = n < r->len ? n : r->len;
      ep->tx_head += DT_SHM_REC;
      if (ncopy) tx_put(ep, r->buf, ncopy);
      ep->tx_head += n - ncopy; /* padding: never read */
      r->done = ncopy;
      tx_header(ep, at, r->tag,
                r->len | (uint64_t)DT_SHM_EAGER << DT_SHM_KIND_SHIFT | (n == total ? DT_SHM_COMPLETE : 0),
                0);
      moved = true;
      if (n == total) {
        ep->sq_head = r->next;
        if (!ep->sq_head) ep->sq_tail = NULL;
        r->done = r->len;
        req_finish(r, 1);
        continue;
      }
      /* It stays at the head of the queue while the rest streams. */
      ep->tx_in_rec = true;
      ep->tx_left = total - n;
      tx_publish(ep);
    }
    struct dt_tp_req *r = ep->sq_head;
    uint64_t sp = tx_room(ep);
    if (!sp) break;
    uint64_t n = ep->tx_left < sp ? ep->tx_left : sp;
    if (n > chunk) n = chunk;
    uint64_t data_left = r->len > r->done ? r->len - r->done : 0;
    uint64_t ncopy = n < data_left ? n : data_left;
    if (ncopy) tx_put(ep, ep->tx_zero ? NULL : (const uint8_t *)r->buf + r->done, ncopy);
    r->done += ncopy;
    ep->tx_head += n - ncopy; /* padding: never read */
    ep->tx_left -= n;
    moved = true;
    if (ep->tx_left == 0) {
      tx_mark_end(ep); /* published by the head store below */
      ep->tx_in_rec = false;
      ep->sq_head = r->next;
      if (!ep->sq_head) ep->sq_tail = NULL;
      if (!ep->tx_zero) req_finish(r, 1);
      ep->tx_zero = false;
      r->done = r->len;
    }
    tx_publish(ep);
  }
  if (moved) tx_publish(ep);
  return moved;
}

/* ---- progress, liveness ----------------------------------------------- */

static bool progress_all(struct dt_tp_ctx *ctx) {
  bool moved = false;
  for (int p = 0; p < ctx->size; p++) {
    struct dt_tp_ep *ep = ctx->eps[p];
    if (!ep || ep->dead) continue;
    int prc = atomic_load_explicit(&ep->phdr->abort_rc, memory_order_relaxed);
    if (prc && !atomic_load_explicit(&ctx->abort_rc, memory_order_relaxed)) {
      char why[DT_TP_ERR_MAX];
      atomic_thread_fence(memory_order_acquire);
      snprintf(why, sizeof why, "reported by rank %d: %.200s", p, ep->phdr->abort_msg);
      shm_abort(ctx, prc, why);
      return true;
    }
    if (dt__shm_rx_progress(ep)) moved = true;
    if (!ep->dead && (ep->sq_head || ep->nacks) && tx_progress(ep)) moved = true;
  }
  return moved;
}

/* Polls every peer's pidfd (one syscall); a peer that exited without a
 * clean close, or with requests pending, is lost. */
static void check_live(struct dt_tp_ctx *ctx) {
  int64_t now = dt_now_ns();
  if (now < ctx->next_live) return;
  ctx->next_live = now + ctx->live_ns;
  struct pollfd pf[64];
  int idx[64], n = 0;
  for (int p = 0; p < ctx->size; p++) {
    struct dt_tp_ep *ep = ctx->eps[p];
    if (!ep || ep->dead || ep->gone) continue;
    if (ep->pidfd < 0 || n == 64) {
      if (dt__shm_pid_gone(ep->pid)) goto exited_nofd;
      continue;
    exited_nofd:
      dt__shm_rx_progress(ep); /* take whatever it published before dying */
      if (atomic_load(&ep->rx->closed) && !dt__match_has_posted(&ep->mt) && !ep->rx_in_rec && !ep->sq_head && !ep->pull_head &&
          !ep->cma_wait)
        ep->gone = true;
      else
        dt__shm_ep_lost(ep, "exited");
      continue;
    }
    pf[n] = (struct pollfd){ep->pidfd, POLLIN, 0};
    idx[n++] = p;
  }
  if (!n || poll(pf, n, 0) <= 0) return;
  for (int i = 0; i < n; i++) {
    if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    struct dt_tp_ep *ep = ctx->eps[idx[i]];
    dt__shm_rx_progress(ep);
    if (ep->dead) continue;
    if (atomic_load(&ep->rx->closed) && !dt__match_has_posted(&ep->mt) && !ep->rx_in_rec && !ep->sq_head && !ep->pull_head &&
        !ep->cma_wait)
      ep->gone = true;
    else
      dt__shm_ep_lost(ep, "exited");
  }
}

/* Sleeps until a peer rings our bell or `ns` passes. */
static void wait_sleep(struct dt_tp_ctx *ctx, int64_t ns) {
  struct dt_shm_hdr *h = ctx->hdr;
  uint32_t seq = atomic_load(&h->bell);
  atomic_store(&h->sleeping, 1);
  atomic_thread_fence(memory_order_seq_cst);
  /* Senders that skip their fence (ring_bell) get one from us here. Should
   * the call fail after registering worked, a wake-up may be missed: sleep
   * at most 1 ms then. */
  if (ctx->asym && syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0 && ns > 1000000)
    ns = 1000000;
  if (!progress_all(ctx) && !atomic_load(&ctx->abort_rc)) futex_wait(&h->bell, seq, ns);
  atomic_store(&h->sleeping, 0);
}

/* First send to / receive from a peer: map that ring's pages now (see
 * dt__shm_prefault) rather than one fault per page during the first lap. Our ring
 * in the peer's inbox is page-aligned (rings_off and stride are). */
static void touch_tx(struct dt_tp_ep *ep) {
  ep->tx_touched = true;
  dt__shm_prefault(ep->tx, (size_t)ep->phdr->ring_stride);
}

/* ---- ops -------------------------------------------------------------- */

/* irecv may pull a CMA message at once (its record already in the ring):
 * the ACK that pull queued must go out now. A wait on an already complete
 * request returns without progress, and if the receiver's next operation
 * does not touch this transport (a window reduction), the sender would wait
 * for that ACK until its deadline. */
static int shm_irecv(struct dt_tp_ep *ep, struct dt_tp_req *r) {
  int rc = dt__shm_irecv(ep, r);
  if (ep->nacks && !ep->dead) tx_progress(ep);
  return rc;
}

static int shm_isend(struct dt_tp_ep *ep, struct dt_tp_req *r) {
  DT_CHECK(dt__shm_req_start(ep, r));
  if (!ep->tx_touched) touch_tx(ep);
  list_append(&ep->sq_head, &ep->sq_tail, r);
  tx_progress(ep);
  return DT_OK;
}

static int shm_test(struct dt_tp_ctx *ctx, struct dt_tp_req *r) {
  if (r->status) return r->status < 0 ? r->status : 1;
  progress_all(ctx);
  check_live(ctx);
  int rc = dt__shm_check_abort(ctx);
  if (r->status) return r->status < 0 ? r->status : 1;
  return rc ? rc : 0;
}

static void owing(struct dt_tp_req **reqs, int n, char *err, const char *what) {
  for (int i = 0; i < n; i++) {
    struct dt_tp_req *r = reqs[i];
    if (r->status) continue;
    dt__shm_set_err(err, "shm: %s waiting for rank %d (%s of %zu bytes, tag 0x%llx, %zu done)", what,
            r->peer, r->kind == DT_TP_SEND ? "send" : "receive", r->len,
            (unsigned long long)r->tag, r->done);
    return;
  }
}

static int shm_wait(struct dt_tp_ctx *ctx, struct dt_tp_req **reqs, int n, int64_t deadline_ns,
                    char *err) {
  int idle = 0, first = 0;
  int64_t spin_from = 0;
  for (int i = 0; i < n; i++)
    if (reqs[i]->ep) reqs[i]->ep->pw = (struct dt_proc_watch){0};
  for (;;) {
    while (first < n && reqs[first]->status > 0) first++;
    for (int i = first; i < n; i++) {
      if (reqs[i]->status < 0) {
        int rc = reqs[i]->status;
        int arc;
        const char *why = shm_abort_reason(ctx, &arc);
        if (arc) dt__shm_set_err(err, "%s", why);
        else if (reqs[i]->ep && reqs[i]->ep->dead && rc == DT_EPEERLOST)
          dt__shm_set_err(err, "shm: rank %d (pid %d) exited", reqs[i]->peer,
                          (int)reqs[i]->ep->pid);
        else dt__shm_set_err(err, "shm: %s with rank %d failed (tag 0x%llx): %s",
                     reqs[i]->kind == DT_TP_SEND ? "send" : "receive", reqs[i]->peer,
                     (unsigned long long)reqs[i]->tag, dt_strerror(rc));
        return rc;
      }
    }
    if (first == n) return DT_OK;
    int arc = dt__shm_check_abort(ctx);
    if (arc) {
      dt__shm_set_err(err, "%s", ctx->abort_msg);
      return arc;
    }
    if (progress_all(ctx)) {
      idle = 0;
      continue;
    }
    /* Nothing moved: poll, then poll while yielding the core (a peer may
     * share it), then sleep on the bell. Time is read only every 64 polls. */
    if (idle == 0) spin_from = 0;
    if ((++idle & 63) != 0) {
      cpu_relax();
      continue;
    }
    int64_t now = dt_now_ns();
    if (!spin_from) spin_from = now;
    check_live(ctx);
    if (now >= deadline_ns) {
      owing(reqs, n, err, "deadline expired");
      return DT_ETIMEDOUT;
    }
    /* A peer we wait for that is stopped (SIGSTOP, a debugger) makes no
     * progress until continued: say so after DTRAIN_SHM_STOPPED_S instead
     * of waiting for the deadline. */
    for (int i = first; i < n; i++) {
      struct dt_tp_ep *ep = reqs[i]->ep;
      double stopped;
      if (reqs[i]->status || !ep || ep->dead || !dt__proc_watch(&ep->pw, ep->pid, now, &stopped)) continue;
      dt__shm_set_err(err, "shm: rank %d (pid %d) is stopped (SIGSTOP?): no progress for %.0f s while waiting "
              "for its %s of %zu bytes (DTRAIN_SHM_STOPPED_S)", ep->peer, (int)ep->pid, stopped,
              reqs[i]->kind == DT_TP_SEND ? "receive" : "send", reqs[i]->len);
      return DT_ETIMEDOUT;
    }
    if (now - spin_from < ctx->spin_ns) {
      if (now - spin_from >= ctx->yield_ns) sched_yield();
      continue;
    }
    int64_t slice = ctx->live_ns > 0 ? ctx->live_ns * 5 : 10000000;
    if (slice > deadline_ns - now) slice = deadline_ns - now;
    wait_sleep(ctx, slice);
    idle = 0;
  }
}

static void shm_cancel(struct dt_tp_ctx *ctx, struct dt_tp_req *r) {
  struct dt_tp_ep *ep = r->ep;
  (void)ctx;
  if (!ep || r->status) return;
  if (ep->sq_head == r && ep->tx_in_rec) {
    ep->tx_zero = true; /* keep the stream framed; the buffer is not read again */
  } else if (list_remove(&ep->sq_head, &ep->sq_tail, r) || list_remove(&ep->cma_wait, NULL, r) ||
             dt__match_cancel(&ep->mt, r)) {
    /* forgotten; a late ACK for it finds nothing */
  } else if (list_remove(&ep->pull_head, &ep->pull_tail, r)) {
    /* never copied: tell the sender, so its send does not wait forever */
    dt__shm_queue_ack(ep, (uint32_t)r->priv[3], DT_EABORTED);
  } else {
    if (ep->rx_req == r) ep->rx_req = NULL; /* the rest of its payload is discarded */
  }
  r->next = NULL;
  r->status = DT_EABORTED;
}

static void ep_free(struct dt_tp_ep *ep) {
  dt__match_drain(&ep->mt, dt__shm_ux_free);
  free(ep->acks);
  if (ep->pidfd >= 0) close(ep->pidfd);
  munmap(ep->pbase, ep->plen);
  free(ep);
}

static void shm_close(struct dt_tp_ep *ep) {
  if (!ep) return;
  struct dt_tp_ctx *ctx = ep->ctx;
  /* Flush what is queued (bounded: the peer may be gone), then mark the
   * ring closed so the peer can tell a clean exit from a crash. */
  int64_t until = dt_now_ns() + 100000000;
  while (!ep->dead && (ep->sq_head || ep->nacks) && dt_now_ns() < until) {
    dt__shm_rx_progress(ep);
    if (!tx_progress(ep)) sched_yield();
  }
  atomic_store_explicit(&ep->tx->closed, 1, memory_order_release);
  ring_bell(ep->phdr, true, true);
  if (ctx->eps[ep->peer] == ep) {
    ctx->eps[ep->peer] = NULL;
    ctx->neps--;
  }
  ep_fail_all(ep, DT_ECLOSED);
  ep_free(ep);
}

static void shm_finalize(struct dt_tp_ctx *ctx) {
  if (!ctx) return;
  for (int p = 0; p < ctx->size; p++)
    if (ctx->eps[p]) shm_close(ctx->eps[p]);
  if (!atomic_load(&ctx->hdr->unlinked)) shm_unlink(ctx->name); /* a peer never mapped it */
  munmap(ctx->base, ctx->map_len);
  free(ctx->eps);
  free(ctx);
  dt__shm_sweep_stale();
}

const struct dt_transport_ops dt__transport_shm = {
    .name = "shm",
    .init = dt__shm_init,
    .can_connect = dt__shm_can_connect,
    .connect = dt__shm_connect,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .test = shm_test,
    .wait = shm_wait,
    .cancel = shm_cancel,
    .abort = shm_abort,
    .close = shm_close,
    .finalize = shm_finalize,
    .abort_reason = shm_abort_reason,
    .setup_done = dt__shm_setup_done,
    .tolerate_loss = shm_tolerate_loss,
};

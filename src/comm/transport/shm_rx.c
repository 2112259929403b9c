/*
 * shm_rx.c — the receiving half of the shared-memory transport's data path:
 * reading records from a peer's ring into posted receives or early-message
 * buffers (matching in match.c), single-copy pulls of CMA records with
 * process_vm_readv and the ACKs that answer them, and irecv. Sending,
 * progress, waiting, liveness, abort and the ops table are in shm.c, the
 * segments' life cycle in shm_seg.c, the shared structures and the small
 * helpers both halves use in shm_int.h.
 */

#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/transport/match.h"
#include "comm/transport/shm_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

int dt__shm_queue_ack(struct dt_tp_ep *ep, uint64_t cookie, int rc) {
  if (ep->nacks == ep->cap_acks) {
    int cap = ep->cap_acks ? 2 * ep->cap_acks : 16;
    struct ack *a = realloc(ep->acks, cap * sizeof *a);
    if (!a) return DT_ENOMEM;
    ep->acks = a;
    ep->cap_acks = cap;
  }
  ep->acks[ep->nacks++] = (struct ack){cookie, rc};
  return DT_OK;
}

/* ---- receiving -------------------------------------------------------- */

/* Copies a CMA message from the sender into r and queues the ACK. */
static void cma_pull(struct dt_tp_ep *ep, struct dt_tp_req *r, uint64_t addr, uint64_t len,
                     uint64_t cookie) {
  int rc = DT_OK;
  if (len != r->len) {
    rc = DT_EPROTO;
  } else {
    uint64_t off = 0;
    while (off < len) {
      struct iovec l = {(uint8_t *)r->buf + off, len - off};
      struct iovec rm = {(void *)(uintptr_t)(addr + off), len - off};
      ssize_t n = process_vm_readv(ep->pid, &l, 1, &rm, 1, 0);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        rc = (n < 0 && errno == ESRCH) ? DT_EPEERLOST : DT_EIO;
        break;
      }
      off += (uint64_t)n;
    }
    r->done = off;
  }
  if (rc == DT_EPROTO)
    DT_LOG_WARN("shm: rank %d sent %llu bytes with tag 0x%llx, receive expects %zu", ep->peer,
                (unsigned long long)len, (unsigned long long)r->tag, r->len);
  if (dt__shm_queue_ack(ep, cookie, rc) < 0) rc = DT_ENOMEM;
  req_finish(r, rc);
}

static struct dt_tp_req *match_posted(struct dt_tp_ep *ep, uint64_t tag) {
  return dt__match_posted(&ep->mt, ep->peer, tag);
}

/* A buffered early message, queued; NULL (with dt_errmsg set) when out of
 * memory or over the early-message bound. */
static struct unexp *ux_new(struct dt_tp_ep *ep, int kind, uint64_t tag, uint64_t len,
                            uint64_t aux) {
  struct unexp *u = calloc(1, sizeof *u);
  if (!u) return dt__seterr(DT_ENOMEM, "out of memory buffering a message"), NULL;
  u->kind = kind;
  u->len = len;
  u->cookie_or_addr = aux;
  if (kind == DT_SHM_EAGER && len) {
    u->data = malloc(len);
    if (!u->data) { free(u); return dt__seterr(DT_ENOMEM, "out of memory buffering a message"), NULL; }
  }
  u->complete = kind == DT_SHM_CMA || len == 0;
  if (dt__match_ux_add(&ep->mt, &u->m, ep->peer, tag, kind == DT_SHM_EAGER ? len : 0) < 0) {
    free(u->data);
    free(u);
    return NULL;
  }
  return u;
}

static void ux_unlink(struct dt_tp_ep *ep, struct unexp *u) { dt__match_ux_remove(&ep->mt, &u->m); }

void dt__shm_ux_free(struct dt_match_msg *m) {
  struct unexp *u = (struct unexp *)m;
  free(u->data);
  free(u);
}

/* Delivers a complete buffered EAGER message into r. */
static void ux_deliver(struct dt_tp_ep *ep, struct unexp *u, struct dt_tp_req *r) {
  if (u->len != r->len) {
    DT_LOG_WARN("shm: rank %d sent %llu bytes with tag 0x%llx, receive expects %zu", ep->peer,
                (unsigned long long)u->len, (unsigned long long)r->tag, r->len);
    req_finish(r, DT_EPROTO);
  } else {
    if (u->len) memcpy(r->buf, u->data, u->len);
    r->done = u->len;
    req_finish(r, 1);
  }
  free(u->data);
  free(u);
}

static void rx_get(struct dt_tp_ep *ep, uint64_t tail, void *dst, uint64_t n) {
  uint64_t pos = tail & ep->rx_mask, first = ep->rx_mask + 1 - pos;
  if (first > n) first = n;
  if (dst) {
    memcpy(dst, ep->rx->data + pos, first);
    if (n > first) memcpy((uint8_t *)dst + first, ep->rx->data, n - first);
  }
}

bool dt__shm_rx_progress(struct dt_tp_ep *ep) {
  if (ep->pull_head) {
    struct dt_tp_req *r = ep->pull_head;
    ep->pull_head = r->next;
    if (!ep->pull_head) ep->pull_tail = NULL;
    r->next = NULL;
    cma_pull(ep, r, r->priv[1], r->priv[2], (uint32_t)r->priv[3]);
    return true;
  }
  struct dt_shm_ring *rg = ep->rx;
  uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_relaxed);
  bool moved = false;
  for (;;) {
    if (!ep->rx_in_rec) {
      struct dt_shm_rec *h = (struct dt_shm_rec *)(rg->data + (tail & ep->rx_mask));
      if (atomic_load_explicit(&h->seq, memory_order_acquire) != tail + 1) break;
      uint64_t tag = h->tag, lenk = h->lenk, aux = h->aux;
      unsigned kind = (unsigned)(lenk >> DT_SHM_KIND_SHIFT);
      uint64_t len = lenk & DT_SHM_LEN_MASK;
      tail += DT_SHM_REC;
      moved = true;
      if (kind == DT_SHM_ACK) {
        struct dt_tp_req *prev = NULL;
        uint32_t err = (uint32_t)(aux >> 32);
        for (struct dt_tp_req *q = ep->cma_wait; q; prev = q, q = q->next) {
          if (q->priv[0] != (aux & 0xffffffffu)) continue;
          if (prev) prev->next = q->next;
          else ep->cma_wait = q->next;
          q->done = q->len;
          req_finish(q, err ? -(int)err : 1);
          break;
        }
        continue;
      }
      if (kind == DT_SHM_CMA) {
        uint8_t ext[DT_SHM_REC];
        uint32_t cookie;
        rx_get(ep, tail, ext, sizeof ext);
        memcpy(&cookie, ext, sizeof cookie);
        tail += DT_SHM_REC;
        struct dt_tp_req *r = match_posted(ep, tag);
        struct unexp *u;
        if (r) {
          cma_pull(ep, r, aux, len, cookie);
          /* One bulk copy per call: the waiter checks its requests before
           * the next, so an algorithm reduces each chunk while it is still
           * in cache instead of after every chunk has been pulled. */
          break;
        } else if ((u = ux_new(ep, DT_SHM_CMA, tag, len, aux))) {
          u->cookie = cookie;
        } else {
          char what[DT_TP_ERR_MAX];
          snprintf(what, sizeof what, "could not be served: %s", dt_errmsg());
          dt__shm_ep_lost(ep, what);
          return true;
        }
        continue;
      }
      bool zt = (lenk & DT_SHM_ZTAIL) != 0;
      if (kind != DT_SHM_EAGER || len > DT_FRAME_MAX_LEN ||
          (zt && (aux >= len || len > DT_SHM_ZTAIL_MAX || !(lenk & DT_SHM_COMPLETE)))) {
        char what[128];
        snprintf(what, sizeof what, "sent a malformed record (kind %u, length %llu)", kind,
                 (unsigned long long)len);
        dt__shm_ep_lost(ep, what);
        return true;
      }
      ep->rx_in_rec = true;
      ep->rx_complete = (lenk & DT_SHM_COMPLETE) != 0;
      ep->rx_len = len;
      ep->rx_total = round_rec(len);
      ep->rx_off = 0;
      ep->rx_tag = tag;
      ep->rx_ux = NULL;
      ep->rx_req = match_posted(ep, tag);
      if (ep->rx_req && ep->rx_req->len != len) {
        DT_LOG_WARN("shm: rank %d sent %llu bytes with tag 0x%llx, receive expects %zu",
                    ep->peer, (unsigned long long)len, (unsigned long long)tag,
                    ep->rx_req->len);
        req_finish(ep->rx_req, DT_EPROTO);
        ep->rx_req = NULL; /* discard the payload */
      } else if (!ep->rx_req) {
        ep->rx_ux = ux_new(ep, DT_SHM_EAGER, tag, len, 0);
        if (!ep->rx_ux) {
          char what[DT_TP_ERR_MAX];
          snprintf(what, sizeof what, "could not be served: %s", dt_errmsg());
          dt__shm_ep_lost(ep, what);
          return true;
        }
      }
      if (zt) { /* complete and small: copy what is there, zero the rest */
        uint8_t *dst = ep->rx_req ? ep->rx_req->buf : ep->rx_ux ? ep->rx_ux->data : NULL;
        if (dst) {
          rx_get(ep, tail, dst, aux);
          memset(dst + aux, 0, len - aux);
        }
        ep->rx_total = ep->rx_off = round_rec(aux);
        ep->rx_len = len;
        tail += ep->rx_total;
        if (ep->rx_req) ep->rx_req->done = len;
        goto record_done;
      }
    }
    /* A complete record is all there; a streaming one as far as the head. */
    uint64_t left = ep->rx_total - ep->rx_off, n = left;
    if (!ep->rx_complete) {
      /* The header is published by its own sequence word, possibly before
       * the head counter moves past it: head may still be behind tail. */
      uint64_t head = atomic_load_explicit(&rg->head, memory_order_acquire);
      uint64_t avail = head > tail ? head - tail : 0;
      if (avail < n) n = avail;
    }
    if (!n && left) break;
    uint64_t data_left = ep->rx_len > ep->rx_off ? ep->rx_len - ep->rx_off : 0;
    uint64_t ncopy = n < data_left ? n : data_left;
    if (ncopy) {
      uint8_t *dst = NULL;
      if (ep->rx_req) dst = (uint8_t *)ep->rx_req->buf + ep->rx_off;
      else if (ep->rx_ux) dst = ep->rx_ux->data + ep->rx_off;
      rx_get(ep, tail, dst, ncopy);
      if (ep->rx_req) ep->rx_req->done = ep->rx_off + ncopy;
    }
    tail += n;
    ep->rx_off += n;
    moved = true;
    if (ep->rx_off == ep->rx_total) {
    record_done:
      ep->rx_in_rec = false;
      if (ep->rx_req) req_finish(ep->rx_req, 1);
      if (ep->rx_ux) {
        struct unexp *u = ep->rx_ux;
        u->complete = true;
        if (u->m.req) {
          ux_unlink(ep, u);
          ux_deliver(ep, u, u->m.req);
        }
      }
      ep->rx_req = NULL;
      ep->rx_ux = NULL;
    }
    /* Release space early so a sender blocked on a full ring goes on. */
    if (!ep->rx_complete) atomic_store_explicit(&rg->tail, tail, memory_order_release);
  }
  if (moved) {
    atomic_store_explicit(&rg->tail, tail, memory_order_release);
    ring_bell(ep->phdr, false, ep->fence);
  } else if (atomic_load_explicit(&rg->closed, memory_order_acquire) && !ep->dead &&
             (dt__match_has_posted(&ep->mt) || ep->rx_in_rec || ep->sq_head || ep->cma_wait)) {
    /* Re-read head: the close is ordered after the peer's last publish. */
    if (atomic_load_explicit(&rg->head, memory_order_acquire) == tail) {
      dt__shm_ep_lost(ep, "closed its endpoint with messages still pending");
      return true;
    }
  }
  return moved;
}

static void touch_rx(struct dt_tp_ep *ep) {
  ep->rx_touched = true;
  dt__shm_prefault_read(ep->rx, (size_t)ep->ctx->hdr->ring_stride);
}

int dt__shm_irecv(struct dt_tp_ep *ep, struct dt_tp_req *r) {
  DT_CHECK(dt__shm_req_start(ep, r));
  if (!ep->rx_touched) touch_rx(ep);
  struct unexp *u = (struct unexp *)dt__match_ux_find(&ep->mt, ep->peer, r->tag);
  if (u) {
    if (u->kind == DT_SHM_CMA) {
      /* Copied by the next progress, one per call (see rx_progress). */
      ux_unlink(ep, u);
      r->priv[1] = u->cookie_or_addr;
      r->priv[2] = u->len;
      r->priv[3] = u->cookie;
      list_append(&ep->pull_head, &ep->pull_tail, r);
      free(u);
    } else if (u->complete) {
      ux_unlink(ep, u);
      ux_deliver(ep, u, r);
    } else {
      u->m.req = r; /* still streaming: delivered when complete */
    }
    return DT_OK;
  }
  dt__match_post(&ep->mt, r);
  dt__shm_rx_progress(ep);
  return DT_OK;
}

/*
 * tree.c — binomial-tree broadcast and reduce (log2 n rounds; for small
 * messages), their pipelined chain forms for large messages, direct
 * allgather and alltoall, and the dissemination barrier.
 *
 * Ranks are renumbered relative to the root (vr = (r - root) mod n) so any
 * root works; non-powers of two need no special case in a binomial tree.
 * The chain broadcast splits the buffer into chunks that flow root -> root+1
 * -> ... so every link is busy at once (bandwidth ~ one link, not log n).
 * Reduce trees combine in a fixed order, so results do not depend on timing.
 */
#include "comm/algo/algo.h"

#include <stdlib.h>
#include <string.h>

int dt__broadcast_tree(dt_comm *c, void *buf, size_t bytes, int root) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  int vr = (r - root + n) % n;
  int mask = 1;
  while (mask < n) { /* receive from the parent */
    if (vr & mask) {
      int src = (vr - mask + root) % n;
      DT_CHECK(dt__coll_sendrecv(c, -1, NULL, 0, src, buf, bytes));
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  dt_comm_req rq[64];
  int nq = 0;
  while (mask > 0) { /* send to the children */
    if (vr + mask < n) DT_CHECK(dt__coll_isend(c, (vr + mask + root) % n, buf, bytes, &rq[nq++]));
    mask >>= 1;
  }
  return dt_comm_waitall(c, rq, nq);
}

int dt__reduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                    dt_redop op, int root) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t es = dt_dtype_size(t), bytes = count * es;
  int vr = (r - root + n) % n;
  uint8_t *acc = r == root ? rbuf : dt__coll_scratch(c, 2, bytes + 64);
  uint8_t *tmp = dt__coll_scratch(c, 0, bytes + 64);
  if (!acc || !tmp) return DT_ENOMEM;
  if (acc != sbuf) memcpy(acc, sbuf, bytes);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      DT_CHECK(dt__coll_sendrecv(c, (vr - mask + root) % n, acc, bytes, -1, NULL, 0));
      return DT_OK;
    }
    if (vr + mask < n) {
      DT_CHECK(dt__coll_sendrecv(c, -1, NULL, 0, (vr + mask + root) % n, tmp, bytes));
      DT_CHECK(dt__reduce(acc, tmp, count, t, op));
    }
    mask <<= 1;
  }
  return dt__reduce_finish(acc, count, t, op, n); /* only the root gets here */
}

int dt__broadcast_ring(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t es = dt_dtype_size(t), bytes = count * es;
  size_t chunk = dt__algo_chunk_bytes();
  size_t nch = (bytes + chunk - 1) / chunk;
  int vr = (r - root + n) % n;
  int next = vr + 1 < n ? (r + 1) % n : -1, prev = vr > 0 ? (r - 1 + n) % n : -1;
  dt_comm_req *rq = dt__coll_scratch(c, 1, 2 * nch * sizeof(dt_comm_req));
  if (!rq) return DT_ENOMEM;
  dt_comm_req *sq = rq + nch;
  uint8_t *b = buf;
  if (prev >= 0)
    for (size_t k = 0; k < nch; k++) {
      size_t o = k * chunk, m = bytes - o < chunk ? bytes - o : chunk;
      DT_CHECK(dt__coll_irecv(c, prev, b + o, m, &rq[k]));
    }
  for (size_t k = 0; k < nch; k++) {
    size_t o = k * chunk, m = bytes - o < chunk ? bytes - o : chunk;
    if (prev >= 0) DT_CHECK(dt_comm_waitall(c, &rq[k], 1));
    if (next >= 0) DT_CHECK(dt__coll_isend(c, next, b + o, m, &sq[k]));
  }
  return next >= 0 ? dt_comm_waitall(c, sq, (int)nch) : DT_OK;
}

int dt__reduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                    dt_redop op, int root) {
  /* ring reduce-scatter (rank i ends owning block i), then gather to root */
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t es = dt_dtype_size(t);
  uint8_t *work = dt__coll_scratch(c, 2, count * es + 64);
  size_t *off = malloc(2 * (size_t)n * sizeof *off);
  if (!work || !off) {
    free(off);
    return dt__seterr(DT_ENOMEM, "reduce: out of memory");
  }
  size_t *cnt = off + n, o = 0;
  for (int i = 0; i < n; i++) {
    cnt[i] = count / (size_t)n + ((size_t)i < count % (size_t)n);
    off[i] = o;
    o += cnt[i];
  }
  memcpy(work, sbuf, count * es);
  int rc = dt__ring_reduce_scatter_blocks(c, work, off, cnt, t, op);
  if (rc == DT_OK) rc = dt__reduce_finish(work + off[r] * es, cnt[r], t, op, n);
  if (rc == DT_OK) {
    if (r == root) {
      dt_comm_req *rq = dt__coll_scratch(c, 1, (size_t)n * sizeof(dt_comm_req));
      int nq = 0;
      uint8_t *out = rbuf;
      memcpy(out + off[r] * es, work + off[r] * es, cnt[r] * es);
      for (int i = 0; i < n && rc == DT_OK; i++)
        if (i != r && cnt[i]) rc = dt__coll_irecv(c, i, out + off[i] * es, cnt[i] * es, &rq[nq++]);
      if (rc == DT_OK) rc = dt_comm_waitall(c, rq, nq);
    } else if (cnt[r]) {
      rc = dt__coll_sendrecv(c, root, work + off[r] * es, cnt[r] * es, -1, NULL, 0);
    }
  }
  free(off);
  return rc;
}

int dt__allgather_direct(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  uint8_t *out = rbuf;
  dt_comm_req *rq = dt__coll_scratch(c, 1, 2 * (size_t)n * sizeof(dt_comm_req));
  if (!rq) return DT_ENOMEM;
  int nq = 0;
  if ((const uint8_t *)sbuf != out + (size_t)r * bytes) memmove(out + (size_t)r * bytes, sbuf, bytes);
  for (int k = 1; k < n; k++) {
    int from = (r - k + n) % n;
    DT_CHECK(dt__coll_irecv(c, from, out + (size_t)from * bytes, bytes, &rq[nq++]));
  }
  for (int k = 1; k < n; k++)
    DT_CHECK(dt__coll_isend(c, (r + k) % n, out + (size_t)r * bytes, bytes, &rq[nq++]));
  return dt_comm_waitall(c, rq, nq);
}

int dt__alltoall_direct(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  const uint8_t *in = sbuf;
  uint8_t *out = rbuf;
  dt_comm_req *rq = dt__coll_scratch(c, 1, 2 * (size_t)n * sizeof(dt_comm_req));
  if (!rq) return DT_ENOMEM;
  int nq = 0;
  memcpy(out + (size_t)r * bytes, in + (size_t)r * bytes, bytes);
  for (int k = 1; k < n; k++) {
    int from = (r - k + n) % n;
    DT_CHECK(dt__coll_irecv(c, from, out + (size_t)from * bytes, bytes, &rq[nq++]));
  }
  for (int k = 1; k < n; k++) {
    int to = (r + k) % n;
    DT_CHECK(dt__coll_isend(c, to, in + (size_t)to * bytes, bytes, &rq[nq++]));
  }
  return dt_comm_waitall(c, rq, nq);
}

int dt__barrier_dissemination(dt_comm *c) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  uint8_t out = 1, in = 0;
  for (int k = 1; k < n; k <<= 1)
    DT_CHECK(dt__coll_sendrecv(c, (r + k) % n, &out, 1, (r - k + n) % n, &in, 1));
  return DT_OK;
}

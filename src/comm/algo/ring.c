/*
 * ring.c — ring algorithms: the pipelined, chunked ring allreduce
 * (reduce-scatter then allgather, 2(n-1) steps, each rank sending 2(n-1)/n
 * of the buffer: bandwidth-optimal), ring reduce-scatter and allgather, and
 * the block building blocks they share.
 *
 * Pipelining: within a reduce-scatter step every chunk's receive is posted
 * at once and the chunk is reduced as soon as it lands, while later chunks
 * are still on the wire (the transport progresses all of them in its wait).
 * Rank r ends the reduce-scatter owning block r. Each block is reduced in
 * one fixed order and then copied, so every rank ends with identical bits.
 * Not here: algorithm choice (tuning.c), transports.
 */
#include "comm/algo/algo.h"

#include <stdlib.h>
#include <string.h>

size_t dt__algo_chunk_bytes(void) {
  int64_t v = dt_param(DT_PARAM_CHUNK_BYTES);
  return v < 4096 ? 4096 : (size_t)v;
}

static void partition(size_t count, int n, size_t *off, size_t *cnt) {
  size_t base = count / (size_t)n, extra = count % (size_t)n, o = 0;
  for (int i = 0; i < n; i++) {
    cnt[i] = base + ((size_t)i < extra);
    off[i] = o;
    o += cnt[i];
  }
}

int dt__ring_reduce_scatter_blocks(dt_comm *c, void *buf, const size_t *off, const size_t *cnt,
                                   dt_dtype t, dt_redop op) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  size_t es = dt_dtype_size(t);
  size_t chunk = dt__algo_chunk_bytes() / es;
  if (chunk == 0) chunk = 1;
  size_t maxcnt = 0;
  for (int i = 0; i < n; i++) maxcnt = cnt[i] > maxcnt ? cnt[i] : maxcnt;
  uint8_t *tmp = dt__coll_scratch(c, 0, maxcnt * es + 64);
  size_t maxchunks = (maxcnt + chunk - 1) / chunk + 1;
  dt_comm_req *rq = dt__coll_scratch(c, 1, 2 * maxchunks * sizeof(dt_comm_req));
  if (!tmp || !rq) return DT_ENOMEM;
  dt_comm_req *sq = rq + maxchunks;
  uint8_t *b = buf;
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s - 1 + 2 * n) % n, rb = (r - s - 2 + 2 * n) % n;
    int nr = 0, ns = 0;
    for (size_t o = 0; o < cnt[rb]; o += chunk) {
      size_t m = cnt[rb] - o < chunk ? cnt[rb] - o : chunk;
      DT_CHECK(dt__coll_irecv(c, left, tmp + o * es, m * es, &rq[nr++]));
    }
    for (size_t o = 0; o < cnt[sb]; o += chunk) {
      size_t m = cnt[sb] - o < chunk ? cnt[sb] - o : chunk;
      DT_CHECK(dt__coll_isend(c, right, b + (off[sb] + o) * es, m * es, &sq[ns++]));
    }
    for (int k = 0; k < nr; k++) {
      size_t o = (size_t)k * chunk, m = cnt[rb] - o < chunk ? cnt[rb] - o : chunk;
      DT_CHECK(dt_comm_waitall(c, &rq[k], 1));
      DT_CHECK(dt__reduce(b + (off[rb] + o) * es, tmp + o * es, m, t, op));
    }
    DT_CHECK(dt_comm_waitall(c, sq, ns));
  }
  return DT_OK;
}

int dt__ring_allgather_blocks(dt_comm *c, void *buf, const size_t *off, const size_t *cnt,
                              size_t es) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  uint8_t *b = buf;
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s + n) % n, rb = (r - s - 1 + 2 * n) % n;
    DT_CHECK(dt__coll_sendrecv(c, cnt[sb] ? right : -1, b + off[sb] * es, cnt[sb] * es,
                               cnt[rb] ? left : -1, b + off[rb] * es, cnt[rb] * es));
  }
  return DT_OK;
}

int dt__allreduce_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                       dt_redop op) {
  int n = dt_comm_size(c);
  size_t es = dt_dtype_size(t);
  if (sbuf != rbuf) memcpy(rbuf, sbuf, count * es);
  size_t *off = malloc(2 * (size_t)n * sizeof *off);
  if (!off) return dt__seterr(DT_ENOMEM, "ring: out of memory");
  size_t *cnt = off + n;
  partition(count, n, off, cnt);
  int rc = dt__ring_reduce_scatter_blocks(c, rbuf, off, cnt, t, op);
  int r = dt_comm_rank(c);
  if (rc == DT_OK) rc = dt__reduce_finish((uint8_t *)rbuf + off[r] * es, cnt[r], t, op, n);
  if (rc == DT_OK) rc = dt__ring_allgather_blocks(c, rbuf, off, cnt, es);
  free(off);
  return rc;
}

int dt__reduce_scatter_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                            dt_redop op) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t es = dt_dtype_size(t);
  /* in place (sendbuf == recvbuf): the buffer itself is the work space and
   * the result stays in its block r, so no buffer-sized scratch is held */
  const int inplace = sbuf == rbuf;
  uint8_t *work = inplace ? rbuf : dt__coll_scratch(c, 2, (size_t)n * count * es);
  size_t *off = malloc(2 * (size_t)n * sizeof *off);
  if (!work || !off) {
    free(off);
    return dt__seterr(DT_ENOMEM, "reduce_scatter: out of memory");
  }
  size_t *cnt = off + n;
  for (int i = 0; i < n; i++) off[i] = (size_t)i * count, cnt[i] = count;
  if (!inplace) memcpy(work, sbuf, (size_t)n * count * es);
  int rc = dt__ring_reduce_scatter_blocks(c, work, off, cnt, t, op);
  if (rc == DT_OK) rc = dt__reduce_finish(work + off[r] * es, count, t, op, n);
  if (rc == DT_OK && !inplace) memcpy(rbuf, work + off[r] * es, count * es);
  free(off);
  return rc;
}

int dt__allgather_ring(dt_comm *c, const void *sbuf, void *rbuf, size_t bytes) {
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  size_t *off = malloc(2 * (size_t)n * sizeof *off);
  if (!off) return dt__seterr(DT_ENOMEM, "allgather: out of memory");
  size_t *cnt = off + n;
  for (int i = 0; i < n; i++) off[i] = (size_t)i * bytes, cnt[i] = bytes;
  uint8_t *out = rbuf;
  if ((const uint8_t *)sbuf != out + (size_t)r * bytes) memmove(out + (size_t)r * bytes, sbuf, bytes);
  int rc = dt__ring_allgather_blocks(c, rbuf, off, cnt, 1);
  free(off);
  return rc;
}

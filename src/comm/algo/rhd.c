/*
 * rhd.c — recursive halving-doubling allreduce (Rabenseifner: reduce-scatter
 * by recursive halving, allgather by recursive doubling; log2 p steps each,
 * bandwidth-optimal like the ring but with fewer, larger messages) and the
 * recursive-doubling allreduce for small messages (log2 p exchanges of the
 * whole buffer: latency-optimal).
 *
 * Non-power-of-two sizes: with p the largest power of two <= n and
 * rem = n - p, the first 2*rem ranks pair up; each even one hands its data
 * to its odd partner and sits out, the remaining p ranks run the
 * power-of-two algorithm, and the odd partners hand the result back
 * (the MPICH scheme). Every pairwise reduction combines exactly two
 * operands, and IEEE addition, min and max are commutative, so both sides of
 * a pair compute identical bits and all ranks end with the same result.
 */
#include "comm/algo/algo.h"

#include <stdlib.h>
#include <string.h>

static int real_rank(int newr, int rem) { return newr < rem ? newr * 2 + 1 : newr + rem; }

/* Pre-step for non-powers of two. Returns the new rank, or -1 if this rank
 * sits out (it must then receive the result in post_step). */
static int pre_step(dt_comm *c, uint8_t *buf, uint8_t *tmp, size_t count, dt_dtype t, dt_redop op,
                    int rem, int *rc) {
  int r = dt_comm_rank(c);
  size_t bytes = count * dt_dtype_size(t);
  *rc = DT_OK;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      *rc = dt__coll_sendrecv(c, r + 1, buf, bytes, -1, NULL, 0);
      return -1;
    }
    *rc = dt__coll_sendrecv(c, -1, NULL, 0, r - 1, tmp, bytes);
    if (*rc == DT_OK) *rc = dt__reduce(buf, tmp, count, t, op);
    return r / 2;
  }
  return r - rem;
}

static int post_step(dt_comm *c, uint8_t *buf, size_t bytes, int rem) {
  int r = dt_comm_rank(c);
  if (r >= 2 * rem) return DT_OK;
  if (r % 2 == 0) return dt__coll_sendrecv(c, -1, NULL, 0, r + 1, buf, bytes);
  return dt__coll_sendrecv(c, r - 1, buf, bytes, -1, NULL, 0);
}

/* What both allreduces share: the result buffer filled from sbuf, scratch
 * space, the power of two p <= n and the pre-step for the other rem ranks. */
typedef struct {
  uint8_t *buf, *tmp;
  size_t bytes;
  int p, rem, newr; /* newr < 0: this rank sits out until post_step */
} rhd_setup;

static int setup(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op,
                 rhd_setup *s) {
  int n = dt_comm_size(c), rc;
  s->bytes = count * dt_dtype_size(t);
  s->buf = rbuf;
  if (sbuf != rbuf) memcpy(rbuf, sbuf, s->bytes);
  s->tmp = dt__coll_scratch(c, 0, s->bytes + 64);
  if (!s->tmp) return DT_ENOMEM;
  for (s->p = 1; s->p * 2 <= n;) s->p *= 2;
  s->rem = n - s->p;
  s->newr = pre_step(c, s->buf, s->tmp, count, t, op, s->rem, &rc);
  return rc;
}

int dt__allreduce_tree(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                       dt_redop op) {
  int n = dt_comm_size(c);
  rhd_setup s;
  DT_CHECK(setup(c, sbuf, rbuf, count, t, op, &s));
  uint8_t *buf = s.buf, *tmp = s.tmp;
  size_t bytes = s.bytes;
  int p = s.p, rem = s.rem, newr = s.newr;
  if (newr >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int dst = real_rank(newr ^ mask, rem);
      DT_CHECK(dt__coll_sendrecv(c, dst, buf, bytes, dst, tmp, bytes));
      /* Combine in a fixed order (lower new rank's data first) so that both
       * partners compute bit-identical results even for non-commutative
       * rounding such as NaN payloads. */
      if ((newr ^ mask) < newr) {
        DT_CHECK(dt__reduce(tmp, buf, count, t, op));
        memcpy(buf, tmp, bytes);
      } else {
        DT_CHECK(dt__reduce(buf, tmp, count, t, op));
      }
    }
    DT_CHECK(dt__reduce_finish(buf, count, t, op, n));
  }
  return post_step(c, buf, bytes, rem);
}

int dt__allreduce_rhd(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                      dt_redop op) {
  int n = dt_comm_size(c), rc;
  rhd_setup s;
  DT_CHECK(setup(c, sbuf, rbuf, count, t, op, &s));
  uint8_t *buf = s.buf, *tmp = s.tmp;
  size_t es = dt_dtype_size(t), bytes = s.bytes;
  int p = s.p, rem = s.rem, newr = s.newr;
  if (newr >= 0) {
    size_t *cnts = malloc(2 * (size_t)p * sizeof *cnts);
    if (!cnts) return dt__seterr(DT_ENOMEM, "rhd: out of memory");
    size_t *disps = cnts + p;
    for (int i = 0; i < p; i++) cnts[i] = count / (size_t)p + ((size_t)i < count % (size_t)p);
    disps[0] = 0;
    for (int i = 1; i < p; i++) disps[i] = disps[i - 1] + cnts[i - 1];
    int send_idx = 0, recv_idx = 0, last_idx = p, mask = 1;
    rc = DT_OK;
    /* reduce-scatter by recursive halving */
    while (mask < p && rc == DT_OK) {
      int dst = real_rank(newr ^ mask, rem);
      size_t send_cnt = 0, recv_cnt = 0;
      if (newr < (newr ^ mask)) {
        send_idx = recv_idx + p / (mask * 2);
        for (int i = send_idx; i < last_idx; i++) send_cnt += cnts[i];
        for (int i = recv_idx; i < send_idx; i++) recv_cnt += cnts[i];
      } else {
        recv_idx = send_idx + p / (mask * 2);
        for (int i = send_idx; i < recv_idx; i++) send_cnt += cnts[i];
        for (int i = recv_idx; i < last_idx; i++) recv_cnt += cnts[i];
      }
      rc = dt__coll_sendrecv(c, send_cnt ? dst : -1, buf + disps[send_idx] * es, send_cnt * es,
                             recv_cnt ? dst : -1, tmp + disps[recv_idx] * es, recv_cnt * es);
      if (rc == DT_OK)
        rc = dt__reduce(buf + disps[recv_idx] * es, tmp + disps[recv_idx] * es, recv_cnt, t, op);
      send_idx = recv_idx;
      mask <<= 1;
      if (mask < p) last_idx = recv_idx + p / mask;
    }
    /* this rank now owns [send_idx, last_idx): finish it (avg) */
    if (rc == DT_OK) {
      size_t own = 0;
      for (int i = send_idx; i < last_idx; i++) own += cnts[i];
      rc = dt__reduce_finish(buf + disps[send_idx] * es, own, t, op, n);
    }
    /* allgather by recursive doubling */
    mask >>= 1;
    while (mask > 0 && rc == DT_OK) {
      int dst = real_rank(newr ^ mask, rem);
      size_t send_cnt = 0, recv_cnt = 0;
      if (newr < (newr ^ mask)) {
        if (mask != p / 2) last_idx = last_idx + p / (mask * 2);
        recv_idx = send_idx + p / (mask * 2);
        for (int i = send_idx; i < recv_idx; i++) send_cnt += cnts[i];
        for (int i = recv_idx; i < last_idx; i++) recv_cnt += cnts[i];
      } else {
        recv_idx = send_idx - p / (mask * 2);
        for (int i = send_idx; i < last_idx; i++) send_cnt += cnts[i];
        for (int i = recv_idx; i < send_idx; i++) recv_cnt += cnts[i];
      }
      rc = dt__coll_sendrecv(c, send_cnt ? dst : -1, buf + disps[send_idx] * es, send_cnt * es,
                             recv_cnt ? dst : -1, buf + disps[recv_idx] * es, recv_cnt * es);
      if (newr > (newr ^ mask)) send_idx = recv_idx;
      mask >>= 1;
    }
    free(cnts);
    DT_CHECK(rc);
  }
  return post_step(c, buf, bytes, rem);
}

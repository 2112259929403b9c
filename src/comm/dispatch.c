/*
 * dispatch.c — the collective entry points (dt_comm_allreduce, broadcast,
 * reduce, allgather, reduce_scatter, alltoall, barrier) and split: check
 * the arguments, ask tuning.c for an algorithm, frame the call
 * (dt__coll_begin / dt__coll_end in comm.c: sequence number, fingerprint,
 * deadline, abort on failure) and run the algorithm.
 *
 * Dependencies run one way: dispatch.c calls algo/ and comm.c; algo/ calls
 * only the point-to-point calls of coll.h (implemented in comm.c); comm.c
 * calls neither. Not here: point-to-point, fingerprints and deadlines
 * (comm.c), the algorithms themselves (algo/), building communicators
 * (comm_create.c).
 */
#include "comm/algo/algo.h"
#include "comm/comm_int.h"

#include <stdlib.h>
#include <string.h>

static int check_args(dt_comm *c, const void *s, const void *r, size_t count, dt_dtype t, int op,
                      int root, bool reduce) {
  if (!c) return dt__seterr(DT_EINVAL, "comm: communicator c is NULL");
  if (!dt_dtype_size(t)) return dt__comm_err(c, DT_EINVAL, "comm: bad dtype %d", (int)t);
  if (reduce && (t == DT_U8 || (unsigned)op >= DT_OP_COUNT))
    return dt__comm_err(c, DT_EINVAL, "comm: cannot reduce %s with op %d", dt_dtype_name(t), op);
  if (root < 0 || root >= c->size) return dt__comm_err(c, DT_EINVAL, "comm: root %d out of range (size %d)", root, c->size);
  if (count && !s) return dt__comm_err(c, DT_EINVAL, "comm: sendbuf (or buf) is NULL");
  if (count && !r) return dt__comm_err(c, DT_EINVAL, "comm: recvbuf is NULL");
  if (count > (SIZE_MAX / 16) / (size_t)c->size) return dt__comm_err(c, DT_EINVAL, "comm: count %zu too large", count);
  return DT_OK;
}

static int ensure_host_comms(dt_comm *c) {
  if (c->host_built) return DT_OK;
  DT_CHECK(dt_comm_split_host(c, &c->host_comm));
  DT_CHECK(dt_comm_split_leaders(c, &c->leader_comm));
  c->host_built = true;
  return DT_OK;
}

/* Hierarchical allreduce for jobs spread over several hosts: reduce inside
 * each host to its leader (local rank 0, over shm when the host's ranks
 * share memory), allreduce among the leaders (over tcp or mpi across
 * hosts), then broadcast inside each host. Only one rank per host crosses
 * the network, so the slow links carry 2(h-1)/h of the buffer per host
 * instead of per rank. It is a composition of collectives on the cached
 * sub-communicators, not a point-to-point algorithm, so it lives here and
 * not in algo/. Reduction order is fixed (host reduce in rank order, then
 * the leaders' algorithm), so every rank ends with the leader's bits. AVG
 * is reduced as SUM and divided once by the world size on the leaders
 * before the broadcast. */
static int allreduce_hier(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                          dt_redop op) {
  dt_comm *host = c->host_comm, *leaders = c->leader_comm;
  if (!host) return dt__comm_err(c, DT_EINVAL, "hier allreduce: no host communicator");
  dt_redop inner = op == DT_OP_AVG ? DT_OP_SUM : op;
  int hsize = dt_comm_size(host);
  if (hsize > 1) {
    DT_CHECK(dt_comm_reduce(host, sbuf, rbuf, count, t, inner, 0));
  } else if (sbuf != rbuf && count) {
    memcpy(rbuf, sbuf, count * dt_dtype_size(t));
  }
  if (leaders) {
    if (dt_comm_size(leaders) > 1) DT_CHECK(dt_comm_allreduce(leaders, rbuf, rbuf, count, t, inner));
    if (op == DT_OP_AVG) DT_CHECK(dt__reduce_finish(rbuf, count, t, op, dt_comm_size(c)));
  }
  if (hsize > 1) DT_CHECK(dt_comm_broadcast(host, rbuf, count, t, 0));
  return DT_OK;
}

int dt_comm_allreduce_algo(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                           dt_redop op, dt_algo a) {
  DT_CHECK(check_args(c, sbuf, rbuf, count, t, op, 0, true));
  size_t bytes = count * dt_dtype_size(t);
  a = dt__tune_allreduce(c, bytes, a != DT_ALGO_AUTO ? a : c->algo);
  if (a == DT_ALGO_HIER) DT_CHECK(ensure_host_comms(c));
  if (c->size == 1 || count == 0) {
    if (count && sbuf != rbuf) memcpy(rbuf, sbuf, bytes);
    return DT_OK;
  }
  DT_CHECK(dt__coll_begin(c, DT_COLL_ALLREDUCE, op, t, count, 0));
  int rc;
  switch (a) {
  case DT_ALGO_RHD: rc = dt__allreduce_rhd(c, sbuf, rbuf, count, t, op); break;
  case DT_ALGO_TREE: rc = dt__allreduce_tree(c, sbuf, rbuf, count, t, op); break;
  case DT_ALGO_HIER: rc = allreduce_hier(c, sbuf, rbuf, count, t, op); break;
  default: rc = dt__allreduce_ring(c, sbuf, rbuf, count, t, op); break;
  }
  return dt__coll_end(c, rc);
}

int dt_comm_allreduce(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_redop op) {
  return dt_comm_allreduce_algo(c, s, r, count, t, op, DT_ALGO_AUTO);
}

int dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  DT_CHECK(check_args(c, buf, buf, count, t, 0, root, false));
  if (c->size == 1 || count == 0) return DT_OK;
  size_t bytes = count * dt_dtype_size(t);
  DT_CHECK(dt__coll_begin(c, DT_COLL_BROADCAST, 0, t, count, root));
  dt_algo a = dt__tune_broadcast(c, bytes, c->algo);
  int rc = a == DT_ALGO_RING ? dt__broadcast_ring(c, buf, count, t, root)
                             : dt__broadcast_tree(c, buf, bytes, root);
  return dt__coll_end(c, rc);
}

int dt_comm_reduce(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, dt_redop op,
                   int root) {
  /* recvbuf matters on root only (checked below) */
  DT_CHECK(check_args(c, sbuf, rbuf ? rbuf : sbuf, count, t, op, root, true));
  if (c->rank == root && count && !rbuf) return dt__comm_err(c, DT_EINVAL, "comm: reduce: NULL recvbuf on root");
  size_t bytes = count * dt_dtype_size(t);
  if (c->size == 1 || count == 0) {
    if (count && sbuf != rbuf) memcpy(rbuf, sbuf, bytes);
    return DT_OK;
  }
  DT_CHECK(dt__coll_begin(c, DT_COLL_REDUCE, op, t, count, root));
  dt_algo a = dt__tune_broadcast(c, bytes, c->algo);
  int rc = a == DT_ALGO_RING ? dt__reduce_ring(c, sbuf, rbuf, count, t, op, root)
                             : dt__reduce_tree(c, sbuf, rbuf, count, t, op, root);
  return dt__coll_end(c, rc);
}

int dt_comm_allgather(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t) {
  DT_CHECK(check_args(c, sbuf, rbuf, count, t, 0, 0, false));
  size_t bytes = count * dt_dtype_size(t);
  if (c->size == 1 || count == 0) {
    if (count && sbuf != rbuf) memmove(rbuf, sbuf, bytes);
    return DT_OK;
  }
  DT_CHECK(dt__coll_begin(c, DT_COLL_ALLGATHER, 0, t, count, 0));
  dt_algo a = dt__tune_allgather(c, bytes, c->algo);
  int rc = a == DT_ALGO_DIRECT ? dt__allgather_direct(c, sbuf, rbuf, bytes)
                               : dt__allgather_ring(c, sbuf, rbuf, bytes);
  return dt__coll_end(c, rc);
}

int dt_comm_reduce_scatter(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                           dt_redop op) {
  DT_CHECK(check_args(c, sbuf, rbuf, count, t, op, 0, true));
  if (c->size == 1 || count == 0) {
    if (count && sbuf != rbuf) memmove(rbuf, sbuf, count * dt_dtype_size(t));
    return DT_OK;
  }
  DT_CHECK(dt__coll_begin(c, DT_COLL_REDUCE_SCATTER, op, t, count, 0));
  return dt__coll_end(c, dt__reduce_scatter_ring(c, sbuf, rbuf, count, t, op));
}

int dt_comm_alltoall(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t) {
  DT_CHECK(check_args(c, sbuf, rbuf, count, t, 0, 0, false));
  size_t bytes = count * dt_dtype_size(t);
  if (count && sbuf == rbuf) return dt__comm_err(c, DT_EINVAL, "comm: alltoall cannot run in place");
  if (c->size == 1 || count == 0) {
    if (count) memcpy(rbuf, sbuf, bytes);
    return DT_OK;
  }
  DT_CHECK(dt__coll_begin(c, DT_COLL_ALLTOALL, 0, t, count, 0));
  return dt__coll_end(c, dt__alltoall_direct(c, sbuf, rbuf, bytes));
}

int dt_comm_barrier(dt_comm *c) {
  if (!c) return dt__seterr(DT_EINVAL, "comm barrier: communicator c is NULL");
  if (c->size == 1) return DT_OK;
  DT_CHECK(dt__coll_begin(c, DT_COLL_BARRIER, 0, DT_U8, 0, 0));
  return dt__coll_end(c, dt__barrier_dissemination(c));
}

/* ---- split ------------------------------------------------------------- */

int dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
  *out = NULL;
  int32_t mine[2] = {color, key};
  int32_t *all = malloc((size_t)c->size * 2 * sizeof *all);
  if (!all) return dt__comm_err(c, DT_ENOMEM, "comm: out of memory");
  int rc = dt_comm_allgather(c, mine, all, 2, DT_I32);
  uint32_t nsplit = ++c->nsplit;
  if (rc < 0 || color < 0) {
    free(all);
    return rc;
  }
  int n = 0;
  for (int r = 0; r < c->size; r++) n += all[2 * r] == color;
  dt_comm *s = dt__comm_alloc(c->w, n);
  if (!s) {
    free(all);
    return dt__comm_err(c, DT_ENOMEM, "comm: out of memory");
  }
  /* members ordered by (key, parent rank): insertion sort, n is small */
  int m = 0;
  for (int r = 0; r < c->size; r++) {
    if (all[2 * r] != color) continue;
    int j = m++;
    while (j > 0 && all[2 * s->wr[j - 1] + 1] > all[2 * r + 1]) {
      s->wr[j] = s->wr[j - 1];
      j--;
    }
    s->wr[j] = r; /* parent rank for now */
  }
  for (int j = 0; j < n; j++) {
    if (s->wr[j] == c->rank) s->rank = j;
    s->wr[j] = c->wr[s->wr[j]];
  }
  free(all);
  c->w->refs++;
  s->parent = c;
  s->timeout = c->timeout;
  s->algo = c->algo;
  /* context id: same on every member, distinct from the parent's */
  uint64_t h = (uint64_t)c->ctxid * 0x9e3779b97f4a7c15ull ^ ((uint64_t)nsplit << 20) ^ (uint32_t)color;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  s->ctxid = (uint32_t)h ? (uint32_t)h : 2;
  dt__comm_compute_hosts(s);
  *out = s;
  return DT_OK;
}

int dt_comm_split_host(dt_comm *c, dt_comm **out) {
  return dt_comm_split(c, c->host[c->rank], c->rank, out);
}

int dt_comm_split_leaders(dt_comm *c, dt_comm **out) {
  struct dt_comm_topo t;
  dt_comm_topology(c, &t);
  return dt_comm_split(c, t.local_rank == 0 ? 0 : -1, c->rank, out);
}

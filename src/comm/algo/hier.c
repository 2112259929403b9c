/*
 * hier.c — hierarchical allreduce for jobs spread over several hosts:
 * reduce inside each host to its leader (local rank 0, over shm when the
 * host's ranks share memory), allreduce among the leaders (over tcp or mpi
 * across hosts), then broadcast inside each host. Only one rank per host
 * crosses the network, so the slow links carry 2(h-1)/h of the buffer per
 * host instead of per rank.
 *
 * Reduction order is fixed (host reduce in rank order, then the leaders'
 * algorithm), so every rank ends with the leader's bits. AVG is reduced as
 * SUM and divided once by the world size on the leaders before the
 * broadcast. Not here: choosing it (tuning.c) or cross-host algorithm
 * choice (the leaders' allreduce picks its own through tuning).
 */
#include "comm/algo/algo.h"

int dt__allreduce_hier(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                       dt_redop op) {
  dt_comm *host = NULL, *leaders = NULL;
  DT_CHECK(dt__comm_host_comm(c, &host, &leaders));
  if (!host) return dt__seterr(DT_EINVAL, "hier allreduce: no host communicator");
  dt_redop inner = op == DT_OP_AVG ? DT_OP_SUM : op;
  int hsize = dt_comm_size(host);
  if (hsize > 1) {
    DT_CHECK(dt_comm_reduce(host, sbuf, rbuf, count, t, inner, 0));
  } else if (sbuf != rbuf && count) {
    size_t es = dt_dtype_size(t);
    __builtin_memcpy(rbuf, sbuf, count * es);
  }
  if (leaders) {
    if (dt_comm_size(leaders) > 1) DT_CHECK(dt_comm_allreduce(leaders, rbuf, rbuf, count, t, inner));
    if (op == DT_OP_AVG) DT_CHECK(dt__reduce_finish(rbuf, count, t, op, dt_comm_size(c)));
  }
  if (hsize > 1) DT_CHECK(dt_comm_broadcast(host, rbuf, count, t, 0));
  return DT_OK;
}

/*
 * tuning.c — the one place that picks a collective algorithm (NCCL's
 * graph/tuning habit): by message size, world size and host topology,
 * unless the caller or DTRAIN_ALGO forced one. Thresholds are knobs:
 * DTRAIN_TREE_MAX_BYTES (recursive doubling below it, default 32 KiB) and
 * DTRAIN_RING_MIN_BYTES (ring above it, RHD between; default 1 MiB).
 * On one oversubscribed host (more ranks than online cores) a power-of-two
 * world keeps RHD up to DTRAIN_RING_MIN_OVERSUB_BYTES (default 32 MiB):
 * the ring's 2(n-1) lock-step exchanges each wait for a neighbour to get a
 * core, RHD's 2 log2(n) exchanges far fewer times (measured with 4 ranks on
 * 2 cores, shm and tcp: docs/comm.md). Every input is the same on every
 * rank (world size, bytes, topology, one host's core count), so all ranks
 * pick the same algorithm. Across hosts with one rank each and a world
 * that is not a power of two, the ring serves everything above the tree
 * (slow links: RHD's fold doubles one rank's traffic).
 * Not here: the algorithms themselves.
 */
#include "comm/algo/algo.h"

#include <unistd.h>

/* The smallest allreduce that uses the ring (when RHD would serve below). */
static size_t ring_min_bytes(const dt_comm *c, const struct dt_comm_topo *topo) {
  int n = dt_comm_size(c);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (topo->nhosts == 1 && cores > 0 && n > cores && (n & (n - 1)) == 0)
    return (size_t)dt_param(DT_PARAM_RING_MIN_OVERSUB_BYTES);
  return (size_t)dt_param(DT_PARAM_RING_MIN_BYTES);
}

dt_algo dt__tune_allreduce(const dt_comm *c, size_t bytes, dt_algo forced) {
  int n = dt_comm_size(c);
  struct dt_comm_topo topo;
  dt_comm_topology(c, &topo);
  if (forced == DT_ALGO_RING || forced == DT_ALGO_RHD || forced == DT_ALGO_TREE) return forced;
  /* hier needs several hosts with several ranks on some: with one rank per
   * host its leaders' communicator (which inherits a communicator-wide
   * forced algorithm) would be the same shape again, recursing forever */
  if (forced == DT_ALGO_HIER && topo.nhosts > 1 && topo.nhosts < n) return forced;
  /* AUTO (or a forced algorithm that cannot serve allreduce) */
  if (topo.nhosts > 1 && topo.nhosts < n &&
      bytes >= (size_t)dt_param(DT_PARAM_HIER_MIN_BYTES))
    return DT_ALGO_HIER;
  if (bytes <= (size_t)dt_param(DT_PARAM_TREE_MAX_BYTES)) return DT_ALGO_TREE;
  /* One rank per host, a world that is not a power of two: every byte
   * crosses the network, and RHD's fold makes one rank send and receive
   * the whole vector twice (3 ranks: 2x the gradient on rank 0's link,
   * measured 1.88 MB per step for a 0.94 MB gradient) where the ring
   * moves 2(n-1)/n of it on every link, in as many steps for small n. */
  if (n > 2 && topo.nhosts == n && (n & (n - 1)) != 0) return DT_ALGO_RING;
  if (n > 2 && bytes < ring_min_bytes(c, &topo)) return DT_ALGO_RHD;
  return DT_ALGO_RING;
}

dt_algo dt__tune_broadcast(const dt_comm *c, size_t bytes, dt_algo forced) {
  if (forced == DT_ALGO_RING || forced == DT_ALGO_TREE) return forced;
  if (dt_comm_size(c) > 2 && bytes >= (size_t)dt_param(DT_PARAM_RING_MIN_BYTES))
    return DT_ALGO_RING;
  return DT_ALGO_TREE;
}

dt_algo dt__tune_allgather(const dt_comm *c, size_t bytes, dt_algo forced) {
  if (forced == DT_ALGO_RING || forced == DT_ALGO_DIRECT) return forced;
  return bytes * (size_t)dt_comm_size(c) <= 64 * 1024 ? DT_ALGO_DIRECT : DT_ALGO_RING;
}

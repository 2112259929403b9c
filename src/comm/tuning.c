/*
 * tuning.c — the one place that picks a collective algorithm (NCCL's
 * graph/tuning habit): by message size, world size and host topology,
 * unless the caller or DTRAIN_ALGO forced one. Thresholds are knobs:
 * DTRAIN_TREE_MAX_BYTES (recursive doubling below it, default 32 KiB) and
 * DTRAIN_RING_MIN_BYTES (ring above it, RHD between; default 1 MiB).
 * Not here: the algorithms themselves.
 */
#include "comm/algo/algo.h"

dt_algo dt__tune_allreduce(const dt_comm *c, size_t bytes, dt_algo forced) {
  int n = dt_comm_size(c);
  struct dt_comm_topo topo;
  dt_comm_topology(c, &topo);
  if (forced == DT_ALGO_RING || forced == DT_ALGO_RHD || forced == DT_ALGO_TREE) return forced;
  if (forced == DT_ALGO_HIER && topo.nhosts > 1) return forced;
  /* AUTO (or a forced algorithm that cannot serve allreduce) */
  if (topo.nhosts > 1 && topo.nhosts < n &&
      bytes >= (size_t)dt_param_int("DTRAIN_HIER_MIN_BYTES", 64 * 1024))
    return DT_ALGO_HIER;
  if (bytes <= (size_t)dt_param_int("DTRAIN_TREE_MAX_BYTES", 32 * 1024)) return DT_ALGO_TREE;
  if (n > 2 && bytes < (size_t)dt_param_int("DTRAIN_RING_MIN_BYTES", 1 << 20)) return DT_ALGO_RHD;
  return DT_ALGO_RING;
}

dt_algo dt__tune_broadcast(const dt_comm *c, size_t bytes, dt_algo forced) {
  if (forced == DT_ALGO_RING || forced == DT_ALGO_TREE) return forced;
  if (dt_comm_size(c) > 2 && bytes >= (size_t)dt_param_int("DTRAIN_RING_MIN_BYTES", 1 << 20))
    return DT_ALGO_RING;
  return DT_ALGO_TREE;
}

dt_algo dt__tune_allgather(const dt_comm *c, size_t bytes, dt_algo forced) {
  if (forced == DT_ALGO_RING || forced == DT_ALGO_DIRECT) return forced;
  return bytes * (size_t)dt_comm_size(c) <= 64 * 1024 ? DT_ALGO_DIRECT : DT_ALGO_RING;
}

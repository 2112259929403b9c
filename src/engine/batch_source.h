/*
 * batch_source.h — where the training loop's samples come from: per step of
 * an epoch, this worker's share of the global batch, as one or more pieces
 * (each one forward and one backward pass). The loop asks for a step's plan,
 * then for each piece; it never knows how the global batch was cut.
 *
 * Built today (batch_source.c):
 *  - "loader": one worker, the whole global batch as one piece, copied by
 *    the prefetching loader thread (data/data.h) while the previous step
 *    computes;
 *  - "shards": global batches cut from the epoch's global order (a pure
 *    function of seed and epoch), either into one balanced contiguous slice
 *    per worker (micro = 0; slices differ by at most one sample, a worker
 *    may get none of a short last batch), or into fixed micro-shards of
 *    `micro` samples dealt out as contiguous runs of whole micro-shards
 *    (deterministic mode: the pieces do not depend on the worker count);
 *    both cut by per-rank weights instead of equally when the strategy sets
 *    them (dist.balance = dynamic: shares that follow measured speed).
 * Later: pipeline micro-batches, federated client data.
 *
 * A source does not compute or communicate, and owns only its buffers: the
 * data set is borrowed and must outlive it.
 */
#ifndef DT_ENGINE_BATCH_SOURCE_H
#define DT_ENGINE_BATCH_SOURCE_H

#include <stdint.h>

#include "data/data.h"

/* This worker's part of global batch k. */
typedef struct dt_step_plan {
  int64_t k;             /* global batch index within the epoch */
  int n_local;           /* samples this worker trains on (sum over its pieces) */
  int n_global;          /* samples in the global batch */
  int64_t start;         /* its first position in the epoch order: it holds [start, start + n_global) */
  int pieces;            /* this worker's pieces; 0 is allowed (it still takes part) */
  int64_t pieces_global; /* pieces of the global batch over all workers */
  int64_t terms;         /* most pieces one worker trains in an epoch (tally bound) */
} dt_step_plan;

typedef struct dt_batch_source dt_batch_source;

struct dt_batch_source_ops {
  const char *name;
  /* This worker is rank of nranks (before the first epoch of a run).
   * DT_EINVAL if the source cannot serve that many workers. */
  int (*bind)(dt_batch_source *s, int rank, int nranks);
  int64_t (*steps_per_epoch)(const dt_batch_source *s);
  /* Epoch `epoch` (1-based) starts: its global order is computed. */
  int (*epoch_begin)(dt_batch_source *s, int epoch);
  /* Global batch k (0-based, in order) of the current epoch. */
  int (*plan)(dt_batch_source *s, int64_t k, dt_step_plan *plan);
  /* Piece i < plan->pieces of the planned step; b stays valid until the
   * next call. b->sample0 is the piece's first position in the epoch order
   * (dropout masks are keyed by it). b->n = 0 ends the step's pieces early
   * (work stealing: the shared queue ran dry). */
  int (*piece)(dt_batch_source *s, int i, dt_batch *b);
  void (*destroy)(dt_batch_source *s);
};

struct dt_batch_source {
  const struct dt_batch_source_ops *ops;
};

/* The loader source: batch samples per step, a background thread started
 * here (create it before any fork only if the child will not train). */
int dt__source_loader(dt_batch_source **out, const dt_dataset *train, int batch, uint64_t seed,
                      int shuffle);
/* The shards source: micro = 0 balanced slices, micro > 0 micro-shards. */
int dt__source_shards(dt_batch_source **out, const dt_dataset *train, int batch, uint64_t seed,
                      int shuffle, int micro);
/* Shards only: from the next plan on, cut every global batch (or its
 * micro-shards) by these nranks weights (copied; every rank must set the
 * same ones), NULL: equally again. DT_EINVAL for another source. */
int dt__source_set_weights(dt_batch_source *s, const double *weights);
/* Shards with micro-shards only: from the next plan on, this worker's
 * pieces of a step are the micro-shards take(ud) returns (indices within
 * the global batch) until it returns -1; piece() then gives a batch of
 * n = 0, which ends the step's pieces early (plan->pieces is only a bound,
 * plan->n_local 0). take = NULL: the static deal again. */
int dt__source_set_taker(dt_batch_source *s, int64_t (*take)(void *ud), void *ud);
/* NULL is a no-op. */
void dt__source_destroy(dt_batch_source *s);

#endif /* DT_ENGINE_BATCH_SOURCE_H */

/*
 * steal.h — the shared micro-shard queue of deterministic work stealing
 * and its backup tasks (dist.balance = steal; docs/ddp.md "Stragglers").
 *
 * The micro-shards of a step are tickets of one counter in memory every
 * rank maps (parallel/ddp.c puts it in rank 0's part of the fixed-point
 * window). A rank takes tickets until none is left. Then, instead of
 * going straight to the reduction, it looks at the shards other ranks
 * still hold: one held for longer than a few of its own micro-shard times
 * (a worker stopped by its CPU quota, SIGSTOP, swapping) is taken again as
 * a backup task — as MapReduce re-runs its last slow tasks — and every
 * copy that finishes commits it with one compare-and-swap; only the first
 * counts, the other is undone (ddp subtracts its exact fixed-point terms,
 * fixsum.h). Any assignment of micro-shards gives the same int64 sums, so
 * a backup never changes a bit of the result. A rank that sees its shard
 * committed by a backup stops adding it.
 *
 * Not here: computing shards (the engine), the sums (ddp.c). Backups need
 * at most DT_STEAL_CAP micro-shards per step (batch / micro_batch); with
 * more, the queue works without them.
 */
#ifndef DT_PARALLEL_STEAL_H
#define DT_PARALLEL_STEAL_H

#include <stddef.h>
#include <stdint.h>

#define DT_STEAL_CAP 1024

typedef struct dt_steal dt_steal;

typedef struct dt_steal_stats {
  int64_t backups;      /* backup tasks this rank ran */
  int64_t backups_won;  /* of those, the copies that finished first */
  int64_t dropped;      /* this rank's own shards a backup finished first */
  double wait_seconds;  /* time in dt_steal_take waiting for other ranks' shards */
  int64_t left;         /* tickets this rank left to the others at a step's end (no backups) */
} dt_steal_stats;

/* Bytes of shared memory the queue of nranks ranks needs (a multiple of 64). */
size_t dt_steal_bytes(int nranks);
/* A queue over `shared` (dt_steal_bytes(nranks) bytes, zeroed when the
 * window is made, the same memory on every rank). */
int dt_steal_create(dt_steal **out, void *shared, int rank, int nranks);
/* NULL is a no-op. */
void dt_steal_destroy(dt_steal *q);

/* Every rank, at every step (the same sequence everywhere): the step has
 * `shards` micro-shards. */
void dt_steal_begin(dt_steal *q, int64_t shards);
/* The next micro-shard for this rank (its index in the step), a backup of
 * a shard another rank holds (*backup = 1), or -1 when there is nothing
 * left to do. With backups != 0 it waits while the only shards left are
 * held by others for less than the backup threshold; with 0 (a rank under
 * a CPU quota: it is the slow one, and polling would eat its quota) it
 * runs no backups, and leaves the step's last tickets to the others when
 * they would finish them before it finished one (DTRAIN_STEAL_TAIL): -1
 * then too. Call dt_steal_commit after each shard. */
int64_t dt_steal_take(dt_steal *q, int backups, int *backup);
/* The shard this rank took last is computed: 1 when this copy counts, 0
 * when another copy was committed first (the caller undoes its sums). */
int dt_steal_commit(dt_steal *q);
/* Another rank has committed the shard this rank is computing (its own
 * copy will not count): cheap, one atomic load. */
int dt_steal_lost(const dt_steal *q);
/* Micro-shards of this step nobody has taken yet. */
int64_t dt_steal_left(const dt_steal *q);

void dt_steal_get_stats(const dt_steal *q, dt_steal_stats *out);

#endif /* DT_PARALLEL_STEAL_H */

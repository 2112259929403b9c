/*
 * shupd.h — one parameter copy per host, updated in slices (docs/ddp.md
 * "The shared update"). With every rank on one host, the model's
 * parameters and the optimizer's state live once, in rank 0's part of a
 * shared window every rank maps, and each step every rank applies the
 * optimizer only to its slice of them: the slice of every gradient bucket
 * it sums anyway in the window reduction (slices cut by the balance
 * weights, dt_comm_window_set_shares), applied right after its sums are
 * made and before it reports its slice done (dt_comm_window_reduce_apply_f32).
 * When the reduction returns, every slice is updated and every rank reads
 * the same new parameters (or, in pull mode, each rank keeps its own copy
 * and copies the others' slices out of theirs after the reduction, so no
 * forward reads a line another core has just written). So the per-step
 * update is done once per host,
 * not once per rank, and a slow rank's part of it follows its speed. Since
 * the state is indexed like the whole model's, a new cut moves nothing.
 *
 * Not here: the reduction itself (comm/window.c), when to use it (the ddp
 * strategy: dist.balance = dynamic, normal mode, no compression, no
 * elastic membership, DTRAIN_SHUPD), and ranks on several hosts
 * (DT_ENOTSUP).
 */
#ifndef DT_PARALLEL_SHUPD_H
#define DT_PARALLEL_SHUPD_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "nn/nn.h"

typedef struct dt_shupd dt_shupd;

/* Collective over c: a window for the model's parameters and o's state
 * (rank 0's part holds the state), filled from rank 0's o (every rank's
 * must be equal: after the start-up broadcast), and the model pointed at
 * the window's parameters on every rank: with pull 0 one copy every rank
 * shares (rank 0's), with pull 1 a copy per rank in its own part, into
 * which dt_shupd_end copies the slices the others stepped. maxspans: the
 * most slices a rank steps in one step (the ddp's buckets). o keeps its
 * own state buffer (a checkpoint reads the shared state back into it:
 * dt_shupd_state_out). DT_ENOTSUP (the same on every rank) when the ranks
 * cannot share a window. */
int dt_shupd_create(dt_shupd **out, dt_model *m, dt_optim *o, const dt_optim_cfg *cfg,
                    dt_comm *c, int pull, size_t maxspans);
/* Copies the shared parameters into the model's own buffer (and points
 * the model there) and the shared state into o, then unmaps. Not
 * collective: call it when no rank updates any more (after the run, or
 * before a membership change rebuilds everything). NULL is a no-op. */
void dt_shupd_destroy(dt_shupd *u, dt_model *m, dt_optim *o);

/* Start of a step: its learning rate; the step number is o's count + 1. */
void dt_shupd_begin(dt_shupd *u, dt_optim *o, float lr);
/* The window's apply function (ud = u): the optimizer over elements
 * [first, end) of the model, with the summed gradients there in this
 * rank's gradient window g (the model's gradient buffer). */
int dt_shupd_apply(void *ud, size_t first, size_t end);
void dt_shupd_set_grads(dt_shupd *u, const float *g);
/* End of a step, after the reduction returned on this rank: with pull,
 * copies the slices the other ranks stepped out of their copies; counts
 * the step in o and gives it the largest |gradient| over every rank's
 * slice (the engine's divergence check). */
void dt_shupd_end(dt_shupd *u, dt_optim *o);

/* The shared state, read (into o, for a checkpoint) or written (from o,
 * after a checkpoint was imported: the caller makes sure no rank updates
 * meanwhile — rank 0 before its first step does). */
void dt_shupd_state_out(dt_shupd *u, dt_optim *o);
void dt_shupd_state_in(dt_shupd *u, dt_optim *o);

#endif /* DT_PARALLEL_SHUPD_H */

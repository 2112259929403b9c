/*
 * window.h — shared-memory windows: memory each rank allocates and every
 * other rank of the same host maps, so a collective on it needs no message
 * at all. Used for data-parallel gradients (src/parallel/ddp.c): the
 * gradient buffer lives in a window, and an allreduce of a span of it is one
 * pass per rank — rank r sums slice r of the span over every rank's window
 * (each contribution multiplied by its owner's scale, so the averaging pass
 * is fused too) and writes the sum into slice r of every window. Compared
 * with a ring through transport buffers there is no staging copy, no extra
 * scaling pass and no system call on the data path, which is what matters
 * on a 2-core machine where reduction time is compute time.
 *
 * Synchronisation per call: every rank publishes (sequence, span, scale) in
 * its header and bumps `ready`; waits for every peer's `ready` (the span
 * must agree: DT_EMISMATCH otherwise, naming both ranks); reduces its slice;
 * bumps `done`; waits for every peer's `done`. Both bumps carry a
 * CLOCK_MONOTONIC stamp, so every rank knows how long it waited for whom.
 * Waits spin briefly (20 us when the process's cgroup has a CPU quota below
 * the core count, where polling would eat the quota), then sleep on a futex; each has the communicator's deadline (DT_ETIMEDOUT
 * naming the peer), notices a dead peer through its pidfd (DT_EPEERLOST
 * naming the rank) and a peer that gave up (DT_EABORTED with its reason).
 *
 * Not here: other dtypes or operations (f32 scaled sums and int64 sums
 * only, what ddp needs), and
 * ranks on several hosts (dt_comm_window_create returns DT_ENOTSUP; the
 * caller then uses dt_comm_allreduce). Knob: DTRAIN_WINDOW=0 disables
 * windows (must be the same on every rank: the decision is collective).
 */
#ifndef DT_COMM_WINDOW_H
#define DT_COMM_WINDOW_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef struct dt_comm_window dt_comm_window;

/* Collective over c: every rank gets `bytes` (zeroed, 4096-byte aligned) of
 * memory that every other rank maps too. DT_ENOTSUP (same verdict on every
 * rank) when c spans several hosts, some rank reaches a peer over a
 * transport other than shm (or inproc), windows are disabled or a segment
 * cannot be created or mapped; other errors are communication failures. c must
 * outlive the window. */
int dt_comm_window_create(dt_comm *c, size_t bytes, dt_comm_window **out);
/* Unmaps every segment. Not collective; NULL is a no-op. */
void dt_comm_window_destroy(dt_comm_window *w);
/* This rank's memory. */
void *dt_comm_window_base(dt_comm_window *w);
/* Rank q's memory as this rank maps it (shared: e.g. a work counter every
 * rank updates with atomics). */
void *dt_comm_window_peer(dt_comm_window *w, int q);

/* Collective over the window's ranks: the float span [off, off + count*4)
 * of every rank's window becomes sum over ranks q of scale_q * span_q, the
 * same bits on every rank. off must be a multiple of 4; every rank must
 * name the same span (its own scale may differ). Not thread-safe against
 * other calls on the same window. */
int dt_comm_window_allreduce_f32(dt_comm_window *w, size_t off, size_t count, float scale);
/* Collective like dt_comm_window_allreduce_f32 (same span and sequence on
 * every rank, the same synchronisation), but each rank sums only its own
 * nranges element ranges [ranges[2g], ranges[2g+1]) of the span, into its
 * own window alone: a reduce-scatter (ZeRO-1's, src/engine/strategy_zero.c)
 * whose sums have the allreduce's bits (both add the scaled contributions
 * in rank order). One rank's ranges must not overlap another's (a rank
 * writes its sums in place while peers read). */
int dt_comm_window_reduce_local_f32(dt_comm_window *w, size_t off, size_t count, float scale,
                                    const size_t *ranges, int nranges);
/* Called by dt_comm_window_reduce_apply_f32 on this rank's slice: floats
 * [first, end) of its own window (element indices from the window's start)
 * hold the sums. Returns DT_OK or a negative DT_E* (the call then fails
 * and aborts the window). */
typedef int (*dt_window_apply_fn)(void *ud, size_t first, size_t end);
/* Collective like dt_comm_window_allreduce_f32 (the same span, slices cut
 * by the shares, the same sums), but the sums of a rank's slice are left
 * in its own window only, and fn is called on them before the rank
 * reports its slice done; the call returns once every rank's fn has
 * returned. So each rank can apply an update to its slice of memory every
 * rank shares (parallel/shupd.c: one parameter copy, the optimizer step
 * split by speed) and on return every slice is updated. Every rank must
 * use this call, or the allreduce, alike (DT_EMISMATCH naming both). */
int dt_comm_window_reduce_apply_f32(dt_comm_window *w, size_t off, size_t count, float scale,
                                    dt_window_apply_fn fn, void *ud);
/* The same for the int64 span [off, off + count*8): every rank's span
 * becomes the plain sum over ranks (exact: the same bits in any order; the
 * fixed-point gradients of deterministic mode). off must be a multiple of 8. */
int dt_comm_window_allreduce_i64(dt_comm_window *w, size_t off, size_t count);
/* dt_comm_window_allreduce_i64 whose sums go back as floats: the int64
 * span [off, off + count*8) of every rank is summed over ranks; its first
 * nint elements become the int64 sums in place (as there), element i >=
 * nint becomes the float (float)((double)sum * k) at byte foff + 4*(i -
 * nint) of every rank's window (the int64 there keep this rank's own
 * terms). Each rank converts only its own slice, so no rank turns the
 * whole span back (the fixed-point gradients of deterministic mode:
 * dt_fix_to_float's expression, the same bits). k > 0 and not 1 as a
 * float; every rank must pass the same k (DT_EMISMATCH naming both
 * otherwise, also against a rank calling dt_comm_window_allreduce_i64). */
int dt_comm_window_allreduce_i64_f32(dt_comm_window *w, size_t off, size_t count, size_t nint,
                                     size_t foff, double k);

/* The allreduce's slices follow these nranks weights from the next call on
 * (rank q sums about weights[q] / sum of weights of every span, in whole
 * cache lines): a slow rank sums less (dist.balance = dynamic). NULL, or
 * any weight negative or not finite: equal slices. Every rank must set the
 * same weights before the same call (DT_EMISMATCH naming both ranks
 * otherwise); the sums have the same bits whoever computes a slice. Not
 * thread-safe against a call in flight. */
int dt_comm_window_set_shares(dt_comm_window *w, const double *weights);

/* Makes this rank's pending and later window calls fail with DT_EABORTED;
 * peers waiting for this rank fail too, with `why` in their message. Any
 * thread. */
void dt_comm_window_abort(dt_comm_window *w, const char *why);

/* Seconds this rank has spent, over all calls, waiting for peers that
 * joined a call later than it did or finished their slice later — judged
 * by the peers' own CLOCK_MONOTONIC stamps in the shared header, not by
 * this rank's wait: a rank that was itself descheduled (a CPU quota ran
 * out, SIGSTOP) while it waited does not count that as waiting for the
 * others. The straggler measure of docs/ddp.md uses it. */
double dt_comm_window_blocked(const dt_comm_window *w);

/* Bytes this rank read from and wrote into other ranks' windows. */
void dt_comm_window_bytes(const dt_comm_window *w, uint64_t *written, uint64_t *read);

#endif /* DT_COMM_WINDOW_H */

/*
 * ddp.h — data-parallel gradient synchronisation for one model over one
 * communicator: gradient buckets in reverse layer order, each allreduced on
 * a communication thread as soon as backward has produced all of its
 * gradients (so reduction overlaps the backward of earlier layers), the
 * parameter broadcast from rank 0 with a SHA-256 check on every worker, and
 * a check that every worker runs the same configuration.
 *
 * Deterministic mode (dt_ddp_create_det): gradients of fixed micro-shards
 * are summed in fixed point (parallel/fixsum.h) and allreduced as int64, so
 * the reduced gradient has the same bits for any number of workers, any
 * transport and any algorithm; batch-norm running statistics are combined
 * the same way; one worker needs no communicator.
 *
 * It does not own the model or the communicator and does not choose data
 * shards or micro-shards (the engine does). While a step is in flight (between dt_ddp_begin_step and
 * dt_ddp_finish_step) the communicator belongs to the communication thread;
 * outside it the caller may use it.
 *
 * Knobs: the bucket cap (dist.bucket_bytes, default 128 KiB; a single layer
 * larger than the cap is a bucket of its own); DTRAIN_DDP_OVERLAP=0 runs
 * without the thread (every bucket reduced in dt_ddp_finish_step), =1 with
 * it; by default the thread runs unless the gradients are in a shared
 * window on a host with fewer cores than 2 threads per worker (ddp.c says
 * why).
 */
#ifndef DT_PARALLEL_DDP_H
#define DT_PARALLEL_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/window.h"
#include "nn/nn.h"

typedef struct dt_ddp dt_ddp;

/* Time and traffic of the synchronisation so far. */
typedef struct dt_ddp_stats {
  double comm_seconds;    /* communication thread busy in allreduce */
  double exposed_seconds; /* compute thread waiting for it after backward */
  int64_t steps;
  int nbuckets;
  uint64_t window_written, window_read; /* bytes moved through a shared window */
} dt_ddp_stats;

/* Builds buckets of at most bucket_bytes (dist.bucket_bytes; <= 0: 128 KiB)
 * over m's gradient buffer and starts the communication thread. m and c must
 * outlive the handle. */
int dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes);
/* Like dt_ddp_create, but every bucket goes through the transport's
 * allreduce, never a shared window (the pipeline's replica reduction: a
 * window names a peer that exited, which there is often a replica that
 * stopped because its own neighbour stage died, not the lost rank; the
 * transport carries the job's abort reason). */
int dt__ddp_create_nowin(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes);
/* Stops the thread (waits for an in-flight step to drain). NULL is a no-op. */
void dt_ddp_destroy(dt_ddp *d);

/* Starts a step: this worker's gradients are the mean over n_local samples
 * and the global batch has n_global samples; the reduced gradient is the
 * global-batch mean (each bucket is scaled by n_local / n_global, then
 * summed). */
void dt_ddp_begin_step(dt_ddp *d, int n_local, int n_global);
/* The dt_grad_ready_fn to hand to dt_model_backward (ud = the dt_ddp). */
void dt_ddp_grad_ready(void *ud, size_t off, size_t n);
/* Marks every bucket ready at once (a worker with no samples this step has
 * zeroed its gradients and skipped backward). */
void dt_ddp_all_ready(dt_ddp *d);
/* Waits until every bucket is reduced. Returns DT_OK or the first error of
 * the communication thread (message naming the peer, e.g. a lost rank). */
int dt_ddp_finish_step(dt_ddp *d);

/* dist.balance = dynamic: the shared window's reduction slices follow the
 * ranks' speed weights (dt_comm_window_set_shares; NULL: equal), so a slow
 * rank sums less of every bucket. Every rank calls it with the same
 * weights between the same steps. A no-op without a window. */
int dt_ddp_set_shares(dt_ddp *d, const double *weights);
/* The shared update (parallel/shupd.h): from the next bucket on, each
 * rank's slice of a bucket is summed into its own window only and fn(ud,
 * first, end) applied to it inside the reduction
 * (dt_comm_window_reduce_apply_f32), so after dt_ddp_finish_step the
 * model's gradient buffer holds the sums of this rank's slices only. NULL
 * goes back to the allreduce. Every rank alike, between steps. DT_ENOTSUP
 * without a shared window, in deterministic mode or with compression. */
int dt_ddp_set_apply(dt_ddp *d, dt_window_apply_fn fn, void *ud);

void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *out);
/* Seconds this rank has waited, over the run, for ranks that reached a
 * bucket's reduction later (or finished their part later), judged by their
 * own clock stamps in the shared window (dt_comm_window_blocked); -1 when
 * the gradients do not go through a window (then only the local wait is
 * known). */
double dt_ddp_blocked_seconds(const dt_ddp *d);

/* ---- compressed gradients (docs/compress.md) ---------------------------------
 * Like dt_ddp_create, but every bucket goes through the compressor of
 * comm/compress (cz->codec != none; its seed and settings must be the same
 * on every rank): no shared window, the weight matrices of linear and conv
 * layers are what powersgd factors. */
struct dt_compress_cfg;
int dt_ddp_create_compressed(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes,
                             const struct dt_compress_cfg *cz);
/* The optimizer step (0-based) and epoch (0-based) of the next step, for
 * the codecs that depend on them (start step, top-k warm-up, randomness);
 * call before dt_ddp_begin_step. A no-op without compression. */
void dt_ddp_set_step(dt_ddp *d, int64_t step, int epoch);
/* Bytes this rank put into compressed collectives and what dense f32 would
 * have been (both 0 without compression). */
void dt_ddp_compress_bytes(const dt_ddp *d, uint64_t *sent, uint64_t *dense);
/* The compressor of d's buckets (its per-worker state goes into
 * checkpoints), or NULL without compression. */
struct dt_compress *dt_ddp_compressor(dt_ddp *d);

/* ---- deterministic mode ------------------------------------------------------
 * Per step: dt_ddp_begin_step_det; for each of this worker's micro-shards
 * (in order): forward, dt_ddp_det_shard, dt_model_backward with
 * dt_ddp_grad_ready; a worker with none calls dt_ddp_all_ready instead;
 * then dt_ddp_finish_step, after which the gradient buffer holds the
 * reduced gradient and the model's buffers the combined running statistics,
 * bit-identical on every rank. */

/* Like dt_ddp_create; c may be NULL (one worker: nothing is sent). */
int dt_ddp_create_det(dt_ddp **out, dt_model *m, dt_comm *c, int64_t bucket_bytes);
/* The global batch has n_global samples in shards_global micro-shards (over
 * all workers). sum = 0: the gradient is the global-batch mean (sum over
 * samples / n_global); sum = 1: the sum of every micro-shard's mean. Saves
 * the model's buffers: every micro-shard's forward starts from them. */
void dt_ddp_begin_step_det(dt_ddp *d, int64_t n_global, int64_t shards_global, int sum);
/* After the forward of a micro-shard of n samples, before its backward:
 * adds the running statistics that forward produced (weight n) and restores
 * the saved buffers; last > 0 on this worker's last micro-shard of the step
 * (its backward hands buckets to the communication thread), 0 before it,
 * < 0 when the worker cannot know (stealing: every bucket is reduced in
 * dt_ddp_finish_step). The micro-shard's backward writes its gradients to
 * a slot of ddp's (the model's gradient buffer is pointed there:
 * DTRAIN_DET_SLOTS, docs/ddp.md "Cost"); they turn into fixed point
 * together with the other filled slots' later, and the model's own buffer
 * is back in place after dt_ddp_finish_step. */
void dt_ddp_det_shard(dt_ddp *d, int n, int last);
/* dt_ddp_finish_step returns DT_ERANGE on every rank when any rank had a
 * value beyond the fixed-point range (dt_fix_bound) or not finite. */

/* Work stealing (dist.balance = steal): the micro-shards of a step form one
 * queue shared by every rank (parallel/steal.h), in the shared window (so
 * only when every rank is on one host: dt_ddp_steal returns NULL
 * otherwise). Every rank calls dt_steal_begin(shards of the global batch)
 * at the start of every step, then dt_steal_take until it returns -1; for
 * each shard taken, dt_ddp_det_shard(n, -1) and its backward (no overlap:
 * every bucket is reduced in dt_ddp_finish_step), then dt_steal_commit;
 * when that says another copy counted (a backup finished first),
 * dt_ddp_det_drop (its gradients are still in their slot: forgotten). */
struct dt_steal;
struct dt_steal *dt_ddp_steal(dt_ddp *d);
/* Undoes this worker's current micro-shard (begun by dt_ddp_det_shard, its
 * backward over or cut short): subtracts exactly what it added, so the
 * sums are as if it had never been taken. The model's buffers and the
 * gradient buffer must still hold what that shard left there. */
void dt_ddp_det_drop(dt_ddp *d);
/* Deterministic mode makes linear layers' weight gradients itself, from
 * what the model's backward stashed (DTRAIN_DET_FUSE; parallel/fixsum.h
 * dt_fix_add_wgrad), so the gradients come from dt_model_backward. A
 * caller that writes the gradient buffer itself (tests) turns that off
 * first, before the first step. */
void dt__ddp_det_nofuse(dt_ddp *d);
/* The longest micro-shard this ddp will see (dist.micro_batch): the stash
 * keeps that many rows per slot instead of the model's batch. Before the
 * first step; a longer micro-shard later turns the stash off. */
int dt__ddp_det_rows(dt_ddp *d, int rows);

/* Collective: rank 0's parameters (and non-trainable buffers) are copied to
 * every worker, then every worker's SHA-256 of them is compared with rank
 * 0's; a difference is DT_EMISMATCH naming the rank. */
int dt_ddp_broadcast_params(dt_model *m, dt_comm *c);
/* Collective: compares every worker's parameter hash with rank 0's
 * (DT_EMISMATCH naming the first rank that differs). */
int dt_ddp_check_params(dt_model *m, dt_comm *c);

/* What must agree between workers, compared field by field so the error can
 * name the key. */
typedef struct dt_ddp_fingerprint {
  int64_t batch, epochs, train_n, test_n, nparams, workers;
  int64_t deterministic, micro_batch;
  int64_t balance, balance_every;   /* dist.balance (enum), dist.balance_every */
  uint64_t seed;
  uint8_t layers_sha[32], optim_sha[32], config_sha[32];
  uint64_t det_probe; /* deterministic mode: dt_tensor_det_probe(), else 0 */
} dt_ddp_fingerprint;
/* Collective: DT_EMISMATCH naming the first rank (and key) whose fingerprint
 * differs from rank 0's; every rank gets the same verdict. */
int dt_ddp_check_config(dt_comm *c, const dt_ddp_fingerprint *fp);
/* The first difference of fingerprint b from a ("train.batch = 64 on rank 3,
 * 32 on rank 0" with who_b "on rank 3", who_a "on rank 0"; buf holds it
 * when needed), NULL if none. */
const char *dt_ddp_fingerprint_diff(const dt_ddp_fingerprint *a, const dt_ddp_fingerprint *b,
                                    const char *who_b, const char *who_a, char *buf,
                                    size_t cap);

#endif /* DT_PARALLEL_DDP_H */

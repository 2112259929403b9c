/*
 * strategy.h — the contract between the one training loop (train.c) and a
 * distribution strategy: how this worker's gradients become the update of
 * the parameters, how evaluation and epoch numbers are combined over
 * workers, and what a strategy saves in a checkpoint. One const ops table per
 * strategy, like the transports (comm/transport.h); the loop picks a table
 * by name (dt__strategy_find) and never asks which one it holds.
 *
 * docs/DESIGN.md "Strategies" is the prose version: when the loop calls each
 * hook, what it may do, its errors, and how to add a strategy. Built today:
 * "local" (one worker, strategy_local.c), "ddp" (bucketed overlapped
 * allreduce, strategy_ddp.c over parallel/ddp.c), "ddp_det" (fixed
 * micro-shards summed in fixed point, bitwise identical for any worker
 * count, strategy_ddp_det.c).
 *
 * It does not load data, build models or write records: the loop lends a
 * strategy the model, the optimizer and the communicator (dt_strategy) and
 * keeps ownership of all three.
 */
#ifndef DT_ENGINE_STRATEGY_H
#define DT_ENGINE_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "data/data.h"
#include "engine/balance.h"
#include "engine/batch_source.h"
#include "engine/engine.h"
#include "nn/nn.h"
#include "parallel/ddp.h"

/* A loss / accuracy tally: one epoch's training numbers or one evaluation.
 * Strategies with fixed = 1 keep the loss in 2^-32 fixed point (an integer
 * sum: the same bits for any grouping, hence any worker count). */
typedef struct dt_tally {
  int fixed;        /* set by the loop from dt_strategy_ops.fixed_point */
  double loss;      /* sum of loss x samples (fixed = 0) */
  int64_t loss_q;   /* the same in fixed point (fixed = 1) */
  int64_t samples, correct;
  int64_t global;   /* samples of the global batches (train tallies) */
  int bad;          /* fixed = 1: some loss was not finite or beyond the range */
  double seconds;   /* train tallies: this worker's time; after epoch_end the slowest's */
} dt_tally;

/* Adds one forward's mean loss over n samples; terms bounds how many such
 * terms the tally will hold (the fixed-point range depends on it). */
void dt__tally_add(dt_tally *t, float loss, int n, int correct, int64_t terms);
/* The loss sum (loss x samples summed) as a double. */
double dt__tally_sum(const dt_tally *t);
/* Mean loss per sample (NaN when a fixed-point term was bad; 0 if empty). */
double dt__tally_mean(const dt_tally *t);

/* What the loop lends a strategy. The loop fills every field before the
 * first hook and keeps them valid until teardown; impl is the strategy's. */
typedef struct dt_strategy {
  const struct dt_strategy_ops *ops;
  dt_model *model;
  dt_optim *optim;
  dt_comm *comm;                 /* NULL: no communicator (one worker) */
  int rank, nranks;
  const dt_run_cfg *cfg;
  int64_t steps_per_epoch;
  const uint8_t *config_sha;     /* SHA-256 of the run's config text (32 bytes) */
  int64_t train_n, test_n;
  int64_t step;                  /* optimizer steps taken (step_finish counts) */
  const dt_sched_cfg *sched;     /* the run's schedule (base_lr, total_steps filled in) */
  dt_comm *job_comm;             /* the whole job when it holds more than the workers
                                  * (parameter servers); NULL otherwise */
  void *impl;                    /* set by setup, freed by teardown */
  void *grad_ud;                 /* handed to grad_ready (set by setup) */
  dt_batch_source *source;       /* the source open_source made (lent, like the model) */
  /* Per-rank speed and wait (balance.h), set by strategies that measure
   * them, read by the records: the last epoch's and the run's, nperf ranks. */
  const dt_rank_perf *perf_epoch, *perf_run;
  int nperf;
  dt_obs *obs;                   /* metrics, flight recorder, spans (src/obs; may be NULL) */
  /* 1: this worker joins a running elastic job: setup makes no collective
   * call and builds nothing over s->comm; membership_change follows at
   * once and brings the job's state. */
  int joining;
  /* Checkpoint notes (ckpt_run.c), for strategies with rank_state_save:
   * with ckpt_notes set, step_begin sends rank 0's ckpt_note_out along
   * with the step's gradients and step_finish sets ckpt_note_in to rank
   * 0's flag on every rank — how the others learn of a checkpoint only
   * rank 0 decided (a timer, a signal) without a collective of its own. */
  int ckpt_notes, ckpt_note_out, ckpt_note_in;
  /* Set by the loop: 1 when the model's parameters were left uninitialised
   * for the strategy (ops.init_own; no model.init file, no resume): setup
   * initialises the part this rank trains (dt__model_init_range). */
  int params_lazy;
  /* Set by dt_engine_resume with params_lazy: the weights are still in
   * the checkpoint, and whoever would initialise layers [first, last)
   * reads them from it instead (params_load(params_load_ud, ...)), so
   * each stage reads only its own tensors and the process that forks the
   * workers none. NULL otherwise. */
  int (*params_load)(void *ud, dt_model *m, int first, int last);
  void *params_load_ud;
  /* Set by setup of strategies whose ranks hold part of the parameters
   * (pipeline stages): own 1 and the span [own_off, own_off + own_n)
   * this rank holds (own_n 0: a stage without parameters); own 0: all of
   * them. */
  int own;
  size_t own_off, own_n;
  /* Set by run_end of those strategies: SHA-256 of the whole model's
   * parameters made from the parts in order, which the summary reports
   * instead of a hash of this rank's model. */
  int params_hashed;
  uint8_t params_sha[32];
  /* Checkpoints of strategies whose ranks hold parts of the model
   * (pipeline stages). ckpt_root: set by ckpt_run.c on the rank that
   * writes (the checkpoint root, where state_gather may keep a spill
   * file); NULL elsewhere. ckpt_spill: set by state_gather on that rank
   * when the other ranks' parts went to a file instead of its memory:
   * the snapshot reads those ranges from the file (ckpt_state.c). */
  const char *ckpt_root;
  const struct dt_ckpt_spill *ckpt_spill;
  /* Elastic parameter-server jobs (strategy_ps.c, dt__engine_set_rdzv):
   * the job's rendezvous store and communicator config, through which a
   * joiner reaches the servers; rdzv_port 0: none. */
  const char *rdzv_host;
  int rdzv_port;
  const struct dt_comm_config *rdzv_cc;
} dt_strategy;

/* Ranges of the model's parameters (buf 0) or buffers (buf 1), floats
 * [off, off + n), whose bytes are in the spill file fd at byte foff. */
typedef struct dt_ckpt_range {
  int buf;
  size_t off, n;
  uint64_t foff;
} dt_ckpt_range;
typedef struct dt_ckpt_spill {
  int fd, n;
  const dt_ckpt_range *r;
} dt_ckpt_spill;

/* Named blobs of a strategy's state, for checkpoints. put copies len bytes
 * out of data under name; get copies the blob called name into buf (at most
 * cap bytes), sets *len to its full size, and returns DT_ENOENT when there
 * is none. Both return DT_OK or a negative DT_E* with dt_errmsg set.
 * put_file / get_file: the same for a blob of another file of the
 * checkpoint, with an owner of its own in the manifest (a parameter
 * server's shard: "ps-shard-2"); NULL where a checkpoint has no such files. */
typedef struct dt_state_writer {
  int (*put)(void *ud, const char *name, const void *data, size_t len);
  void *ud;
  int (*put_file)(void *ud, const char *file, const char *owner, const char *name,
                  const void *data, size_t len);
  /* put_file of len bytes held in file fd at byte foff (a spill file, see
   * dt_strategy.ckpt_spill): not copied, read when the file is written */
  int (*put_file_fd)(void *ud, const char *file, const char *owner, const char *name, int fd,
                     uint64_t foff, size_t len);
  /* put of len bytes held in file fd at byte foff (as put_file_fd; a
   * ZeRO-1 checkpoint's optimizer state); may be NULL */
  int (*put_fd)(void *ud, const char *name, int fd, uint64_t foff, size_t len);
} dt_state_writer;
typedef struct dt_state_reader {
  int (*get)(void *ud, const char *name, void *buf, size_t cap, size_t *len);
  void *ud;
  int (*get_file)(void *ud, const char *file, const char *name, void *buf, size_t cap,
                  size_t *len);
  /* Bytes [off, off + len) of a blob into buf, nothing else read (a
   * rank's slice of the whole model's optimizer state): file NULL for the
   * strategy's own blobs (as get), else a blob of that file (as
   * get_file); *total gets the blob's size; a range past its end is
   * DT_ECORRUPT. May be NULL (then get / get_file of the whole blob). */
  int (*get_part)(void *ud, const char *file, const char *name, uint64_t off, void *buf,
                  size_t len, size_t *total);
} dt_state_reader;

/* A membership change (elastic training): the new communicator, what
 * became of this worker, and the rank whose state (parameters, buffers,
 * optimizer, step) every member takes: the most advanced one. */
typedef struct dt_membership {
  dt_comm *comm;                 /* the re-formed communicator */
  int rank, nranks;              /* this worker in it */
  int source;                    /* rank whose state everyone copies */
  int have_state;                /* 1: every rank holds the source's parameters and optimizer
                                  * state already (elastic_run.c); only buffers and step
                                  * counts need to move */
} dt_membership;

/* Checkpoint decisions of sharded strategies (state_gather). */
enum { DT__CK_TAKE = 1, DT__CK_PENDING = 2, DT__CK_STOP = 4 };

struct dt_strategy_ops {
  const char *name;
  /* 1: tallies in fixed point (evaluation chunks aligned to train.batch). */
  int fixed_point;
  /* 1: each rank holds a different part of the state (pipeline stages,
   * ZeRO-1 blocks), so rank 0 alone cannot write a checkpoint: state_gather
   * brings it there (without one, checkpoints are off for the strategy).
   * 0: state_export of rank 0 is the whole replicated state. */
  int state_sharded;
  /* 1: the strategy steps optimizers of its own over its share of the
   * parameters (pipeline stages, ZeRO-1 blocks); the engine's optimizer
   * (s->optim) is then made for one float, so no rank holds state for the
   * whole model. */
  int own_optim;
  /* 1: with dist.pipeline_stages > 1 each rank initialises only its own
   * part of the parameters (s->params_lazy), so the process that forks
   * the workers never writes (and they never inherit) the whole model. */
  int init_own;
  /* At dt_engine_create (no communicator yet, may precede a fork): the
   * batch source this strategy trains from. */
  int (*open_source)(const dt_run_cfg *cfg, const dt_dataset *train, dt_batch_source **out);
  /* Start of a run, every rank: check the communicator (or its absence),
   * check that every rank runs the same configuration, make every rank's
   * parameters equal (broadcast from rank 0), allocate s->impl. A failure
   * here is collective: every rank gets an error. */
  int (*setup)(dt_strategy *s);
  /* Before this worker's pieces of a step (plan: see batch_source.h). */
  int (*step_begin)(dt_strategy *s, const dt_step_plan *plan);
  /* Before the forward of each piece, with its batch (may be NULL): fetch
   * what that forward reads (ps: the embedding rows of the batch). An
   * error ends the step as step_finish's would. */
  int (*forward_begin)(dt_strategy *s, const dt_batch *b, int index, int count);
  /* Between the forward and the backward of each piece (may be NULL).
   * Returns 1 when the piece no longer counts on this worker (work
   * stealing: a backup copy of it finished first): the loop skips its
   * backward and its loss; 0 otherwise. */
  int (*backward_begin)(dt_strategy *s, const dt_batch *b, int index, int count);
  /* After the backward of each piece (may be NULL): 1 when the piece
   * counts on this worker, 0 when another copy of it counted first (its
   * loss is then not tallied here). */
  int (*piece_done)(dt_strategy *s);
  /* Runs this worker's pieces of a step itself, adding each forward's loss
   * to *t (dt__tally_add): for strategies whose pieces are not one forward
   * and one backward of the whole model in order (pipeline stages: a
   * schedule of micro-batch forwards and backwards over part of the
   * model). NULL: the loop runs them (forward, backward_begin, backward
   * with grad_ready, one piece after another). */
  int (*run_pieces)(dt_strategy *s, dt_batch_source *src, const dt_step_plan *plan, dt_tally *t);
  /* Handed to dt_model_backward as the grad-ready callback with ud =
   * s->grad_ud (NULL: none). Called on the compute thread, in reverse layer order, with
   * each layer's gradient span as soon as it is final: overlap starts here. */
  dt_grad_ready_fn grad_ready;
  /* After every piece: reduce (or push/pull) the gradients, then apply the
   * optimizer at learning rate lr, and count the step. On return every
   * rank's parameters are equal. An error names the step's peer or value. */
  int (*step_finish)(dt_strategy *s, float lr);
  /* Evaluation, a collective when there is a communicator: prepare the
   * model (e.g. average running statistics) and return this worker's test
   * positions [*lo, *hi) (the loop walks them in chunks of chunk samples
   * starting at *lo). Needs no setup (dt_engine_evaluate may come first). */
  int (*eval_begin)(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi);
  /* Runs the whole evaluation itself (may be NULL): every test sample in
   * chunks of chunk samples, the tally summed over every worker into *t
   * on every rank (a collective). Returns 1 when it cannot (before setup):
   * the loop then evaluates through eval_begin and eval_reduce. For
   * strategies whose ranks hold part of the model (pipeline stages). */
  int (*evaluate)(dt_strategy *s, const dt_dataset *test, int chunk, dt_tally *t);
  /* Sums a tally over every worker in place (an evaluation's). */
  int (*eval_reduce)(dt_strategy *s, dt_tally *t);
  /* End of an epoch: combines the epoch's train tally over workers (sums;
   * seconds becomes the slowest worker's). */
  int (*epoch_end)(dt_strategy *s, int epoch, dt_tally *train);
  /* Checkpoints of a state_sharded strategy, collective over every rank at
   * every step boundary and epoch end (ckpt_run.c): broadcast rank 0's
   * decision *flags (DT__CK_* bits) to every rank, and when it has
   * DT__CK_TAKE bring every owner's state to rank 0, whose state_export
   * then writes each owner's part as a file of its own (put_file). An error
   * names the lost peer as the strategy's other collectives do (zero
   * brings its blocks to rank 0, which writes them as one whole blob).
   * NULL: checkpoints are off for a sharded strategy. */
  int (*state_gather)(dt_strategy *s, int32_t *flags);
  /* Checkpoints: the strategy's state as named blobs ("optim", "step", ...)
   * and back. Import happens after setup and before the first step. */
  int (*state_export)(dt_strategy *s, const dt_state_writer *w);
  int (*state_import)(dt_strategy *s, const dt_state_reader *r);
  /* Checkpoints of state that differs from rank to rank (the compressor's
   * error-feedback residuals, worker momentum): this rank's blob. save
   * with buf NULL sets *len to its size (0: none; the same on every rank);
   * with buf it fills *len bytes. The engine gathers every rank's blob to
   * rank 0 at the checkpoints every rank agrees on (ckpt_run.c) and writes
   * rank r's as worker-r.safetensors (owner "worker-r"). load puts this
   * rank's blob back after state_import; DT_EMISMATCH (saved by another
   * codec or configuration) leaves the state as it was and the engine goes
   * on with a warning. Both NULL: the strategy has none. */
  int (*rank_state_save)(dt_strategy *s, void *buf, size_t *len);
  int (*rank_state_load)(dt_strategy *s, const void *buf, size_t len);
  /* Elastic training: the world changed (a step or an epoch's end was
   * interrupted and will be redone). Collective over m->comm: take the
   * new communicator, copy m->source's state (parameters, buffers,
   * optimizer, step) to every member, rebuild what depended on the old
   * communicator. ddp and ddp_det do; local says DT_ENOTSUP. */
  int (*membership_change)(dt_strategy *s, const dt_membership *m);
  /* End of a successful run, every rank: check that every rank ends with
   * the same parameters, add this worker's communication numbers to *me
   * (the loop filled samples and train_seconds) and gather every worker's
   * into all[nranks] (all[0] = *me without a communicator). */
  int (*run_end)(dt_strategy *s, dt_worker_stats *me, dt_worker_stats *all);
  /* Frees s->impl; NULL is fine (setup failed or never ran). */
  void (*teardown)(dt_strategy *s);
};

extern const struct dt_strategy_ops dt__strategy_local;
extern const struct dt_strategy_ops dt__strategy_ddp;
extern const struct dt_strategy_ops dt__strategy_ddp_det;
extern const struct dt_strategy_ops dt__strategy_pipeline;
extern const struct dt_strategy_ops dt__strategy_pipeline_det;
extern const struct dt_strategy_ops dt__strategy_ps;
extern const struct dt_strategy_ops dt__strategy_zero;

/* The table entry called name, or NULL. */
const struct dt_strategy_ops *dt__strategy_find(const char *name);
/* The strategy a configuration asks for: ps with ps.servers or ps.colocate;
 * pipeline (pipeline_det with
 * dist.deterministic) with dist.pipeline_stages > 1, dist.micro_batches > 1
 * or train.recompute; zero with dist.zero and several workers; ddp_det with
 * dist.deterministic, ddp with more than one worker, local otherwise. */
const char *dt__strategy_for(const dt_run_cfg *cfg);

/* Shared by the strategies built so far: the optimizer state ("optim", its
 * floats; "optim_step", its step count) and the loop's step ("step"). */
int dt__strategy_export_optim(dt_strategy *s, const dt_state_writer *w);
int dt__strategy_import_optim(dt_strategy *s, const dt_state_reader *r);
/* The optimizer state of parameters [off, off + n) of the whole model
 * (slots floats per parameter, slot-major: SGD momentum 1, AdamW 2) into
 * dst (slots * n floats), from a checkpoint of any strategy: the whole
 * model's "optim" blob (local, ddp, ddp_det) or the pipeline stages' files
 * ("pipe.spans" in the state, "optim" in stage-T.safetensors), whatever
 * the stage count that wrote it: the state is per parameter, so any cut
 * of the model reads exactly its own values. */
int dt__import_optim_span(const dt_state_reader *r, size_t total, size_t slots, size_t off,
                          size_t n, float *dst);
int dt__strategy_no_membership(dt_strategy *s, const dt_membership *m);

/* Shared by ddp and ddp_det (strategy_ddp.c): the start-up checks (same
 * configuration everywhere, rank 0's parameters everywhere), the end-of-run
 * parameter check and statistics, and a message naming this rank and the
 * communicator's reason. */
int dt__ddp_startup(dt_strategy *s);
/* The configuration check of dt__ddp_startup alone (pipeline stages, who
 * hold different parameters). */
int dt__ddp_check_cfg(dt_strategy *s);
int dt__ddp_finish(dt_strategy *s, dt_ddp *ddp, uint64_t sent0, uint64_t recv0,
                   dt_worker_stats *me, dt_worker_stats *all);
int dt__ddp_comm_err(dt_strategy *s, int rc, const char *what);
/* Shared by ddp and ddp_det: the balance (balance.h) of a run, its numbers
 * lent to the records through s->perf_*; a step's exchange timed (the
 * wait for later ranks in dt_ddp_finish_step); after the optimizer step the
 * step's measurement closed and dynamic shares re-planned into s->source
 * and into ddp's window slices (dt_ddp_set_shares). */
int dt__ddp_balance_create(dt_strategy *s, dt_balance **out);
int dt__ddp_exchange(dt_strategy *s, dt_ddp *ddp, dt_balance *bal, const dt_step_plan *plan);
int dt__ddp_replan(dt_strategy *s, dt_ddp *ddp, dt_balance *bal);
void dt__ddp_balance_destroy(dt_strategy *s, dt_balance *bal);
/* Shared by ddp and ddp_det: a membership change. Frees *ddp, takes the new
 * communicator, broadcasts the source's state; det: makes a fresh
 * deterministic *ddp (otherwise the caller makes one). ddp NULL (the
 * strategy was not set up): DT_EINVAL after the arguments are checked. */
int dt__ddp_membership(dt_strategy *s, const dt_membership *m, dt_ddp **ddp, int det);
/* Shared by ddp, ps and zero: evaluation of a replicated model. eval_begin
 * averages the non-trainable buffers (batch-norm statistics) over the ranks
 * and gives this rank its contiguous share of the n test samples;
 * eval_reduce sums the loss and the correct count over the ranks. One rank
 * or no communicator: the whole set, nothing to sum. */
int dt__ddp_eval_begin(dt_strategy *s, int64_t n, int chunk, int64_t *lo, int64_t *hi);
int dt__ddp_eval_reduce(dt_strategy *s, dt_tally *t);
/* Shared by ddp, ps and zero at an epoch's end: sums the loss, correct and
 * sample counts over the ranks and takes the slowest rank's seconds. */
int dt__ddp_epoch_reduce(dt_strategy *s, dt_tally *t);

#endif /* DT_ENGINE_STRATEGY_H */

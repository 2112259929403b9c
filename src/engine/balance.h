/*
 * balance.h — stragglers seen and evened out (dist.balance, docs/ddp.md
 * "Stragglers"). Every data-parallel worker times each step from
 * step_begin to the end of its optimizer step and the part of it that it
 * spent waiting in the gradient exchange for ranks that came later; the
 * rest is its busy time ("compute": forward, backward, fetching its pieces,
 * its part of the reduction, the update — and any stall of its own, such
 * as a CPU quota running out, wherever it lands). At the end of every
 * epoch the job gathers each rank's numbers, flags a rank whose busy time
 * per sample is more than dist.straggler_threshold above the median, and
 * rank 0 logs which rank slows the job and by how much.
 *
 * With dist.balance = dynamic the ranks also exchange their measurements
 * every dist.balance_every steps and give each rank a share of the global
 * batch in proportion to its speed (an exponentially forgetting ratio of
 * seconds to samples, so a quota-throttled process that runs and stalls in
 * turns is judged by its average), every share at least one sample; a
 * rank under a CPU quota is planned a margin under its measured speed
 * (dt__balance_margin). The
 * weights are computed on every rank from the same gathered numbers by the
 * same code, so every rank cuts the global batch the same way.
 *
 * It neither reduces gradients nor cuts batches itself: the strategies call
 * it around their steps and hand its weights to the batch source
 * (dt__split_range cuts a batch by weights).
 */
#ifndef DT_ENGINE_BALANCE_H
#define DT_ENGINE_BALANCE_H

#include <stdint.h>

#include "comm/comm.h"
#include "engine/engine.h"

/* One rank's numbers, for events.jsonl (this epoch) and summary.json
 * (the whole run). */
typedef struct dt_rank_perf {
  double sec_per_sample;   /* compute seconds per sample (epoch: measured; run: total) */
  double compute_seconds;  /* forward + backward + data of its pieces */
  double wait_seconds;     /* waiting for the gradient exchange to finish */
  double samples;          /* samples it trained on */
  double share;            /* its mean fraction of the global batch */
  double slower;           /* sec_per_sample / the median's - 1 (0.5 = 50% slower) */
  int straggler;           /* slower > dist.straggler_threshold */
  double backups;          /* steal: backup copies of others' micro-shards it ran */
  double backups_won;      /* of those, the ones that finished first and counted */
  double dropped;          /* its own micro-shards a backup copy finished first */
} dt_rank_perf;

typedef struct dt_balance dt_balance;

/* For rank of nranks under cfg (dist.balance, straggler_threshold,
 * balance_every). */
int dt__balance_create(dt_balance **out, const dt_run_cfg *cfg, int rank, int nranks);
/* NULL is a no-op. */
void dt__balance_destroy(dt_balance *b);

/* A step starts on this worker. */
void dt__balance_step_begin(dt_balance *b);
/* This worker's pieces of the step are computed (n samples of a global
 * batch of g). The test knob DTRAIN_TEST_SLOW_US sleeps here on rank
 * DTRAIN_TEST_SLOW_RANK (n x that many microseconds). */
void dt__balance_computed(dt_balance *b, int n, int g);
/* A piece of n samples is about to be computed (strategies that see pieces
 * call it, so the test knob slows every piece, not only the step's end). */
void dt__balance_piece(dt_balance *b, int n);
/* Work stealing's backup tasks on this worker since the last call (ran,
 * won, own shards dropped), for the epoch's and the run's records. */
void dt__balance_backups(dt_balance *b, double ran, double won, double dropped);
/* Seconds this worker waited in the step's gradient exchange for ranks
 * that came later (dt__ddp_exchange says how that is judged). */
void dt__balance_waited(dt_balance *b, double seconds);
/* The step is over on this worker (after its optimizer step): its busy
 * time is the step's wall time less that wait. */
void dt__balance_step_end(dt_balance *b);

/* After a step's exchange (every rank, step = steps done): in dynamic mode,
 * every dist.balance_every steps, gathers every rank's recent speed and
 * recomputes the weights (a collective; a no-op in between and in static
 * mode). *weights is then the nranks weights to cut batches by (NULL in
 * static mode); *changed says whether they moved. With dist.balance =
 * steal the same weights are computed (the queue deals the micro-shards;
 * the weights cut the shared window's reduction slices). */
int dt__balance_replan(dt_balance *b, dt_comm *c, int64_t step, const double **weights,
                       int *changed);

/* The margin under a CPU quota of q cores (0 < q < 1) for a rank whose
 * measured seconds per sample vary between re-plans with coefficient of
 * variation v, nranks ranks: the fraction of its measured speed its share
 * is planned at, 1 + z(q / (q + nranks - 1)) v with z the normal quantile
 * (logistic approximation), in [0.5, 1]; 1 for v <= 0 (docs/ddp.md "The
 * margin under a quota"). dist.balance = dynamic uses it with
 * DTRAIN_DYNAMIC_QUOTA_PCT=0 (by default the margin is a fixed 80%). */
double dt__balance_margin(double v, double q, int nranks);

/* The margin under a CPU quota moved by the kernel's throttling
 * (DTRAIN_DYNAMIC_MARGIN_MAX above DTRAIN_DYNAMIC_QUOTA_PCT, the default):
 * m after a window of `wall` seconds in which the rank's cgroup was
 * throttled `throttled` seconds (cpu.stat) — up 0.05 per second of wall,
 * down 5 per throttled second, so it settles where the rank is throttled
 * about 1% of the time — kept in [lo, hi]; lo when hi <= lo (docs/ddp.md
 * "The margin under a quota"). */
/* The weights the shared window's reduction slices are cut by, from the
 * weights dt__balance_replan just gave (dynamic mode): those, except that
 * with DTRAIN_DYNAMIC_QUOTA_SLICE (default 1) a rank under a CPU quota
 * below one core gets 0 — it sums no slice (and with the shared update
 * steps none), the ranks without a quota sum its part — as long as some
 * rank has no quota. Otherwise weights itself. Owned by b, valid until the
 * next replan; every rank gets the same numbers. */
const double *dt__balance_slice_weights(dt_balance *b, const double *weights);
/* Its rule on plain numbers: rank r's quota is quota[r * stride] (cores,
 * 0: none). Writes out (nranks) and returns 1 when some rank is under a
 * quota below one core and some is not; 0 (out untouched) otherwise. */
int dt__balance_slice_cut(const double *weights, const double *quota, int stride, int nranks,
                          double *out);

double dt__balance_margin_step(double m, double wall, double throttled, double lo, double hi);

/* Stealing under a CPU quota below one core (dist.balance = steal): before
 * this rank takes a micro-shard from ddp's queue, waits (sleeping in steps
 * of 50 us) while its process has used more CPU than 0.97 x its
 * quota allows since it began pacing — a token bucket at most 4 ms and a
 * fifth of its quota per 100 ms deep — or until the queue is empty. A throttled rank then takes
 * micro-shards only as fast as its quota lets it compute them, and the
 * kernel does not stop it for the rest of a quota period while it holds
 * one. A no-op without a quota (one clock read per second to see). */
struct dt_ddp;
void dt__balance_pace(dt_balance *b, struct dt_ddp *ddp);
/* dist.balance = dynamic under a CPU quota below one core, at the start
 * of each step (after dt__balance_step_begin, so the wait counts in the
 * rank's busy time and its measured speed, hence its share, follows the
 * pace): sleeps in steps of 50 us while the same token bucket is empty.
 * The kernel then rarely stops the rank for the rest of a quota period
 * with the others waiting for it at the reduction. A no-op in other modes,
 * without a quota, or unless DTRAIN_DYNAMIC_PACE=1. */
void dt__balance_step_pace(dt_balance *b);
/* This rank's cgroup allows it less than one core (as last read by
 * dt__balance_pace or a replan; re-read every second). */
int dt__balance_throttled(const dt_balance *b);

/* End of an epoch, every rank (a collective with a communicator): gathers
 * the epoch's numbers, flags stragglers; rank 0 logs the slowest rank when
 * it is one. */
int dt__balance_epoch_end(dt_balance *b, dt_comm *c, int epoch);
/* The last epoch's numbers per rank (*n = nranks) and the run's. */
const dt_rank_perf *dt__balance_epoch_perf(const dt_balance *b, int *n);
const dt_rank_perf *dt__balance_run_perf(const dt_balance *b, int *n);

/* Cuts g samples into nranks contiguous ranges by weights (NULL or any
 * weight not finite and > 0: equal sizes differing by at most one, the
 * first ranges the shorter). With weights and g >= nranks every range has
 * at least one sample and the rest goes by weight (largest remainders,
 * ties to the lower rank). Rank r's range is [*lo, *hi) within [0, g). */
void dt__split_range(const double *weights, int nranks, int64_t g, int r, int64_t *lo,
                     int64_t *hi);

#endif /* DT_ENGINE_BALANCE_H */

/*
 * balance.c — per-rank speed and wait, the straggler flag, and dynamic
 * shares of the global batch (balance.h; docs/ddp.md "Stragglers").
 *
 * A rank's time is its busy time: the step's wall time less what it waited
 * in the exchange for ranks that came later, judged through the shared
 * window by those ranks' own clock stamps (dt__ddp_exchange). Not the time
 * up to the exchange (the first version): under a CPU quota the process is
 * stopped wherever its quota runs out, and for a small model a third of its
 * CPU goes to its part of the reduction, the update and polling the window,
 * so most stalls fell outside "compute" and both ranks looked equally fast.
 * Not thread CPU time against wall time either: that needs the quota's
 * share as well and misses stalls that are no quota (other processes on the
 * core, swapping, SIGSTOP). Busy time counts a stall wherever it lands, and
 * it is exactly what makes the others wait, so shares settle where nobody
 * waits: with w_r = n_r / busy_r and n_r proportional to w_r the fixed
 * point is busy_r equal on every rank.
 *
 * Measuring costs three clock reads per step. Static mode communicates only
 * at the end of an epoch (one small allgather); dynamic mode adds one
 * allgather of five doubles per rank every dist.balance_every steps (and,
 * under a CPU quota, reads the process CPU clock then).
 *
 * The speed estimate is a ratio of exponentially forgetting sums —
 * seconds / samples, both decayed by exp(-T / tau) where T is the slowest
 * rank's wall time of the window and tau DT_BALANCE_TAU seconds — rather than
 * an average of per-window rates: a process under a CPU quota (cgroup
 * cpu.cfs_quota_us) runs at full speed and then stalls for the rest of the
 * quota period, so single windows are either fast or very slow, and only
 * the ratio of sums over several periods gives its true average speed.
 * Every rank runs this on the same gathered numbers, so every rank gets the
 * same weights bit for bit.
 *
 * It does not decide what a step is or cut the pieces (batch_source.c
 * does, with dt__split_range).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "engine/balance.h"
#include "parallel/ddp.h"
#include "parallel/steal.h"

/* Memory of the speed estimate, seconds: several 100 ms CFS quota periods. */
#define DT_BALANCE_TAU 1.0

/* A straggler is a warning rather than a debug line when it is flagged two
 * epochs running and the others waited this long in the epoch (and 10% of
 * their time): one short or noisy epoch on a shared machine flags ranks
 * that do not matter. */
#define DT_BALANCE_WARN_S 0.5

/* Gathered per rank at a replan: window busy seconds, samples, wall, the
 * process's CPU seconds, its cgroup's CPU quota in cores (0: none) and the
 * seconds its cgroup was throttled in the window (cpu.stat). */
#define WIN_FIELDS 6

/* How often a rank re-reads its CPU quota (a process can be moved into a
 * cgroup while it runs), seconds. */
#define DT_BALANCE_QUOTA_S 1.0
/* Pacing (dt__balance_pace): the share of the quota a paced rank uses
 * (dynamic's DTRAIN_DYNAMIC_PACE; steal's, 0.97 since the eleventh session:
 * 1.036x paired on the MLP against 0.9, no more throttled periods — a
 * stealing rank paces only its micro-shards, its other per-step work is
 * what keeps it under the quota), and the bucket's depth in CPU seconds:
 * at most 4 ms and a fifth of what the quota allows per CFS period (q x
 * 100 ms), so that the kernel's own accounting, whose periods are not
 * ours, rarely finds the rank over its quota. */
#define DT_BALANCE_PACE 0.9
#define DT_BALANCE_STEAL_PACE 0.97
#define DT_BALANCE_PACE_DEPTH 0.004
#define DT_BALANCE_CFS_PERIOD 0.1
/* The margin under a quota (quota_margin): the one used until this many
 * windows (forgetting-weighted) have been measured, and that margin. */
#define DT_BALANCE_MARGIN_WINDOWS 3.0
#define DT_BALANCE_MARGIN0 0.8
/* The margin from the kernel's throttling (dt__balance_margin_step): it
 * rises by MARGIN_UP per second of wall time and falls by MARGIN_DOWN per
 * second the cgroup was throttled, so it settles where the rank is
 * throttled MARGIN_UP / MARGIN_DOWN = 1% of the time: a 20 ms stall takes
 * back what 2 s without one gave. */
#define DT_BALANCE_MARGIN_UP 0.05
#define DT_BALANCE_MARGIN_DOWN 5.0

/* Gathered per rank at an epoch end: compute, wait, samples, share sum,
 * steps, backups ran, won, dropped. */
#define EP_FIELDS 8

struct dt_balance {
  int rank, nranks, mode, every;
  double threshold;
  int64_t slow_us;     /* test knob on this rank (0: none) */
  int slept;           /* samples of this step the knob already slept for */
  double t0, t_last;   /* step start; end of the previous replan window */
  double step_wait;    /* this step's wait for later ranks */
  double cpu_last;     /* process CPU seconds at the last replan */
  double quota, quota_next; /* CPU quota in cores (0: none); when to re-read it */
  int pace;            /* dynamic: DTRAIN_DYNAMIC_PACE */
  double quota_use;    /* dynamic: DTRAIN_DYNAMIC_QUOTA_PCT / 100 (0: quota_margin's rule) */
  double margin_max;   /* dynamic: DTRAIN_DYNAMIC_MARGIN_MAX / 100 (<= quota_use: fixed) */
  double thr_last;     /* the cgroup's throttled seconds at the last replan (-1: none) */
  double pace_t, pace_cpu, budget; /* pacing under a quota: the token bucket */
  double pace_rate;    /* the share of its quota a paced rank uses (by mode) */
  /* this rank, since the last replan */
  double win_compute, win_samples, win_wall;
  /* this rank, this epoch */
  double ep_compute, ep_wait, ep_samples, ep_share, ep_steps;
  double ep_backups, ep_won, ep_dropped;
  /* every rank: the forgetting sums and the weights */
  double *sum_sec, *sum_n, *weights;
  /* every rank: forgetting sums of its windows' charged seconds per sample
   * (count, sum, sum of squares; restarted when its quota changes, the
   * quota of the last window) and the margin they give (quota_margin) */
  double *var_w, *var_x, *var_x2, *last_q, *margin;
  /* every rank: the margin under its quota from its throttling
   * (dt__balance_margin_step), between quota_use and margin_max */
  double *fbm;
  double *slice_w;     /* every rank: its weight in the reduction's cut (dt__balance_slice_weights) */
  int quota_slice;     /* dynamic: DTRAIN_DYNAMIC_QUOTA_SLICE */
  double *gather;      /* nranks x max(WIN_FIELDS, EP_FIELDS) */
  dt_rank_perf *epoch, *run;
  double *run_share, *run_steps; /* every rank: share sums and steps, the run */
  int have_weights;
  int last_worst;      /* rank 0: the previous epoch's worst straggler, or -1 */
};

int dt__balance_create(dt_balance **out, const dt_run_cfg *cfg, int rank, int nranks) {
  *out = NULL;
  dt_balance *b = calloc(1, sizeof *b);
  if (!b) return dt__seterr(DT_ENOMEM, "balance: out of memory");
  const size_t n = (size_t)(nranks > 0 ? nranks : 1);
  b->rank = rank;
  b->nranks = (int)n;
  b->mode = cfg->balance;
  b->every = cfg->balance_every > 0 ? cfg->balance_every : 8;
  b->threshold = cfg->straggler_threshold;
  b->pace = (int)dt_param(DT_PARAM_DYNAMIC_PACE);
  b->pace_rate = b->mode == DT_BALANCE_STEAL ? DT_BALANCE_STEAL_PACE : DT_BALANCE_PACE;
  b->quota_use = (double)dt_param(DT_PARAM_DYNAMIC_QUOTA_PCT) / 100.0; /* 0: the rule */
  b->margin_max = (double)dt_param(DT_PARAM_DYNAMIC_MARGIN_MAX) / 100.0;
  b->thr_last = -1;
  b->slow_us = dt_param(DT_PARAM_TEST_SLOW_RANK) == rank ? dt_param(DT_PARAM_TEST_SLOW_US) : 0;
  b->sum_sec = calloc(n, sizeof(double));
  b->sum_n = calloc(n, sizeof(double));
  b->weights = calloc(n, sizeof(double));
  b->var_w = calloc(n, sizeof(double));
  b->var_x = calloc(n, sizeof(double));
  b->var_x2 = calloc(n, sizeof(double));
  b->last_q = calloc(n, sizeof(double));
  b->margin = calloc(n, sizeof(double));
  b->fbm = calloc(n, sizeof(double));
  b->slice_w = calloc(n, sizeof(double));
  b->quota_slice = (int)dt_param(DT_PARAM_DYNAMIC_QUOTA_SLICE);
  b->gather = calloc(n * EP_FIELDS, sizeof(double));
  b->epoch = calloc(n, sizeof(dt_rank_perf));
  b->run = calloc(n, sizeof(dt_rank_perf));
  b->run_share = calloc(n, sizeof(double));
  b->run_steps = calloc(n, sizeof(double));
  if (!b->sum_sec || !b->sum_n || !b->weights || !b->var_w || !b->var_x || !b->var_x2 ||
      !b->last_q || !b->margin || !b->fbm || !b->slice_w || !b->gather || !b->epoch || !b->run || !b->run_share ||
      !b->run_steps) {
    dt__balance_destroy(b);
    return dt__seterr(DT_ENOMEM, "balance: out of memory");
  }
  b->t_last = dt_now();
  b->last_worst = -1;
  *out = b;
  return DT_OK;
}

void dt__balance_destroy(dt_balance *b) {
  if (!b) return;
  free(b->sum_sec);
  free(b->sum_n);
  free(b->weights);
  free(b->var_w);
  free(b->var_x);
  free(b->var_x2);
  free(b->last_q);
  free(b->margin);
  free(b->fbm);
  free(b->slice_w);
  free(b->gather);
  free(b->epoch);
  free(b->run);
  free(b->run_share);
  free(b->run_steps);
  free(b);
}

void dt__balance_step_begin(dt_balance *b) {
  b->t0 = dt_now();
  b->step_wait = 0;
}

static void sleep_us(int64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void dt__balance_piece(dt_balance *b, int n) {
  if (b->slow_us <= 0 || n <= 0) return;
  sleep_us(b->slow_us * n);
  b->slept += n;
}

void dt__balance_computed(dt_balance *b, int n, int g) {
  if (b->slow_us > 0 && n > b->slept) sleep_us(b->slow_us * (n - b->slept));
  b->slept = 0;
  b->win_samples += n;
  b->ep_samples += n;
  b->ep_share += g > 0 ? (double)n / g : 0;
  b->ep_steps += 1;
}

void dt__balance_waited(dt_balance *b, double seconds) { b->step_wait += seconds; }

void dt__balance_backups(dt_balance *b, double ran, double won, double dropped) {
  b->ep_backups += ran;
  b->ep_won += won;
  b->ep_dropped += dropped;
}

void dt__balance_step_end(dt_balance *b) {
  double busy = dt_now() - b->t0 - b->step_wait;
  if (busy < 0) busy = 0;
  b->win_compute += busy;
  b->ep_compute += busy;
  b->ep_wait += b->step_wait;
  b->step_wait = 0;
}

/* Weights from the forgetting sums: speed = samples / seconds. A rank with
 * no measurement yet gets the mean speed of those that have one. */
static void weights_from_sums(dt_balance *b) {
  double mean = 0;
  int have = 0;
  for (int r = 0; r < b->nranks; r++)
    if (b->sum_sec[r] > 0 && b->sum_n[r] > 0) {
      b->weights[r] = b->sum_n[r] / b->sum_sec[r];
      mean += b->weights[r];
      have++;
    } else {
      b->weights[r] = 0;
    }
  mean = have ? mean / have : 1;
  for (int r = 0; r < b->nranks; r++)
    if (!(b->weights[r] > 0)) b->weights[r] = mean;
}

static double cpu_seconds(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The seconds a window's samples are charged on rank r: its busy time, or,
 * under a CPU quota of q cores, its CPU seconds / q when that is more. Busy
 * time alone would settle the shares where every rank's busy time is equal,
 * which for a quota-throttled rank means equal waits on both sides: it runs
 * ahead while it has quota (and waits), then stalls for the rest of the
 * quota period (and the others wait) — a fifth to a third of the time lost
 * on the MLP. Its quota says where the edge is: a rank that may use q of a
 * core does n samples in n x (CPU per sample) / q seconds of wall time on
 * average, whether or not it waited in between, so shares settle where it
 * uses just its quota and never stalls. */
static double charged(const double *g, double m) {
  double busy = g[0], cpu = g[3], q = g[4] * m;
  if (q > 0 && cpu > 0 && cpu / q > busy) return cpu / q;
  return busy;
}

/* The margin under the quota of rank r (q of a core, 0 < q < 1): the
 * fraction of its measured speed its share is planned at (docs/ddp.md
 * "The margin"). A share is planned for the next window from the speed
 * measured so far, but what the rank can do in that window varies: a step
 * much shorter than the 100 ms CFS period (the MLP) makes windows that the
 * kernel throttles and windows it does not, one of several periods (the
 * CNN) averages them out (the spread is measured with the speed's own
 * memory, and afresh when the rank's quota changes: a quota that just
 * began is a new speed, not spread). Planning one sample too many costs
 * every rank c / q of wall time per step (they wait for the throttled rank), one too
 * few costs c / (N - 1) (the others compute it), so the expected loss is
 * least at the quantile p = q / (q + N - 1) of what the rank can do (the
 * newsvendor's critical ratio): with its windows' seconds per sample spread
 * with coefficient of variation v, a margin of 1 + z(p) v (z the normal
 * quantile, here by the logistic approximation ln(p / (1 - p)) / 1.702),
 * kept in [0.5, 1]. Rank 1 of 2 at half a core: p = 1/3, margin 1 - 0.41 v:
 * ~0.85 on the MLP (v ~ 0.37), ~0.98 on the CNN (v ~ 0.05). Only with
 * DTRAIN_DYNAMIC_QUOTA_PCT=0 (the default, 80, fixes the margin: the rule
 * measured 1.04-1.05x on the CNN under load but 0.93x at load 4.5, where
 * its ~0.98 let the kernel throttle the rank in most periods); 0.8 until a
 * few windows are in. Every rank computes it from the same gathered
 * numbers. */
static double quota_margin(const dt_balance *b, int r, double q) {
  if (b->quota_use > 0) return 1.0; /* fixed: in the quota it is charged against */
  double w = b->var_w[r];
  if (!(w >= DT_BALANCE_MARGIN_WINDOWS)) return DT_BALANCE_MARGIN0;
  double mean = b->var_x[r] / w, var = b->var_x2[r] / w - mean * mean;
  return dt__balance_margin(mean > 0 && var > 0 ? sqrt(var) / mean : 0, q, b->nranks);
}

double dt__balance_margin_step(double m, double wall, double throttled, double lo, double hi) {
  if (!(hi > lo)) return lo;
  if (wall > 0) m += DT_BALANCE_MARGIN_UP * wall;
  if (throttled > 0) m -= DT_BALANCE_MARGIN_DOWN * throttled;
  return m < lo ? lo : m > hi ? hi : m;
}

double dt__balance_margin(double v, double q, int nranks) {
  if (!(v > 0) || !(q > 0) || nranks < 2) return 1.0;
  double p = q / (q + nranks - 1);
  double m = 1.0 + log(p / (1.0 - p)) / 1.702 * v;
  return m < 0.5 ? 0.5 : m > 1.0 ? 1.0 : m;
}

int dt__balance_replan(dt_balance *b, dt_comm *c, int64_t step, const double **weights,
                       int *changed) {
  *changed = 0;
  *weights = b->have_weights ? b->weights : NULL;
  /* steal measures too: its weights cut no batch (the queue deals the
   * micro-shards) but the shared window's reduction slices */
  if ((b->mode != DT_BALANCE_DYNAMIC && b->mode != DT_BALANCE_STEAL) || !c || b->nranks < 2 ||
      step % b->every)
    return DT_OK;
  double now = dt_now();
  if (now >= b->quota_next) {
    b->quota = dt_cpu_quota();
    b->quota_next = now + DT_BALANCE_QUOTA_S;
  }
  /* CPU time only matters under a quota (a system call; skipped otherwise) */
  double cpu = b->quota > 0 ? cpu_seconds() : 0;
  /* the quota it is charged against (charged()): with a fixed margin the
   * part of it the shares may fill, and a rank that paces itself
   * (dt__balance_step_pace) uses at most DT_BALANCE_PACE of its quota: that
   * is its edge. quota_margin's rule (DTRAIN_DYNAMIC_QUOTA_PCT=0) is
   * applied to the weights instead. */
  double q = b->quota;
  if (b->mode == DT_BALANCE_DYNAMIC && q > 0 && q < 1.0 && b->pace) q *= DT_BALANCE_PACE;
  /* the kernel's throttling of this rank in the window: what moves its
   * margin (dt__balance_margin_step); read only when the margin moves */
  double thr = 0;
  if (b->mode == DT_BALANCE_DYNAMIC && q > 0 && q < 1.0 && b->quota_use > 0 &&
      b->margin_max > b->quota_use) {
    double t = dt_cpu_throttled();
    if (t >= 0 && b->thr_last >= 0 && t > b->thr_last) thr = t - b->thr_last;
    b->thr_last = t;
  } else {
    b->thr_last = -1;
  }
  double mine[WIN_FIELDS] = {b->win_compute, b->win_samples, now - b->t_last,
                             b->cpu_last > 0 ? cpu - b->cpu_last : 0, q, thr};
  b->cpu_last = cpu;
  int rc = dt_comm_allgather(c, mine, b->gather, WIN_FIELDS, DT_F64);
  if (rc < 0) {
    const char *m = dt_comm_errmsg(c);
    return dt__seterr(rc, "rank %d: balance: speed exchange: %s", b->rank,
                      m && *m ? m : dt_errmsg());
  }
  b->t_last = now;
  b->win_compute = b->win_samples = 0;
  double wall = 0;
  for (int r = 0; r < b->nranks; r++)
    if (b->gather[r * WIN_FIELDS + 2] > wall) wall = b->gather[r * WIN_FIELDS + 2];
  const double keep = exp(-wall / DT_BALANCE_TAU);
  for (int r = 0; r < b->nranks; r++) {
    const double *g = b->gather + r * WIN_FIELDS;
    /* the margin under a quota (DTRAIN_DYNAMIC_QUOTA_PCT): the part of it
     * the shares may fill, fixed or moved by the rank's throttling; with
     * quota_margin's rule (0) applied to the weights instead */
    double m = 1.0;
    if (b->mode == DT_BALANCE_DYNAMIC && g[4] > 0 && g[4] < 1.0 && b->quota_use > 0) {
      if (g[4] != b->last_q[r] || !(b->fbm[r] > 0)) b->fbm[r] = b->quota_use;
      m = b->fbm[r];
      b->fbm[r] = dt__balance_margin_step(m, g[2], g[5], b->quota_use, b->margin_max);
    }
    double sec = charged(g, m);
    b->sum_sec[r] = b->sum_sec[r] * keep + sec;
    b->sum_n[r] = b->sum_n[r] * keep + g[1];
    if (g[1] > 0) { /* the window's seconds per sample, for the margin */
      double x = sec / g[1];
      if (g[4] != b->last_q[r]) /* a new quota: a new speed, not spread */
        b->var_w[r] = b->var_x[r] = b->var_x2[r] = 0;
      b->var_w[r] = b->var_w[r] * keep + 1;
      b->var_x[r] = b->var_x[r] * keep + x;
      b->var_x2[r] = b->var_x2[r] * keep + x * x;
      b->last_q[r] = g[4];
    }
  }
  weights_from_sums(b);
  if (b->mode == DT_BALANCE_DYNAMIC)
    for (int r = 0; r < b->nranks; r++) {
      double qr = b->gather[r * WIN_FIELDS + 4];
      b->margin[r] = qr > 0 && qr < 1.0 ? quota_margin(b, r, qr) : 1.0;
      b->weights[r] *= b->margin[r];
    }
  b->have_weights = 1;
  *weights = b->weights;
  *changed = 1;
  return DT_OK;
}

int dt__balance_slice_cut(const double *weights, const double *quota, int stride, int nranks,
                          double *out) {
  int free_ranks = 0, bound = 0;
  for (int r = 0; r < nranks; r++) {
    double q = quota[r * stride];
    if (q > 0 && q < 1.0) bound++;
    else free_ranks++;
  }
  if (!bound || !free_ranks) return 0;
  for (int r = 0; r < nranks; r++) {
    double q = quota[r * stride];
    out[r] = q > 0 && q < 1.0 ? 0.0 : weights[r];
  }
  return 1;
}

const double *dt__balance_slice_weights(dt_balance *b, const double *weights) {
  if (!weights || b->mode != DT_BALANCE_DYNAMIC || !b->quota_slice || weights != b->weights)
    return weights;
  /* with the quotas gathered at this replan */
  return dt__balance_slice_cut(weights, b->gather + 4, WIN_FIELDS, b->nranks, b->slice_w)
             ? b->slice_w : weights;
}

/* Whether this rank paces itself now (its cgroup allows it less than one
 * core; the quota re-read every second), and the bucket's state refilled
 * up to now. */
static int pace_on(dt_balance *b) {
  double now = dt_now();
  if (now >= b->quota_next) {
    b->quota = dt_cpu_quota();
    b->quota_next = now + DT_BALANCE_QUOTA_S;
  }
  if (!(b->quota > 0 && b->quota < 1.0)) {
    b->pace_t = 0;
    return 0;
  }
  double depth = 0.2 * b->quota * DT_BALANCE_CFS_PERIOD;
  if (depth > DT_BALANCE_PACE_DEPTH) depth = DT_BALANCE_PACE_DEPTH;
  double cpu = cpu_seconds();
  if (b->pace_t == 0) {
    b->budget = depth;
  } else {
    b->budget += b->pace_rate * b->quota * (now - b->pace_t) - (cpu - b->pace_cpu);
    if (b->budget > depth) b->budget = depth;
  }
  b->pace_t = now;
  b->pace_cpu = cpu;
  return 1;
}

/* With a queue (steal): waits 50 us at a time while the bucket is empty
 * and the queue is not. Without one (dynamic, at a step's start): sleeps
 * once for as long as the bucket needs to fill up again, and goes on even
 * if the CPU the process used meanwhile (its other threads, the wake-up)
 * left it short: the debt is paid at the next step. Sleeping until the
 * bucket is full again would never end under a small quota, where every
 * wake-up costs more of the bucket than a millisecond's sleep refills. */
static void pace(dt_balance *b, const struct dt_steal *q) {
  if (!pace_on(b)) return;
  if (!q) {
    if (b->budget >= 0) return;
    double s = -b->budget / (b->pace_rate * b->quota);
    if (s > 0.1) s = 0.1;
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
    pace_on(b);
    return;
  }
  while (b->budget <= 0 && dt_steal_left(q) > 0) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
    pace_on(b);
  }
}

void dt__balance_pace(dt_balance *b, struct dt_ddp *ddp) {
  const struct dt_steal *q = dt_ddp_steal(ddp);
  if (q) pace(b, q);
}

void dt__balance_step_pace(dt_balance *b) {
  if (b->pace && b->mode == DT_BALANCE_DYNAMIC && b->nranks > 1) pace(b, NULL);
}

int dt__balance_throttled(const dt_balance *b) { return b->quota > 0 && b->quota < 1.0; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of the other ranks' seconds per sample (ranks with samples
 * only; 0 if none): with two ranks, the other one's. */
static double median_others(const dt_rank_perf *p, int n, int self, double *v) {
  int m = 0;
  for (int r = 0; r < n; r++)
    if (r != self && p[r].samples > 0) v[m++] = p[r].sec_per_sample;
  if (!m) return 0;
  qsort(v, (size_t)m, sizeof *v, cmp_double);
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

/* Fills sec_per_sample, slower and straggler from the other fields: a rank
 * is compared with the median of the others, so one slow rank among two is
 * measured against the fast one, not against their mean. */
static int flag(dt_rank_perf *p, int n, double threshold) {
  double *v = malloc((size_t)n * sizeof *v);
  if (!v) return dt__seterr(DT_ENOMEM, "balance: out of memory");
  for (int r = 0; r < n; r++)
    p[r].sec_per_sample = p[r].samples > 0 ? p[r].compute_seconds / p[r].samples : 0;
  for (int r = 0; r < n; r++) {
    double med = median_others(p, n, r, v);
    p[r].slower = med > 0 && p[r].samples > 0 ? p[r].sec_per_sample / med - 1 : 0;
    p[r].straggler = n > 1 && p[r].slower > threshold;
  }
  free(v);
  return DT_OK;
}

int dt__balance_epoch_end(dt_balance *b, dt_comm *c, int epoch) {
  double mine[EP_FIELDS] = {b->ep_compute, b->ep_wait,    b->ep_samples, b->ep_share,
                            b->ep_steps,   b->ep_backups, b->ep_won,     b->ep_dropped};
  if (c && b->nranks > 1) {
    int rc = dt_comm_allgather(c, mine, b->gather, EP_FIELDS, DT_F64);
    if (rc < 0) {
      const char *m = dt_comm_errmsg(c);
      return dt__seterr(rc, "rank %d: balance: epoch statistics: %s", b->rank,
                        m && *m ? m : dt_errmsg());
    }
  } else {
    memcpy(b->gather, mine, sizeof mine);
  }
  b->ep_compute = b->ep_wait = b->ep_samples = b->ep_share = b->ep_steps = 0;
  b->ep_backups = b->ep_won = b->ep_dropped = 0;
  for (int r = 0; r < b->nranks; r++) {
    const double *g = b->gather + r * EP_FIELDS;
    dt_rank_perf *e = &b->epoch[r], *t = &b->run[r];
    memset(e, 0, sizeof *e);
    e->compute_seconds = g[0];
    e->wait_seconds = g[1];
    e->samples = g[2];
    e->share = g[4] > 0 ? g[3] / g[4] : 0;
    e->backups = g[5];
    e->backups_won = g[6];
    e->dropped = g[7];
    t->backups += g[5];
    t->backups_won += g[6];
    t->dropped += g[7];
    t->compute_seconds += g[0];
    t->wait_seconds += g[1];
    t->samples += g[2];
    b->run_share[r] += g[3];
    b->run_steps[r] += g[4];
    t->share = b->run_steps[r] > 0 ? b->run_share[r] / b->run_steps[r] : 0;
  }
  DT_CHECK(flag(b->epoch, b->nranks, b->threshold));
  DT_CHECK(flag(b->run, b->nranks, b->threshold));
  if (b->rank != 0 || b->nranks < 2) return DT_OK;
  int worst = -1;
  for (int r = 0; r < b->nranks; r++)
    if (b->epoch[r].straggler && (worst < 0 || b->epoch[r].slower > b->epoch[worst].slower))
      worst = r;
  if (worst < 0) {
    b->last_worst = -1;
    return DT_OK;
  }
  const dt_rank_perf *w = &b->epoch[worst];
  /* the others' mean wait: a warning only when the straggler cost them real
   * time (short or noisy epochs on a shared machine flag ranks that do not
   * matter; those go to the debug log and the records) */
  double wait = 0, busy = 0;
  for (int r = 0; r < b->nranks; r++)
    if (r != worst) {
      wait += b->epoch[r].wait_seconds / (b->nranks - 1);
      busy += (b->epoch[r].wait_seconds + b->epoch[r].compute_seconds) / (b->nranks - 1);
    }
  int costly = wait >= DT_BALANCE_WARN_S && wait >= 0.1 * busy && b->last_worst == worst;
  b->last_worst = worst;
  dt_log(costly ? DT_LOG_WARN : DT_LOG_DEBUG,
         "epoch %d: rank %d is a straggler: %.3g ms per sample, %.0f%% slower than the median "
         "of the others; its share of the batch %.0f%%, the others waited %.2f s each for the "
         "exchange (dist.balance = %s)", epoch, worst, 1e3 * w->sec_per_sample, 100 * w->slower,
         100 * w->share, wait, dt__enum_name(dt__balance_names, b->mode));
  return DT_OK;
}

const dt_rank_perf *dt__balance_epoch_perf(const dt_balance *b, int *n) {
  *n = b->nranks;
  return b->epoch;
}

const dt_rank_perf *dt__balance_run_perf(const dt_balance *b, int *n) {
  *n = b->nranks;
  return b->run;
}

void dt__split_range(const double *weights, int nranks, int64_t g, int r, int64_t *lo,
                     int64_t *hi) {
  const int64_t N = nranks;
  int ok = weights && g >= N;
  double W = 0;
  for (int i = 0; ok && i < nranks; i++) {
    if (!(weights[i] > 0) || !isfinite(weights[i])) ok = 0;
    W += ok ? weights[i] : 0;
  }
  if (!ok || !(W > 0) || !isfinite(W)) {
    *lo = g * r / N;
    *hi = g * (r + 1) / N;
    return;
  }
  /* one sample each, the rest by weight: floors, then the leftover samples
   * one each to the largest remainders (ties: lower rank first) */
  const int64_t rest = g - N;
  int64_t given = 0, start = 0, mine = 0;
  for (int i = 0; i < nranks; i++) given += (int64_t)floor((double)rest * weights[i] / W);
  int64_t left = rest - given; /* 0 <= left < nranks */
  for (int i = 0; i < nranks; i++) {
    double q = (double)rest * weights[i] / W;
    int64_t s = 1 + (int64_t)floor(q);
    double fi = q - floor(q);
    /* rank i's place among the remainders: how many beat it */
    int64_t ahead = 0;
    for (int j = 0; j < nranks && left; j++) {
      double qj = (double)rest * weights[j] / W, fj = qj - floor(qj);
      if (fj > fi || (fj == fi && j < i)) ahead++;
    }
    if (ahead < left) s++;
    if (i < r) start += s;
    if (i == r) mine = s;
  }
  *lo = start;
  *hi = start + mine;
}

/*
 * steal.c — the shared micro-shard queue and its backup tasks (steal.h).
 *
 * Shared layout (every field its own cache line where ranks write it):
 *   ticket            the next ticket; this step's are [base, base + shards)
 *   done              tickets committed so far (over all steps)
 *   per rank q        holding: ticket + 1 of the shard q computes (0: none),
 *                     since: when it took it (CLOCK_MONOTONIC ns)
 *   commit[CAP]       ticket + 1 of the shard whose copy counted, by ticket % CAP
 *   backup[CAP]       ticket + 1 of a shard someone took as a backup
 * Tickets grow over the whole run, so a slot still holding an older
 * step's ticket reads as "not committed": nothing is cleared per step.
 * Tickets are taken by compare-and-swap, never fetch-add: a ticket past
 * the step's end would belong to the next step.
 *
 * A backup is taken only of a shard held for longer than DTRAIN_STEAL_BACKUP
 * times this rank's own mean micro-shard time (forgetting average), at
 * least DT_STEAL_MIN_S: a worker that is merely somewhat slower finishes
 * its shard before anyone would, and is left alone. While the only shards
 * left are held by others below that threshold, the idle rank waits here
 * (spinning briefly, then yielding the core) instead of in the reduction,
 * which it would reach no sooner; the wait is counted. A rank under a CPU
 * quota never waits here (the caller says so): polling would eat the quota
 * of the rank that is slow already.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "parallel/steal.h"

#define DT_STEAL_MIN_S 200e-6
/* spinning before sleeping in the wait for held shards */
#define DT_STEAL_SPIN_S 50e-6
/* a wait in take never lasts longer than this: the reduction has the
 * deadline and the dead-peer checks */
#define DT_STEAL_WAIT_MAX_S 1.0

typedef struct line {
  _Atomic int64_t v;
  char pad[64 - sizeof(int64_t)];
} line;

typedef struct held {
  _Atomic int64_t holding, since;
  _Atomic int64_t mean_ns; /* its forgetting mean shard time (0: none yet) */
  char pad[64 - 3 * sizeof(int64_t)];
} held;

struct dt_steal {
  line *ticket, *done;
  held *rank;               /* nranks */
  _Atomic int64_t *commit;  /* DT_STEAL_CAP */
  _Atomic int64_t *backup;  /* DT_STEAL_CAP */
  int me, nranks;
  int64_t base, shards, next_base;
  int64_t cur;              /* ticket this rank computes, -1: none */
  int cur_backup;
  double factor;            /* DTRAIN_STEAL_BACKUP (0: no backups) */
  int tail;                 /* DTRAIN_STEAL_TAIL: a throttled rank leaves the step's tail */
  int took;                 /* tickets of this step this rank took (not backups) */
  double t_take, mean_s;    /* when cur was taken; forgetting mean shard time */
  dt_steal_stats st;
};

size_t dt_steal_bytes(int nranks) {
  return 2 * sizeof(line) + (size_t)nranks * sizeof(held) +
         2 * DT_STEAL_CAP * sizeof(int64_t);
}

int dt_steal_create(dt_steal **out, void *shared, int rank, int nranks) {
  dt_steal *q = calloc(1, sizeof *q);
  if (!q) return dt__seterr(DT_ENOMEM, "steal: out of memory");
  char *p = shared;
  q->ticket = (line *)p;
  q->done = (line *)(p + sizeof(line));
  q->rank = (held *)(p + 2 * sizeof(line));
  q->commit = (_Atomic int64_t *)(p + 2 * sizeof(line) + (size_t)nranks * sizeof(held));
  q->backup = q->commit + DT_STEAL_CAP;
  q->me = rank;
  q->nranks = nranks;
  q->cur = -1;
  q->factor = (double)dt_param(DT_PARAM_STEAL_BACKUP);
  q->tail = (int)dt_param(DT_PARAM_STEAL_TAIL);
  *out = q;
  return DT_OK;
}

void dt_steal_destroy(dt_steal *q) { free(q); }

void dt_steal_begin(dt_steal *q, int64_t shards) {
  q->base = q->next_base;
  q->shards = shards;
  q->next_base = q->base + shards;
  q->cur = -1;
  q->took = 0;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void hold(dt_steal *q, int64_t t, int backup) {
  q->cur = t;
  q->cur_backup = backup;
  q->t_take = dt_now();
  atomic_store_explicit(&q->rank[q->me].since, now_ns(), memory_order_relaxed);
  atomic_store_explicit(&q->rank[q->me].holding, t + 1, memory_order_release);
}

/* A shard another rank has held past the threshold, claimed as this rank's
 * backup: its ticket, or -1. *busy says whether some shard of the step is
 * still held by another rank with no backup yet (worth waiting for). */
static int64_t claim_backup(dt_steal *q, int *busy) {
  *busy = 0;
  const int64_t end = q->base + q->shards, now = now_ns();
  double th = q->factor * q->mean_s;
  if (th < DT_STEAL_MIN_S) th = DT_STEAL_MIN_S;
  for (int r = 0; r < q->nranks; r++) {
    if (r == q->me) continue;
    int64_t h = atomic_load_explicit(&q->rank[r].holding, memory_order_acquire);
    if (h <= q->base || h > end) continue; /* nothing of this step */
    const int64_t t = h - 1, slot = t % DT_STEAL_CAP;
    if (atomic_load_explicit(&q->commit[slot], memory_order_acquire) == h) continue;
    int64_t b = atomic_load_explicit(&q->backup[slot], memory_order_relaxed);
    if (b == h) continue; /* someone runs a backup already */
    int64_t since = atomic_load_explicit(&q->rank[r].since, memory_order_relaxed);
    if ((double)(now - since) * 1e-9 < th) {
      *busy = 1;
      continue;
    }
    if (atomic_compare_exchange_strong(&q->backup[slot], &b, h)) return t;
  }
  return -1;
}

/* Whether a rank without backups (under a CPU quota) leaves a ticket to
 * the others, with `left` tickets of the step not yet taken: when the
 * tickets left after this one would keep the other ranks busy for less
 * than its own shard time, (left - 1) x their fastest mean shard time /
 * (N - 1) < its own mean. Such a rank's CPU per step is what its quota
 * allows whenever it computes it, so a shard it takes at the step's end
 * (the others idle at the reduction until it is done) is one it could
 * have taken at the next step's start with the bucket it saved. Nothing
 * is left before every rank has a mean shard time. */
static int leave_tail(const dt_steal *q, int64_t left) {
  if (q->mean_s <= 0 || q->nranks < 2) return 0;
  /* its first ticket of a step it takes while there are as many as ranks:
   * a mean made long by one stall (the kernel stopped it mid-shard, a
   * SIGSTOP) is only ever corrected by the shards it computes */
  if (!q->took && left >= q->nranks) return 0;
  int64_t fast = 0;
  for (int r = 0; r < q->nranks; r++) {
    if (r == q->me) continue;
    int64_t m = atomic_load_explicit(&q->rank[r].mean_ns, memory_order_relaxed);
    if (m <= 0) return 0;
    if (!fast || m < fast) fast = m;
  }
  return (double)(left - 1) * (double)fast * 1e-9 < q->mean_s * (double)(q->nranks - 1);
}

int64_t dt_steal_take(dt_steal *q, int backups, int *backup) {
  *backup = 0;
  const int64_t end = q->base + q->shards;
  int64_t cur = atomic_load_explicit(&q->ticket->v, memory_order_relaxed);
  while (cur < end) {
    if (!backups && q->tail && leave_tail(q, end - cur)) {
      q->st.left++;
      return -1;
    }
    if (atomic_compare_exchange_weak(&q->ticket->v, &cur, cur + 1)) {
      q->took++;
      hold(q, cur, 0);
      return cur - q->base;
    }
  }
  if (!backups || q->factor <= 0 || q->shards > DT_STEAL_CAP || q->nranks < 2) return -1;
  const double t0 = dt_now();
  double t = t0;
  int64_t got = -1;
  for (;;) {
    if (atomic_load_explicit(&q->done->v, memory_order_acquire) >= end) break;
    int busy = 0;
    if ((got = claim_backup(q, &busy)) >= 0 || !busy) break;
    if (t - t0 > DT_STEAL_WAIT_MAX_S) break;
    /* yield rather than sleep: a sleep's wake-up comes late on a busy
     * machine, and this rank is due at the reduction the moment the
     * holder commits */
    if (t - t0 > DT_STEAL_SPIN_S) sched_yield();
    t = dt_now();
  }
  q->st.wait_seconds += dt_now() - t0;
  if (got < 0) return -1;
  q->st.backups++;
  *backup = 1;
  hold(q, got, 1);
  return got - q->base;
}

int dt_steal_commit(dt_steal *q) {
  if (q->cur < 0) return 1;
  const int64_t h = q->cur + 1, slot = q->cur % DT_STEAL_CAP;
  int won = 0;
  if (q->shards > DT_STEAL_CAP) {
    won = 1; /* no backups: every ticket has one taker */
  } else {
    int64_t v = atomic_load_explicit(&q->commit[slot], memory_order_acquire);
    while (v != h)
      if (atomic_compare_exchange_weak(&q->commit[slot], &v, h)) {
        won = 1;
        break;
      }
  }
  if (won) atomic_fetch_add_explicit(&q->done->v, 1, memory_order_acq_rel);
  atomic_store_explicit(&q->rank[q->me].holding, 0, memory_order_release);
  if (q->cur_backup) q->st.backups_won += won;
  else q->st.dropped += !won;
  /* this rank's own shard time (a backup's too: the same work) */
  double s = dt_now() - q->t_take;
  q->mean_s = q->mean_s > 0 ? 0.9 * q->mean_s + 0.1 * s : s;
  atomic_store_explicit(&q->rank[q->me].mean_ns, (int64_t)(q->mean_s * 1e9), memory_order_relaxed);
  q->cur = -1;
  return won;
}

int dt_steal_lost(const dt_steal *q) {
  if (q->cur < 0 || q->shards > DT_STEAL_CAP) return 0;
  return atomic_load_explicit(&q->commit[q->cur % DT_STEAL_CAP], memory_order_acquire) ==
         q->cur + 1;
}

int64_t dt_steal_left(const dt_steal *q) {
  int64_t left = q->base + q->shards - atomic_load_explicit(&q->ticket->v, memory_order_relaxed);
  return left > 0 ? left : 0;
}

void dt_steal_get_stats(const dt_steal *q, dt_steal_stats *out) { *out = q->st; }

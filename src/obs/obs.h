/*
 * obs.h — seeing inside a run: the small API every layer calls to count,
 * time and record what it does, and the readers the launcher uses to show
 * it. One `dt_obs` handle per rank holds:
 *
 *   - metrics: counters, gauges and histograms, registered by name on first
 *     use (dt_obs_counter / _gauge / _histogram return a slot pointer to
 *     keep) and updated with one atomic store or add (dt_obs_add / _set /
 *     _observe; a NULL slot is a no-op, so code need not ask whether
 *     observability is on);
 *   - the flight recorder: the last DT_OBS_FR_LEN collective and
 *     point-to-point operations (op, sequence number, bytes, peer, start and
 *     end time, state), written by comm at the start and end of each;
 *   - trace spans (trace.c): Chrome trace events of the last obs.trace_steps
 *     steps, kept in memory and written at the end of the run.
 *
 * Metrics and the flight recorder live in one fixed-layout page per rank
 * (obs_file.h), a file DIR/obs/rank-R mapped shared when the run has an
 * output directory (anonymous memory otherwise). Writers store into it; the
 * launcher of the node maps the same files read-only, so it can serve every
 * rank's metrics on one port (http_mhd.c, expo.c) and name the rank that is
 * behind and the operation it is stuck in (diag.c) even when that rank is
 * stopped or dead and cannot speak for itself.
 *
 * Layering: obs sits right below core (DESIGN.md "Layers") so that comm,
 * parallel, engine and the later layers (ps, resil, pipeline) can all call
 * it; it knows nothing about them. How to add a metric of your own:
 * docs/observability.md "Adding metrics".
 *
 * Threads: registration takes a lock; updates are lock-free (one writer
 * per slot is the common case, concurrent adds are still exact). The
 * flight recorder and the trace take entries from any thread without a
 * lock, a system call, formatting or an allocation.
 */
#ifndef DT_OBS_H
#define DT_OBS_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

typedef struct dt_obs dt_obs;
typedef struct dt_obs_slot dt_obs_metric;

enum dt_obs_type { DT_OBS_COUNTER = 1, DT_OBS_GAUGE = 2, DT_OBS_HISTOGRAM = 3 };

#define DT_OBS_FR_LEN 64          /* flight recorder entries per rank */
#define DT_OBS_MAX_METRICS 96     /* metric slots per rank */
#define DT_OBS_MAX_BOUNDS 15      /* histogram bucket bounds (+Inf is implicit) */
#define DT_OBS_NAME_MAX 64
#define DT_OBS_HELP_MAX 128

/* Opens rank's page. dir: the directory of the rank files (DIR/obs, made if
 * missing; the file DIR/obs/rank-R is created or truncated) or NULL for
 * anonymous memory (nothing is visible outside the process). job and host
 * become the labels of every series (NULL: "dtrain" and gethostname()).
 * DT_EINVAL for a bad rank/size, DT_EIO naming the path. *out is the
 * caller's (dt_obs_close). */
int dt_obs_open(dt_obs **out, const char *dir, int rank, int size, const char *job,
                const char *host);
/* Unmaps the page (the file stays for the launcher and `dtrain report`)
 * and frees the trace. NULL is a no-op. */
void dt_obs_close(dt_obs *o);
int dt_obs_rank(const dt_obs *o);
/* After a membership change (elastic re-forming renumbers the ranks,
 * keeping their order): the page says rank of size from now on, and its
 * file is (also) named dir/rank-R, moved over a lost rank's page or the
 * old name of an earlier member (which it waits, at most 2 s, to have
 * named its own page first). The old name may stay, pointing at this
 * page, until another member takes it; readers serve a file rank-R only
 * when the page in it says rank R. dir NULL: only the labels change.
 * DT_EIO naming the path (the labels changed all the same). */
int dt_obs_rerank(dt_obs *o, const char *dir, int rank, int size);

/* ---- metrics --------------------------------------------------------------- */

/* The slot called name (Prometheus rules: [a-zA-Z_:][a-zA-Z0-9_:]*, units
 * as suffixes: _seconds, _bytes, _total for counters), registered with help
 * on first use; the same slot on later calls. NULL when o is NULL, the name
 * is invalid, registered with another type, or every slot is taken (logged
 * once). Histogram bounds: n (<= DT_OBS_MAX_BOUNDS) increasing upper bounds;
 * NULL uses dt_obs_seconds_bounds. */
dt_obs_metric *dt_obs_counter(dt_obs *o, const char *name, const char *help);
dt_obs_metric *dt_obs_gauge(dt_obs *o, const char *name, const char *help);
dt_obs_metric *dt_obs_histogram(dt_obs *o, const char *name, const char *help,
                                const double *bounds, int n);
/* 100 us .. 10 s, roughly x3 apart: step times, allreduce times. */
extern const double dt_obs_seconds_bounds[DT_OBS_MAX_BOUNDS];

/* counter += v (v >= 0) */
void dt_obs_add(dt_obs_metric *m, double v);
/* gauge = v; for a counter mirrored from a total kept elsewhere (bytes a
 * transport counted), the new total (never smaller than before) */
void dt_obs_set(dt_obs_metric *m, double v);
/* histogram: one observation */
void dt_obs_observe(dt_obs_metric *m, double v);
/* The current value (counter, gauge) or count (histogram); 0 for NULL. */
double dt_obs_value(const dt_obs_metric *m);

/* ---- flight recorder ----------------------------------------------------------- */

/* The stream of shared-memory window allreduces (comm/window.c): their own
 * numbering, shown as "(..., shared window)". Communicators use their
 * context id. */
#define DT_OBS_STREAM_WINDOW 0x57494e00u

enum dt_obs_fr_state { DT_FR_ENTERED = 1, DT_FR_DONE = 2, DT_FR_FAILED = 3 };

/* Records the start of an operation: op ("allreduce", "send", "push", ...,
 * at most 15 characters kept), stream (which numbering seq belongs to: a
 * communicator's context id, a window's), seq, bytes, peer (-1: all).
 * Returns the entry's ticket for dt_obs_fr_end (-1 with o NULL). The note
 * this thread set with dt_obs_fr_note (if any) goes with it and is
 * cleared. */
int64_t dt_obs_fr_begin(dt_obs *o, const char *op, uint32_t stream, uint64_t seq,
                        uint64_t bytes, int peer);
/* The end of the operation of ticket t: done (rc >= 0) or failed (rc). */
void dt_obs_fr_end(dt_obs *o, int64_t t, int rc);
/* A few words about the next operation the calling thread begins on o
 * ("bucket 3"), printed with it in a diagnosis: note is copied (at most 23
 * characters kept); dt_obs_fr_note_n keeps "word n" without formatting
 * anything now (word must outlive the handle). No lock, no allocation. */
void dt_obs_fr_note(dt_obs *o, const char *note);
void dt_obs_fr_note_n(dt_obs *o, const char *word, int64_t n);
/* Marks this rank failed with rc and msg (the first failure is kept). */
void dt_obs_fail(dt_obs *o, int rc, const char *msg);

/* ---- trace spans (trace.c) ------------------------------------------------------ */

/* Starts keeping spans: at most steps x DT_OBS_SPANS_PER_STEP of them, the
 * oldest dropped first. t0_ns is time zero of the trace (dt_now_ns() right
 * after a barrier, so every rank's zero is the same moment). */
#define DT_OBS_SPANS_PER_STEP 32
int dt_obs_trace_start(dt_obs *o, int steps, int64_t t0_ns);
/* Whether spans are kept (cheap: call before taking times). */
int dt_obs_tracing(const dt_obs *o);
/* One complete span [t0, t1) (dt_now_ns times) on thread tid (0: the
 * training thread, 1: the communication thread, ...). name must be a
 * string literal or otherwise outlive the handle. arg: a number shown with
 * the span (bucket index, bytes), or -1 for none. */
void dt_obs_span(dt_obs *o, const char *name, int tid, int64_t t0, int64_t t1, int64_t arg);
/* The end of a timed operation that began at t0_ns (dt_now_ns): observes
 * its seconds in histogram h and, when tracing, keeps the span [t0, now)
 * named span on thread tid with arg. Returns the seconds (also with o and
 * h NULL), so a caller that adds up its own waits needs one line:
 *   int64_t t0 = dt_now_ns(); rc = wait(...);
 *   p->wait_s += dt_obs_lap(p->obs, p->m_wait, "recv", 0, t0, j); */
double dt_obs_lap(dt_obs *o, dt_obs_metric *h, const char *span, int tid, int64_t t0_ns,
                  int64_t arg);
/* Writes the kept spans as a Chrome trace event file (JSON object with
 * traceEvents; pid = rank, tid as given). DT_EIO naming the path. */
int dt_obs_trace_write(dt_obs *o, const char *path);
/* Merges the per-rank files DIR/obs/trace-rank-R.json (R < nranks; missing
 * ones skipped) into path. DT_EIO naming the file. */
int dt_obs_trace_merge(const char *obs_dir, int nranks, const char *path);

#endif /* DT_OBS_H */

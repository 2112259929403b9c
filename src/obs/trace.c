/*
 * trace.c — Chrome trace event files (the JSON object format Perfetto and
 * chrome://tracing open): spans kept in a bounded ring in memory while the
 * run goes, written as complete events ("ph":"X", ts/dur in microseconds,
 * pid = rank, tid = thread) at the end, and the per-rank files merged into
 * one. The ring holds steps x DT_OBS_SPANS_PER_STEP spans; when it is full
 * the oldest go first, and the file holds the spans of the last `steps`
 * "step" spans (and what came after them), so a long run keeps its last
 * steps and the file stays small (docs/observability.md has the sizes). It takes no times
 * itself (callers pass dt_now_ns() pairs), except dt_obs_lap, which ends a
 * timed operation now.
 */
#include "obs/obs_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt_obs_trace_start(dt_obs *o, int steps, int64_t t0_ns) {
  if (!o) return dt__seterr(DT_EINVAL, "obs trace: handle is NULL");
  if (steps < 1) return dt__seterr(DT_EINVAL, "obs.trace_steps = %d: expects at least 1", steps);
  size_t cap = (size_t)steps * DT_OBS_SPANS_PER_STEP;
  struct dt_span *s = malloc(cap * sizeof *s);
  int64_t *st = malloc((size_t)steps * sizeof *st);
  if (!s || !st) {
    free(s);
    free(st);
    return dt__seterr(DT_ENOMEM, "obs trace: cannot keep %zu spans", cap);
  }
  /* touched now, not page by page inside training steps */
  memset(s, 0, cap * sizeof *s);
  memset(st, 0, (size_t)steps * sizeof *st);
  pthread_mutex_lock(&o->mu);
  free(o->spans);
  free(o->step_t0);
  o->spans = s;
  o->step_t0 = st;
  o->steps = (size_t)steps;
  atomic_store(&o->nstep, 0);
  o->span_cap = cap;
  atomic_store(&o->span_next, 0);
  o->t0_ns = t0_ns;
  pthread_mutex_unlock(&o->mu);
  atomic_store(&o->tracing, 1);
  return DT_OK;
}

int dt_obs_tracing(const dt_obs *o) { return o && atomic_load_explicit(&((dt_obs *)o)->tracing, memory_order_relaxed); }

/* No lock: a slot is taken with one atomic add, so a thread preempted
 * while recording (ranks' training and communication threads share the
 * cores) never holds up another. Two writers meet in one slot only if the
 * whole ring (steps x 32 spans) is recorded while one of them writes. */
void dt_obs_span(dt_obs *o, const char *name, int tid, int64_t t0, int64_t t1, int64_t arg) {
  if (!dt_obs_tracing(o)) return;
  uint64_t k = atomic_fetch_add_explicit(&o->span_next, 1, memory_order_relaxed);
  o->spans[k % o->span_cap] = (struct dt_span){name, t0, t1 < t0 ? t0 : t1, arg, tid};
  /* the training thread's "step" spans mark the steps the file keeps */
  if (tid == 0 && !strcmp(name, "step")) {
    uint64_t n = atomic_fetch_add_explicit(&o->nstep, 1, memory_order_relaxed);
    o->step_t0[n % o->steps] = t0;
  }
}

double dt_obs_lap(dt_obs *o, dt_obs_metric *h, const char *span, int tid, int64_t t0_ns,
                  int64_t arg) {
  int64_t t1 = dt_now_ns();
  double s = (double)(t1 - t0_ns) / 1e9;
  dt_obs_observe(h, s);
  if (dt_obs_tracing(o)) dt_obs_span(o, span, tid, t0_ns, t1, arg);
  return s;
}

void dt__obs_trace_free(dt_obs *o) {
  atomic_store(&o->tracing, 0);
  free(o->spans);
  free(o->step_t0);
  o->spans = NULL;
  o->step_t0 = NULL;
  o->span_cap = 0;
  atomic_store(&o->span_next, 0);
  atomic_store(&o->nstep, 0);
}

/* Names are literals of our own code; still, nothing but safe characters
 * reaches the JSON. */
static void put_name(FILE *f, const char *s) {
  for (; *s; s++) fputc(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20 ? '_' : *s, f);
}

/* Writes the events of o (no surrounding brackets); *first says whether a
 * comma is due. */
static void write_events(dt_obs *o, FILE *f, int *first) {
  int rank = o->pg->rank;
  fprintf(f, "%s\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"name\":\"rank %d\"}}", *first ? "" : ",", rank, rank);
  *first = 0;
  fprintf(f, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"sort_index\":%d}}", rank, rank);
  static const char *const tname[] = {"train", "comm"};
  for (int t = 0; t < 2; t++)
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"%s\"}}", rank, t, tname[t]);
  /* only spans from the start of the oldest of the last `steps` steps on */
  uint64_t nstep = atomic_load(&o->nstep), next = atomic_load(&o->span_next);
  int64_t cut = nstep >= o->steps ? o->step_t0[nstep % o->steps] : INT64_MIN;
  /* the ring: the oldest kept span is the slot after the newest once full */
  size_t n = next < o->span_cap ? (size_t)next : o->span_cap,
         head = next < o->span_cap ? 0 : (size_t)(next % o->span_cap);
  for (size_t k = 0; k < n; k++) {
    const struct dt_span *s = &o->spans[(head + k) % o->span_cap];
    if (s->t0 < cut) continue;
    double ts = (double)(s->t0 - o->t0_ns) / 1e3, dur = (double)(s->t1 - s->t0) / 1e3;
    fputs(",\n{\"name\":\"", f);
    put_name(f, s->name);
    fprintf(f, "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", ts, dur, rank,
            s->tid);
    if (s->arg >= 0) fprintf(f, ",\"args\":{\"n\":%lld}", (long long)s->arg);
    fputc('}', f);
  }
}

int dt_obs_trace_write(dt_obs *o, const char *path) {
  if (!o || !path) return dt__seterr(DT_EINVAL, "obs trace: %s is NULL", o ? "path" : "handle");
  FILE *f = fopen(path, "w");
  if (!f) return dt__seterr(DT_EIO, "trace %s: %s", path, strerror(errno));
  int first = 1;
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f);
  pthread_mutex_lock(&o->mu);
  if (o->spans) write_events(o, f, &first);
  pthread_mutex_unlock(&o->mu);
  fputs("\n]}\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) return dt__seterr(DT_EIO, "trace %s: write failed", path);
  return DT_OK;
}

/* Copies the events of one per-rank file (between the first '[' and the
 * last ']') into out. Files are our own, written whole at a run's end. */
static int copy_events(const char *path, FILE *out, int *first) {
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT ? DT_ENOENT : dt__seterr(DT_EIO, "trace %s: %s", path, strerror(errno));
  if (fseek(f, 0, SEEK_END) < 0) {
    fclose(f);
    return dt__seterr(DT_EIO, "trace %s: cannot seek", path);
  }
  long n = ftell(f);
  rewind(f);
  char *buf = n > 0 ? malloc((size_t)n + 1) : NULL;
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return dt__seterr(DT_EIO, "trace %s: cannot read", path);
  }
  fclose(f);
  buf[n] = '\0';
  char *a = strchr(buf, '['), *b = strrchr(buf, ']');
  if (!a || !b || b < a) {
    free(buf);
    return dt__seterr(DT_ECORRUPT, "trace %s: no event array", path);
  }
  a++;
  while (a < b && (*a == '\n' || *a == ' ')) a++;
  if (a < b) {
    if (!*first) fputc(',', out);
    fputc('\n', out);
    fwrite(a, 1, (size_t)(b - a), out);
    *first = 0;
  }
  free(buf);
  return DT_OK;
}

int dt_obs_trace_merge(const char *obs_dir, int nranks, const char *path) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) return dt__seterr(DT_EIO, "trace %s: %s", tmp, strerror(errno));
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", out);
  int first = 1, rc = DT_OK, found = 0;
  for (int r = 0; r < nranks && rc >= 0; r++) {
    char p[4200];
    snprintf(p, sizeof p, "%s/trace-rank-%d.json", obs_dir, r);
    int x = copy_events(p, out, &first);
    if (x == DT_OK) found++;
    else if (x != DT_ENOENT) rc = x;
  }
  fputs("\n]}\n", out);
  int bad = ferror(out);
  if (fclose(out) != 0 || bad) rc = rc < 0 ? rc : dt__seterr(DT_EIO, "trace %s: write failed", tmp);
  if (rc >= 0 && !found) rc = dt__seterr(DT_ENOENT, "trace: no per-rank trace in %s", obs_dir);
  if (rc >= 0 && rename(tmp, path) < 0) rc = dt__seterr(DT_EIO, "trace %s: %s", path, strerror(errno));
  if (rc < 0) remove(tmp);
  return rc;
}

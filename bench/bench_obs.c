/*
 * bench_obs.c — the CPU cost of what the training loop records per step
 * with metrics and tracing on (engine/observe.c, train.c, parallel/ddp.c):
 * one step-time observation, two counter adds, five gauge sets, six spans
 * with their clock reads, and per gradient bucket a flight-recorder entry,
 * a note, an allreduce observation and a span. Prints ns per step (the
 * best of 5 runs of 200k steps), to set against a step's time. Built by
 * `make bench` (bench/obs.sh runs it).
 */
#include <stdio.h>
#include <string.h>

#include "obs/obs.h"

int main(int argc, char **argv) {
  dt_obs *o;
  int trace = !(argc > 1 && !strcmp(argv[1], "--no-trace")); /* metrics + recorder only */
  if (dt_obs_open(&o, NULL, 0, 2, "bench", "h") < 0 || (trace && dt_obs_trace_start(o, 1000, 0) < 0))
    return 1;
  dt_obs_metric *h = dt_obs_histogram(o, "s_seconds", "", NULL, 0),
                *ar = dt_obs_histogram(o, "a_seconds", "", NULL, 0),
                *c1 = dt_obs_counter(o, "a_total", ""), *c2 = dt_obs_counter(o, "b_total", ""),
                *g[5];
  for (int i = 0; i < 5; i++) {
    char n[16];
    snprintf(n, sizeof n, "g%d", i);
    g[i] = dt_obs_gauge(o, n, "");
  }
  const int steps = 200000, buckets = 2;
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    int64_t t0 = dt_now_ns();
    for (int s = 0; s < steps; s++) {
      int64_t a = dt_now_ns(), b;
      for (int k = 0; k < 4; k++) b = dt_now_ns(), dt_obs_span(o, "x", 0, a, b, -1), a = b;
      for (int k = 0; k < buckets; k++) {
        dt_obs_fr_note_n(o, "bucket", k);
        int64_t q = dt_now_ns(), t = dt_obs_fr_begin(o, "allreduce", 1, (uint64_t)s, 4096, -1);
        dt_obs_fr_end(o, t, 0);
        int64_t r = dt_now_ns();
        dt_obs_observe(ar, (double)(r - q) / 1e9);
        dt_obs_span(o, "allreduce", 1, q, r, k);
      }
      b = dt_now_ns();
      dt_obs_span(o, "reduce+update", 0, a, b, -1);
      dt_obs_span(o, "step", 0, a, b, s);
      dt_obs_observe(h, 4e-4);
      dt_obs_add(c1, 32);
      dt_obs_add(c2, 1);
      for (int i = 0; i < 5; i++) dt_obs_set(g[i], s);
    }
    double ns = (double)(dt_now_ns() - t0) / steps;
    if (ns < best) best = ns;
  }
  printf("obs cost per step (metrics + recorder%s, %d buckets): %.0f ns (best of 5 x %d steps)\n",
         trace ? " + trace" : "", buckets, best, steps);
  dt_obs_close(o);
  return 0;
}

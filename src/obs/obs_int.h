/*
 * obs_int.h — private to src/obs: the handle's fields, shared by obs.c
 * (page, metrics, flight recorder) and trace.c (spans).
 */
#ifndef DT_OBS_INT_H
#define DT_OBS_INT_H

#include <pthread.h>

#include "obs/obs_file.h"

struct dt_span {
  const char *name;
  int64_t t0, t1, arg;
  int tid;
};

struct dt_obs {
  struct dt_obs_page *pg;
  size_t len;
  int fd;               /* the page's file (-1: anonymous), kept to name it anew (dt_obs_rerank) */
  pthread_mutex_t mu;   /* registration; replacing or writing out the span ring */
  int full_warned;
  /* trace.c */
  struct dt_span *spans;
  size_t span_cap;      /* ring of spans; span_next % span_cap is the next slot */
  _Atomic uint64_t span_next; /* spans recorded so far (taken without a lock) */
  int64_t *step_t0;     /* ring of the last `steps` "step" span starts */
  size_t steps;
  _Atomic uint64_t nstep;
  int64_t t0_ns;
  _Atomic int tracing;
};

void dt__obs_trace_free(dt_obs *o);

#endif /* DT_OBS_INT_H */

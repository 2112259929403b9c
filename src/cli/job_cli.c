/*
 * job_cli.c — how the commands that run a job (train, launch, bench) show
 * it: the job's lines go to stdout (facts such as the worker pids) or to
 * stderr with the "dtrain: " prefix (warnings, failures as they happen),
 * and dt_job_run's result becomes the exit status. Also how a loss is
 * printed (NaN and inf spelled the same on every libc).
 *
 * It does not start anything; src/launch does.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>

#include "cli/cli.h"
#include "core/core.h"

void dt__cli_job_notify(void *ud, int level, const char *line) {
  (void)ud;
  if (level == DT_JOB_INFO) {
    printf("%s\n", line);
    fflush(stdout);
  } else {
    fprintf(stderr, "dtrain: %s\n", line);
    fflush(stderr);
  }
}

int dt__cli_job_status(const dt_job *job, int rc) {
  if (rc == DT_OK) return DT_EXIT_OK;
  int sig = dt_job_signal(job);
  if (sig) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    return 128 + sig;
  }
  int f = dt_job_failed_worker(job);
  struct dt_job_status st;
  if (f >= 0 && dt_job_worker_status(job, f, &st) == DT_OK)
    return st.exited && st.code == DT_EXIT_USAGE ? DT_EXIT_USAGE : DT_EXIT_FAIL;
  fprintf(stderr, "dtrain: %s\n", dt_errmsg());
  return DT_EXIT_FAIL;
}

void dt__cli_fmt_loss(double x, char *buf, size_t cap) {
  if (isnan(x)) snprintf(buf, cap, "NaN");
  else if (isinf(x)) snprintf(buf, cap, "%s", x > 0 ? "inf" : "-inf");
  else snprintf(buf, cap, "%.4f", x);
}

/*
 * obs_cli.c — the launcher's side of observability for `dtrain train` and
 * `dtrain launch`: before the workers start it clears the previous run's
 * rank pages (DIR/obs), while they run it serves every local rank's
 * metrics on obs.metrics (one port per node) and, when a worker fails or
 * SIGUSR1 arrives, reads every rank's flight recorder and prints the hang
 * diagnosis naming the rank that is behind (DIR/diagnosis.txt, with each
 * rank's recorder in DIR/obs/flight.txt); after the job it merges the
 * per-rank traces into DIR/trace.json. The work itself is src/obs; this
 * file decides when and prints.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/core.h"
#include "obs/obs_diag.h"

static volatile sig_atomic_t usr1_seen;
static void on_usr1(int sig) {
  (void)sig;
  usr1_seen = 1;
}

/* Removes an earlier run's files of ranks r0..r0+n-1 (several processes
 * of one job may share DIR under mpirun: each clears only its own). */
static void clear_obs_dir(const char *dir, int r0, int n) {
  static const char *const pat[] = {"%s/rank-%d", "%s/trace-rank-%d.json", "%s/flight-rank-%d.txt"};
  for (int r = r0; r < r0 + n; r++)
    for (int i = 0; i < 3; i++) {
      char p[DT_CFG_PATH_MAX + 64];
      snprintf(p, sizeof p, pat[i], dir, r);
      unlink(p);
    }
}

int dt__cli_obs_begin(struct dt__cli_obs *co, const char *out, int r0, int n, const char *metrics,
                      int trace) {
  memset(co, 0, sizeof *co);
  snprintf(co->dir, sizeof co->dir, "%s/obs", out);
  snprintf(co->out, sizeof co->out, "%s", out);
  co->r0 = r0;
  co->n = n;
  co->trace = trace;
  snprintf(co->metrics, sizeof co->metrics, "%s", metrics ? metrics : "");
  clear_obs_dir(co->dir, r0, n);
  if (r0 == 0) {
    char p[DT_CFG_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/diagnosis.txt", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/trace.json", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/obs/flight.txt", out);
    unlink(p);
  }
  usr1_seen = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &co->old_usr1);
  co->have_old = 1;
  return DT_OK;
}

/* Diagnoses now; prints the line and writes the files. why: what asked. */
static void diagnose(struct dt__cli_obs *co, const char *why) {
  char msg[2048], p[DT_CFG_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/flight.txt", co->dir);
  FILE *dump = fopen(p, "w");
  int rc = dt_obs_diagnose(co->dir, co->r0, co->n, dt_now_ns(), msg, sizeof msg, dump);
  if (dump) fclose(dump);
  if (rc < 0) {
    fprintf(stderr, "dtrain: hang diagnosis failed: %s\n", dt_errmsg());
    return;
  }
  if (rc == 0 && strcmp(why, "SIGUSR1")) return; /* a failure that is no hang */
  fprintf(stderr, "dtrain: hang diagnosis (%s): %s (every rank's last operations: %s)\n", why, msg,
          p);
  fflush(stderr);
  snprintf(p, sizeof p, "%s/diagnosis.txt", co->out);
  FILE *f = fopen(p, "w");
  if (f) {
    fprintf(f, "%s\n", msg);
    fclose(f);
  }
}

void dt__cli_obs_serve(struct dt__cli_obs *co) {
  if (!co->metrics[0] || co->srv || co->serve_tried) return;
  co->serve_tried = 1;
  if (dt_obs_server_start(&co->srv, co->metrics, co->dir, co->r0, co->n) < 0) {
    fprintf(stderr, "dtrain: warning: %s; training goes on without it\n", dt_errmsg());
    return;
  }
  char host[64];
  snprintf(host, sizeof host, "%s", co->metrics);
  char *colon = strrchr(host, ':');
  if (colon) *colon = '\0';
  printf("metrics: http://%s:%d/metrics (ranks %d-%d)\n", host, dt_obs_server_port(co->srv),
         co->r0, co->r0 + co->n - 1);
  fflush(stdout);
}

void dt__cli_obs_watch(void *ud, const dt_job *job) {
  struct dt__cli_obs *co = ud;
  dt__cli_obs_serve(co); /* after the fork: the server's thread is the launcher's alone */
  if (usr1_seen) {
    usr1_seen = 0;
    diagnose(co, "SIGUSR1");
  }
  if (!co->diagnosed && dt_job_failed_worker(job) >= 0) {
    co->diagnosed = 1;
    diagnose(co, "a worker failed");
  }
}

void dt__cli_obs_end(struct dt__cli_obs *co) {
  dt_obs_server_stop(co->srv);
  co->srv = NULL;
  if (co->have_old) sigaction(SIGUSR1, &co->old_usr1, NULL);
  co->have_old = 0;
  if (co->trace && co->r0 == 0) { /* the node of rank 0 (several nodes: its own ranks) */
    char p[DT_CFG_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/trace.json", co->out);
    if (dt_obs_trace_merge(co->dir, co->r0 + co->n, p) < 0)
      fprintf(stderr, "dtrain: warning: %s\n", dt_errmsg());
  }
}

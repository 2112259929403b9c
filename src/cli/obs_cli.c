/*
 * obs_cli.c — the launcher's side of observability for `dtrain train` and
 * `dtrain launch`: before the workers start it clears the previous run's
 * rank pages (DIR/obs), while they run it serves every local rank's
 * metrics on obs.metrics (one port per node) and, when a worker fails or
 * SIGUSR1 arrives, reads every rank's flight recorder and prints the hang
 * diagnosis naming the rank that is behind (DIR/diagnosis.txt, with each
 * rank's recorder in DIR/obs/flight.txt); after the job it merges the
 * per-rank traces into DIR/trace.json. Under mpirun/srun there is no
 * launcher: the first rank of each host serves that host's ranks
 * (dt__cli_obs_serve_ranks, called by cmd_train.c once the ranks have met). The work itself is src/obs; this
 * file decides when and prints.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
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

/* "0-3" or "0,2,4": the ranks a server serves, for its line. */
static void rank_list(const int *r, int n, char *buf, size_t cap) {
  int contiguous = 1;
  for (int i = 1; i < n; i++) contiguous &= r[i] == r[0] + i;
  if (contiguous) {
    snprintf(buf, cap, "%d-%d", r[0], r[n - 1]);
    return;
  }
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && k + 16 < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", r[i]);
}

void dt__cli_obs_serve_ranks(struct dt__cli_obs *co, const int *ranks, int n) {
  if (!co->metrics[0] || co->srv || co->serve_tried || n < 1) return;
  co->serve_tried = 1;
  if (dt_obs_server_start(&co->srv, co->metrics, co->dir, ranks, n) < 0) {
    fprintf(stderr, "dtrain: warning: %s; training goes on without it\n", dt_errmsg());
    return;
  }
  char host[64], list[256];
  snprintf(host, sizeof host, "%s", co->metrics);
  char *colon = strrchr(host, ':');
  if (colon) *colon = '\0';
  rank_list(ranks, n, list, sizeof list);
  printf("metrics: http://%s:%d/metrics (ranks %s)\n", host, dt_obs_server_port(co->srv), list);
  fflush(stdout);
}

void dt__cli_obs_advertise(const struct dt__cli_obs *co, char *buf, size_t cap) {
  char host[64];
  snprintf(host, sizeof host, "%s", co->metrics);
  char *colon = strrchr(host, ':');
  if (colon) *colon = '\0';
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  if (!strcmp(host, "0.0.0.0")) { /* every address: name one the others can reach */
    struct ifaddrs *ifs = NULL, *i;
    snprintf(host, sizeof host, "127.0.0.1");
    if (getifaddrs(&ifs) == 0) {
      for (i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK) &&
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host, sizeof host))
          break;
      freeifaddrs(ifs);
    }
  }
  snprintf(buf, cap, "%s:%d", host, dt_obs_server_port(co->srv));
}

void dt__cli_obs_serve(struct dt__cli_obs *co) {
  if (!co->metrics[0] || co->srv || co->serve_tried) return;
  int *r = malloc((size_t)co->n * sizeof *r);
  if (!r) {
    co->serve_tried = 1;
    fprintf(stderr, "dtrain: warning: obs.metrics: out of memory; training goes on without it\n");
    return;
  }
  for (int i = 0; i < co->n; i++) r[i] = co->r0 + i;
  dt__cli_obs_serve_ranks(co, r, co->n);
  free(r);
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

/*
 * local_job.c — runs one job as N worker processes on this host, for
 * `dtrain train --workers N` and `dtrain bench allreduce`: a fresh job
 * token, the workers forked while this process has one thread (the store
 * server's thread must not exist yet, or a child could inherit a lock it
 * holds, OpenSSL's say), then the TCP store on 127.0.0.1:0 whose port
 * reaches the workers through a pipe. The parent waits on every worker by
 * pid; after the first failure the others get a grace period to notice the
 * lost peer and exit, then are killed.
 *
 * It does not know what a worker does (the callback does) and it does not
 * span hosts (that is `dtrain launch`).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "core/core.h"

static void make_token(char *hex, size_t cap) {
  unsigned char raw[16] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, raw, sizeof raw);
    (void)n;
    close(fd);
  }
  uint64_t t = (uint64_t)dt_now_ns() ^ ((uint64_t)getpid() << 32);
  for (size_t i = 0; i < 8; i++) raw[i] ^= (unsigned char)(t >> (8 * i));
  for (size_t i = 0; i < sizeof raw && 2 * i + 2 < cap; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
}

/* Waits for every worker; returns the job's exit status (the first
 * failure's: 2 if that worker exited 2, else 1). */
static int reap(pid_t *pids, int n, double grace) {
  int left = n, status = DT_EXIT_OK;
  double kill_at = 0;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < n; r++) {
        if (pids[r] != p) continue;
        pids[r] = 0;
        left--;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) break;
        if (WIFSIGNALED(st))
          fprintf(stderr, "dtrain: worker rank %d (pid %d) was killed by signal %d%s\n", r,
                  (int)p, WTERMSIG(st), status ? "" : "; stopping the other workers");
        if (status == DT_EXIT_OK) {
          kill_at = dt_now() + grace;
          status = WIFEXITED(st) && WEXITSTATUS(st) == DT_EXIT_USAGE ? DT_EXIT_USAGE
                                                                     : DT_EXIT_FAIL;
        }
        break;
      }
      continue;
    }
    if (p < 0 && errno != EINTR) break;
    if (status != DT_EXIT_OK && dt_now() > kill_at) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "dtrain: worker rank %d (pid %d) did not exit within %.0f s; killing "
                  "it\n", r, (int)pids[r], grace);
          kill(pids[r], SIGKILL);
        }
      kill_at = dt_now() + 3600; /* report once; waitpid reaps them next */
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return status;
}

int dt__local_job_run(int n, dt__worker_fn fn, void *arg, double grace, int print_pids) {
  char token[40] = {0};
  make_token(token, sizeof token);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int pfd[2];
  if (!pids || pipe(pfd)) {
    free(pids);
    fprintf(stderr, "dtrain: out of resources\n");
    return DT_EXIT_FAIL;
  }
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  int started = 0;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(pfd[1]);
      int port = 0;
      ssize_t got = read(pfd[0], &port, sizeof port);
      close(pfd[0]);
      /* port 0, or the parent's death (which closes the pipe), means quit */
      if (getppid() != parent || got != (ssize_t)sizeof port || port <= 0) _exit(DT_EXIT_FAIL);
      _exit(fn(r, n, port, token, arg));
    }
    if (p < 0) {
      fprintf(stderr, "dtrain: fork: %s\n", strerror(errno));
      break;
    }
    pids[r] = p;
    started++;
  }
  close(pfd[0]);
  dt_store_server *srv = NULL;
  int port = 0;
  if (started == n && dt_store_server_start(&srv, "127.0.0.1", 0, token) == DT_OK)
    port = dt_store_server_port(srv);
  else if (started == n)
    fprintf(stderr, "dtrain: store: %s\n", dt_errmsg());
  if (print_pids) {
    printf("workers:");
    for (int r = 0; r < started; r++)
      printf(" rank %d pid %d%s", r, (int)pids[r], r + 1 < started ? "," : "");
    printf("\n");
    fflush(stdout);
  }
  for (int r = 0; r < started; r++) {
    ssize_t w = write(pfd[1], &port, sizeof port);
    (void)w;
  }
  close(pfd[1]);
  int status = started < n || port == 0 ? DT_EXIT_FAIL : DT_EXIT_OK;
  int st = reap(pids, started, grace);
  if (status == DT_EXIT_OK) status = st;
  dt_store_server_stop(srv);
  free(pids);
  return status;
}

/*
 * local_job.c — runs this node's share of a job as worker processes, for
 * `dtrain train --workers N`, `dtrain bench allreduce` and every node of
 * `dtrain launch`: the workers are forked while this process has one
 * thread (the store server's thread must not exist yet, or a child could
 * inherit a lock it holds, OpenSSL's say); then the node that serves the
 * rendezvous store starts it, every node's launcher meets the others
 * through it (node records under "launch/node/<i>": a node that does not
 * show up before the deadline is named, as is one started with a different
 * node count or workers per node, or a node rank claimed twice), and only
 * then are the workers released: the store port reaches them through a
 * pipe (0 means quit). The parent waits on every worker by pid; after the
 * first failure the others get a grace period to notice the lost peer and
 * exit, then are killed.
 *
 * It does not know what a worker does (the callback does), and it does not
 * watch other nodes' workers: their failures reach this node's workers
 * through the communicator (a lost peer), which then exit.
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

void dt__make_token(char *hex, size_t cap) {
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
static int reap(pid_t *pids, int n, int rank0, double grace) {
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
          fprintf(stderr, "dtrain: worker rank %d (pid %d) was killed by signal %d%s\n",
                  rank0 + r, (int)p, WTERMSIG(st), status ? "" : "; stopping the other workers");
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
                  "it\n", rank0 + r, (int)pids[r], grace);
          kill(pids[r], SIGKILL);
        }
      kill_at = dt_now() + 3600; /* report once; waitpid reaps them next */
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return status;
}

/* Ranks of node i, "2-3" or "2". */
static void node_ranks(const struct dt__job *j, int i, char *buf, size_t cap) {
  int a = i * j->nlocal, b = a + j->nlocal - 1;
  if (a == b) snprintf(buf, cap, "%d", a);
  else snprintf(buf, cap, "%d-%d", a, b);
}

/* The launchers meet: this node's record goes in (a node rank taken twice
 * is refused), then every other node's record must appear before the
 * deadline and agree on the job's shape. Prints the one-line reason and
 * returns -1 on failure. */
static int meet_nodes(const struct dt__job *j, const char *host, int port, const char *token) {
  double deadline = dt_now() + j->timeout;
  dt_store *st = NULL;
  if (dt_store_connect(&st, host, port, token, j->timeout) < 0) {
    fprintf(stderr, "dtrain: node %d: cannot reach the rendezvous store at %s:%d (served by "
            "node 0) within %.0f s: %s\n", j->node, host, port, j->timeout, dt_errmsg());
    return -1;
  }
  char key[64], rec[512], hn[256] = "?";
  gethostname(hn, sizeof hn - 1);
  int n = snprintf(rec, sizeof rec, "%d %d %d %s %s", j->nnodes, j->nlocal, (int)getpid(),
                   j->bind_addr ? j->bind_addr : "127.0.0.1", hn);
  snprintf(key, sizeof key, "launch/node/%d", j->node);
  bool swapped = false;
  char cur[512];
  size_t curlen = 0;
  int rc = dt_store_cas(st, key, NULL, 0, rec, (size_t)n, &swapped, cur, sizeof cur - 1, &curlen,
                        j->timeout);
  if (rc < 0 || !swapped) {
    if (rc < 0) {
      fprintf(stderr, "dtrain: node %d: rendezvous: %s\n", j->node, dt_errmsg());
    } else {
      cur[curlen] = '\0';
      const char *who = strrchr(cur, ' ');
      fprintf(stderr, "dtrain: node %d: --node-rank %d is already taken by host %s (two nodes "
              "with the same node rank?)\n", j->node, j->node, who ? who + 1 : "?");
    }
    dt_store_destroy(st);
    return -1;
  }
  for (int i = 0; i < j->nnodes; i++) {
    if (i == j->node) continue;
    snprintf(key, sizeof key, "launch/node/%d", i);
    double left = deadline - dt_now();
    rc = dt_store_get(st, key, cur, sizeof cur - 1, &curlen, left > 0.01 ? left : 0.01);
    if (rc == DT_ETIMEDOUT) {
      /* name every node still missing, not only the first */
      char missing[256] = "", rk[32];
      int nmiss = 0;
      for (int k = i; k < j->nnodes; k++) {
        if (k == j->node) continue;
        snprintf(key, sizeof key, "launch/node/%d", k);
        if (k > i && dt_store_get(st, key, cur, sizeof cur - 1, &curlen, 0.01) == DT_OK) continue;
        node_ranks(j, k, rk, sizeof rk);
        size_t ml = strlen(missing);
        snprintf(missing + ml, sizeof missing - ml, "%s%d (ranks %s)", nmiss ? ", " : "", k, rk);
        nmiss++;
      }
      fprintf(stderr, "dtrain: node %d: node%s %s did not join the rendezvous at %s:%d within "
              "%.0f s (DTRAIN_TIMEOUT)\n", j->node, nmiss > 1 ? "s" : "", missing, host, port,
              j->timeout);
      dt_store_destroy(st);
      return -1;
    }
    if (rc < 0) {
      fprintf(stderr, "dtrain: node %d: rendezvous: waiting for node %d: %s\n", j->node, i,
              dt_errmsg());
      dt_store_destroy(st);
      return -1;
    }
    cur[curlen] = '\0';
    int nn = 0, np = 0;
    if (sscanf(cur, "%d %d", &nn, &np) != 2 || nn != j->nnodes || np != j->nlocal) {
      const char *who = strrchr(cur, ' ');
      fprintf(stderr, "dtrain: node %d: node %d (host %s) was started with --nnodes %d "
              "--nproc-per-node %d, this node with --nnodes %d --nproc-per-node %d\n", j->node, i,
              who ? who + 1 : "?", nn, np, j->nnodes, j->nlocal);
      dt_store_destroy(st);
      return -1;
    }
  }
  dt_store_destroy(st);
  return 0;
}

int dt__job_run(const struct dt__job *j, dt__worker_fn fn, void *arg) {
  char fresh[40] = {0};
  const char *token = j->token;
  if (!token || !*token) {
    dt__make_token(fresh, sizeof fresh);
    token = fresh;
  }
  const char *host = j->rdzv_host ? j->rdzv_host : "127.0.0.1";
  pid_t *pids = calloc((size_t)j->nlocal, sizeof *pids);
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
  for (int r = 0; r < j->nlocal; r++) {
    pid_t p = fork();
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(pfd[1]);
      int port = 0;
      ssize_t got = read(pfd[0], &port, sizeof port);
      close(pfd[0]);
      /* port 0, or the parent's death (which closes the pipe), means quit */
      if (getppid() != parent || got != (ssize_t)sizeof port || port <= 0) _exit(DT_EXIT_FAIL);
      struct dt__worker w = {j->rank0 + r, j->world, r, host, port, token, j->bind_addr,
                             j->host_id};
      _exit(fn(&w, arg));
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
  int port = j->rdzv_port;
  if (started < j->nlocal) {
    port = 0;
  } else if (j->serve_addr) {
    if (dt_store_server_start(&srv, j->serve_addr, j->rdzv_port, token) == DT_OK) {
      port = dt_store_server_port(srv);
    } else {
      fprintf(stderr, "dtrain: node %d: rendezvous store on %s:%d: %s\n", j->node, j->serve_addr,
              j->rdzv_port, dt_errmsg());
      port = 0;
    }
  }
  if (port > 0 && j->nnodes > 1 && meet_nodes(j, host, port, token) < 0) port = 0;
  if (j->print_pids && port > 0) {
    printf("workers:");
    for (int r = 0; r < started; r++)
      printf(" rank %d pid %d%s", j->rank0 + r, (int)pids[r], r + 1 < started ? "," : "");
    printf("\n");
    fflush(stdout);
  }
  for (int r = 0; r < started; r++) {
    ssize_t w = write(pfd[1], &port, sizeof port);
    (void)w;
  }
  close(pfd[1]);
  int status = port <= 0 ? DT_EXIT_FAIL : DT_EXIT_OK;
  /* workers told to quit exit 1 quietly; only the reason above is printed */
  int st = reap(pids, started, j->rank0, j->grace);
  if (status == DT_EXIT_OK) status = st;
  dt_store_server_stop(srv);
  free(pids);
  return status;
}

int dt__local_job_run(int n, dt__worker_fn fn, void *arg, double grace, int print_pids) {
  struct dt__job j = {0};
  j.nlocal = n;
  j.world = n;
  j.nnodes = 1;
  j.serve_addr = "127.0.0.1";
  j.rdzv_host = "127.0.0.1";
  j.timeout = 60;
  j.grace = grace;
  j.print_pids = print_pids;
  return dt__job_run(&j, fn, arg);
}

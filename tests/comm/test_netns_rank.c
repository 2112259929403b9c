/*
 * test_netns_rank.c — one rank of a tcp job, for the multi-host test
 * (test_netns_tcp.sh runs one per network namespace), and on its own a
 * loopback check of the same path.
 *
 *   test_netns_rank worker RANK SIZE STORE_ADDR:PORT BIND_ADDR MIN_BYTES MAX_BYTES
 *     Rank 0 serves the store on STORE_ADDR:PORT. Every rank joins the job
 *     over tcp (listening on BIND_ADDR, host id "netns-<rank>"), runs the
 *     allreduce benchmark with result checking from MIN to MAX bytes (rank 0
 *     prints the table) and exits 0 only if every call succeeded.
 *   test_netns_rank            (no arguments: the ctest entry)
 *     Forks 3 such workers on 127.0.0.1 and checks that they all succeed
 *     and agree, so the worker itself is tested without namespaces. Rank 0
 *     serves the store on port 0 (the kernel picks a free one) and passes
 *     the port to the parent through a pipe before ranks 1 and 2 start, so
 *     parallel runs cannot collide on a port.
 *
 * Every process this file forks is reaped, or killed by pid after 60 s.
 */
#define _GNU_SOURCE
#include "comm/comm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The loopback self-check checks results, not speed: a few timed calls per
 * size (after the benchmark's 2 warm-up calls) instead of its automatic
 * 200 per size up to 64 KiB and 50 up to 1 MiB. Those ~3100 allreduces
 * over tcp, each a few wake-ups of 3 processes, took over 60 s (the limit
 * below) in the ASan build under load 30, where each wake-up waited for a
 * core; the worker mode (test_netns_tcp.sh) measures bandwidth and keeps
 * the automatic count. */
#define SELF_ITERS 3

/* port_fd >= 0 (rank 0 of the loopback self-check): the store's port is
 * 0 in STORE, and the port the server got is written to port_fd. */
static int worker(int rank, int size, const char *store, const char *bind, size_t minb,
                  size_t maxb, int port_fd, int iters) {
  char host[64];
  int port;
  const char *colon = strrchr(store, ':');
  if (!colon || colon - store >= (long)sizeof host) return 2;
  memcpy(host, store, (size_t)(colon - store));
  host[colon - store] = 0;
  port = atoi(colon + 1);
  dt_store_server *srv = NULL;
  dt_store *st = NULL;
  dt_comm *c = NULL;
  int rc;
  if (rank == 0 && (rc = dt_store_server_start(&srv, host, port, NULL)) < 0) {
    fprintf(stderr, "rank 0: store server on %s: %s\n", store, dt_errmsg());
    return 1;
  }
  if (rank == 0 && port_fd >= 0) {
    port = dt_store_server_port(srv);
    if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) {
      fprintf(stderr, "rank 0: cannot pass the store port to the parent\n");
      dt_store_server_stop(srv);
      return 1;
    }
    close(port_fd);
  }
  if ((rc = dt_store_connect(&st, host, port, NULL, 30)) < 0) {
    fprintf(stderr, "rank %d: store %s: %s\n", rank, store, dt_errmsg());
    dt_store_server_stop(srv);
    return 1;
  }
  char hid[32];
  snprintf(hid, sizeof hid, "netns-%d", rank);
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "tcp";
  cfg.rank = rank;
  cfg.size = size;
  cfg.job = "netns";
  cfg.bind_addr = bind;
  cfg.host_id = hid;
  cfg.timeout_s = 60;
  if ((rc = dt_comm_create(&c, st, &cfg)) < 0) {
    fprintf(stderr, "rank %d: join: %s\n", rank, dt_errmsg());
  } else {
    struct dt_comm_bench_config bc = DT_COMM_BENCH_CONFIG_INIT;
    bc.min_bytes = minb;
    bc.max_bytes = maxb;
    bc.check = true;
    bc.iters = iters; /* 0: the benchmark's own count by size */
    FILE *tab = rank == 0 ? tmpfile() : NULL;
    rc = dt_comm_bench_allreduce(c, &bc, tab);
    if (rc < 0) fprintf(stderr, "rank %d: bench: %s\n", rank, dt_comm_errmsg(c));
    else rc = dt_comm_barrier(c); /* the store server (rank 0) outlives every client */
    if (tab) {
      /* Echo the table; any row with a nonzero #wrong (last column) fails. */
      char line[256];
      rewind(tab);
      while (fgets(line, sizeof line, tab)) {
        fputs(line, stdout);
        const char *last = strrchr(line, ' ');
        if (line[0] != '#' && last && atoll(last + 1) != 0) {
          fprintf(stderr, "rank 0: wrong results: %s", line);
          rc = DT_ECORRUPT;
        }
      }
      fclose(tab);
    }
    fflush(stdout);
  }
  dt_comm_destroy(c);
  dt_store_destroy(st);
  dt_store_server_stop(srv);
  return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 8 && !strcmp(argv[1], "worker"))
    return worker(atoi(argv[2]), atoi(argv[3]), argv[4], argv[5], strtoull(argv[6], 0, 10),
                  strtoull(argv[7], 0, 10), -1, 0);
  if (argc != 1) {
    fprintf(stderr, "usage: %s worker RANK SIZE STORE:PORT BIND MIN MAX\n", argv[0]);
    return 2;
  }
  /* Loopback self-check with 3 ranks: rank 0 first, on port 0; the others
   * once it has said which port the kernel gave its store. */
  char store[64] = "127.0.0.1:0";
  pid_t pids[3];
  int pfd[2];
  if (pipe(pfd) < 0) return 1;
  fflush(NULL);
  pids[0] = fork();
  if (pids[0] < 0) return 1;
  if (pids[0] == 0) {
    close(pfd[0]);
    _exit(worker(0, 3, store, "127.0.0.1", 4, 1 << 20, pfd[1], SELF_ITERS));
  }
  close(pfd[1]);
  int port = 0;
  ssize_t got = read(pfd[0], &port, sizeof port); /* EOF if rank 0 failed */
  close(pfd[0]);
  if (got != (ssize_t)sizeof port || port <= 0) {
    fprintf(stderr, "rank 0 did not start its store server\n");
    kill(pids[0], SIGKILL);
    waitpid(pids[0], NULL, 0);
    return 1;
  }
  snprintf(store, sizeof store, "127.0.0.1:%d", port);
  for (int r = 1; r < 3; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      for (int k = 0; k < r; k++) { kill(pids[k], SIGKILL); waitpid(pids[k], NULL, 0); }
      return 1;
    }
    if (pids[r] == 0) _exit(worker(r, 3, store, "127.0.0.1", 4, 1 << 20, -1, SELF_ITERS));
  }
  int bad = 0, left = 3;
  bool alive[3] = {true, true, true};
  double until = dt_now() + 60;
  while (left) {
    for (int r = 0; r < 3; r++) {
      int st;
      if (alive[r] && waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        alive[r] = false;
        left--;
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
          fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
          bad++;
        }
      }
    }
    if (left && dt_now() > until) {
      for (int r = 0; r < 3; r++)
        if (alive[r]) { kill(pids[r], SIGKILL); waitpid(pids[r], NULL, 0); }
      fprintf(stderr, "ranks still running after 60 s: killed\n");
      return 1;
    }
    usleep(2000);
  }
  printf(bad ? "FAILED\n" : "OK: 3 tcp ranks on loopback\n");
  return bad ? 1 : 0;
}

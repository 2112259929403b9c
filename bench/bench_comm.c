/*
 * bench_comm.c — quick allreduce benchmark of the comm layer: forks N
 * ranks on this host (each its own process with a communicator over the
 * chosen transport, rendezvous through a TCP store on 127.0.0.1:0) and
 * prints rank 0's nccl-tests style table from dt_comm_bench_allreduce.
 * Not built by default. Build:
 *   cc -O3 -march=native -std=gnu11 -Iinclude -Isrc bench/bench_comm.c \
 *      build/<dir>/libdt_comm.a build/<dir>/libdt_core.a -lcrypto -lpthread -lm -o bench_comm
 * Run: ./bench_comm [-n RANKS] [-t tcp|shm|inproc] [-a auto|ring|rhd|tree]
 *                   [-b MINBYTES] [-e MAXBYTES] [-i ITERS]
 */
#define _GNU_SOURCE
#include "comm/comm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  int n = 2, opt;
  const char *tp = "tcp";
  struct dt_comm_bench_config bc = DT_COMM_BENCH_CONFIG_INIT;
  bc.min_bytes = 8;
  bc.max_bytes = 64u << 20;
  while ((opt = getopt(argc, argv, "n:t:a:b:e:i:")) != -1) {
    switch (opt) {
    case 'n': n = atoi(optarg); break;
    case 't': tp = optarg; break;
    case 'a': if (dt_algo_parse(optarg, &bc.algo)) { fprintf(stderr, "%s\n", dt_errmsg()); return 2; } break;
    case 'b': bc.min_bytes = strtoull(optarg, NULL, 0); break;
    case 'e': bc.max_bytes = strtoull(optarg, NULL, 0); break;
    case 'i': bc.iters = atoi(optarg); break;
    default: fprintf(stderr, "usage: %s [-n N] [-t T] [-a A] [-b MIN] [-e MAX] [-i ITERS]\n", argv[0]); return 2;
    }
  }
  dt_store_server *srv;
  if (dt_store_server_start(&srv, "127.0.0.1", 0, NULL)) {
    fprintf(stderr, "store: %s\n", dt_errmsg());
    return 1;
  }
  int port = dt_store_server_port(srv);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      dt_store *s;
      struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
      cfg.transport = tp;
      cfg.rank = r;
      cfg.size = n;
      cfg.job = "bench";
      cfg.timeout_s = 120;
      dt_comm *c;
      if (dt_store_connect(&s, "127.0.0.1", port, NULL, 10) || dt_comm_create(&c, s, &cfg)) {
        fprintf(stderr, "rank %d: %s\n", r, dt_errmsg());
        _exit(1);
      }
      dt_store_destroy(s);
      int rc = dt_comm_bench_allreduce(c, &bc, stdout);
      if (rc) fprintf(stderr, "rank %d: %s\n", r, dt_errmsg());
      dt_comm_destroy(c);
      _exit(rc ? 1 : 0);
    }
  }
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st);
  }
  dt_store_server_stop(srv);
  free(pids);
  return bad;
}

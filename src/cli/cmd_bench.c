/*
 * cmd_bench.c — `dtrain bench allreduce`: forks N local ranks (one process
 * each), joins them through a TCP store on 127.0.0.1 with a fresh job token,
 * and prints rank 0's nccl-tests style table (dt_comm_bench_allreduce):
 * bytes, count, time_us, algbw and busbw = algbw * 2(n-1)/n, and a check of
 * the result at every size.
 *
 * It measures one host only; across hosts, use `dtrain launch` (later) or
 * mpirun with --transport mpi. Every child is stopped by pid: if one fails,
 * the others get a grace period to report the lost peer, then SIGKILL.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "core/core.h"

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: dtrain bench allreduce [--workers N] [--transport T] [--algo A]\n"
          "                              [--min BYTES] [--max BYTES] [--iters I]\n"
          "                              [--dtype D] [--op OP] [--timeout S]\n"
          "\n"
          "Allreduce bandwidth and latency between N local worker processes.\n"
          "  --workers N     ranks (default 2)\n"
          "  --transport T   shm | tcp | auto (default auto: shm on one host)\n"
          "  --algo A        auto | ring | rhd | tree | direct (default auto)\n"
          "  --min, --max    sizes in bytes, doubling (default 8 .. 64M; suffixes K, M, G)\n"
          "  --iters I       iterations per size (default: by size)\n"
          "  --dtype D       f32 f64 bf16 f16 i32 i64 (default f32)\n"
          "  --op OP         sum avg min max (default sum)\n"
          "  --timeout S     deadline of every blocking call, seconds (default 60)\n"
          "Columns as in nccl-tests: busbw = algbw * 2(n-1)/n.\n");
}

static int parse_bytes(const char *s, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  if (*end == 'K' || *end == 'k') v <<= 10, end++;
  else if (*end == 'M' || *end == 'm') v <<= 20, end++;
  else if (*end == 'G' || *end == 'g') v <<= 30, end++;
  if (*end) return -1;
  *out = (size_t)v;
  return 0;
}

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

static int run_rank(int r, int n, int port, const char *token, const char *transport,
                    double timeout, const struct dt_comm_bench_config *bc) {
  dt_store *s = NULL;
  dt_comm *c = NULL;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = transport;
  cfg.rank = r;
  cfg.size = n;
  cfg.job = "bench";
  cfg.token = token;
  cfg.timeout_s = timeout;
  if (dt_store_connect(&s, "127.0.0.1", port, token, timeout) || dt_comm_create(&c, s, &cfg)) {
    fprintf(stderr, "dtrain bench: rank %d: %s\n", r, dt_errmsg());
    dt_store_destroy(s);
    return 1;
  }
  dt_store_destroy(s);
  int rc = dt_comm_bench_allreduce(c, bc, r == 0 ? stdout : NULL);
  if (rc) fprintf(stderr, "dtrain bench: rank %d: %s\n", r, dt_comm_errmsg(c));
  fflush(stdout);
  dt_comm_destroy(c);
  return rc ? 1 : 0;
}

/* Waits for every child; after the first failure the rest get `grace`
 * seconds to notice the lost peer and exit, then are killed. */
static int reap(pid_t *pids, int n, double grace) {
  int left = n, bad = 0;
  double kill_at = 0;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < n; r++)
        if (pids[r] == p) {
          pids[r] = 0;
          left--;
          if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            if (WIFSIGNALED(st)) fprintf(stderr, "dtrain bench: rank %d killed by signal %d\n", r, WTERMSIG(st));
            if (!bad) kill_at = dt_now() + grace;
            bad = 1;
          }
        }
      continue;
    }
    if (p < 0 && errno != EINTR) break;
    if (bad && dt_now() > kill_at) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return bad;
}

int dt__cmd_bench(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    bench_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? DT_EXIT_USAGE : DT_EXIT_OK;
  }
  if (strcmp(argv[1], "allreduce")) {
    fprintf(stderr, "dtrain bench: unknown benchmark '%s' (known: allreduce)\n", argv[1]);
    return DT_EXIT_USAGE;
  }
  int n = 2;
  const char *transport = "auto";
  double timeout = 60;
  struct dt_comm_bench_config bc = DT_COMM_BENCH_CONFIG_INIT;
  for (int i = 2; i < argc; i += 2) { /* every option takes one value */
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!v) {
      fprintf(stderr, "dtrain bench: %s needs a value (try dtrain bench --help)\n", a);
      return DT_EXIT_USAGE;
    }
    char *end;
    int bad = 0;
    if (!strcmp(a, "--workers")) {
      long w = strtol(v, &end, 10);
      bad = *end || w < 1 || w > 256;
      n = (int)w;
    } else if (!strcmp(a, "--transport")) {
      transport = v;
      bad = strcmp(v, "shm") && strcmp(v, "tcp") && strcmp(v, "auto");
    } else if (!strcmp(a, "--algo")) {
      bad = dt_algo_parse(v, &bc.algo) != 0;
    } else if (!strcmp(a, "--min")) {
      bad = parse_bytes(v, &bc.min_bytes) != 0;
    } else if (!strcmp(a, "--max")) {
      bad = parse_bytes(v, &bc.max_bytes) != 0;
    } else if (!strcmp(a, "--iters")) {
      long it = strtol(v, &end, 10);
      bad = *end || it < 1 || it > 1000000;
      bc.iters = (int)it;
    } else if (!strcmp(a, "--dtype")) {
      bad = dt_dtype_parse(v, &bc.dtype) != 0;
    } else if (!strcmp(a, "--op")) {
      bad = dt_redop_parse(v, &bc.op) != 0;
    } else if (!strcmp(a, "--timeout")) {
      timeout = strtod(v, &end);
      bad = *end || !(timeout > 0 && timeout <= 86400);
    } else {
      fprintf(stderr, "dtrain bench: unknown option '%s' (try dtrain bench --help)\n", a);
      return DT_EXIT_USAGE;
    }
    if (bad) {
      fprintf(stderr, "dtrain bench: %s: bad value '%s' (try dtrain bench --help)\n", a, v);
      return DT_EXIT_USAGE;
    }
  }
  if (bc.min_bytes > bc.max_bytes || bc.max_bytes > ((size_t)1 << 32)) {
    fprintf(stderr, "dtrain bench: need --min <= --max <= 4G (got %zu, %zu)\n", bc.min_bytes, bc.max_bytes);
    return DT_EXIT_USAGE;
  }
  char token[40] = {0};
  make_token(token, sizeof token);
  printf("# dtrain bench allreduce: %d ranks, transport %s, algo %s, %s %s\n", n, transport,
         dt_algo_name(bc.algo), dt_dtype_name(bc.dtype), dt_redop_name(bc.op));
  fflush(stdout);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int pfd[2];
  if (!pids || pipe(pfd)) {
    free(pids);
    fprintf(stderr, "dtrain bench: out of resources\n");
    return DT_EXIT_FAIL;
  }
  /* Fork while this process has one thread: the store server's thread must
   * not exist yet, or a child could inherit a lock it holds. The children
   * learn the store's port through the pipe. */
  int started = 0;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p == 0) {
      close(pfd[1]);
      int port = 0;
      ssize_t got = read(pfd[0], &port, sizeof port);
      _exit(got == (ssize_t)sizeof port && port > 0
                ? run_rank(r, n, port, token, transport, timeout, &bc)
                : 1);
    }
    if (p < 0) {
      fprintf(stderr, "dtrain bench: fork: %s\n", strerror(errno));
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
    fprintf(stderr, "dtrain bench: store: %s\n", dt_errmsg());
  for (int r = 0; r < started; r++) {
    ssize_t w = write(pfd[1], &port, sizeof port); /* port 0 tells children to quit */
    (void)w;
  }
  close(pfd[1]);
  int bad = started < n || port == 0;
  bad |= reap(pids, started, 10.0);
  dt_store_server_stop(srv);
  free(pids);
  return bad ? DT_EXIT_FAIL : DT_EXIT_OK;
}

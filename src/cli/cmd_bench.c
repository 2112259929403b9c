/*
 * cmd_bench.c — `dtrain bench allreduce`: runs N local ranks as one job
 * (dt_job_*: one process each, a TCP store on 127.0.0.1, a fresh job
 * token) and prints rank 0's nccl-tests style table (dt_comm_bench_allreduce):
 * bytes, count, time_us, algbw and busbw = algbw * 2(n-1)/n, and a check of
 * the result at every size.
 *
 * It measures one host only; across hosts, use `dtrain launch` (later) or
 * mpirun with --transport mpi.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

struct bench_args {
  const struct dt_comm_bench_config *bc;
};

static int run_rank(const struct dt_job_worker *w, void *arg) {
  const struct bench_args *a = arg;
  int rc = dt_comm_bench_allreduce(w->comm, a->bc, w->rank == 0 ? stdout : NULL);
  if (rc) fprintf(stderr, "dtrain bench: rank %d: %s\n", w->rank, dt_comm_errmsg(w->comm));
  fflush(stdout);
  return rc ? 1 : 0;
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
    } else if (!strcmp(a, "--min") || !strcmp(a, "--max")) {
      uint64_t b;
      if (dt__parse_bytes(a, v, (uint64_t)1 << 32, &b) < 0) {
        fprintf(stderr, "dtrain bench: %s\n", dt_errmsg());
        return DT_EXIT_USAGE;
      }
      *(a[3] == 'i' ? &bc.min_bytes : &bc.max_bytes) = (size_t)b;
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
  printf("# dtrain bench allreduce: %d ranks, transport %s, algo %s, %s %s\n", n, transport,
         dt_algo_name(bc.algo), dt_dtype_name(bc.dtype), dt_redop_name(bc.op));
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = n;
  jc.transport = transport;
  jc.name = "bench";
  jc.deadline_s = timeout;
  jc.grace_s = 10.0;
  jc.notify = dt__cli_job_notify;
  dt_job *job = NULL;
  struct bench_args args = {&bc};
  int rc = dt_job_create(&job, &jc);
  int status = rc < 0 ? DT_EXIT_USAGE : dt__cli_job_status(job, dt_job_run(job, run_rank, &args));
  if (rc < 0) fprintf(stderr, "dtrain bench: %s\n", dt_errmsg());
  dt_job_destroy(job);
  return status;
}

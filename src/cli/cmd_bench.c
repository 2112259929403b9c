/*
 * cmd_bench.c — `dtrain bench allreduce`: runs N local ranks as one job
 * (dt_job_*: one process each, a TCP store on 127.0.0.1, a fresh job
 * token) and prints rank 0's nccl-tests style table (dt_comm_bench_allreduce):
 * bytes, count, time_us, algbw and busbw = algbw * 2(n-1)/n, and a check of
 * the result at every size.
 *
 * It measures one host only; across hosts, use `dtrain launch` (later) or
 * mpirun with --transport mpi.
 *
 * `dtrain bench compress`: the gradient codecs' speed on one core
 * (dt_cz_bench, src/comm/compress/bench.c), no job.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "comm/compress/compress.h"
#include "core/core.h"

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: dtrain bench allreduce [--workers N] [--transport T] [--algo A]\n"
          "                              [--min BYTES] [--max BYTES] [--iters I]\n"
          "                              [--dtype D] [--op OP] [--timeout S] [--time T]\n"
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
          "  --time T        mean | median: time column is the mean per call (default), or\n"
          "                  the median of calls timed one by one (steadier on a busy host)\n"
          "Columns as in nccl-tests: busbw = algbw * 2(n-1)/n.\n"
          "\n"
          "usage: dtrain bench compress [--bytes B] [--ratio R] [--seconds S]\n"
          "Gradient codecs (docs/compress.md) on one core: encode + decode GB/s of f32.\n"
          "  --bytes B       bucket size (default 4M; suffixes K, M, G)\n"
          "  --ratio R       topk density (default 0.01)\n"
          "  --seconds S     time per codec (default 1)\n");
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

static int bench_compress(int argc, char **argv) {
  uint64_t bytes = 4u << 20;
  double ratio = 0.01, seconds = 1;
  for (int i = 2; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!v) {
      fprintf(stderr, "dtrain bench compress: %s needs a value (try dtrain bench --help)\n", a);
      return DT_EXIT_USAGE;
    }
    char *end;
    int bad = 0;
    if (!strcmp(a, "--bytes")) {
      if (dt__parse_bytes(a, v, (uint64_t)1 << 32, &bytes) < 0) {
        fprintf(stderr, "dtrain bench compress: %s\n", dt_errmsg());
        return DT_EXIT_USAGE;
      }
      bad = bytes < 64;
    } else if (!strcmp(a, "--ratio")) {
      ratio = strtod(v, &end);
      bad = *end || !(ratio > 0 && ratio <= 1);
    } else if (!strcmp(a, "--seconds")) {
      seconds = strtod(v, &end);
      bad = *end || !(seconds > 0 && seconds <= 600);
    } else {
      fprintf(stderr, "dtrain bench compress: unknown option '%s' (try dtrain bench --help)\n", a);
      return DT_EXIT_USAGE;
    }
    if (bad) {
      fprintf(stderr, "dtrain bench compress: %s: bad value '%s'\n", a, v);
      return DT_EXIT_USAGE;
    }
  }
  if (dt_cz_bench(stdout, (size_t)(bytes / 4), ratio, seconds) < 0) {
    fprintf(stderr, "dtrain bench compress: %s\n", dt_errmsg());
    return DT_EXIT_USAGE;
  }
  return DT_EXIT_OK;
}

int dt__cmd_bench(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    bench_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? DT_EXIT_USAGE : DT_EXIT_OK;
  }
  if (!strcmp(argv[1], "compress")) return bench_compress(argc, argv);
  if (strcmp(argv[1], "allreduce")) {
    fprintf(stderr, "dtrain bench: unknown benchmark '%s' (known: allreduce, compress)\n", argv[1]);
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
    } else if (!strcmp(a, "--time")) {
      bad = strcmp(v, "mean") && strcmp(v, "median");
      bc.median = !strcmp(v, "median");
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

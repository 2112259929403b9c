/*
 * bench.c — dt_comm_bench_allreduce: the allreduce benchmark behind
 * `dtrain bench allreduce`, printing an nccl-tests style table on rank 0.
 *
 * For each size (doubling from min to max bytes) it runs warm-up
 * iterations, then timed iterations between barriers; the time is the
 * maximum over ranks of the mean per-iteration time (as nccl-tests reports
 * it), or with `median` of the median of calls timed one by one. algbw = bytes / time, busbw = algbw * 2(n-1)/n. With check set, one
 * extra call per size uses exact small-integer inputs and counts wrong
 * elements on every rank. Not here: launching ranks (the CLI does that).
 */
#include "comm/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int auto_iters(size_t bytes) {
  if (bytes <= 64 * 1024) return 200;
  if (bytes <= 1 << 20) return 50;
  if (bytes <= 16 << 20) return 10;
  return 5;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void fill(void *buf, size_t count, dt_dtype t, int r) {
  for (size_t i = 0; i < count; i++) {
    int v = (int)((r * 7 + i * 3) % 11) - 5;
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)buf)[i] = v; break;
    case DT_I64: ((int64_t *)buf)[i] = v; break;
    default: break;
    }
  }
}

static double as_double(const void *buf, size_t i, dt_dtype t) {
  switch (t) {
  case DT_F32: return ((const float *)buf)[i];
  case DT_F64: return ((const double *)buf)[i];
  case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case DT_F16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
  case DT_I32: return ((const int32_t *)buf)[i];
  case DT_I64: return (double)((const int64_t *)buf)[i];
  default: return 0;
  }
}

int dt_comm_bench_allreduce(dt_comm *c, const struct dt_comm_bench_config *cfg_in, void *out_file) {
  struct dt_comm_bench_config cfg = DT_COMM_BENCH_CONFIG_INIT;
  if (cfg_in) cfg = *cfg_in;
  FILE *out = dt_comm_rank(c) == 0 ? out_file : NULL;
  size_t es = dt_dtype_size(cfg.dtype);
  if (!es || cfg.dtype == DT_U8) return dt__seterr(DT_EINVAL, "bench: dtype cannot be reduced");
  if (cfg.min_bytes < es) cfg.min_bytes = es;
  if (cfg.max_bytes < cfg.min_bytes) cfg.max_bytes = cfg.min_bytes;
  int n = dt_comm_size(c), r = dt_comm_rank(c);
  void *buf = dt_alloc(cfg.max_bytes + 64), *res = dt_alloc(cfg.max_bytes + 64);
  if (!buf || !res) {
    dt_free(buf), dt_free(res);
    return dt__seterr(DT_ENOMEM, "bench: cannot allocate %zu bytes", cfg.max_bytes);
  }
  memset(buf, 0, cfg.max_bytes);
  if (out) {
    fprintf(out, "# dtrain allreduce: %d ranks, transport %s, algo %s, dtype %s, op %s\n", n,
            n > 1 ? dt_comm_transport_name(c, (r + 1) % n) : "self", dt_algo_name(cfg.algo),
            dt_dtype_name(cfg.dtype), dt_redop_name(cfg.op));
    fprintf(out, "#%11s %12s %6s %6s %10s %9s %9s %7s\n", "size(B)", "count", "type", "redop",
            "time(us)", "algbw", "busbw", "#wrong");
    fprintf(out, "#%11s %12s %6s %6s %10s %9s %9s %7s\n", "", "(elements)", "", "", "", "(GB/s)",
            "(GB/s)", "");
    fflush(out);
  }
  int rc = DT_OK;
  for (size_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes && rc == DT_OK; bytes *= 2) {
    size_t count = bytes / es;
    int iters = cfg.iters > 0 ? cfg.iters : auto_iters(bytes);
    int warm = cfg.warmup > 0 ? cfg.warmup : (iters / 10 > 2 ? iters / 10 : 2);
    for (int i = 0; i < warm && rc == DT_OK; i++)
      rc = dt_comm_allreduce_algo(c, buf, buf, count, cfg.dtype, cfg.op, cfg.algo);
    if (rc == DT_OK) rc = dt_comm_barrier(c);
    double dt;
    if (cfg.median) {
      int64_t *ts = malloc((size_t)iters * sizeof *ts);
      if (!ts) { rc = dt__seterr(DT_ENOMEM, "bench: out of memory"); break; }
      int done = 0;
      for (int i = 0; i < iters && rc == DT_OK; i++, done++) {
        int64_t t0 = dt_now_ns();
        rc = dt_comm_allreduce_algo(c, buf, buf, count, cfg.dtype, cfg.op, cfg.algo);
        ts[i] = dt_now_ns() - t0;
      }
      qsort(ts, (size_t)done, sizeof *ts, cmp_i64);
      dt = done ? (double)ts[done / 2] * 1e-9 : 0;
      free(ts);
    } else {
      double t0 = dt_now();
      for (int i = 0; i < iters && rc == DT_OK; i++)
        rc = dt_comm_allreduce_algo(c, buf, buf, count, cfg.dtype, cfg.op, cfg.algo);
      dt = (dt_now() - t0) / iters;
    }
    double tmax = dt;
    if (rc == DT_OK) rc = dt_comm_allreduce(c, &dt, &tmax, 1, DT_F64, DT_OP_MAX);
    int64_t wrong = 0;
    if (rc == DT_OK && cfg.check) {
      fill(buf, count, cfg.dtype, r);
      rc = dt_comm_allreduce_algo(c, buf, res, count, cfg.dtype, cfg.op, cfg.algo);
      for (size_t i = 0; i < count && rc == DT_OK; i++) {
        double want;
        int64_t acc = (int64_t)((0 * 7 + i * 3) % 11) - 5;
        for (int q = 1; q < n; q++) {
          int64_t v = (int64_t)((q * 7 + i * 3) % 11) - 5;
          acc = cfg.op == DT_OP_MIN ? (v < acc ? v : acc) : cfg.op == DT_OP_MAX ? (v > acc ? v : acc) : acc + v;
        }
        want = (double)acc;
        double got = as_double(res, i, cfg.dtype);
        if (cfg.op == DT_OP_AVG) got *= n; /* compare the sum, with a tolerance for the division */
        if (got < want - 1e-2 * (1 + (want < 0 ? -want : want)) || got > want + 1e-2 * (1 + (want < 0 ? -want : want))) wrong++;
      }
      int64_t tot = wrong;
      if (rc == DT_OK) rc = dt_comm_allreduce(c, &wrong, &tot, 1, DT_I64, DT_OP_SUM);
      wrong = tot;
      memset(buf, 0, bytes);
    }
    if (rc == DT_OK && out) {
      double algbw = (double)bytes / tmax / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
      fprintf(out, " %11zu %12zu %6s %6s %10.2f %9.3f %9.3f %7lld\n", bytes, count,
              dt_dtype_name(cfg.dtype), dt_redop_name(cfg.op), tmax * 1e6, algbw, busbw,
              (long long)wrong);
      fflush(out);
    }
  }
  dt_free(buf);
  dt_free(res);
  return rc;
}

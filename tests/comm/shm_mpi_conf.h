/*
 * shm_mpi_conf.h — the conformance body shared by test_shm_comm.c (forked
 * ranks over shm) and test_mpi_ranks.c (ranks under mpirun over mpi): every
 * collective over counts {0, 1, 7, 1023, 1M+3}, checked against references
 * each rank computes locally. Failures are recorded per rank in a board the
 * including test provides (struct board *B, fields rc and msg).
 *
 * Exactness: inputs are small integers (|x| <= 8), so f32/f64/bf16 sums of
 * at most 8 ranks are exact in every summation order and compare with ==;
 * AVG divides an exact sum once, so it is compared with a relative
 * tolerance of 1e-6 (f32 rounding of one division). Integers are exact.
 * Header-only (static) so each test stays one executable.
 */
#ifndef DT_TEST_SHM_MPI_CONF_H
#define DT_TEST_SHM_MPI_CONF_H

#include "comm/comm.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 8
struct board {
  int rc[MAXR];
  double seconds[MAXR];
  char msg[MAXR][600];
  _Atomic int ready;
};
static struct board *B;

static void fail_rank(int r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_rank(int r, int rc, const char *fmt, ...) {
  if (B->rc[r]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(B->msg[r], sizeof B->msg[r], fmt, ap);
  va_end(ap);
  B->rc[r] = rc ? rc : DT_ECORRUPT;
}

static int val(int rank, size_t i) { return (int)((i * 7 + (size_t)rank * 13) % 17) - 8; }

static void fill(void *p, dt_dtype t, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) {
    int v = val(rank, i);
    switch (t) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_BF16: ((uint16_t *)p)[i] = dt_f32_to_bf16((float)v); break;
    case DT_I32: ((int32_t *)p)[i] = v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v * ((int64_t)1 << 33); break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)(v + 8 + rank * 3); break;
    default: break;
    }
  }
}

static double expect(dt_dtype t, dt_redop op, int n, size_t i) {
  double acc = 0;
  for (int r = 0; r < n; r++) {
    double v = val(r, i);
    if (t == DT_I64) v *= 8589934592.0;
    if (r == 0) acc = v;
    else if (op == DT_OP_SUM || op == DT_OP_AVG) acc += v;
    else if (op == DT_OP_MIN) acc = v < acc ? v : acc;
    else acc = v > acc ? v : acc;
  }
  if (op == DT_OP_AVG) {
    if (t == DT_I32 || t == DT_I64) acc = (double)(int64_t)(acc / n);
    else acc /= n;
  }
  return acc;
}

static double get(const void *p, dt_dtype t, size_t i) {
  switch (t) {
  case DT_F32: return ((const float *)p)[i];
  case DT_F64: return ((const double *)p)[i];
  case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
  case DT_I32: return ((const int32_t *)p)[i];
  case DT_I64: return (double)((const int64_t *)p)[i];
  default: return 0;
  }
}

static bool close_to(double got, double want, dt_redop op) {
  if (op != DT_OP_AVG) return got == want;
  return fabs(got - want) <= 1e-6 * fabs(want) + 1e-6;
}

/* Checks allreduce-type output. Returns the first bad index or -1. */
static long check_red(const void *out, dt_dtype t, dt_redop op, int n, size_t count, size_t off) {
  for (size_t i = 0; i < count; i++)
    if (!close_to(get(out, t, i), expect(t, op, n, off + i), op)) return (long)i;
  return -1;
}

static const size_t counts[] = {0, 1, 7, 1023, (1u << 20) + 3};

struct red_case { dt_dtype t; dt_redop op; };
static const struct red_case red_cases[] = {
    {DT_F32, DT_OP_SUM}, {DT_I32, DT_OP_MAX}, {DT_I64, DT_OP_MIN}, {DT_F64, DT_OP_AVG}, {DT_BF16, DT_OP_SUM},
};

static int body_conformance(dt_comm *c, int r, int n) {
  size_t maxc = (1u << 20) + 3;
  uint8_t *in = malloc(maxc * 8 * MAXR + 64), *out = malloc(maxc * 8 * MAXR + 64);
  if (!in || !out) return DT_ENOMEM;
  int rc = DT_OK;
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && !B->rc[r]; ci++) {
    size_t cnt = counts[ci];
    bool big = cnt > 4096;
    /* allreduce: every case with the automatic choice; big f32 sum with every algorithm */
    for (size_t k = 0; k < sizeof red_cases / sizeof red_cases[0]; k++) {
      const struct red_case *rcase = &red_cases[k];
      if (big && k > 1) break;
      fill(in, rcase->t, cnt, r);
      memset(out, 0x5a, cnt * dt_dtype_size(rcase->t));
      if ((rc = dt_comm_allreduce(c, in, out, cnt, rcase->t, rcase->op)))
        return fail_rank(r, rc, "allreduce %s %s n=%d count=%zu: %s", dt_dtype_name(rcase->t),
                         dt_redop_name(rcase->op), n, cnt, dt_comm_errmsg(c)), rc;
      long bad = check_red(out, rcase->t, rcase->op, n, cnt, 0);
      if (bad >= 0)
        return fail_rank(r, 0, "allreduce %s %s n=%d count=%zu: element %ld = %g, want %g",
                         dt_dtype_name(rcase->t), dt_redop_name(rcase->op), n, cnt, bad,
                         get(out, rcase->t, bad), expect(rcase->t, rcase->op, n, bad)), DT_ECORRUPT;
    }
    const dt_algo algos[] = {DT_ALGO_RING, DT_ALGO_RHD, DT_ALGO_TREE};
    for (int a = 0; a < 3; a++) {
      fill(out, DT_F32, cnt, r); /* in place */
      if ((rc = dt_comm_allreduce_algo(c, out, out, cnt, DT_F32, DT_OP_SUM, algos[a])))
        return fail_rank(r, rc, "allreduce %s in place n=%d count=%zu: %s", dt_algo_name(algos[a]),
                         n, cnt, dt_comm_errmsg(c)), rc;
      long bad = check_red(out, DT_F32, DT_OP_SUM, n, cnt, 0);
      if (bad >= 0)
        return fail_rank(r, 0, "allreduce %s n=%d count=%zu: element %ld wrong",
                         dt_algo_name(algos[a]), n, cnt, bad), DT_ECORRUPT;
    }
    /* broadcast from the last rank */
    int root = n - 1;
    fill(out, DT_I32, cnt, r == root ? 99 : r);
    if ((rc = dt_comm_broadcast(c, out, cnt, DT_I32, root)))
      return fail_rank(r, rc, "broadcast n=%d count=%zu: %s", n, cnt, dt_comm_errmsg(c)), rc;
    fill(in, DT_I32, cnt, 99);
    if (cnt && memcmp(in, out, cnt * 4))
      return fail_rank(r, 0, "broadcast n=%d count=%zu: wrong data", n, cnt), DT_ECORRUPT;
    /* reduce to rank 1 % n */
    root = 1 % n;
    fill(in, DT_I32, cnt, r);
    memset(out, 0, cnt * 4);
    if ((rc = dt_comm_reduce(c, in, out, cnt, DT_I32, DT_OP_SUM, root)))
      return fail_rank(r, rc, "reduce n=%d count=%zu: %s", n, cnt, dt_comm_errmsg(c)), rc;
    if (r == root && check_red(out, DT_I32, DT_OP_SUM, n, cnt, 0) >= 0)
      return fail_rank(r, 0, "reduce n=%d count=%zu: wrong data", n, cnt), DT_ECORRUPT;
    if (big) continue;
    /* allgather of bytes */
    fill(in, DT_U8, cnt, r);
    if ((rc = dt_comm_allgather(c, in, out, cnt, DT_U8)))
      return fail_rank(r, rc, "allgather n=%d count=%zu: %s", n, cnt, dt_comm_errmsg(c)), rc;
    for (int q = 0; q < n; q++) {
      fill(in, DT_U8, cnt, q);
      if (cnt && memcmp(in, out + (size_t)q * cnt, cnt))
        return fail_rank(r, 0, "allgather n=%d count=%zu: block %d wrong", n, cnt, q), DT_ECORRUPT;
    }
    /* reduce-scatter: block b of rank r's input is val(r, b*cnt + i) */
    fill(in, DT_I32, cnt * n, r);
    if ((rc = dt_comm_reduce_scatter(c, in, out, cnt, DT_I32, DT_OP_SUM)))
      return fail_rank(r, rc, "reduce_scatter n=%d count=%zu: %s", n, cnt, dt_comm_errmsg(c)), rc;
    if (check_red(out, DT_I32, DT_OP_SUM, n, cnt, (size_t)r * cnt) >= 0)
      return fail_rank(r, 0, "reduce_scatter n=%d count=%zu: wrong data", n, cnt), DT_ECORRUPT;
    /* alltoall: block j from rank i is (i*31 + j*7 + k) */
    for (int j = 0; j < n; j++)
      for (size_t k = 0; k < cnt; k++) in[(size_t)j * cnt + k] = (uint8_t)(r * 31 + j * 7 + k);
    if ((rc = dt_comm_alltoall(c, in, out, cnt, DT_U8)))
      return fail_rank(r, rc, "alltoall n=%d count=%zu: %s", n, cnt, dt_comm_errmsg(c)), rc;
    for (int i = 0; i < n; i++)
      for (size_t k = 0; k < cnt; k++)
        if (out[(size_t)i * cnt + k] != (uint8_t)(i * 31 + r * 7 + k))
          return fail_rank(r, 0, "alltoall n=%d count=%zu: block %d wrong", n, cnt, i), DT_ECORRUPT;
    if ((rc = dt_comm_barrier(c)))
      return fail_rank(r, rc, "barrier n=%d: %s", n, dt_comm_errmsg(c)), rc;
  }
  free(in);
  free(out);
  return DT_OK;
}

#endif

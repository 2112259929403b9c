/*
 * bench_pipe_gemm.c — what a pipeline stage's micro-batch products cost
 * against one process's whole-batch ones, at the deep MLP's shapes
 * (examples/fashion_deep_mlp.ini, batch 256, m = 8: 32-row products):
 * 256 rows as 8 products of 32 against 1 of 256, for the forward with
 * weights packed once (dt_sgemm_packed, as DTRAIN_PIPE_WPACK does) and the
 * input gradient (dt_sgemm, W read in place), on the first layer (784 ->
 * 2048) and the 2048 x 2048 ones, each over 3 weight matrices in turn
 * (48 MiB, so they stream from L3 or memory as in training), plus a
 * control: 512 x 512 weights (1 MiB), which stay in L2.
 *
 * Two conditions: "idle" (nothing else runs; one process's baseline runs
 * so, the second core idle) and "busy" (a forked child runs 256-row
 * 2048 x 2048 products on its own buffers the whole time, as the other
 * stage does). Times are this thread's CPU time (other processes taking
 * the core do not count), the minimum and the paired median ratio over
 * interleaved rounds. Output (one line per shape and condition, then the
 * summary):
 *
 *   <shape> <cond>: 8x32 <ms> ms, 1x256 <ms> ms (min, per 256 rows), ratio <r> (paired median)
 *   stage products (forward + input gradient, by stage 0's FLOPs): 32-row / 256-row idle <r>, busy <r>;
 *   256-row busy / idle <r>; 32-row busy / 256-row idle <r>
 *
 * The last figure is what a stage's products cost per row against the one
 * process's: the share of a stage's compute above its share of the model
 * that the GEMMs explain. Usage: bench_pipe_gemm [rounds [rows]] (default 9
 * rounds, ~1 s each on this 2-core host; rows per product 32, e.g. 64 for
 * m = 4). Build: cmake --build BUILD --target
 * bench_pipe_gemm. Needs dt_sgemm's own kernels (AVX-512 or AVX2); exits 77
 * without.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "tensor/tensor.h"

enum { NW = 3, ROWS = 256, MAXR = 64 };
static int MB = 32; /* rows per micro-batch product (argv[2]) */

static double cpu_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmpd);
  return v[n / 2];
}

static float *rnd(size_t n, uint64_t seed) {
  float *p = dt_alloc(n * sizeof(float));
  if (!p) exit(1);
  dt_rng_uniform(p, n, -1.0f, 1.0f, seed, DT_RNG_USER, 0);
  return p;
}

typedef struct {
  const char *name;
  int in, out, dgrad; /* forward: x(rows, in) W^T, W (out, in); dgrad: dy(rows, out) W */
  int nw;             /* weight matrices cycled */
  int uses;           /* products of this shape per micro-batch on stage 0 (cut at 7) */
  float *w[NW], *wp[NW];
} shape;

/* ROWS rows through weight matrix l as products of mb rows. */
static void rows(const shape *s, int l, int mb, const float *x, float *y) {
  for (int r0 = 0; r0 < ROWS; r0 += mb) {
    if (s->dgrad)
      dt_sgemm(0, 0, mb, s->in, s->out, 1.0f, x + (size_t)r0 * s->out, s->out, s->w[l], s->in,
               0.0f, y + (size_t)r0 * s->in, s->in);
    else
      dt_sgemm_packed(mb, s->out, s->in, 1.0f, x + (size_t)r0 * s->in, s->in, s->wp[l], 0.0f,
                      y + (size_t)r0 * s->out, s->out);
  }
}

/* The other stage: 256-row 2048 x 2048 products until killed. */
static void busy_loop(void) {
  float *w = rnd((size_t)2048 * 2048, 91), *x = rnd((size_t)ROWS * 2048, 92);
  float *y = rnd((size_t)ROWS * 2048, 93);
  for (;;) dt_sgemm(0, 1, ROWS, 2048, 2048, 1.0f, x, 2048, w, 2048, 0.0f, y, 2048);
}

int main(int argc, char **argv) {
  int R = argc > 1 ? atoi(argv[1]) : 9;
  if (R < 1) R = 1;
  if (R > MAXR) R = MAXR;
  if (argc > 2) MB = atoi(argv[2]);
  if (MB < 1 || ROWS % MB) {
    fprintf(stderr, "bench_pipe_gemm: rows per product must divide %d\n", ROWS);
    return 2;
  }
  dt_tensor_set_threads(1);
  if (strcmp(dt_tensor_gemm_impl(), "blas") == 0 || !dt_sgemm_packb_floats(1, 64, 64)) {
    printf("bench_pipe_gemm: dt_sgemm does not run its own kernels here (%s); nothing to measure\n",
           dt_tensor_gemm_impl());
    return 77;
  }
  shape sh[] = {
      {"fwd 784->2048 (packed W)", 784, 2048, 0, NW, 1, {0}, {0}},
      {"fwd 2048->2048 (packed W)", 2048, 2048, 0, NW, 2, {0}, {0}},
      {"dgrad 2048->2048 (W in place)", 2048, 2048, 1, NW, 2, {0}, {0}},
      {"control: fwd 512->512, L2-resident", 512, 512, 0, 1, 0, {0}, {0}},
  };
  const int NS = (int)(sizeof sh / sizeof *sh);
  for (int i = 0; i < NS; i++)
    for (int l = 0; l < sh[i].nw; l++) {
      shape *s = &sh[i];
      s->w[l] = rnd((size_t)s->out * s->in, 10 + 3 * i + l);
      if (!s->dgrad) {
        s->wp[l] = dt_alloc(dt_sgemm_packb_floats(1, s->in, s->out) * sizeof(float));
        if (!s->wp[l]) return 1;
        dt_sgemm_packb(1, s->in, s->out, s->w[l], s->in, s->wp[l]);
      }
    }
  float *x = rnd((size_t)ROWS * 2048, 1), *y = rnd((size_t)ROWS * 2048, 2);
  /* t[cond][shape][mb 32 / 256][round], ms per ROWS rows per weight matrix */
  static double t[2][8][2][MAXR];
  double flops[8];
  for (int cond = 0; cond < 2; cond++) {
    pid_t child = -1;
    if (cond == 1) {
      fflush(stdout);
      child = fork();
      if (child == 0) busy_loop();
      if (child < 0) {
        perror("fork");
        return 1;
      }
      struct timespec ts = {0, 200 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    for (int r = 0; r < R; r++)
      for (int i = 0; i < NS; i++)
        for (int q = 0; q < 2; q++) {
          int k = (r & 1) ? 1 - q : q; /* order alternates */
          int mb = k ? ROWS : MB, reps = sh[i].nw == 1 ? NW : 1;
          double t0 = cpu_ms();
          for (int p = 0; p < reps; p++)
            for (int l = 0; l < sh[i].nw; l++) rows(&sh[i], l, mb, x, y);
          t[cond][i][k][r] = (cpu_ms() - t0) / NW;
        }
    if (child > 0) {
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
    }
  }
  static const char *cn[] = {"idle", "busy"};
  double ratio[2] = {0, 0}, r256 = 0, rall = 0, fsum = 0;
  for (int i = 0; i < NS; i++) {
    flops[i] = 2.0 * ROWS * sh[i].in * sh[i].out;
    const double wgt = flops[i] * sh[i].uses;
    for (int cond = 0; cond < 2; cond++) {
      double pr[MAXR];
      for (int r = 0; r < R; r++) pr[r] = t[cond][i][0][r] / t[cond][i][1][r];
      double rm = median(pr, R);
      double m32[MAXR], m256[MAXR];
      memcpy(m32, t[cond][i][0], sizeof(double) * R);
      memcpy(m256, t[cond][i][1], sizeof(double) * R);
      qsort(m32, (size_t)R, sizeof(double), cmpd);
      qsort(m256, (size_t)R, sizeof(double), cmpd);
      printf("%-36s %s: %dx%d %7.3f ms, 1x256 %7.3f ms (min, per 256 rows; %.0f GFLOP/s), ratio %.3f (paired median)\n",
             sh[i].name, cn[cond], ROWS / MB, MB, m32[0], m256[0], flops[i] / m256[0] * 1e-6, rm);
      ratio[cond] += wgt * rm;
    }
    if (sh[i].uses) {
      double b[MAXR], a[MAXR];
      for (int r = 0; r < R; r++) b[r] = t[1][i][1][r], a[r] = t[0][i][1][r];
      double busy256 = median(b, R), idle256 = median(a, R);
      for (int r = 0; r < R; r++) b[r] = t[1][i][0][r];
      r256 += wgt * busy256 / idle256;
      rall += wgt * median(b, R) / idle256;
      fsum += wgt;
    }
  }
  printf("stage 0's products (forward + input gradient, by FLOPs): %d-row / 256-row idle %.3f, busy %.3f; "
         "256-row busy / idle %.3f; %d-row busy / 256-row idle %.3f\n",
         MB, ratio[0] / fsum, ratio[1] / fsum, r256 / fsum, MB, rall / fsum);
  return 0;
}

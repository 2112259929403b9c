/*
 * mpi_allreduce.c — peer baseline for `make bench-comm`: Open MPI's
 * MPI_Allreduce (float sum) timed the way nccl-tests and `dtrain bench
 * allreduce` time it, so the columns line up: bytes, count, time_us, algbw,
 * busbw with busbw = algbw * 2(n-1)/n. It measures only the library call on
 * already-allocated buffers; it does not check results beyond one sanity
 * value (a wrong sum would make the comparison meaningless).
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 * Run:   mpirun --allow-run-as-root --oversubscribe -n N ./mpi_allreduce [MIN_BYTES [MAX_BYTES [ITERS [median]]]]
 * (ITERS: timed calls per size instead of the default by size; 0 keeps the
 * default. "median": time = the median of calls timed one by one, as
 * `dtrain bench allreduce --time median`.)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int iters_for(size_t bytes) {
  return bytes < (256u << 10) ? 200 : (bytes < (16u << 20) ? 20 : 5);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minb = argc > 1 ? strtoull(argv[1], 0, 10) : 4;
  size_t maxb = argc > 2 ? strtoull(argv[2], 0, 10) : (64u << 20);
  int fixed_iters = argc > 3 ? atoi(argv[3]) : 0;
  int median = argc > 4 && !strcmp(argv[4], "median");
  if (minb < 4) minb = 4;
  size_t maxc = maxb / 4;
  float *a = malloc(maxc * 4), *b = malloc(maxc * 4);
  if (!a || !b) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < maxc; i++) a[i] = (float)(i % 7) + rank;
  if (!rank)
    printf("# peer=openmpi ranks=%d\n%12s %12s %12s %12s %12s\n", n, "bytes", "count",
           "time_us", "algbw_GBps", "busbw_GBps");
  for (size_t c = minb / 4; c <= maxc; c *= 4) {
    int iters = fixed_iters > 0 ? fixed_iters : iters_for(c * 4);
    MPI_Allreduce(a, b, (int)c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    float want = 0;
    for (int r = 0; r < n; r++) want += (float)((c - 1) % 7) + r;
    if (b[c - 1] != want) {
      fprintf(stderr, "mpi_allreduce: wrong sum %g != %g at count %zu\n", b[c - 1], want, c);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t;
    if (median) {
      double *ts = malloc((size_t)iters * sizeof *ts);
      if (!ts) MPI_Abort(MPI_COMM_WORLD, 1);
      for (int i = 0; i < iters; i++) {
        double t0 = MPI_Wtime();
        MPI_Allreduce(a, b, (int)c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        ts[i] = MPI_Wtime() - t0;
      }
      qsort(ts, (size_t)iters, sizeof *ts, cmp_d);
      t = ts[iters / 2];
      free(ts);
    } else {
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; i++) MPI_Allreduce(a, b, (int)c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t = (MPI_Wtime() - t0) / iters;
    }
    /* The slowest rank defines the collective's time. */
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double alg = c * 4.0 / t / 1e9;
    if (!rank)
      printf("%12zu %12zu %12.2f %12.3f %12.3f\n", c * 4, c, t * 1e6, alg, alg * 2.0 * (n - 1) / n);
    fflush(stdout);
  }
  free(a);
  free(b);
  MPI_Finalize();
  return 0;
}

/*
 * bench_ckpt_write.c — the checkpoint writer alone (bench/ckpt.sh section
 * 2b): a snapshot the size of the wide MLP's (examples/fashion_wide_mlp.ini:
 * 20.0M parameters in model.safetensors plus as many floats of SGD momentum
 * in state.safetensors, 160 MB) written REPS times with dt__ckpt_write
 * exactly as the background thread writes it (hashed while written,
 * streamed, fsynced, renamed, `latest` replaced, keep 1), timed from the
 * call to its return. Prints one line per write and the median in MB/s, so
 * bench/ckpt.sh can put it beside `dd oflag=direct` without a training run
 * competing for the two cores, and the CPU seconds each write used (hashing
 * and copying into the page cache), which bound it on a busy machine.
 *
 *   bench_ckpt_write DIR [FLOATS [REPS]]
 *
 * It measures; it checks nothing beyond the writes' return codes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ckpt/ckpt.h"

/* CPU seconds (user + system) this process has used. */
static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
         (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_ckpt_write DIR [FLOATS [REPS]]\n");
    return 2;
  }
  size_t n = argc > 2 ? (size_t)atoll(argv[2]) : 20037642; /* the wide MLP's parameters */
  int reps = argc > 3 ? atoi(argv[3]) : 5;
  if (reps < 1 || reps > 100) reps = 5;
  float *w = dt_alloc(n * sizeof(float)), *m = dt_alloc(n * sizeof(float));
  if (!w || !m) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++) w[i] = (float)(i % 1000) * 1e-3f, m[i] = -w[i];
  double *mbs = calloc((size_t)reps, sizeof *mbs);
  dt_ckpt_snap s;
  memset(&s, 0, sizeof s);
  for (int r = 0; r < reps; r++) {
    dt__snap_reset(&s, r + 1, 0);
    dt_st *st;
    int64_t shape[1] = {(int64_t)n};
    if (dt__snap_st(&s, "model.safetensors", "rank0", "model", &st) ||
        dt__st_add(st, "0.weight", DT_ST_F32, 1, shape, w) ||
        dt__snap_st(&s, "state.safetensors", "rank0", "state", &st) ||
        dt__st_add(st, "strategy/optim", DT_ST_F32, 1, shape, m) ||
        dt__snap_text(&s, "trainer.json", "rank0", "trainer", "{}", 2)) {
      fprintf(stderr, "snapshot: %s\n", dt_errmsg());
      return 1;
    }
    double t0 = dt_now(), c0 = cpu_seconds();
    if (dt__ckpt_write(argv[1], &s, 1, NULL, 0) < 0) {
      fprintf(stderr, "write: %s\n", dt_errmsg());
      return 1;
    }
    double t = dt_now() - t0, cpu = cpu_seconds() - c0;
    mbs[r] = 2.0 * (double)n * sizeof(float) / t / 1e6;
    /* the CPU the write needed: on an idle core it could not go faster
     * than bytes / cpu, whatever the disk */
    printf("write %d: %.1f MB in %.3f s, %.0f MB/s; %.3f s of CPU (%.0f MB/s per CPU second)\n",
           r + 1, 2.0 * (double)n * 4 / 1e6, t, mbs[r], cpu,
           cpu > 0 ? 2.0 * (double)n * 4 / cpu / 1e6 : 0);
  }
  qsort(mbs, (size_t)reps, sizeof *mbs, cmp);
  printf("median %.0f MB/s\n", reps % 2 ? mbs[reps / 2] : (mbs[reps / 2 - 1] + mbs[reps / 2]) / 2);
  dt__snap_free(&s);
  dt_free(w);
  dt_free(m);
  free(mbs);
  return 0;
}

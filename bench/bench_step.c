/*
 * bench_step.c — samples/s of a pure in-memory training step (forward,
 * softmax cross-entropy, backward, SGD momentum 0.9) at batch 64, one
 * thread, random data, for the MLP 784-256-128-10 and the 2-conv CNN. No data
 * loading, no evaluation: it measures the NN core alone.
 *
 * Build and run (not built by default):
 *   cmake --build BUILD --target bench_step && BUILD/bench_step [seconds] [mlp|cnn]
 * The last figure, samples per second of this thread's CPU time, is the
 * steadier one on a loaded machine. One thread; the GEMM back end is chosen as in dtrain train (DTRAIN_GEMM).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "nn/nn.h"
#include "tensor/tensor.h"

static const char *MLP = "flatten linear(256) relu linear(128) relu linear(10)";
static const char *CNN =
    "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(128) relu "
    "linear(10)";

/* CPU time of this thread: on a shared machine wall time mostly measures
 * the other processes, CPU time much less so. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench(const char *name, const char *spec, double seconds) {
  enum { B = 64, NB = 16 };
  dt_model *m = NULL;
  if (dt_model_create(&m, spec, 1, 28, 28, B) != DT_OK) {
    fprintf(stderr, "%s: %s\n", name, dt_errmsg());
    return 1;
  }
  dt_model_init(m, 1);
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.momentum = 0.9f;
  dt_optim *o = NULL;
  if (dt_optim_create(&o, &oc, dt_model_nparams(m)) != DT_OK) return 1;
  size_t D = (size_t)dt_model_in_dim(m);
  float *x = malloc((size_t)NB * B * D * sizeof(float));
  int32_t *y = malloc((size_t)NB * B * sizeof(int32_t));
  dt_rng_uniform(x, (size_t)NB * B * D, 0.0f, 1.0f, 42, DT_RNG_USER, 0);
  for (int i = 0; i < NB * B; i++) y[i] = i % 10;
  float loss = 0.0f;
  int64_t steps = 0;
  double t0 = 0.0, c0 = 0.0;
  for (int phase = 0; phase < 2; phase++) { /* 0: warm-up, 1: timed */
    double limit = phase ? seconds : seconds / 5;
    steps = 0;
    t0 = dt_now();
    c0 = cpu_now();
    while (dt_now() - t0 < limit) {
      for (int k = 0; k < 10; k++, steps++) {
        int b = (int)(steps % NB);
        dt_step_ctx ctx = {1, 1, (uint64_t)steps, steps * B};
        dt_model_forward(m, x + (size_t)b * B * D, B, &ctx);
        dt_model_backward(m, y + (size_t)b * B, B, &loss, NULL, NULL, NULL);
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), oc.lr);
      }
    }
  }
  double dt = dt_now() - t0, dc = cpu_now() - c0;
  double sps = (double)steps * B / dt, cps = (double)steps * B / dc;
  double gflops = sps * dt_model_flops_per_sample(m, 1) / 1e9;
  printf("%-4s params %zu  steps %lld  %.0f samples/s  %.1f GFLOP/s  (last loss %.4f)  "
         "%.0f samples per CPU second\n", name, dt_model_nparams(m), (long long)steps, sps, gflops,
         loss, cps);
  free(x);
  free(y);
  dt_optim_destroy(o);
  dt_model_destroy(m);
  return 0;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  const char *only = argc > 2 ? argv[2] : "";
  dt_tensor_set_threads(1);
  printf("one thread, batch 64, SGD momentum 0.9; GEMM back end %s, OpenBLAS core %s\n",
         dt_tensor_gemm_impl(), dt_tensor_blas_core());
  int rc = 0;
  if (strcmp(only, "cnn")) rc |= bench("mlp", MLP, seconds);
  if (strcmp(only, "mlp")) rc |= bench("cnn", CNN, seconds);
  return rc;
}

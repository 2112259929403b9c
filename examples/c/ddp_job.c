/*
 * ddp_job.c — a 2-worker data-parallel job through libdtrain's API: the
 * launcher (this process) reads Fashion-MNIST and creates the engine for
 * the 784-256-128-10 MLP once, then dt_job_run forks two workers that
 * share that memory copy-on-write. Each worker gets a joined communicator,
 * attaches it to its engine and trains: every global batch of 64 samples is
 * split 32 + 32 over the workers and the gradients are averaged (the "ddp"
 * strategy), so the result matches one worker's. Rank 0 prints the test
 * accuracy.
 *
 *   cc ddp_job.c $(pkg-config --cflags --libs dtrain) -o ddp_job
 *   ./ddp_job [EPOCHS [DATA_DIR]]       (defaults: 1, /usr/share/datasets/fashion-mnist)
 *
 * One epoch reaches a test accuracy of about 0.86.
 */
#include <stdio.h>
#include <stdlib.h>

#include <dtrain.h>

#define WORKERS 2

/* Runs in each forked worker; returns its exit status. */
static int worker(const struct dt_job_worker *w, void *arg) {
  dt_engine *e = arg; /* this worker's copy of the launcher's engine */
  dt_run_summary sum;
  int rc = dt_engine_set_comm(e, w->comm);
  if (rc == DT_OK) rc = dt_engine_run(e, NULL, NULL, NULL, &sum);
  if (rc < 0) {
    fprintf(stderr, "ddp_job: rank %d: %s: %s\n", w->rank, dt_strerror(rc), dt_errmsg());
    return 1;
  }
  if (w->rank == 0) {
    printf("rank 0 of %d: %lld steps, %.0f samples/s over the job\n", w->size,
           (long long)sum.steps, sum.samples_per_second);
    printf("test accuracy %.4f  test loss %.4f\n", sum.test_accuracy, sum.test_loss);
    fflush(stdout); /* the worker process ends without unwinding stdio */
  }
  return 0;
}

int main(int argc, char **argv) {
  int epochs = argc > 1 ? atoi(argv[1]) : 1;
  const char *dir = argc > 2 ? argv[2] : DT_FASHION_DIR;
  if (epochs < 1) {
    fprintf(stderr, "usage: ddp_job [EPOCHS [DATA_DIR]]\n");
    return 2;
  }
  dt_run_cfg cfg;
  dt_run_cfg_defaults(&cfg);
  snprintf(cfg.layers, sizeof cfg.layers, "flatten linear(256) relu linear(128) relu linear(10)");
  snprintf(cfg.train_images, sizeof cfg.train_images, "%s/train-images-idx3-ubyte.gz", dir);
  snprintf(cfg.train_labels, sizeof cfg.train_labels, "%s/train-labels-idx1-ubyte.gz", dir);
  snprintf(cfg.test_images, sizeof cfg.test_images, "%s/t10k-images-idx3-ubyte.gz", dir);
  snprintf(cfg.test_labels, sizeof cfg.test_labels, "%s/t10k-labels-idx1-ubyte.gz", dir);
  cfg.format = DT_FMT_IDX;
  cfg.optim.lr = 0.05f;
  cfg.optim.momentum = 0.9f;
  cfg.optim.weight_decay = 0.0f;
  cfg.sched.kind = DT_SCHED_COSINE;
  cfg.epochs = epochs;
  cfg.batch = 64; /* the global batch */
  cfg.seed = 42;
  cfg.workers = WORKERS;

  dt_engine *e = NULL;
  dt_job *job = NULL;
  /* With workers > 1 the engine starts no thread, so this process may fork. */
  int rc = dt_engine_create(&e, &cfg);
  struct dt_job_config jc = DT_JOB_CONFIG_INIT;
  jc.workers = WORKERS;
  if (rc == DT_OK) rc = dt_job_create(&job, &jc);
  if (rc == DT_OK) rc = dt_job_run(job, worker, e);
  if (rc < 0) fprintf(stderr, "ddp_job: %s: %s\n", dt_strerror(rc), dt_errmsg());
  dt_job_destroy(job);
  dt_engine_destroy(e);
  return rc < 0;
}

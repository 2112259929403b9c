/*
 * train_loop.c — the Fashion-MNIST MLP of train_mlp.c (784-256-128-10)
 * with a training loop of your own instead of the engine's: datasets read
 * from IDX files and normalised with the training set's statistics, a model
 * built layer by layer, SGD with momentum under a cosine schedule, and the
 * forward / backward / optimizer-step calls over shuffled batches. Prints
 * the test accuracy. Use it as the starting point for a loop the engine
 * does not offer.
 *
 *   cc train_loop.c $(pkg-config --cflags --libs dtrain) -o train_loop
 *   ./train_loop [EPOCHS [DATA_DIR]]    (defaults: 1, /usr/share/datasets/fashion-mnist)
 *
 * One epoch reaches a test accuracy of about 0.86.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dtrain.h>

#define BATCH 64

/* Prints what failed and returns 1 from main. */
#define TRY(call)                                                                    \
  do {                                                                               \
    int rc_ = (call);                                                                \
    if (rc_ < 0) {                                                                   \
      fprintf(stderr, "train_loop: %s: %s\n", dt_strerror(rc_), dt_errmsg());         \
      goto out;                                                                      \
    }                                                                                \
  } while (0)

/* A permutation of 0..n-1 for one epoch (xorshift64*, Fisher-Yates). */
static void shuffle(int64_t *order, int64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) order[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    int64_t j = (int64_t)((s * 0x2545F4914F6CDD1Dull) % (uint64_t)(i + 1));
    int64_t t = order[i];
    order[i] = order[j], order[j] = t;
  }
}

/* Mean loss and accuracy of m over ds, in batches. */
static int evaluate(dt_model *m, const dt_dataset *ds, double *loss, double *acc) {
  double sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < ds->n; i += BATCH) {
    int n = (int)(ds->n - i < BATCH ? ds->n - i : BATCH);
    float l;
    int nc;
    int rc = dt_model_forward(m, ds->x + i * ds->dim, n, NULL);
    if (rc == DT_OK) rc = dt_model_loss(m, ds->y + i, n, &l, &nc);
    if (rc < 0) return rc;
    sum += (double)l * n;
    correct += nc;
  }
  *loss = sum / (double)ds->n;
  *acc = (double)correct / (double)ds->n;
  return DT_OK;
}

int main(int argc, char **argv) {
  int epochs = argc > 1 ? atoi(argv[1]) : 1;
  const char *dir = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  int status = 1;
  dt_dataset train = {0}, test = {0};
  dt_model_builder *b = NULL;
  dt_model *m = NULL;
  dt_optim *opt = NULL;
  int64_t *order = NULL;
  float *x = NULL;
  int32_t y[BATCH];
  char p1[1024], p2[1024];
  if (epochs < 1) {
    fprintf(stderr, "usage: train_loop [EPOCHS [DATA_DIR]]\n");
    return 2;
  }

  /* Data: the files as Debian's dataset-fashion-mnist installs them. */
  snprintf(p1, sizeof p1, "%s/train-images-idx3-ubyte.gz", dir);
  snprintf(p2, sizeof p2, "%s/train-labels-idx1-ubyte.gz", dir);
  TRY(dt_idx_load(&train, p1, p2));
  snprintf(p1, sizeof p1, "%s/t10k-images-idx3-ubyte.gz", dir);
  snprintf(p2, sizeof p2, "%s/t10k-labels-idx1-ubyte.gz", dir);
  TRY(dt_idx_load(&test, p1, p2));
  float mean, std;
  TRY(dt_dataset_stats(&train, &mean, &std));
  TRY(dt_dataset_normalize(&train, mean, std));
  TRY(dt_dataset_normalize(&test, mean, std)); /* the training set's statistics */

  /* Model: 784-256-128-10, one layer at a time. */
  TRY(dt_model_builder_create(&b, train.c, train.h, train.w));
  const char *layers[] = {"flatten", "linear(256)", "relu", "linear(128)", "relu", "linear(10)"};
  for (size_t i = 0; i < sizeof layers / sizeof *layers; i++) TRY(dt_model_add(b, layers[i]));
  TRY(dt_model_build(b, BATCH, &m));
  TRY(dt_model_init(m, 42));
  printf("model: %s, %zu parameters; %lld train / %lld test samples\n",
         dt_model_builder_spec(b), dt_model_nparams(m), (long long)train.n, (long long)test.n);

  /* SGD with momentum, cosine decay to 0 over the whole run. */
  dt_optim_cfg oc = DT_OPTIM_CFG_INIT;
  oc.lr = 0.05f, oc.momentum = 0.9f;
  TRY(dt_optim_create(&opt, &oc, dt_model_nparams(m)));
  int64_t steps_per_epoch = (train.n + BATCH - 1) / BATCH;
  dt_sched_cfg sc = DT_SCHED_CFG_INIT;
  sc.kind = DT_SCHED_COSINE, sc.base_lr = oc.lr, sc.total_steps = steps_per_epoch * epochs;
  TRY(dt_sched_check(&sc));

  order = malloc(sizeof *order * (size_t)train.n);
  x = malloc(sizeof *x * BATCH * (size_t)train.dim);
  if (!order || !x) {
    fprintf(stderr, "train_loop: out of memory\n");
    goto out;
  }
  int64_t step = 0;
  for (int ep = 1; ep <= epochs; ep++) {
    shuffle(order, train.n, (uint64_t)ep);
    double loss_sum = 0;
    for (int64_t i = 0; i < train.n; i += BATCH, step++) {
      int n = (int)(train.n - i < BATCH ? train.n - i : BATCH);
      for (int k = 0; k < n; k++) { /* gather the batch */
        int64_t s = order[i + k];
        memcpy(x + (size_t)k * train.dim, train.x + s * train.dim, sizeof *x * train.dim);
        y[k] = train.y[s];
      }
      dt_step_ctx ctx = {1, 42, (uint64_t)step, i};
      float loss;
      TRY(dt_model_forward(m, x, n, &ctx));
      TRY(dt_model_backward(m, y, n, &loss, NULL, NULL, NULL));
      TRY(dt_optim_step(opt, dt_model_params(m), dt_model_grads(m), dt_sched_lr(&sc, step)));
      loss_sum += loss;
    }
    double tl, ta;
    TRY(evaluate(m, &test, &tl, &ta));
    printf("epoch %d  train_loss %.4f  test_loss %.4f  test_acc %.4f\n", ep,
           loss_sum / (double)steps_per_epoch, tl, ta);
    if (ep == epochs) printf("test accuracy %.4f\n", ta);
  }
  status = 0;
out:
  free(order);
  free(x);
  dt_optim_destroy(opt);
  dt_model_destroy(m);
  dt_model_builder_destroy(b);
  dt_dataset_free(&train);
  dt_dataset_free(&test);
  return status;
}

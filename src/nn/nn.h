/*
 * nn.h — models, optimizers and schedules.
 *
 * A model is an ordered list of layers built from a one-line spec
 * ("conv(32,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)").
 * Its parameters live in ONE contiguous float buffer and its gradients in
 * ANOTHER, laid out in forward layer order (within a layer: weight, then
 * bias, PyTorch's state_dict order), so buckets, broadcasts, checkpoints and
 * compression work on spans of one array. Non-trainable state (batchnorm
 * running statistics) lives in a third flat buffer.
 */
#ifndef DT_NN_H
#define DT_NN_H

#include <stddef.h>
#include <stdint.h>

#include "nn/kernels.h"

typedef struct dt_model dt_model;

enum dt_layer_kind {
  DT_L_LINEAR, DT_L_CONV2D, DT_L_MAXPOOL2D, DT_L_AVGPOOL2D, DT_L_RELU, DT_L_GELU,
  DT_L_DROPOUT, DT_L_FLATTEN, DT_L_LAYERNORM, DT_L_BATCHNORM
};

/* Read-only description of one layer, for tools (DDP buckets, checkpoints,
 * printing). Offsets are in floats into the flat buffers. */
typedef struct dt_layer_info {
  int kind;
  const char *name;      /* "linear", "conv", ... */
  int in_c, in_h, in_w;  /* per-sample input shape (in_h = in_w = 1 for vectors) */
  int out_c, out_h, out_w;
  size_t param_off, nparams; /* span in params/grads */
  size_t buf_off, nbufs;     /* span in the state buffer */
  double fwd_flops;          /* per sample */
} dt_layer_info;

/* Builds a model from `spec` for per-sample input shape (c,h,w), with
 * activation storage for batches up to max_batch. Errors (DT_EINVAL) name
 * the offending token and layer, e.g. "layer 3 'linear(128)': expects ..." or
 * "unknown layer 'conv3d'". The last layer's output size is the number of
 * classes. */
int dt_model_create(dt_model **out, const char *spec, int c, int h, int w, int max_batch);
void dt_model_destroy(dt_model *m); /* NULL is a no-op */

/* PyTorch-default initialisation (kaiming-uniform weights, uniform biases in
 * +-1/sqrt(fan_in), norms weight 1 bias 0), a pure function of seed. */
void dt_model_init(dt_model *m, uint64_t seed);

size_t dt_model_nparams(const dt_model *m);
float *dt_model_params(dt_model *m);
float *dt_model_grads(dt_model *m);
/* Moves the gradient buffer to caller memory of dt_model_nparams floats,
 * 64-byte aligned (e.g. a shared-memory window peers can read); the current
 * gradients are copied. NULL moves it back to the model's own buffer. The
 * caller's memory must outlive its use; the model never frees it. */
void dt_model_set_grads(dt_model *m, float *grads);
size_t dt_model_nbufs(const dt_model *m);
float *dt_model_bufs(dt_model *m);
int dt_model_nlayers(const dt_model *m);
const dt_layer_info *dt_model_layer(const dt_model *m, int i);
int dt_model_out_dim(const dt_model *m);   /* classes */
int dt_model_in_dim(const dt_model *m);    /* c*h*w */
double dt_model_flops_per_sample(const dt_model *m, int train); /* fwd, or fwd+bwd */

/* Per-step context: train toggles dropout/batchnorm behaviour; dropout masks
 * are keyed by (seed, step, sample0 + i). */
typedef struct dt_step_ctx {
  int train;
  uint64_t seed;
  uint64_t step;
  int64_t sample0;
} dt_step_ctx;

/* Forward pass of B <= max_batch samples x (B, in_dim). Returns the logits
 * (B, out_dim), owned by the model, valid until the next forward. */
const float *dt_model_forward(dt_model *m, const float *x, int B, const dt_step_ctx *ctx);

/* Called after each layer's backward with that layer's gradient span, in
 * reverse layer order, so a caller can start reducing it while backward goes
 * on (DDP buckets). */
typedef void (*dt_grad_ready_fn)(void *ud, size_t off, size_t n);

/* Loss and backward for the last forward: softmax cross-entropy against
 * labels (B). Overwrites the gradient buffer. Returns the mean loss; counts
 * correct predictions into *ncorrect if not NULL. on_ready may be NULL. */
float dt_model_backward(dt_model *m, const int32_t *labels, int B, int *ncorrect,
                        dt_grad_ready_fn on_ready, void *ud);

/* Loss and correct count of the last forward without computing gradients. */
float dt_model_loss(dt_model *m, const int32_t *labels, int B, int *ncorrect);

/* ---- optimizers over flat buffers --------------------------------------- */

enum dt_optim_kind { DT_OPT_SGD, DT_OPT_ADAMW };

typedef struct dt_optim_cfg {
  int kind;
  float lr;
  float momentum;     /* SGD */
  float dampening;    /* SGD */
  int nesterov;       /* SGD */
  float weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
  float beta1, beta2, eps; /* AdamW */
} dt_optim_cfg;
#define DT_OPTIM_CFG_INIT {DT_OPT_SGD, 0.01f, 0.0f, 0.0f, 0, 0.0f, 0.9f, 0.999f, 1e-8f}

typedef struct dt_optim dt_optim;
/* Creates optimizer state (momentum / Adam moments) for n parameters. */
int dt_optim_create(dt_optim **out, const dt_optim_cfg *cfg, size_t n);
void dt_optim_destroy(dt_optim *o);
/* One update of params from grads with learning rate lr (the schedule's
 * value for this step). PyTorch semantics (torch.optim.SGD / AdamW). */
void dt_optim_step(dt_optim *o, float *params, const float *grads, float lr);
/* Flat optimizer state for checkpoints: nstate floats plus the step count. */
size_t dt_optim_state_floats(const dt_optim *o);
float *dt_optim_state(dt_optim *o);
int64_t *dt_optim_step_count(dt_optim *o);

/* ---- learning-rate schedules -------------------------------------------- */

enum dt_sched_kind { DT_SCHED_CONSTANT, DT_SCHED_STEP, DT_SCHED_COSINE };
typedef struct dt_sched_cfg {
  int kind;
  float base_lr;
  int64_t warmup_steps;  /* linear warm-up from base_lr/warmup to base_lr */
  int64_t total_steps;   /* cosine: decay to min_lr at total_steps */
  int64_t step_size;     /* step: multiply by gamma every step_size steps */
  float gamma;
  float min_lr;
} dt_sched_cfg;
#define DT_SCHED_CFG_INIT {DT_SCHED_CONSTANT, 0.01f, 0, 0, 1, 0.1f, 0.0f}
float dt_sched_lr(const dt_sched_cfg *s, int64_t step);

#endif /* DT_NN_H */

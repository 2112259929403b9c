/*
 * dtrain/model.h — neural network models: built from a one-line spec or
 * layer by layer, initialised, run forward and backward on caller batches.
 *
 * A model is an ordered list of layers over ONE contiguous float buffer of
 * parameters and ANOTHER of gradients, laid out in forward layer order
 * (within a layer: weight, then bias — PyTorch's state_dict order), plus a
 * third for non-trainable state (batchnorm running statistics). Activations
 * for batches of up to max_batch samples are allocated once at creation: a
 * training step allocates nothing.
 *
 * The layer language (one token per layer, separated by spaces):
 *   linear(OUT)                    fully connected, OUT outputs
 *   conv(OUT,K[,stride=S][,pad=P]) 2-D convolution, K x K kernel
 *   maxpool(K[,S]) avgpool(K[,S])  2-D pooling (stride defaults to K)
 *   relu gelu                      activations
 *   dropout(P)                     dropout with probability P (training only)
 *   flatten                        (c,h,w) -> c*h*w
 *   layernorm batchnorm            normalisation (PyTorch defaults)
 *   embedding(V,D[,std=S])         first layer only: each input feature is a
 *                                  row id in [0, V); out: the rows (D each)
 *   dot                            the inner product of the two halves of a
 *                                  flat input, plus a bias: one output
 * The last layer's output size is the number of classes; the loss is
 * softmax cross-entropy over it, or the mean squared error of a single
 * output against the integer label (dt__model_set_loss, model.loss = mse).
 *
 * Errors follow dtrain/core.h: DT_EINVAL with a dt_errmsg() line naming the
 * argument, or the 1-based layer number and its token for a bad spec.
 * Threads: a model is used by one thread at a time.
 */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_model dt_model;

enum dt_layer_kind {
  DT_L_LINEAR, DT_L_CONV2D, DT_L_MAXPOOL2D, DT_L_AVGPOOL2D, DT_L_RELU, DT_L_GELU,
  DT_L_DROPOUT, DT_L_FLATTEN, DT_L_LAYERNORM, DT_L_BATCHNORM, DT_L_EMBEDDING, DT_L_DOT
};

/* Read-only description of one layer. Offsets and counts are in floats
 * into the flat buffers (dt_model_params / dt_model_grads for param_*,
 * dt_model_bufs for buf_*). */
typedef struct dt_layer_info {
  int kind;                  /* enum dt_layer_kind */
  const char *name;          /* "linear", "conv", ... (static storage) */
  int in_c, in_h, in_w;      /* per-sample input shape (in_h = in_w = 1 for vectors) */
  int out_c, out_h, out_w;   /* per-sample output shape */
  size_t param_off, nparams; /* span in params/grads */
  size_t buf_off, nbufs;     /* span in the state buffer */
  double fwd_flops;          /* forward floating-point operations per sample */
} dt_layer_info;

/* ---- creating ------------------------------------------------------------ */

/* Builds a model from `spec` ("flatten linear(256) relu linear(10)") for a
 * per-sample input of shape (c,h,w), with activation memory for batches of
 * up to max_batch (1..2^24) samples. Parameters are zero until
 * dt_model_init. On success *out is a new model the caller owns (free with
 * dt_model_destroy). On failure *out is NULL and the return is DT_EINVAL
 * (NULL out or spec, non-positive shape or max_batch, unknown layer, a layer
 * that does not fit its input: the message names the 1-based layer and its
 * token, e.g. "layer 3 'linear(128)': ...") or DT_ENOMEM. */
DT_API int dt_model_create(dt_model **out, const char *spec, int c, int h, int w, int max_batch);

/* Frees the model and every buffer it owns. NULL is a no-op. */
DT_API void dt_model_destroy(dt_model *m);

/* A model under construction, one layer at a time: the same language and
 * the same model as dt_model_create, but each layer is checked against the
 * shape its predecessors produce as it is added, so an error names the layer
 * the caller just tried. Owned by the caller; free with
 * dt_model_builder_destroy. */
typedef struct dt_model_builder dt_model_builder;

/* Starts an empty model for per-sample input (c,h,w). DT_EINVAL for a NULL
 * out or a non-positive dimension; DT_ENOMEM. *out is NULL on failure. */
DT_API int dt_model_builder_create(dt_model_builder **out, int c, int h, int w);

/* Appends one layer ("linear(128)", "relu", "conv(32,3,pad=1)"). DT_EINVAL
 * if b or layer is NULL, layer is empty or holds more than one token, or the
 * layer is unknown or does not fit the output of the layers before it; the
 * builder is then unchanged, so the caller may try another layer. */
DT_API int dt_model_add(dt_model_builder *b, const char *layer);

/* The spec built so far ("" when empty), owned by the builder, valid until
 * the next dt_model_add or destroy. NULL if b is NULL. */
DT_API const char *dt_model_builder_spec(const dt_model_builder *b);

/* Creates the model of the layers added so far, as dt_model_create would
 * with the builder's spec and input shape. The builder is not consumed: it
 * may be extended and built again. DT_EINVAL for NULL arguments, no layers
 * or a bad max_batch. */
DT_API int dt_model_build(dt_model_builder *b, int max_batch, dt_model **out);

/* Frees the builder (models built from it are independent). NULL is a
 * no-op. */
DT_API void dt_model_builder_destroy(dt_model_builder *b);

/* PyTorch-default initialisation (kaiming-uniform weights, uniform biases
 * in +-1/sqrt(fan_in), norm weights 1 and biases 0, running variance 1), a
 * pure function of seed: the same seed gives the same bits everywhere.
 * DT_EINVAL if m is NULL. */
DT_API int dt_model_init(dt_model *m, uint64_t seed);

/* ---- looking inside ------------------------------------------------------ */

/* Counts and flat buffers. The pointers are owned by the model, valid for
 * its life, and may be read and written (e.g. to load weights): params and
 * grads hold dt_model_nparams floats, bufs dt_model_nbufs. A NULL model
 * gives 0 or NULL. */
DT_API size_t dt_model_nparams(const dt_model *m);
DT_API float *dt_model_params(dt_model *m);
DT_API float *dt_model_grads(dt_model *m);
DT_API size_t dt_model_nbufs(const dt_model *m);
DT_API float *dt_model_bufs(dt_model *m);

/* Number of layers, and layer i's description (owned by the model; NULL if
 * m is NULL or i is out of range). */
DT_API int dt_model_nlayers(const dt_model *m);
DT_API const dt_layer_info *dt_model_layer(const dt_model *m, int i);
/* Output size (the number of classes) and input size (c*h*w) per sample;
 * 0 for a NULL model. */
DT_API int dt_model_out_dim(const dt_model *m);
DT_API int dt_model_in_dim(const dt_model *m);
/* The largest batch forward accepts (max_batch at creation); 0 if NULL. */
DT_API int dt_model_max_batch(const dt_model *m);
/* Floating-point operations per sample: forward only (train = 0) or
 * forward + backward (train != 0). 0 for a NULL model. */
DT_API double dt_model_flops_per_sample(const dt_model *m, int train);

/* ---- running ------------------------------------------------------------- */

/* Per-step context: train != 0 turns dropout on and makes batchnorm use and
 * update batch statistics. Dropout masks are a pure function of (seed,
 * step, sample0 + i) for sample i of the batch, so they do not depend on
 * how a global batch is split. */
typedef struct dt_step_ctx {
  int train;
  uint64_t seed;
  uint64_t step;
  int64_t sample0;
} dt_step_ctx;
#define DT_STEP_CTX_INIT {0, 0, 0, 0}

/* Forward pass of B samples, x of (B, in_dim) floats (caller memory, read
 * only and kept by the model until the next forward: backward reads it).
 * ctx may be NULL (evaluation). The logits are then in dt_model_logits.
 * DT_EINVAL if m or x is NULL or B is outside 1..max_batch. */
DT_API int dt_model_forward(dt_model *m, const float *x, int B, const dt_step_ctx *ctx);

/* The logits (B, out_dim) of the last forward, owned by the model and valid
 * until the next forward; NULL before the first forward or if m is NULL. */
DT_API const float *dt_model_logits(const dt_model *m);

/* Called after each layer's backward with that layer's span of the gradient
 * buffer (offset and count in floats), in reverse layer order, so a caller
 * can start reducing it while backward goes on. */
typedef void (*dt_grad_ready_fn)(void *ud, size_t off, size_t n);

/* Softmax cross-entropy loss and backward for the last forward, against
 * labels (B integers in 0..out_dim-1). Overwrites the gradient buffer with
 * the gradient of the mean loss. *loss (may be NULL) gets the mean loss,
 * *ncorrect (may be NULL) the number of correct predictions. on_ready may
 * be NULL. DT_EINVAL if m or labels is NULL, no forward ran, B differs from
 * the last forward's batch, or a label is out of range (the message names
 * the sample); the gradients are then unchanged. */
DT_API int dt_model_backward(dt_model *m, const int32_t *labels, int B, float *loss,
                             int *ncorrect, dt_grad_ready_fn on_ready, void *ud);

/* Loss and correct count of the last forward without computing gradients
 * (evaluation). Arguments and errors as for dt_model_backward. */
DT_API int dt_model_loss(dt_model *m, const int32_t *labels, int B, float *loss, int *ncorrect);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_MODEL_H */

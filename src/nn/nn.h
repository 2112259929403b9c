/*
 * nn.h — the nn layer's interface for the rest of the library: the public
 * model, optimizer and schedule API (include/dtrain/model.h, optim.h) plus
 * what only the library uses — moving the gradient buffer into a shared
 * window, and the optimizer's flat state for checkpoints.
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

#include "dtrain/model.h"
#include "dtrain/optim.h"
#include "nn/kernels.h"

/* Moves the gradient buffer to caller memory of dt_model_nparams floats,
 * 64-byte aligned (e.g. a shared-memory window peers can read); the current
 * gradients are copied. NULL moves it back to the model's own buffer. The
 * caller's memory must outlive its use; the model never frees it. */
void dt_model_set_grads(dt_model *m, float *grads);

/* dt_sgemm_f flags for every matrix product of this model from now on
 * (DT_GEMM_FIXED: deterministic mode, so no product goes through OpenBLAS,
 * whose kernel choice depends on the CPU and OPENBLAS_CORETYPE). A NULL
 * model is ignored. */
void dt_model_set_gemm_flags(dt_model *m, int flags);

/* Flat optimizer state for checkpoints: nstate floats plus the step count. */
size_t dt_optim_state_floats(const dt_optim *o);
float *dt_optim_state(dt_optim *o);
int64_t *dt_optim_step_count(dt_optim *o);
/* The largest |gradient| the last dt_optim_step read: inf or NaN when one
 * was not finite (the update has already happened; the engine ends the run
 * on it). Computed inside the update loops, so the engine's per-step check
 * needs no pass of its own over the gradient. */
float dt__optim_grad_maxabs(const dt_optim *o);

#endif /* DT_NN_H */

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

/* The loss (model.loss): softmax cross-entropy, or the mean squared error
 * of a single output against the integer label (DT_EINVAL unless the model
 * has one output). */
enum dt__loss { DT__LOSS_XENT = 0, DT__LOSS_MSE = 1 };
int dt__model_set_loss(dt_model *m, int loss);
/* Embedding backward zeroes only the rows its previous backward wrote, not
 * the whole table: only for a caller that writes no other rows of the
 * gradient buffer (the parameter-server worker). */
void dt__model_set_sparse_grads(dt_model *m, int on);
/* The first layer, when it is a linear layer whose input gradient backward
 * does not need, makes its weight gradient in pieces of rows of about
 * `floats` floats (0: at once), from the last rows to the first, and reports
 * each ready (the first report with the bias) so a caller can send the
 * layer's later pieces while backward makes its earlier ones (the
 * parameter-server worker). Every gradient float is the same sum as
 * without pieces. */
void dt__model_set_ready_piece(dt_model *m, size_t floats);
/* The sorted distinct rows the first layer, an embedding, reads for input
 * x of B samples (rows: B x ids-per-sample entries of room); 0 when the
 * first layer is not an embedding; DT_EINVAL for an id outside the table. */
int dt__model_embedding_rows(const dt_model *m, const float *x, int B, int32_t *rows);

/* A lazy step over some rows only (a parameter server's embedding keys):
 * grads holds nrows rows of rowlen floats, the update of params' row
 * rows[j] (and of its optimizer state); other rows and their state do not
 * move (as torch.optim.SparseAdam / lazy Adam). The step count advances
 * once. DT_EINVAL for a row outside the buffer. */
int dt__optim_step_rows(dt_optim *o, float *params, const float *grads, float lr,
                        const uint32_t *rows, size_t nrows, size_t rowlen);

/* dt_optim_step's update with the state outside an optimizer object: n
 * floats of params stepped by grads under cfg, with state (cfg's state
 * floats per parameter: none for plain SGD, n for momentum, 2n for AdamW:
 * m then v) and the step count *step (advanced once) held by the caller —
 * e.g. in shared memory that several processes step in turn (the ps's
 * direct asp). *maxbits (may be NULL) gets the largest |gradient|'s bits. */
int dt__optim_step_state(const dt_optim_cfg *cfg, size_t n, float *params, const float *grads,
                         float lr, float *state, int64_t *step, uint32_t *maxbits);

/* The update of elements [lo, hi) of an n-float model only, with state in
 * the whole model's layout (dt_optim_state's: SGD's buffer at state[i],
 * AdamW's m at state[i] and v at state[n + i]) at step number t (counted
 * by the caller, >= 1): the same bits per element as dt_optim_step over
 * all n. *maxbits gets the bits of the span's largest |gradient|. Ranks
 * that update one shared copy in slices use it (parallel/shupd.c). */
int dt__optim_step_span(const dt_optim_cfg *cfg, size_t n, size_t lo, size_t hi, float *params,
                        const float *grads, float lr, float *state, int64_t t,
                        uint32_t *maxbits);
/* Sets what dt__optim_grad_maxabs reports (the bits of |x|): the largest
 * |gradient| of a step some other code applied. */
void dt__optim_set_grad_maxbits(dt_optim *o, uint32_t bits);
/* Flat optimizer state for checkpoints: nstate floats plus the step count. */
size_t dt_optim_state_floats(const dt_optim *o);
float *dt_optim_state(dt_optim *o);
int64_t *dt_optim_step_count(dt_optim *o);
/* The largest |gradient| the last dt_optim_step read: inf or NaN when one
 * was not finite (the update has already happened; the engine ends the run
 * on it). Computed inside the update loops, so the engine's per-step check
 * needs no pass of its own over the gradient. */
float dt__optim_grad_maxabs(const dt_optim *o);

/* ---- pipeline stages (model.c) --------------------------------------------
 * A stage is a model of layers [l0, l1) of a spec, used by parallel/pipe.c. */

/* How many layers spec has for input (c,h,w). DT_EINVAL as dt_model_create. */
int dt__model_spec_layers(const char *spec, int c, int h, int w, int *nlayers);
/* A model of layers [l0, l1) of spec (input: what layer l0 receives), its
 * parameters zero and unwritten (it usually shares a whole model's:
 * dt__model_share). Its dropout masks are those of the whole model's
 * layers l0.. . Flags:
 * DT__STAGE_NEED_DX: its backward also produces the input gradient (every
 * stage but the first); DT__STAGE_KEEP_CHUNKS: a first-layer conv keeps the
 * whole model's chunked backward (bitwise the whole model's gradients, for
 * deterministic mode; not with accumulation). Owned by the caller. */
#define DT__STAGE_NEED_DX 1
#define DT__STAGE_KEEP_CHUNKS 2
int dt__model_create_range(dt_model **out, const char *spec, int c, int h, int w, int max_batch,
                           int l0, int l1, int flags);
/* m's parameters and state become owner's, starting at param_off /
 * buf_off floats (m's own are freed); its gradients become grads (same
 * layout as m's own, which are then freed) or, with grads NULL, stay its
 * own. Several stage models over one span (micro-batches in flight) share
 * the first one's gradients; the first trains the whole model's span in
 * place. owner and grads must outlive m. */
void dt__model_share(dt_model *m, dt_model *owner, size_t param_off, size_t buf_off,
                     float *grads);
/* Points the model's gradients at grads (same layout) without copying
 * anything (dt_model_set_grads copies): the next backward writes there.
 * Only for a model whose backward rewrites every gradient value
 * (dt__model_grads_rewritten); grads must outlive its use. */
void dt__model_point_grads(dt_model *m, float *grads);
/* The model's parameters move to `params` (nparams floats, the caller's,
 * which must outlive the model's use of them; the values are copied
 * there); NULL moves them back into the model's own buffer (copied back).
 * The ps strategy's shared-memory window (src/ps). DT_EINVAL for a model
 * that shares another's parameters. */
int dt__model_point_params(dt_model *m, float *params);
/* 1 if backward overwrites every parameter gradient (no accumulation, no
 * sparse rows, no deferred weight gradients, not sharing another model's),
 * so gradients may go to a different buffer each backward. */
int dt__model_grads_rewritten(const dt_model *m);
/* dt_model_create without initialising anything: the parameters stay
 * zero and unwritten, so they take no memory until written (a pipeline
 * stage's whole model, of which it writes only its own span). */
int dt__model_create_noinit(dt_model **out, const char *spec, int c, int h, int w,
                            int max_batch);
/* dt_model_init of layers [l0, l1) only (the same values as the whole
 * model's init gives them: keyed by the layer's index in m): a pipeline
 * stage initialises, and so makes resident, only its own span of the whole
 * model's parameter buffer, which costs no memory until written. */
int dt__model_init_range(dt_model *m, uint64_t seed, int l0, int l1);
/* Frees the model's own gradient buffer (a whole model whose stages keep
 * their own): dt_model_grads is NULL after; backward must not run again. */
void dt__model_drop_grads(dt_model *m);
/* accumulate: backward adds to the parameter gradients instead of
 * overwriting them; gscale multiplies the loss gradient (a micro-batch of n
 * samples in a batch of N: n / N, so the sum is the batch mean). */
void dt__model_set_accum(dt_model *m, int accumulate, float gscale);
/* Backward from the output gradient dy (B samples, after a forward of B);
 * *dx (may be NULL) gets the input gradient when the model was made with
 * need_dx (model memory, valid until the next backward). */
int dt__model_backward_dy(dt_model *m, const float *dy, int B, const float **dx,
                          dt_grad_ready_fn on_ready, void *ud);
/* Deferred weight gradients (pipeline micro-batches): with a stash set
 * (dt__model_set_wstash), the backward of a linear layer makes only its
 * input and bias gradients and copies its input and output gradient into
 * the stash's rows [row0, row0 + B); dt__model_wgrad_flush then makes every
 * linear layer's weight gradient in one product over the first `rows`
 * stashed rows (overwriting it, or adding to it with accumulate): one pass
 * over the weight gradient per step (or per group of micro-batches) instead
 * of one per micro-batch. One stash serves every model of a stage
 * (the same layers). Deterministic mode (parallel/ddp.c) uses it per gradient
 * slot and makes the weight gradients itself, straight in fixed point
 * (dt__wstash_rows). */
typedef struct dt__wstash dt__wstash;
int dt__wstash_create(dt__wstash **out, const dt_model *m, int max_rows);
void dt__wstash_destroy(dt__wstash *s);
size_t dt__wstash_bytes(const dt__wstash *s);
/* s NULL: backward makes weight gradients itself again. */
void dt__model_set_wstash(dt_model *m, dt__wstash *s, int row0);
void dt__model_wgrad_flush(dt_model *m, const dt__wstash *s, int rows, int accumulate);
/* The same, last layer first, then on_ready (if not NULL) for every layer
 * with parameters right after its weight gradient is made (a layer the
 * stash does not hold, or every layer with rows = 0 or s NULL, is only
 * reported): a caller reducing the gradients overlaps the rest. */
void dt__model_wgrad_flush_ready(dt_model *m, const dt__wstash *s, int rows, int accumulate,
                                 dt_grad_ready_fn on_ready, void *ud);
/* dt__model_wgrad_flush's products for two threads: the stashed layers
 * split once into two sets of about equal work (out x in each, largest
 * first to the lighter set, ties to set 0); part 0 or 1 makes its set's.
 * Each layer's product is the same call whichever part makes it: the two
 * parts together give dt__model_wgrad_flush's bits. */
void dt__model_wgrad_flush_part(dt_model *m, const dt__wstash *s, int rows, int accumulate,
                                int part);
/* Layer i's stashed inputs (rows x in) and output gradients (rows x out),
 * row 0 first; NULL for a layer the stash does not hold (not linear). */
void dt__wstash_rows(const dt__wstash *s, int i, const float **x, const float **dy);
/* Layer i's weight-gradient product alone (as dt__model_wgrad_flush makes
 * it; nothing for a layer the stash does not hold). */
void dt__model_wgrad_layer(dt_model *m, const dt__wstash *s, int i, int rows, int accumulate);
/* Where linear layer i's weight gradient (out x in) is (NULL: not linear). */
float *dt__model_wgrad_dst(dt_model *m, int i);
/* The same product for another model's layer (a pipeline's last stage
 * making stage 0's, DTRAIN_PIPE_OFFLOAD), with m's GEMM flags, into dw
 * (overwritten): dw(OC,C) = dy^T(OC,rows) * x(rows,C). */
void dt__wgrad_product(const dt_model *m, int OC, int C, int rows, const float *dy,
                       const float *x, float *dw);
/* Packed forward weights (wpack.c): every linear layer's W packed for the
 * forward product once (dt__wpack_refresh, after W changed) and used by
 * every forward of the models it is set on (dt__model_set_wpack; NULL
 * unsets) — the same bits as unpacked. The caller refreshes it whenever
 * the parameters change, before the next forward. */
typedef struct dt__wpack dt__wpack;
int dt__wpack_create(dt__wpack **out, const dt_model *m);
void dt__wpack_destroy(dt__wpack *p);
void dt__wpack_refresh(dt__wpack *p, const dt_model *m);
/* A refresh on another thread: after dt__wpack_refresh_begin, until that
 * thread's dt__wpack_refresh returns, dt__wpack_get and
 * dt__wpack_get_dinp wait for their layer's form (every forward form is
 * packed first, layer by layer, then the input-gradient forms). */
void dt__wpack_refresh_begin(dt__wpack *p);
size_t dt__wpack_bytes(const dt__wpack *p);
const float *dt__wpack_get(const dt__wpack *p, int layer);
/* Layer's W packed for the input-gradient product (DTRAIN_WPACK_DINP), or
 * NULL: multiply by W in place. */
const float *dt__wpack_get_dinp(const dt__wpack *p, int layer);
void dt__model_set_wpack(dt_model *m, const dt__wpack *p);
/* Whether backward computes layer i's input gradient (every layer above
 * the first with parameters; that one too in a stage that sends it back). */
int dt__model_wants_dinp(const dt_model *m, int layer);
/* Bytes of activation memory the model allocated for max_batch samples
 * (outputs, masks, saved statistics, pooling indices, gradient buffers). */
size_t dt__model_act_bytes(const dt_model *m);
/* The input gradient of the last backward (need_dx), or NULL. */
const float *dt__model_dx(const dt_model *m);
/* Recomputation with the output kept (a pipeline stage keeps what it sent
 * to the next): the backward of a last linear layer needs only its input,
 * and of a last relu after a linear layer only its output, so those
 * trailing layers (1 or 2 of them, _tail_skip; 0: none) need no repeat.
 * _forward_kept runs the forward of the others and points *out at the
 * buffer the caller must fill with the kept output (B rows) before the
 * backward: the skipped layers' output, which is also the model's. */
int dt__model_tail_skip(const dt_model *m);
int dt__model_forward_kept(dt_model *m, const float *x, int B, const dt_step_ctx *ctx,
                           float **out);

#endif /* DT_NN_H */

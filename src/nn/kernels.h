/*
 * kernels.h — layer kernels: pure forward/backward functions over raw float
 * arrays (llm.c style). No allocation inside; shapes are arguments; NCHW
 * layout; weights in PyTorch layout so golden files compare directly.
 *
 * Conventions:
 *  - Gradient arguments start with `d`. Backward kernels OVERWRITE parameter
 *    gradients (dweight, dbias) and dinp; they never accumulate. Callers that
 *    accumulate (micro-batches) add the results themselves.
 *  - dinp may be NULL when the input gradient is not needed (first layer);
 *    the kernel then skips that work.
 *  - `ws` is caller-provided scratch of the size the matching *_ws_floats()
 *    returns.
 */
#ifndef DT_NN_KERNELS_H
#define DT_NN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* linear: inp (B,C), weight (OC,C), bias (OC) or NULL -> out (B,OC) */
void dt_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int B, int C, int OC);
void dt_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int B, int C, int OC);
/* The same with dt_sgemm_f flags (DT_GEMM_FIXED in deterministic mode). */
void dt_linear_forward_f(int gemm_flags, float *out, const float *inp, const float *weight,
                         const float *bias, int B, int C, int OC);
/* dt_linear_forward_f (flags 0) with the weight packed by dt_sgemm_packb
 * (tb = 1, K = C, N = OC): the same bits, no packing per call. */
void dt_linear_forward_packed(float *out, const float *inp, const float *wpacked,
                              const float *bias, int B, int C, int OC);
void dt_linear_backward_f(int gemm_flags, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int C, int OC);

/* The same, ADDING dweight and dbias to what they hold (beta = 1): the one
 * exception to "never accumulate", for micro-batch accumulation in pipeline
 * stages, where a separate pass over a large weight gradient would cost as
 * much as the product. dinp is still overwritten. */
void dt_linear_backward_acc_f(int gemm_flags, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int B,
                              int C, int OC);

/* conv2d geometry. OH = (H + 2*pad - KH)/stride + 1, same for OW. */
typedef struct dt_conv2d_geom {
  int B, C, H, W;      /* input  (B,C,H,W) */
  int OC, KH, KW;      /* weight (OC,C,KH,KW), bias (OC) */
  int stride, pad;
  int OH, OW;          /* output (B,OC,OH,OW); fill with dt_conv2d_geom_init */
  int gemm_flags;      /* dt_sgemm_f flags for its products (0 = default) */
} dt_conv2d_geom;
/* Fills OH/OW; returns 0, or -1 if the geometry is impossible (kernel larger
 * than padded input, non-positive sizes). */
int dt_conv2d_geom_init(dt_conv2d_geom *g);
size_t dt_conv2d_ws_floats(const dt_conv2d_geom *g);
void dt_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias,
                       const dt_conv2d_geom *g, float *ws);
void dt_conv2d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const dt_conv2d_geom *g, float *ws);
/* 3x3 stride-1 convolutions by Winograd F(2x2,3x3) (winograd.c), normal
 * mode with AVX2: whether g takes it, its scratch, forward, and backward
 * (dweight overwritten if not NULL; dinp if not NULL; no dbias). */
int dt__wino_ok(const dt_conv2d_geom *g);
int dt__wino_enabled(void);
size_t dt__wino_ws_floats(const dt_conv2d_geom *g);
void dt__wino_forward(float *out, const float *inp, const float *weight, const float *bias,
                      const dt_conv2d_geom *g, float *ws);
void dt__wino_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                       const float *weight, const dt_conv2d_geom *g, float *ws);

/* pooling over (B,C,H,W) with kernel k, stride s, no padding; floor mode.
 * maxpool saves the argmax (index within the input plane) per output. */
void dt_maxpool2d_forward(float *out, int32_t *argmax, const float *inp, int B, int C, int H,
                          int W, int k, int s);
void dt_maxpool2d_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int C,
                           int H, int W, int k, int s);
/* ReLU followed by a 2x2 stride-2 max pool, fused: out (B,C,H/2,W/2) =
 * maxpool(relu(inp)) without writing relu(inp). code (one byte per output)
 * holds the position of the window's maximum: 0 top-left, 1 top-right,
 * 2 bottom-left, 3 bottom-right, or 4 where out is 0 (the ReLU stops the
 * gradient there). Backward writes ALL of dinp (B,C,H,W): dout routed
 * through code, zero elsewhere. Both are bitwise equal to dt_relu_forward +
 * dt_maxpool2d_forward(k=2,s=2) and the matching backward composition. */
void dt_relu_maxpool2x2_forward(float *out, uint8_t *code, const float *inp, int B, int C, int H,
                                int W);
void dt_relu_maxpool2x2_backward(float *dinp, const float *dout, const uint8_t *code, int B, int C,
                                 int H, int W);
void dt_avgpool2d_forward(float *out, const float *inp, int B, int C, int H, int W, int k, int s);
void dt_avgpool2d_backward(float *dinp, const float *dout, int B, int C, int H, int W, int k,
                           int s);

/* embedding: weight (V,D), idx (N) in [0, V) -> out (N,D) = weight[idx].
 * Backward OVERWRITES dweight (V,D): zero, then dout's rows added at their
 * indices (repeats add up). check: DT_EINVAL naming the first index outside
 * [0, V). rows: the sorted distinct indices into rows (N entries of room);
 * returns how many. */
int dt_embedding_check(const int32_t *idx, int N, int V);
void dt_embedding_forward(float *out, const int32_t *idx, const float *weight, int N, int D);
void dt_embedding_backward(float *dweight, const float *dout, const int32_t *idx, int N, int V,
                           int D);
int dt_embedding_rows(const int32_t *idx, int N, int32_t *rows);
/* The same scatter without the zeroing: dweight's rows idx[i] += dout[i]. */
void dt_embedding_backward_add(float *dweight, const float *dout, const int32_t *idx, int N,
                               int D);
/* Float ids (a model's input) to indices: DT_EINVAL naming the first that
 * is not an integer in [0, V). */
int dt_embedding_ids(int32_t *idx, const float *x, int N, int V);

/* dot: x (B, 2D) -> out (B) = sum_d x[b][d] * x[b][D + d] + bias (the inner
 * product of a sample's two halves: matrix factorisation's user . item).
 * Backward: dinp (may be NULL) and dbias (one float, overwritten). */
void dt_dot_forward(float *out, const float *x, float bias, int B, int D);
void dt_dot_backward(float *dinp, float *dbias, const float *dout, const float *x, int B, int D);

/* Mean squared error over B predictions (one per sample) against integer
 * targets: loss = mean (pred - t)^2; dpred (may be NULL) = 2 (pred - t) / B;
 * *ncorrect = predictions within 0.5 of their target (the rounded
 * prediction is right). */
float dt_mse(float *dpred, int *ncorrect, const float *pred, const int32_t *targets, int B);

/* element-wise activations over N floats; out may alias inp for forward. */
void dt_relu_forward(float *out, const float *inp, size_t N);
/* dinp = dout * (out > 0); uses the forward OUTPUT so inp need not be kept. */
void dt_relu_backward(float *dinp, const float *dout, const float *out, size_t N);
/* exact GELU: x * Phi(x) (PyTorch's default, approximate='none'). */
void dt_gelu_forward(float *out, const float *inp, size_t N);
void dt_gelu_backward(float *dinp, const float *dout, const float *inp, size_t N);

/* dropout with keep-scaling 1/(1-p). The mask is a pure function of
 * (seed, step, global sample index, layer id, element): sample i of the batch
 * has global index sample0 + i. mask holds 0 or 1/(1-p) per element. */
void dt_dropout_forward(float *out, float *mask, const float *inp, int B, size_t D, float p,
                        uint64_t seed, uint64_t step, int64_t sample0, int layer_id);
void dt_dropout_backward(float *dinp, const float *dout, const float *mask, size_t N);

/* layernorm over the trailing D elements of each of B rows, affine weight and
 * bias of size D (PyTorch LayerNorm(normalized_shape)). Saves mean and rstd
 * (B each) for backward. */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int B, int D, float eps);
void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int B, int D);

/* batchnorm over (B,C,S) with S = H*W (S = 1 for BatchNorm1d). Training:
 * batch statistics (biased variance to normalise), running stats updated
 * with momentum (unbiased variance), PyTorch semantics. Eval (train=0):
 * running stats. Saves mean and rstd (C each) for backward. */
void dt_batchnorm_forward(float *out, float *mean, float *rstd, float *running_mean,
                          float *running_var, const float *inp, const float *weight,
                          const float *bias, int B, int C, int S, float eps, float momentum,
                          int train);
void dt_batchnorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int B, int C, int S);

/* softmax cross-entropy, mean over the batch. logits (B,V), targets (B).
 * Returns the mean loss; writes dlogits = (softmax - onehot)/B if dlogits is
 * not NULL; counts argmax == target into *ncorrect if not NULL. A target
 * outside [0,V) is not checked here (the data layer validates labels). */
float dt_softmax_xent(float *dlogits, int *ncorrect, const float *logits, const int32_t *targets,
                      int B, int V);

#endif /* DT_NN_KERNELS_H */

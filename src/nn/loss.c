/*
 * loss.c — softmax cross-entropy averaged over the batch, fused with its
 * gradient and an accuracy count. Log-sum-exp is taken around the row
 * maximum so large logits do not overflow. Labels are not validated here.
 * With and without the gradient the loss is computed by the same operations
 * in the same order, so dt_model_loss and dt_model_backward agree bitwise.
 * Also the mean squared error of one prediction per sample against integer
 * targets (the ratings workload's regression loss, model.loss = mse).
 */
#include "nn/kernels.h"

#include <math.h>

float dt_softmax_xent(float *dlogits, int *ncorrect, const float *logits, const int32_t *targets,
                      int B, int V) {
  double loss = 0.0;
  int correct = 0;
  float invB = 1.0f / (float)B;
  for (int b = 0; b < B; b++) {
    const float *x = logits + (size_t)b * V;
    float mx = x[0];
    int am = 0;
    for (int v = 1; v < V; v++)
      if (x[v] > mx) { mx = x[v]; am = v; }
    float sum = 0.0f;
    int t = targets[b];
    if (dlogits) {
      /* exponentials kept in the gradient row, normalised below: one expf
       * per logit instead of two */
      float *d = dlogits + (size_t)b * V;
      for (int v = 0; v < V; v++) d[v] = expf(x[v] - mx), sum += d[v];
      float inv = 1.0f / sum;
      for (int v = 0; v < V; v++) d[v] = d[v] * inv * invB;
      d[t] -= invB;
    } else {
      for (int v = 0; v < V; v++) sum += expf(x[v] - mx);
    }
    float lse = mx + logf(sum);
    loss += (double)(lse - x[t]);
    if (am == t) correct++;
  }
  if (ncorrect) *ncorrect = correct;
  return (float)(loss / B);
}

float dt_mse(float *dpred, int *ncorrect, const float *pred, const int32_t *targets, int B) {
  double loss = 0.0;
  int correct = 0;
  const float s = 2.0f / (float)B;
  for (int b = 0; b < B; b++) {
    float e = pred[b] - (float)targets[b];
    loss += (double)e * e;
    if (e < 0.5f && e > -0.5f) correct++;
    if (dpred) dpred[b] = s * e;
  }
  if (ncorrect) *ncorrect = correct;
  return (float)(loss / B);
}

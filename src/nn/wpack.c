/*
 * wpack.c — linear layers' weights packed once for many forward products
 * (nn.h, dt__wpack): a pipeline stage runs every micro-batch of a step
 * through the same weights, and the forward product out = x * W^T would
 * otherwise transpose-pack W (OC x C) into the GEMM's panels once per
 * micro-batch. Packed once per step (after the optimizer changed W), the m
 * forward products of the step stream the ready panels instead: measured on
 * a 2048 x 2048 layer, 8 micro-batches of 32, 22.9 ms unpacked vs 19.6 ms
 * packed + 2.9 ms for the one packing. The bits are those of dt_sgemm.
 *
 * The input-gradient product dinp = dout * W reads W itself (not
 * transposed) as its B; read in place, a micro-batch of 32 rows streamed
 * each 2048 x 2048 W from L3 at 1.35x the per-row cost of a 256-row
 * product (bench_pipe_gemm, 2026-11-28). With DTRAIN_WPACK_DINP (the
 * default) W is packed for that product too, once per step, for every
 * linear layer whose input gradient the model computes (not a model's
 * first layer unless a pipeline stage sends it back).
 *
 * It costs one more copy of the packed layers' weights (two with the
 * input-gradient form) and does nothing where dt_sgemm would not use our
 * own kernels.
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/core.h"
#include "nn/nn.h"
#include "tensor/tensor.h"

struct dt__wpack {
  int n;           /* layers of the model */
  float **w;       /* per layer: its packed W^T (forward), or NULL */
  float **wd;      /* per layer: its packed W (input gradient), or NULL */
  size_t bytes;
  /* a refresh on another thread (dt__wpack_refresh_begin): while pending,
   * dt__wpack_get / _get_dinp wait for their layer's form (done[i] bit 1:
   * W^T, bit 2: W) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending;
  unsigned char *done;
};

void dt__wpack_destroy(dt__wpack *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) {
    dt_free(p->w[i]);
    if (p->wd) dt_free(p->wd[i]);
  }
  if (p->done) {
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
  }
  free(p->done);
  free(p->w);
  free(p->wd);
  free(p);
}

int dt__wpack_create(dt__wpack **out, const dt_model *m) {
  *out = NULL;
  dt__wpack *p = calloc(1, sizeof *p);
  if (!p || !(p->w = calloc((size_t)dt_model_nlayers(m), sizeof *p->w)) ||
      !(p->wd = calloc((size_t)dt_model_nlayers(m), sizeof *p->wd))) {
    if (p) free(p->w);
    free(p);
    return dt__seterr(DT_ENOMEM, "packed weights: out of memory");
  }
  p->n = dt_model_nlayers(m);
  if (!(p->done = calloc((size_t)p->n + 1, 1))) {
    free(p->w), free(p->wd), free(p);
    return dt__seterr(DT_ENOMEM, "packed weights: out of memory");
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (int i = 0; i < p->n; i++) {
    const dt_layer_info *l = dt_model_layer(m, i);
    if (l->kind != DT_L_LINEAR) continue;
    const int C = l->in_c * l->in_h * l->in_w, OC = l->out_c;
    size_t nf = dt_sgemm_packb_floats(1, C, OC);
    if (!nf) continue;
    if (!(p->w[i] = dt_alloc(nf * sizeof(float)))) {
      dt__wpack_destroy(p);
      return dt__seterr(DT_ENOMEM, "packed weights: out of memory (%zu bytes)", nf * sizeof(float));
    }
    p->bytes += nf * sizeof(float);
    /* op(B) = W: OC x C */
    size_t nd = dt_param(DT_PARAM_WPACK_DINP) && dt__model_wants_dinp(m, i)
                    ? dt_sgemm_packb_floats(0, OC, C)
                    : 0;
    if (!nd) continue;
    if (!(p->wd[i] = dt_alloc(nd * sizeof(float)))) {
      dt__wpack_destroy(p);
      return dt__seterr(DT_ENOMEM, "packed weights: out of memory (%zu bytes)", nd * sizeof(float));
    }
    p->bytes += nd * sizeof(float);
  }
  *out = p;
  return DT_OK;
}

/* Layer i's form f (1, 2) is ready (a pending refresh). */
static void mark(dt__wpack *p, int i, int f) {
  pthread_mutex_lock(&p->mu);
  p->done[i] |= (unsigned char)f;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void dt__wpack_refresh(dt__wpack *p, const dt_model *m) {
  if (!p) return;
  const int async = __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE);
  /* every layer's forward form first (the forwards need them first) */
  for (int f = 1; f <= 2; f++) {
    for (int i = 0; i < p->n; i++) {
      if (!p->w[i]) continue;
      const dt_layer_info *l = dt_model_layer(m, i);
      const int C = l->in_c * l->in_h * l->in_w;
      const float *W = dt_model_params((dt_model *)m) + l->param_off;
      /* op(B) = W^T: C x OC, W stored OC x C; op(B) = W: OC x C */
      if (f == 1) dt_sgemm_packb(1, C, l->out_c, W, C, p->w[i]);
      else if (p->wd[i]) dt_sgemm_packb(0, l->out_c, C, W, C, p->wd[i]);
      if (async) mark(p, i, f);
    }
  }
  if (async) {
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->pending, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

void dt__wpack_refresh_begin(dt__wpack *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->n; i++) p->done[i] = 0;
  __atomic_store_n(&p->pending, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&p->mu);
}

/* Waits, during a pending refresh, for layer i's form f. */
static void await(const dt__wpack *cp, int i, int f) {
  dt__wpack *p = (dt__wpack *)cp;
  if (!__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&p->mu);
  while (p->pending && !(p->done[i] & f)) pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

size_t dt__wpack_bytes(const dt__wpack *p) { return p ? p->bytes : 0; }

const float *dt__wpack_get(const dt__wpack *p, int layer) {
  if (!p || layer < 0 || layer >= p->n || !p->w[layer]) return NULL;
  await(p, layer, 1);
  return p->w[layer];
}

const float *dt__wpack_get_dinp(const dt__wpack *p, int layer) {
  if (!p || layer < 0 || layer >= p->n || !p->wd[layer]) return NULL;
  await(p, layer, 2);
  return p->wd[layer];
}

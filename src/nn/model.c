/*
 * model.c — a model is the parsed spec (spec.c) plus memory: one flat
 * parameter buffer, one flat gradient buffer, one flat state buffer
 * (batchnorm running statistics), and activations, saved statistics and
 * scratch sized for max_batch, all allocated once in dt_model_create. Forward
 * and backward only dispatch to the kernels of kernels.h over that memory;
 * a training step allocates nothing.
 *
 * Memory plan: a layer whose backward needs its input keeps the previous
 * layer's output alive, so each layer owns its output, except that flatten
 * is a pointer alias (no copy) and relu runs in place on its input (its
 * backward only needs its output, and no layer's backward needs its own
 * output, so overwriting the input is safe) unless that input is the
 * caller's x. Activation gradients ping-pong between two buffers of the
 * largest activation size. Backward stops at the first layer with
 * parameters and asks it for no input gradient.
 *
 * Execution plan: `relu maxpool(2)` (kernel 2, stride 2) runs as one fused
 * kernel (dt_relu_maxpool2x2_*): ReLU and max commute, so the pool reads the
 * raw input and the ReLU layer does nothing in either direction (its output
 * is its input, its input gradient is the pool's). The spec, the parameter
 * layout and the results, bitwise, are those of the unfused layers. A conv
 * whose output feeds only such a pair runs in chunks of a few samples
 * (DTRAIN_NN_CHUNK_BYTES of conv output, default 128 KiB; 0 turns it off),
 * each pooled straight after it is computed, while it is still in cache: the
 * conv output is then a chunk-sized scratch buffer instead of a batch-sized
 * array that goes to memory and back. For the same reason the backward of
 * the first layer with parameters, when it is a conv (it needs no input
 * gradient, only dW and db), runs in chunks of that many samples, adding
 * the chunks' dW and db in chunk order; behind a fused pair each chunk's
 * output gradient is produced by the pool's backward into that scratch just
 * before it is used. The unfused layers chunk the same way, so fused and
 * unfused stay bitwise equal.
 *
 * Pipeline stages (dt__model_create_range, nn.h): a model of a contiguous
 * range of another spec's layers, whose parameters, gradients and state may
 * be borrowed from the whole model's buffers (dt__model_share), whose
 * backward can start from an output gradient and produce the input
 * gradient, and which can add its parameter gradients to the buffer instead
 * of overwriting it (micro-batch accumulation: linear layers through GEMM's
 * beta = 1, the small others through one layer-sized scratch). Dropout masks
 * are keyed by the layer's index in the whole model, so a stage draws the
 * masks the whole model would.
 *
 * Embedding layers: model_embed.c.
 *
 * Losses: softmax cross-entropy over the outputs, or (dt__model_set_loss)
 * the mean squared error of one output per sample against the integer
 * label. It does not do threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/nn.h"
#include "nn/model_int.h"
#include "nn/spec.h"
#include "tensor/tensor.h"

/* Does layer i start a `relu maxpool(2)` pair the fused kernel can run? */
static int relu_pool_at(const dt__spec *sp, int i) {
  return i + 1 < sp->n && sp->L[i].info.kind == DT_L_RELU &&
         sp->L[i + 1].info.kind == DT_L_MAXPOOL2D && sp->L[i + 1].k == 2 &&
         sp->L[i + 1].stride == 2;
}

/* Zeroed floats, 64-byte aligned, that cost no resident memory until
 * written: calloc of a large block is a fresh mapping the C library does
 * not clear by hand (dt_calloc writes every byte). For the gradient buffer,
 * which a pipeline stage's whole model never writes (its stages keep their
 * own) and which forked workers would otherwise inherit resident, and for
 * the parameters, of which a pipeline stage writes (and so holds) only its
 * own span (dt__model_init_range). *raw is what to free(). */
static float *zalloc64(size_t n, void **raw) {
  *raw = calloc(n * sizeof(float) + 64, 1);
  if (!*raw) return NULL;
  return (float *)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}

/* Rounds a float count up to a 64-byte multiple so every sub-buffer stays
 * aligned for vector loads. */
static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

void dt_model_destroy(dt_model *m) {
  if (!m) return;
  if (!m->shared) {
    free(m->params_raw);
    dt_free(m->bufs);
  }
  free(m->grads_raw);
  dt_free(m->gtmp);
  dt_free(m->acts);
  dt_free(m->iacts);
  dt_free(m->dbuf[0]);
  dt_free(m->dbuf[1]);
  dt_free(m->ws);
  free(m->infos);
  free(m->L);
  free(m);
}

/* The model of a parsed spec (freed here, success or not). stage != 0: a
 * pipeline stage (no chunked first-conv backward, so that accumulation and
 * input gradients take the plain path). init: dt_model_init(m, 0) (else
 * the parameters stay zero and unwritten, so not resident). */
static int create_from(dt_model **out, dt__spec sp, int c, int h, int w, int max_batch,
                       int stage, int init) {
  int rc = DT_OK;
  dt_model *m = calloc(1, sizeof *m);
  if (!m) {
    dt__spec_free(&sp);
    return dt__seterr(DT_ENOMEM, "model: out of memory");
  }
  m->n = sp.n;
  m->max_batch = max_batch;
  m->in_c = c, m->in_h = h, m->in_w = w;
  m->in_dim = (size_t)c * h * w;
  m->nparams = sp.nparams;
  m->nbufs = sp.nbufs;
  m->first_param = sp.n;
  m->L = calloc((size_t)sp.n, sizeof *m->L);
  m->infos = calloc((size_t)sp.n, sizeof *m->infos);
  if (!m->L || !m->infos) goto nomem;
  size_t MB = (size_t)max_batch;
  /* Guard the products below: activations of the whole batch in bytes. */
  if ((double)MB * (double)sp.max_elems * 4.0 * 4.0 > (double)SIZE_MAX / 4) {
    rc = dt__seterr(DT_EINVAL, "model: max_batch %d x %zu activations is too large", max_batch,
                    sp.max_elems);
    goto fail;
  }

  /* Pass 1: decide aliasing and count arena sizes. */
  size_t nacts = 0, niacts = 0, nws = 0;
  int input_owned = 0; /* is the current activation a model-owned buffer? */
  int64_t chunk_bytes = dt_param(DT_PARAM_NN_CHUNK_BYTES);
  for (int i = 0; i < sp.n; i++) {
    layer *l = &m->L[i];
    l->s = sp.L[i];
    const dt_layer_info *in = &l->s.info;
    l->in_el = (size_t)in->in_c * in->in_h * in->in_w;
    l->out_el = (size_t)in->out_c * in->out_h * in->out_w;
    if (in->nparams && m->first_param == sp.n) m->first_param = i;
    l->owns_out = 1;
    if (in->kind == DT_L_FLATTEN) l->owns_out = 0;
    if (relu_pool_at(&sp, i)) l->fused = FUSE_ABSORBED, l->owns_out = 0;
    if (in->kind == DT_L_CONV2D && chunk_bytes > 0) {
      int64_t c = chunk_bytes / (int64_t)(l->out_el * sizeof(float));
      c = c < 1 ? 1 : c > max_batch ? max_batch : c;
      if (relu_pool_at(&sp, i + 1)) l->chunk = (int)c;
      if (m->first_param == i && c < max_batch && !stage)
        l->bchunk = (int)c, nacts += al16(in->nparams);
    }
    if (in->kind == DT_L_MAXPOOL2D && i > 0 && m->L[i - 1].fused == FUSE_ABSORBED)
      l->fused = FUSE_RELU_POOL;
    if (in->kind == DT_L_RELU && !l->fused && input_owned) l->owns_out = 0, l->inplace = 1;
    if (l->owns_out) nacts += al16((l->chunk ? (size_t)l->chunk : MB) * l->out_el), input_owned = 1;
    switch (in->kind) {
    case DT_L_DROPOUT: nacts += al16(MB * l->out_el); break;
    case DT_L_MAXPOOL2D:
      niacts += l->fused == FUSE_RELU_POOL ? al16((MB * l->out_el + 3) / 4) : al16(MB * l->out_el);
      break;
    case DT_L_LAYERNORM: nacts += 2 * al16(MB); break;
    case DT_L_BATCHNORM: nacts += 2 * al16((size_t)l->s.bn_c); break;
    case DT_L_EMBEDDING: niacts += 2 * al16(MB * l->in_el); break;
    case DT_L_CONV2D: {
      dt_conv2d_geom *g = &l->g;
      g->B = max_batch, g->C = in->in_c, g->H = in->in_h, g->W = in->in_w;
      g->OC = l->s.oc, g->KH = g->KW = l->s.k, g->stride = l->s.stride, g->pad = l->s.pad;
      g->OH = in->out_h, g->OW = in->out_w;
      size_t ws = dt_conv2d_ws_floats(g);
      if (ws > nws) nws = ws;
      break;
    }
    default: break;
    }
  }
  m->out_dim = m->L[sp.n - 1].out_el;
  m->gscale = 1.0f;
  size_t ntmp = 1;
  for (int i = 0; i < sp.n; i++)
    if (sp.L[i].info.kind != DT_L_LINEAR && sp.L[i].info.kind != DT_L_EMBEDDING &&
        sp.L[i].info.nparams > ntmp)
      ntmp = sp.L[i].info.nparams;

  /* Pass 2: allocate once and lay the pointers into the arenas. */
  m->params = zalloc64(m->nparams ? m->nparams : 1, &m->params_raw);
  m->grads = m->own_grads = zalloc64((m->nparams ? m->nparams : 1), &m->grads_raw);
  m->bufs = dt_calloc((m->nbufs ? m->nbufs : 1) * sizeof(float));
  m->acts = dt_alloc((nacts ? nacts : 1) * sizeof(float));
  m->act_bytes = (nacts + 2 * al16(MB * sp.max_elems)) * sizeof(float) + niacts * sizeof(int32_t);
  m->iacts = dt_alloc((niacts ? niacts : 1) * sizeof(int32_t));
  m->dbuf[0] = dt_alloc(al16(MB * sp.max_elems) * sizeof(float));
  m->dbuf[1] = dt_alloc(al16(MB * sp.max_elems) * sizeof(float));
  m->ws = dt_alloc((nws ? nws : 1) * sizeof(float));
  m->gtmp = dt_alloc(ntmp * sizeof(float));
  if (!m->params || !m->grads || !m->bufs || !m->acts || !m->iacts || !m->dbuf[0] ||
      !m->dbuf[1] || !m->ws || !m->gtmp)
    goto nomem;
  float *a = m->acts;
  int32_t *ia = m->iacts;
  for (int i = 0; i < sp.n; i++) {
    layer *l = &m->L[i];
    const dt_layer_info *in = &l->s.info;
    if (l->owns_out) l->out = a, a += al16((l->chunk ? (size_t)l->chunk : MB) * l->out_el);
    if (in->nparams) {
      l->w = m->params + in->param_off;
      l->dw = m->grads + in->param_off;
      size_t nb = in->kind == DT_L_LINEAR || in->kind == DT_L_CONV2D ? (size_t)l->s.oc
                  : in->kind == DT_L_EMBEDDING || in->kind == DT_L_DOT ? 0 /* dot: w[0] */
                                                                       : in->nparams / 2;
      l->b = l->w + (in->nparams - nb);
      l->db = l->dw + (in->nparams - nb);
    }
    switch (in->kind) {
    case DT_L_CONV2D:
      if (l->bchunk) l->dwtmp = a, a += al16(in->nparams);
      break;
    case DT_L_DROPOUT: l->mask = a, a += al16(MB * l->out_el); break;
    case DT_L_MAXPOOL2D:
      if (l->fused == FUSE_RELU_POOL)
        l->code = (uint8_t *)ia, ia += al16((MB * l->out_el + 3) / 4);
      else
        l->argmax = ia, ia += al16(MB * l->out_el);
      break;
    case DT_L_EMBEDDING:
      l->ids = ia, ia += al16(MB * l->in_el);
      l->prev = ia, ia += al16(MB * l->in_el);
      l->nprev = -1;
      break;
    case DT_L_LAYERNORM:
      l->mean = a, a += al16(MB);
      l->rstd = a, a += al16(MB);
      break;
    case DT_L_BATCHNORM:
      l->mean = a, a += al16((size_t)l->s.bn_c);
      l->rstd = a, a += al16((size_t)l->s.bn_c);
      l->run_mean = m->bufs + in->buf_off;
      l->run_var = l->run_mean + l->s.bn_c;
      break;
    default: break;
    }
    m->infos[i] = *in;
  }
  dt__spec_free(&sp);
  if (init) dt_model_init(m, 0);
  *out = m;
  return DT_OK;
nomem:
  rc = dt__seterr(DT_ENOMEM, "model: out of memory allocating %zu parameters for batch %d",
                  sp.nparams, max_batch);
fail:
  dt__spec_free(&sp);
  dt_model_destroy(m);
  return rc;
}

static int create(dt_model **out, const char *spec, int c, int h, int w, int max_batch,
                  int init) {
  if (!out) return dt__seterr(DT_EINVAL, "model create: out is NULL");
  *out = NULL;
  if (!spec) return dt__seterr(DT_EINVAL, "model create: spec is NULL");
  if (max_batch < 1 || max_batch > (1 << 24))
    return dt__seterr(DT_EINVAL, "model: max_batch %d must be in [1, %d]", max_batch, 1 << 24);
  dt__spec sp;
  DT_CHECK(dt__spec_parse(&sp, spec, c, h, w));
  return create_from(out, sp, c, h, w, max_batch, 0, init);
}

int dt_model_create(dt_model **out, const char *spec, int c, int h, int w, int max_batch) {
  return create(out, spec, c, h, w, max_batch, 1);
}

int dt__model_create_noinit(dt_model **out, const char *spec, int c, int h, int w,
                            int max_batch) {
  return create(out, spec, c, h, w, max_batch, 0);
}

int dt__model_spec_layers(const char *spec, int c, int h, int w, int *nlayers) {
  dt__spec sp;
  DT_CHECK(dt__spec_parse(&sp, spec, c, h, w));
  *nlayers = sp.n;
  dt__spec_free(&sp);
  return DT_OK;
}

int dt__model_create_range(dt_model **out, const char *spec, int c, int h, int w, int max_batch,
                           int l0, int l1, int flags) {
  const int need_dx = flags & DT__STAGE_NEED_DX;
  *out = NULL;
  if (max_batch < 1 || max_batch > (1 << 24))
    return dt__seterr(DT_EINVAL, "model: max_batch %d must be in [1, %d]", max_batch, 1 << 24);
  dt__spec sp;
  DT_CHECK(dt__spec_parse(&sp, spec, c, h, w));
  if (l0 < 0 || l1 > sp.n || l0 >= l1) {
    int n = sp.n;
    dt__spec_free(&sp);
    return dt__seterr(DT_EINVAL, "model stage: layers [%d, %d) outside the %d layers", l0, l1, n);
  }
  /* The range as a spec of its own: offsets rebased to its first layer. */
  size_t p0 = sp.L[l0].info.param_off, b0 = sp.L[l0].info.buf_off;
  dt__spec sub = {0};
  sub.n = l1 - l0;
  sub.L = malloc((size_t)sub.n * sizeof *sub.L);
  if (!sub.L) {
    dt__spec_free(&sp);
    return dt__seterr(DT_ENOMEM, "model stage: out of memory");
  }
  for (int i = 0; i < sub.n; i++) {
    dt__layer_spec *l = &sub.L[i];
    *l = sp.L[l0 + i];
    l->info.param_off -= p0;
    l->info.buf_off -= b0;
    sub.nparams += l->info.nparams;
    sub.nbufs += l->info.nbufs;
    size_t in = (size_t)l->info.in_c * l->info.in_h * l->info.in_w;
    size_t o = (size_t)l->info.out_c * l->info.out_h * l->info.out_w;
    if (in > sub.max_elems) sub.max_elems = in;
    if (o > sub.max_elems) sub.max_elems = o;
  }
  const dt_layer_info *first = &sp.L[l0].info;
  int ic = first->in_c, ih = first->in_h, iw = first->in_w;
  dt__spec_free(&sp);
  /* the chunked first-conv backward neither accumulates nor gives dx */
  int plain = need_dx || !(flags & DT__STAGE_KEEP_CHUNKS);
  DT_CHECK(create_from(out, sub, ic, ih, iw, max_batch, plain, 0));
  (*out)->layer_base = l0;
  (*out)->need_dx = need_dx;
  return DT_OK;
}

void dt__model_share(dt_model *m, dt_model *owner, size_t param_off, size_t buf_off,
                     float *grads) {
  float *P = owner->params + param_off, *S = owner->bufs + buf_off;
  float *G = grads ? grads : m->grads;
  for (int i = 0; i < m->n; i++) {
    layer *l = &m->L[i];
    if (l->s.info.nparams) {
      l->w = P + (l->w - m->params);
      l->b = P + (l->b - m->params);
      l->dw = G + (l->dw - m->grads);
      l->db = G + (l->db - m->grads);
    }
    if (l->run_mean) {
      l->run_mean = S + (l->run_mean - m->bufs);
      l->run_var = S + (l->run_var - m->bufs);
    }
  }
  if (!m->shared) {
    free(m->params_raw);
    m->params_raw = NULL;
    dt_free(m->bufs);
  }
  if (grads && m->own_grads) {
    free(m->grads_raw);
    m->grads_raw = NULL;
    m->own_grads = NULL;
  }
  m->params = P;
  m->grads = G;
  m->bufs = S;
  m->shared = 1;
}

void dt__model_drop_grads(dt_model *m) {
  if (!m || m->grads != m->own_grads) return;
  free(m->grads_raw);
  m->grads_raw = NULL;
  m->own_grads = m->grads = NULL;
  for (int i = 0; i < m->n; i++) m->L[i].dw = m->L[i].db = NULL;
}

int dt__model_set_loss(dt_model *m, int loss) {
  if (!m) return dt__seterr(DT_EINVAL, "model loss: model is NULL");
  if (loss != DT__LOSS_XENT && loss != DT__LOSS_MSE)
    return dt__seterr(DT_EINVAL, "model loss: unknown loss %d", loss);
  if (loss == DT__LOSS_MSE && m->out_dim != 1)
    return dt__seterr(DT_EINVAL, "model.loss = mse needs one output per sample; the last layer "
                      "has %zu", m->out_dim);
  m->loss = loss;
  return DT_OK;
}


void dt__model_set_accum(dt_model *m, int accumulate, float gscale) {
  m->accum = accumulate;
  m->gscale = gscale;
}


int dt_model_init(dt_model *m, uint64_t seed) {
  if (!m) return dt__seterr(DT_EINVAL, "model init: model is NULL");
  return dt__model_init_range(m, seed, 0, m->n);
}

int dt__model_init_range(dt_model *m, uint64_t seed, int l0, int l1) {
  if (!m || l0 < 0 || l1 > m->n || l0 > l1)
    return dt__seterr(DT_EINVAL, "model init: layers [%d, %d) outside the model", l0, l1);
  for (int i = l0; i < l1; i++) {
    layer *l = &m->L[i];
    const dt_layer_info *in = &l->s.info;
    switch (in->kind) {
    case DT_L_LINEAR:
    case DT_L_CONV2D: {
      /* kaiming_uniform_(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), ...), the
       * same bound PyTorch uses for the bias. */
      size_t fan_in = in->kind == DT_L_LINEAR ? l->in_el : (size_t)in->in_c * l->s.k * l->s.k;
      float bound = (float)(1.0 / sqrt((double)fan_in));
      size_t nb = (size_t)l->s.oc;
      dt_rng_uniform(l->w, in->nparams - nb, -bound, bound, seed, DT_RNG_INIT, 2 * (uint64_t)i);
      dt_rng_uniform(l->b, nb, -bound, bound, seed, DT_RNG_INIT, 2 * (uint64_t)i + 1);
      break;
    }
    case DT_L_EMBEDDING: dt__embed_init(l, seed, i); break;
    case DT_L_DOT: l->w[0] = 0.0f; break;
    case DT_L_LAYERNORM:
    case DT_L_BATCHNORM: {
      size_t half = in->nparams / 2;
      for (size_t j = 0; j < half; j++) l->w[j] = 1.0f, l->b[j] = 0.0f;
      if (in->kind == DT_L_BATCHNORM)
        for (int j = 0; j < l->s.bn_c; j++) l->run_mean[j] = 0.0f, l->run_var[j] = 1.0f;
      break;
    }
    default: break;
    }
  }
  return DT_OK;
}

size_t dt_model_nparams(const dt_model *m) { return m ? m->nparams : 0; }
float *dt_model_params(dt_model *m) { return m ? m->params : NULL; }
float *dt_model_grads(dt_model *m) { return m ? m->grads : NULL; }

void dt_model_set_grads(dt_model *m, float *grads) {
  if (!grads) grads = m->own_grads;
  if (grads == m->grads) return;
  memcpy(grads, m->grads, m->nparams * sizeof(float));
  dt__model_point_grads(m, grads);
}

void dt__model_point_grads(dt_model *m, float *grads) {
  if (!grads || grads == m->grads) return;
  for (int i = 0; i < m->n; i++) {
    layer *l = &m->L[i];
    if (!l->s.info.nparams) continue;
    l->db = grads + (l->db - m->grads);
    l->dw = grads + (l->dw - m->grads);
  }
  m->grads = grads;
}

int dt__model_point_params(dt_model *m, float *params) {
  if (!m || m->shared)
    return dt__seterr(DT_EINVAL, "model: the parameters of a stage that shares another "
                      "model's cannot move");
  if (!params) params = m->own_params;
  if (!params || params == m->params) return DT_OK;
  memcpy(params, m->params, m->nparams * sizeof(float));
  for (int i = 0; i < m->n; i++) {
    layer *l = &m->L[i];
    if (!l->s.info.nparams) continue;
    l->w = params + (l->w - m->params);
    l->b = params + (l->b - m->params);
  }
  if (!m->own_params) m->own_params = m->params;
  else if (params == m->own_params) m->own_params = NULL;
  m->params = params;
  return DT_OK;
}

int dt__model_grads_rewritten(const dt_model *m) {
  if (!m || m->accum || m->sparse_grads || m->wst || m->shared) return 0;
  for (int i = 0; i < m->n; i++)
    if (m->L[i].s.info.kind == DT_L_EMBEDDING) return 0;
  return 1;
}

void dt_model_set_gemm_flags(dt_model *m, int flags) {
  if (!m) return;
  m->gemm_flags = flags;
  for (int i = 0; i < m->n; i++) m->L[i].g.gemm_flags = flags;
}

size_t dt_model_nbufs(const dt_model *m) { return m ? m->nbufs : 0; }
float *dt_model_bufs(dt_model *m) { return m ? m->bufs : NULL; }
int dt_model_nlayers(const dt_model *m) { return m ? m->n : 0; }
const dt_layer_info *dt_model_layer(const dt_model *m, int i) {
  return m && i >= 0 && i < m->n ? &m->infos[i] : NULL;
}
int dt_model_out_dim(const dt_model *m) { return m ? (int)m->out_dim : 0; }
int dt_model_in_dim(const dt_model *m) { return m ? (int)m->in_dim : 0; }
int dt_model_max_batch(const dt_model *m) { return m ? m->max_batch : 0; }
const float *dt_model_logits(const dt_model *m) { return m ? m->logits : NULL; }

double dt_model_flops_per_sample(const dt_model *m, int train) {
  double f = 0.0;
  if (!m) return 0.0;
  for (int i = 0; i < m->n; i++) {
    const dt_layer_info *in = &m->L[i].s.info;
    f += in->fwd_flops;
    if (!train || i < m->first_param) continue;
    /* Backward of a GEMM layer is two GEMMs of the forward's size (weight
     * and input gradients), one for the first layer; element-wise layers
     * cost about their forward again. */
    int gemm = in->kind == DT_L_LINEAR || in->kind == DT_L_CONV2D;
    f += in->fwd_flops * (gemm ? (i == m->first_param ? 1.0 : 2.0) : 1.0);
  }
  return f;
}

/* Layers i (conv), i+1 (relu, absorbed), i+2 (2x2 pool, fused) over the
 * batch in chunks of l->chunk samples; the conv output is chunk-sized
 * scratch that only the pool reads. */
static void conv_relu_pool_chunked(dt_model *m, int i, const float *x, int B) {
  layer *c = &m->L[i], *r = &m->L[i + 1], *p = &m->L[i + 2];
  const dt_layer_info *pin = &p->s.info;
  c->in = x;
  r->out = c->out;
  r->in = p->in = c->out;
  for (int b0 = 0; b0 < B; b0 += c->chunk) {
    int n = B - b0 < c->chunk ? B - b0 : c->chunk;
    c->g.B = n;
    dt_conv2d_forward(c->out, x + (size_t)b0 * c->in_el, c->w, c->b, &c->g, m->ws);
    dt_relu_maxpool2x2_forward(p->out + (size_t)b0 * p->out_el, p->code + (size_t)b0 * p->out_el,
                               c->out, n, pin->in_c, pin->in_h, pin->in_w);
  }
}

/* The forward of layers [0, stop); the model's output is the last one's. */
static int forward_layers(dt_model *m, const float *x, int B, const dt_step_ctx *ctx, int stop) {
  if (!m) return dt__seterr(DT_EINVAL, "model forward: model is NULL");
  if (!x) return dt__seterr(DT_EINVAL, "model forward: input x is NULL");
  if (B < 1 || B > m->max_batch)
    return dt__seterr(DT_EINVAL, "model forward: batch %d outside [1, %d]", B, m->max_batch);
  int train = ctx ? ctx->train : 0;
  const float *cur = x;
  for (int i = 0; i < stop; i++) {
    layer *l = &m->L[i];
    const dt__layer_spec *s = &l->s;
    const dt_layer_info *in = &s->info;
    size_t N = (size_t)B * l->out_el;
    l->in = cur;
    switch (in->kind) {
    case DT_L_LINEAR:
      if (m->wpk && dt__wpack_get(m->wpk, i))
        dt_linear_forward_packed(l->out, cur, dt__wpack_get(m->wpk, i), l->b, B, (int)l->in_el,
                                 s->oc);
      else
        dt_linear_forward_f(m->gemm_flags, l->out, cur, l->w, l->b, B, (int)l->in_el, s->oc);
      break;
    case DT_L_CONV2D:
      if (l->chunk) {
        conv_relu_pool_chunked(m, i, cur, B);
        cur = m->L[i + 2].out;
        i += 2;
        continue;
      }
      l->g.B = B;
      dt_conv2d_forward(l->out, cur, l->w, l->b, &l->g, m->ws);
      break;
    case DT_L_MAXPOOL2D:
      if (l->fused == FUSE_RELU_POOL)
        dt_relu_maxpool2x2_forward(l->out, l->code, cur, B, in->in_c, in->in_h, in->in_w);
      else
        dt_maxpool2d_forward(l->out, l->argmax, cur, B, in->in_c, in->in_h, in->in_w, s->k,
                             s->stride);
      break;
    case DT_L_AVGPOOL2D:
      dt_avgpool2d_forward(l->out, cur, B, in->in_c, in->in_h, in->in_w, s->k, s->stride);
      break;
    case DT_L_RELU:
      if (l->fused == FUSE_ABSORBED) {
        l->out = (float *)cur; /* never written: the fused pool reads it */
        break;
      }
      /* In place: the input is a model buffer no later backward needs. */
      if (l->inplace) l->out = (float *)cur;
      dt_relu_forward(l->out, cur, N);
      break;
    case DT_L_GELU: dt_gelu_forward(l->out, cur, N); break;
    case DT_L_DROPOUT:
      if (train && s->p > 0.0f)
        dt_dropout_forward(l->out, l->mask, cur, B, l->out_el, s->p, ctx->seed, ctx->step,
                           ctx->sample0, m->layer_base + i);
      else
        memcpy(l->out, cur, N * sizeof(float));
      break;
    case DT_L_FLATTEN:
      /* Same memory, new shape. The cast is safe: a layer only writes its
       * input in place when the model owns it (relu checks owns_out chains). */
      l->out = (float *)cur;
      break;
    case DT_L_LAYERNORM:
      dt_layernorm_forward(l->out, l->mean, l->rstd, cur, l->w, l->b, B, (int)l->in_el, s->eps);
      break;
    case DT_L_BATCHNORM:
      dt_batchnorm_forward(l->out, l->mean, l->rstd, l->run_mean, l->run_var, cur, l->w, l->b, B,
                           s->bn_c, s->bn_s, s->eps, s->momentum, train);
      break;
    case DT_L_EMBEDDING: DT_CHECK(dt__embed_forward(l, cur, B)); break;
    case DT_L_DOT: dt_dot_forward(l->out, cur, l->w[0], B, (int)l->in_el / 2); break;
    }
    cur = l->out;
  }
  m->B = B;
  m->train = train;
  m->logits = cur;
  return DT_OK;
}

int dt_model_forward(dt_model *m, const float *x, int B, const dt_step_ctx *ctx) {
  return forward_layers(m, x, B, ctx, m ? m->n : 0);
}

int dt__model_tail_skip(const dt_model *m) {
  const int n = m->n;
  if (n >= 1 && m->L[n - 1].s.info.kind == DT_L_LINEAR) return 1;
  if (n >= 2 && m->L[n - 1].s.info.kind == DT_L_RELU && !m->L[n - 1].fused &&
      m->L[n - 2].s.info.kind == DT_L_LINEAR)
    return 2;
  return 0;
}

int dt__model_forward_kept(dt_model *m, const float *x, int B, const dt_step_ctx *ctx,
                           float **out) {
  const int k = dt__model_tail_skip(m), n = m->n;
  DT_CHECK(forward_layers(m, x, B, ctx, n - k));
  /* the skipped layers' inputs and outputs where their forward would put
   * them (the linear's output is the relu's too when the relu is in place) */
  const float *cur = m->logits;
  for (int i = n - k; i < n; i++) {
    layer *l = &m->L[i];
    l->in = cur;
    if (l->s.info.kind == DT_L_RELU && l->inplace) l->out = (float *)cur;
    cur = l->out;
  }
  m->logits = cur;
  *out = (float *)cur;
  return DT_OK;
}

/* The checks dt_model_loss and dt_model_backward share: a forward of B
 * samples ran and every label names a class. */
static int check_labels(const dt_model *m, const int32_t *labels, int B, const char *what) {
  if (!m) return dt__seterr(DT_EINVAL, "model %s: model is NULL", what);
  if (!labels) return dt__seterr(DT_EINVAL, "model %s: labels is NULL", what);
  if (!m->logits) return dt__seterr(DT_EINVAL, "model %s: no forward pass ran before", what);
  if (B != m->B)
    return dt__seterr(DT_EINVAL, "model %s: batch %d does not match the last forward (%d)", what,
                      B, m->B);
  uint32_t V = m->loss == DT__LOSS_MSE ? 1u << 24 : (uint32_t)m->out_dim;
  int bad = -1;
  for (int b = 0; b < B; b++)
    if ((uint32_t)labels[b] >= V) bad = b;
  if (bad >= 0)
    return dt__seterr(DT_EINVAL, "model %s: labels[%d] = %d is not a class in [0, %u)", what, bad,
                      (int)labels[bad], V);
  return DT_OK;
}

int dt_model_loss(dt_model *m, const int32_t *labels, int B, float *loss, int *ncorrect) {
  DT_CHECK(check_labels(m, labels, B, "loss"));
  float l = m->loss == DT__LOSS_MSE
                ? dt_mse(NULL, ncorrect, m->logits, labels, B)
                : dt_softmax_xent(NULL, ncorrect, m->logits, labels, B, (int)m->out_dim);
  if (loss) *loss = l;
  return DT_OK;
}

/* Backward of the first-parameter conv c (no input gradient) in chunks of
 * c->bchunk samples, dW and db summed in chunk order. With pool (the fused
 * relu+pool after c), each chunk's output gradient is made from d by the
 * pool's backward into c's chunk scratch; without, it is read from d. */
static void conv_first_backward_chunked(dt_model *m, layer *c, const float *d, const layer *pool,
                                        int B) {
  size_t nw = c->s.info.nparams, nb = (size_t)c->s.oc;
  for (int b0 = 0; b0 < B; b0 += c->bchunk) {
    int n = B - b0 < c->bchunk ? B - b0 : c->bchunk;
    const float *dc = d + (size_t)b0 * c->out_el;
    if (pool) {
      const dt_layer_info *pin = &pool->s.info;
      dt_relu_maxpool2x2_backward(c->out, d + (size_t)b0 * pool->out_el,
                                  pool->code + (size_t)b0 * pool->out_el, n, pin->in_c,
                                  pin->in_h, pin->in_w);
      dc = c->out;
    }
    float *dw = b0 ? c->dwtmp : c->dw;
    c->g.B = n;
    dt_conv2d_backward(NULL, dw, dw + (nw - nb), dc, c->in + (size_t)b0 * c->in_el, c->w, &c->g,
                       m->ws);
    if (b0) {
      float *restrict acc = c->dw;
      const float *restrict t = c->dwtmp;
      for (size_t j = 0; j < nw; j++) acc[j] += t[j];
    }
  }
}

/* Where a non-linear layer's backward writes its parameter gradients: the
 * buffer itself, or with accumulation the scratch that add_grads adds. */
static float *gdst(const dt_model *m, const layer *l) { return m->accum ? m->gtmp : l->dw; }
static void add_grads(const dt_model *m, layer *l) {
  if (!m->accum) return;
  float *restrict g = l->dw;
  const float *restrict t = m->gtmp;
  for (size_t j = 0; j < l->s.info.nparams; j++) g[j] += t[j];
}

void dt__model_set_wpack(dt_model *m, const dt__wpack *p) { m->wpk = p; }

int dt__model_wants_dinp(const dt_model *m, int layer) {
  return m && layer >= 0 && layer < m->n && (m->need_dx || layer > m->first_param);
}

void dt__model_set_wstash(dt_model *m, dt__wstash *s, int row0) {
  m->wst = s;
  m->wrow0 = row0;
}

/* A linear layer's input gradient dinp = d * W from W packed once per step
 * (wpack.c, DTRAIN_WPACK_DINP) when the model has it: computed here, and
 * NULL returned so the layer's backward makes only its other gradients;
 * otherwise dinp back, for the backward's own product. */
static float *packed_dinp(dt_model *m, int i, float *dinp, const float *d, int B) {
  const float *wd = dinp && m->wpk ? dt__wpack_get_dinp(m->wpk, i) : NULL;
  if (!wd) return dinp;
  const int C = (int)m->L[i].in_el, OC = m->L[i].s.oc;
  dt_sgemm_packed(B, C, OC, 1.0f, d, OC, wd, 0.0f, dinp, C);
  return NULL;
}

/* Linear layer i's input and output gradient d (B samples) into the stash. */
static int stash_rows(dt_model *m, int i, const float *d, int B) {
  const layer *l = &m->L[i];
  if (m->wrow0 < 0 || m->wrow0 + B > m->wst->max_rows || m->wst->n != m->n || !m->wst->x[i])
    return dt__seterr(DT_EINVAL, "model backward: stash rows [%d, %d) outside its %d rows",
                      m->wrow0, m->wrow0 + B, m->wst->max_rows);
  memcpy(m->wst->x[i] + (size_t)m->wrow0 * l->in_el, l->in, (size_t)B * l->in_el * sizeof(float));
  memcpy(m->wst->dy[i] + (size_t)m->wrow0 * l->out_el, d, (size_t)B * l->out_el * sizeof(float));
  return DT_OK;
}

/* Backward through the layers from the output gradient d (B samples). */
static int backward_layers(dt_model *m, float *d, int B, dt_grad_ready_fn on_ready, void *ud) {
  const int stop = m->need_dx ? 0 : m->first_param;
  for (int i = m->n - 1; i >= stop; i--) {
    layer *l = &m->L[i];
    const dt__layer_spec *s = &l->s;
    const dt_layer_info *in = &s->info;
    float *dinp = i == m->first_param && !m->need_dx
                      ? NULL
                      : (d == m->dbuf[0] ? m->dbuf[1] : m->dbuf[0]);
    size_t N = (size_t)B * l->out_el;
    float *gw = in->nparams ? gdst(m, l) : NULL;
    float *gb = in->nparams ? gw + (l->db - l->dw) : NULL;
    int reported = 0;
    switch (in->kind) {
    case DT_L_LINEAR:
      if (!dinp && on_ready && m->ready_piece && !m->wst && !m->accum &&
          in->nparams > m->ready_piece && l->db == l->dw + (size_t)s->oc * l->in_el) {
        /* the first layer in pieces of rows, last rows first (the bias with
         * them): each piece's floats are the same sums as in one product */
        const int C = (int)l->in_el, OC = s->oc;
        const int R = m->ready_piece / (size_t)C > 0 ? (int)(m->ready_piece / (size_t)C) : 1;
        dt_linear_backward_f(m->gemm_flags, NULL, NULL, l->db, d, l->in, l->w, B, C, OC);
        for (int o1 = OC; o1 > 0; o1 -= R) {
          const int o0 = o1 > R ? o1 - R : 0;
          dt_sgemm_f(m->gemm_flags, 1, 0, o1 - o0, C, B, 1.0f, d + o0, OC, l->in, C, 0.0f,
                     l->dw + (size_t)o0 * C, C);
          size_t n = (size_t)(o1 - o0) * C + (o1 == OC ? (size_t)OC : 0);
          on_ready(ud, in->param_off + (size_t)o0 * C, n);
        }
        reported = 1;
      } else if (m->wst) {
        DT_CHECK(stash_rows(m, i, d, B));
        float *din = packed_dinp(m, i, dinp, d, B);
        if (m->accum)
          dt_linear_backward_acc_f(m->gemm_flags, din, NULL, l->db, d, l->in, l->w, B,
                                   (int)l->in_el, s->oc);
        else
          dt_linear_backward_f(m->gemm_flags, din, NULL, l->db, d, l->in, l->w, B,
                               (int)l->in_el, s->oc);
      } else if (m->accum) {
        float *din = packed_dinp(m, i, dinp, d, B);
        dt_linear_backward_acc_f(m->gemm_flags, din, l->dw, l->db, d, l->in, l->w, B,
                                 (int)l->in_el, s->oc);
      } else {
        float *din = packed_dinp(m, i, dinp, d, B);
        dt_linear_backward_f(m->gemm_flags, din, l->dw, l->db, d, l->in, l->w, B, (int)l->in_el,
                             s->oc);
      }
      break;
    case DT_L_CONV2D:
      if (l->bchunk) {
        conv_first_backward_chunked(m, l, d, NULL, B);
        break;
      }
      l->g.B = B;
      dt_conv2d_backward(dinp, gw, gb, d, l->in, l->w, &l->g, m->ws);
      add_grads(m, l);
      break;
    case DT_L_MAXPOOL2D:
      if (l->fused == FUSE_RELU_POOL && i >= 2 && m->L[i - 2].chunk && m->L[i - 2].bchunk) {
        /* pool, relu and the first conv at once, chunk by chunk; the conv
         * is the last layer backward visits */
        layer *c = &m->L[i - 2];
        conv_first_backward_chunked(m, c, d, l, B);
        if (on_ready) on_ready(ud, c->s.info.param_off, c->s.info.nparams);
        return DT_OK;
      }
      if (l->fused == FUSE_RELU_POOL)
        dt_relu_maxpool2x2_backward(dinp, d, l->code, B, in->in_c, in->in_h, in->in_w);
      else
        dt_maxpool2d_backward(dinp, d, l->argmax, B, in->in_c, in->in_h, in->in_w, s->k,
                              s->stride);
      break;
    case DT_L_AVGPOOL2D:
      dt_avgpool2d_backward(dinp, d, B, in->in_c, in->in_h, in->in_w, s->k, s->stride);
      break;
    case DT_L_RELU:
      if (l->fused == FUSE_ABSORBED)
        dinp = d; /* the pool's input gradient is already the relu's */
      else
        dt_relu_backward(dinp, d, l->out, N);
      break;
    case DT_L_GELU: dt_gelu_backward(dinp, d, l->in, N); break;
    case DT_L_DROPOUT:
      if (m->train && s->p > 0.0f)
        dt_dropout_backward(dinp, d, l->mask, N);
      else
        memcpy(dinp, d, N * sizeof(float));
      break;
    case DT_L_FLATTEN: dinp = d; break;
    case DT_L_LAYERNORM:
      dt_layernorm_backward(dinp, gw, gb, d, l->in, l->w, l->mean, l->rstd, B, (int)l->in_el);
      add_grads(m, l);
      break;
    case DT_L_BATCHNORM:
      dt_batchnorm_backward(dinp, gw, gb, d, l->in, l->w, l->mean, l->rstd, B, s->bn_c, s->bn_s);
      add_grads(m, l);
      break;
    case DT_L_EMBEDDING: dt__embed_backward(m, l, d, dinp, B); break;
    case DT_L_DOT:
      dt_dot_backward(dinp, gw, d, l->in, B, (int)l->in_el / 2);
      add_grads(m, l);
      break;
    }
    if (in->nparams && on_ready && !reported) on_ready(ud, in->param_off, in->nparams);
    d = dinp;
  }
  m->dx = d;
  return DT_OK;
}

int dt_model_backward(dt_model *m, const int32_t *labels, int B, float *loss_out, int *ncorrect,
                      dt_grad_ready_fn on_ready, void *ud) {
  DT_CHECK(check_labels(m, labels, B, "backward"));
  float *d = m->dbuf[0];
  float loss = m->loss == DT__LOSS_MSE
                   ? dt_mse(d, ncorrect, m->logits, labels, B)
                   : dt_softmax_xent(d, ncorrect, m->logits, labels, B, (int)m->out_dim);
  if (loss_out) *loss_out = loss;
  if (m->gscale != 1.0f) {
    const float g = m->gscale;
    for (size_t j = 0; j < (size_t)B * m->out_dim; j++) d[j] *= g;
  }
  return backward_layers(m, d, B, on_ready, ud);
}

int dt__model_backward_dy(dt_model *m, const float *dy, int B, const float **dx,
                          dt_grad_ready_fn on_ready, void *ud) {
  if (!m->logits) return dt__seterr(DT_EINVAL, "model backward: no forward pass ran before");
  if (B != m->B)
    return dt__seterr(DT_EINVAL, "model backward: batch %d does not match the last forward (%d)",
                      B, m->B);
  /* the kernels only read the output gradient (const in every signature) */
  DT_CHECK(backward_layers(m, (float *)dy, B, on_ready, ud));
  if (dx) *dx = m->dx;
  return DT_OK;
}

const float *dt__model_dx(const dt_model *m) { return m->dx; }
size_t dt__model_act_bytes(const dt_model *m) { return m ? m->act_bytes : 0; }

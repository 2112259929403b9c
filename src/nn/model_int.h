/*
 * model_int.h — the model's insides, for the files that make up the model
 * (model.c: memory, forward, backward; model_embed.c: embedding layers):
 * a layer's spans of the flat buffers and its saved state, and the model
 * struct behind the opaque dt_model of nn.h. Nothing outside src/nn/
 * includes it.
 */
#ifndef DT_NN_MODEL_INT_H
#define DT_NN_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "nn/nn.h"
#include "nn/spec.h"
#include "tensor/tensor.h"

/* How a layer takes part in the execution plan. */
enum fuse {
  FUSE_NONE = 0,
  FUSE_ABSORBED,  /* relu done by the next layer: identity here */
  FUSE_RELU_POOL, /* 2x2 stride-2 maxpool that applies the relu before it */
};

typedef struct layer {
  dt__layer_spec s;
  size_t in_el, out_el;   /* per-sample elements */
  int owns_out;           /* out is this layer's own buffer */
  int inplace;            /* relu over its input buffer */
  int fused;              /* see enum fuse */
  int chunk;              /* conv before a relu+pool pair: samples per chunk, else 0 */
  int bchunk;             /* first-parameter conv: samples per backward chunk, else 0 */
  float *dwtmp;           /* bchunk: one chunk's dW and db (nparams) */
  float *out;             /* (max_batch, out_el); for flatten, the input */
  const float *in;        /* input of the last forward */
  float *w, *b;           /* spans of params: weight, then bias */
  float *dw, *db;         /* same spans of grads */
  float *run_mean, *run_var; /* batchnorm: spans of bufs (C each) */
  float *mean, *rstd;     /* saved statistics: layernorm (B), batchnorm (C) */
  float *mask;            /* dropout: (max_batch, out_el) */
  int32_t *argmax;        /* maxpool: (max_batch, out_el) */
  int32_t *ids, *prev;    /* embedding: the batch's ids; those the last backward wrote */
  int nprev;              /* embedding: entries of prev; -1: zero the whole gradient */
  uint8_t *code;          /* fused relu+maxpool: (max_batch, out_el), in the argmax arena */
  dt_conv2d_geom g;       /* conv: geometry at max_batch; B is set per call */
} layer;

/* Deferred weight gradients (nn.h, wstash.c): per linear layer, the stashed
 * inputs and output gradients of a step's rows. */
struct dt__wstash {
  int n, max_rows;
  float **x, **dy; /* per layer (linear ones): stashed inputs, output gradients */
  size_t bytes;
};

struct dt_model {
  int n;
  layer *L;
  int max_batch;
  int in_c, in_h, in_w;
  size_t in_dim, out_dim;
  int first_param;        /* first layer with parameters (n if none) */
  size_t nparams, nbufs;
  float *params, *grads, *bufs;
  float *own_grads;       /* the grads allocated here (grads may be borrowed) */
  void *params_raw;       /* the params' allocation (zalloc64) */
  float *own_params;      /* dt__model_point_params: the params allocated here while
                          * params are borrowed (NULL: params are its own) */
  void *grads_raw;        /* own_grads' allocation (zalloc64) */
  float *acts;            /* one arena for outputs, masks and statistics */
  int32_t *iacts;         /* one arena for maxpool argmax and codes */
  float *dbuf[2];         /* activation-gradient ping-pong, max_batch * max_elems */
  float *ws;              /* conv scratch, the largest over conv layers */
  dt_layer_info *infos;
  /* last forward */
  int B;
  int train;
  const float *logits;
  int gemm_flags;         /* dt_sgemm_f flags of every product (dt_model_set_gemm_flags) */
  /* pipeline stages (nn.h, dt__model_*) */
  int layer_base;         /* index of layer 0 in the whole model (dropout keys) */
  int need_dx;            /* backward goes down to layer 0 and keeps the input gradient */
  int accum;              /* backward adds parameter gradients instead of writing them */
  float gscale;           /* the loss gradient is multiplied by this */
  int loss;               /* enum dt__loss */
  int sparse_grads;       /* embeddings zero only the rows they wrote last */
  size_t ready_piece;     /* > 0: the first layer's (linear) weight gradient is made and
                          * reported ready in pieces of about this many floats */
  const float *dx;        /* input gradient of the last backward (need_dx) */
  float *gtmp;            /* accum: a non-linear layer's gradients before they are added */
  int shared;             /* params, grads and bufs are another model's */
  dt__wstash *wst;        /* deferred weight gradients (nn.h), or NULL */
  const dt__wpack *wpk;   /* packed forward weights (nn.h), or NULL */
  int wrow0;              /* this micro-batch's first stash row */
  size_t act_bytes;       /* activations, saved statistics, masks, gradient ping-pong */
};

/* model_embed.c: an embedding layer's (the first layer: ids in, rows out)
 * initialisation (layer i of the model), forward and backward. */
void dt__embed_init(layer *l, uint64_t seed, int i);
int dt__embed_forward(layer *l, const float *x, int B);
void dt__embed_backward(dt_model *m, layer *l, const float *d, float *dinp, int B);

#endif /* DT_NN_MODEL_INT_H */

/*
 * spec.h — internal to src/nn: the parsed form of a one-line model spec
 * ("conv(32,3,pad=1) relu maxpool(2) flatten linear(10)") with every layer's
 * shapes and its spans in the flat parameter and state buffers already
 * inferred. spec.c fills it without allocating any tensor memory, so the
 * parser can be fuzzed on its own; model.c turns it into a runnable model.
 */
#ifndef DT_NN_SPEC_H
#define DT_NN_SPEC_H

#include <stddef.h>

#include "nn/nn.h"

/* Limits that keep every size computation far from overflow (and a fuzzer
 * from asking for terabytes): per-sample elements of any activation, total
 * parameters, number of layers, any single integer argument. */
#define DT__SPEC_MAX_LAYERS 256
#define DT__SPEC_MAX_ELEMS ((size_t)1 << 26)
#define DT__SPEC_MAX_PARAMS ((size_t)1 << 30)
#define DT__SPEC_MAX_INT (1 << 24)

typedef struct dt__layer_spec {
  dt_layer_info info;
  char token[64];   /* the spec text of this layer, for messages (may be cut) */
  int oc;           /* linear: out features; conv: out channels */
  int k, stride, pad; /* conv and pooling */
  float p;          /* dropout probability */
  float eps;        /* layernorm, batchnorm */
  float momentum;   /* batchnorm running-stat momentum (PyTorch: 0.1) */
  int flat_in;      /* input is a flat vector (after flatten or linear) */
  int bn_c, bn_s;   /* batchnorm: channels and spatial size per sample */
} dt__layer_spec;

typedef struct dt__spec {
  int n;
  dt__layer_spec *L; /* n layers, malloc'd; free with dt__spec_free */
  size_t nparams, nbufs;
  size_t max_elems;  /* largest per-sample activation (input included) */
} dt__spec;

/* Parses `text` for per-sample input (c,h,w) and infers shapes. On error
 * returns DT_EINVAL (DT_ENOMEM if out of memory) with a message naming the
 * 1-based layer number and its token, and leaves *out empty. */
int dt__spec_parse(dt__spec *out, const char *text, int c, int h, int w);
void dt__spec_free(dt__spec *s);

#endif /* DT_NN_SPEC_H */

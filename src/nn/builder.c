/*
 * builder.c — a model put together one layer at a time (dt_model_builder):
 * the builder keeps the spec text and the input shape, and every
 * dt_model_add re-parses the whole spec with the new layer appended, so a
 * layer that does not fit is refused with the parser's message the moment
 * it is added and the builder stays as it was. dt_model_build is then
 * dt_model_create of that text.
 *
 * It does not know the layer language itself (spec.c does) and builds no
 * memory until dt_model_build.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/nn.h"
#include "nn/spec.h"

struct dt_model_builder {
  int c, h, w;
  int nlayers;
  size_t len, cap;
  char *spec; /* NUL-terminated, layers separated by one space */
};

int dt_model_builder_create(dt_model_builder **out, int c, int h, int w) {
  if (!out) return dt__seterr(DT_EINVAL, "model builder: out is NULL");
  *out = NULL;
  if (c < 1 || h < 1 || w < 1)
    return dt__seterr(DT_EINVAL, "model builder: input shape %dx%dx%d must be positive", c, h, w);
  dt_model_builder *b = calloc(1, sizeof *b);
  if (b) b->spec = calloc(1, b->cap = 64);
  if (!b || !b->spec) {
    free(b);
    return dt__seterr(DT_ENOMEM, "model builder: out of memory");
  }
  b->c = c, b->h = h, b->w = w;
  *out = b;
  return DT_OK;
}

void dt_model_builder_destroy(dt_model_builder *b) {
  if (!b) return;
  free(b->spec);
  free(b);
}

const char *dt_model_builder_spec(const dt_model_builder *b) { return b ? b->spec : NULL; }

int dt_model_add(dt_model_builder *b, const char *layer) {
  if (!b) return dt__seterr(DT_EINVAL, "model add: builder is NULL");
  if (!layer) return dt__seterr(DT_EINVAL, "model add: layer is NULL");
  size_t ll = strlen(layer);
  size_t need = b->len + 1 + ll + 1;
  if (need > b->cap) {
    size_t cap = need * 2;
    char *p = realloc(b->spec, cap);
    if (!p) return dt__seterr(DT_ENOMEM, "model add: out of memory");
    b->spec = p, b->cap = cap;
  }
  size_t old = b->len;
  if (old) b->spec[b->len++] = ' ';
  memcpy(b->spec + b->len, layer, ll + 1);
  b->len += ll;
  /* The whole model so far: the layer's syntax and whether it fits the
   * shape before it, and that it was exactly one layer. */
  dt__spec all;
  int rc = dt__spec_parse(&all, b->spec, b->c, b->h, b->w);
  int n = all.n;
  dt__spec_free(&all);
  if (rc == DT_OK && n != b->nlayers + 1)
    rc = dt__seterr(DT_EINVAL, "layer '%.64s' must be exactly one layer, not %d", layer,
                    n - b->nlayers);
  if (rc < 0) {
    b->len = old;
    b->spec[old] = '\0';
    return dt__preerr(rc, "model add");
  }
  b->nlayers++;
  return DT_OK;
}

int dt_model_build(dt_model_builder *b, int max_batch, dt_model **out) {
  if (!out) return dt__seterr(DT_EINVAL, "model build: out is NULL");
  *out = NULL;
  if (!b) return dt__seterr(DT_EINVAL, "model build: builder is NULL");
  if (!b->nlayers) return dt__seterr(DT_EINVAL, "model build: the builder has no layers");
  return dt_model_create(out, b->spec, b->c, b->h, b->w, max_batch);
}

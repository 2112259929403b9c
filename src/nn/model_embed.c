/*
 * model_embed.c — embedding layers inside a model (model.c dispatches to
 * them): an embedding is the first layer, its float input is a batch of
 * row ids, converted to indices once per batch with every one checked, and
 * its output those rows of the table. Its backward scatters into the
 * weight gradient; with dt__model_set_sparse_grads it zeroes only the rows
 * the previous backward wrote instead of the whole table, so a step costs
 * the batch's rows, not V x D (a parameter server moves only those rows,
 * docs/ps.md). The kernels are in embedding.c; this file does not
 * allocate (model.c lays out ids and prev with the other arenas).
 */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "nn/model_int.h"

void dt__model_set_ready_piece(dt_model *m, size_t floats) { m->ready_piece = floats; }

void dt__model_set_sparse_grads(dt_model *m, int on) {
  m->sparse_grads = on;
  for (int i = 0; i < m->n; i++) m->L[i].nprev = -1;
}

int dt__model_embedding_rows(const dt_model *m, const float *x, int B, int32_t *rows) {
  const layer *l = &m->L[0];
  if (l->s.info.kind != DT_L_EMBEDDING) return 0;
  int N = B * (int)l->in_el;
  DT_CHECK(dt_embedding_ids(rows, x, N, l->s.k));
  return dt_embedding_rows(rows, N, rows);
}

void dt__embed_init(layer *l, uint64_t seed, int i) {
  /* uniform with standard deviation std (PyTorch draws normal(0, 1)) */
  float bound = (float)(l->s.eps * sqrt(3.0));
  dt_rng_uniform(l->w, l->s.info.nparams, -bound, bound, seed, DT_RNG_INIT, 2 * (uint64_t)i);
}

int dt__embed_forward(layer *l, const float *x, int B) {
  DT_CHECK(dt_embedding_ids(l->ids, x, B * (int)l->in_el, l->s.k));
  dt_embedding_forward(l->out, l->ids, l->w, B * (int)l->in_el, l->s.oc);
  return DT_OK;
}

void dt__embed_backward(dt_model *m, layer *l, const float *d, float *dinp, int B) {
  /* accumulation adds straight into the gradient (no table-sized scratch) */
  const int n = B * (int)l->in_el, D = l->s.oc;
  if (!m->accum) {
    if (m->sparse_grads && l->nprev >= 0)
      for (int j = 0; j < l->nprev; j++)
        memset(l->dw + (size_t)l->prev[j] * D, 0, (size_t)D * sizeof(float));
    else
      memset(l->dw, 0, l->s.info.nparams * sizeof(float));
    l->nprev = 0;
  }
  dt_embedding_backward_add(l->dw, d, l->ids, n, D);
  if (l->nprev >= 0 && (size_t)l->nprev + n <= (size_t)m->max_batch * l->in_el) {
    memcpy(l->prev + l->nprev, l->ids, (size_t)n * sizeof(int32_t));
    l->nprev += n;
  } else {
    l->nprev = -1; /* more than one batch accumulated: zero everything next time */
  }
  if (dinp) memset(dinp, 0, (size_t)B * l->in_el * sizeof(float)); /* ids have none */
}

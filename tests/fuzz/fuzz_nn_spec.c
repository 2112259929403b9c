/*
 * fuzz_nn_spec.c — libFuzzer target for the model spec parser. Any input is
 * parsed as a spec for a small input shape chosen from the first byte; a
 * spec that parses into a small enough model is also built and run for one
 * training forward and backward on zeros, so the memory plan (aliases,
 * in-place relu, ping-pong buffers) meets ASan with odd layer sequences.
 * Must never crash, leak or hang.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "nn/nn.h"
#include "nn/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  static const int shapes[4][3] = {{1, 28, 28}, {3, 8, 8}, {16, 1, 1}, {2, 5, 7}};
  const int *sh = shapes[data[0] & 3];
  char *spec = malloc(size);
  if (!spec) return 0;
  memcpy(spec, data + 1, size - 1);
  spec[size - 1] = '\0';
  dt__spec sp;
  if (dt__spec_parse(&sp, spec, sh[0], sh[1], sh[2]) == DT_OK) {
    /* Keep each run cheap: bounded parameters, activations and work. */
    double flops = 0.0;
    for (int i = 0; i < sp.n; i++) flops += sp.L[i].info.fwd_flops;
    int small = sp.nparams <= (1u << 20) && sp.max_elems <= (1u << 16) && flops < 5e7;
    size_t nlayers = (size_t)sp.n;
    dt__spec_free(&sp);
    dt_model *m = NULL;
    if (small && dt_model_create(&m, spec, sh[0], sh[1], sh[2], 2) == DT_OK) {
      if ((size_t)dt_model_nlayers(m) != nlayers) abort();
      dt_model_init(m, 1);
      size_t in = (size_t)dt_model_in_dim(m), V = (size_t)dt_model_out_dim(m);
      float *x = calloc(2 * in, sizeof(float));
      int32_t y[2] = {0, (int32_t)(V - 1)};
      dt_step_ctx ctx = {1, 1, 0, 0};
      if (x && dt_model_forward(m, x, 2, &ctx) == DT_OK) dt_model_backward(m, y, 2, NULL, NULL, NULL, NULL);
      free(x);
      dt_model_destroy(m);
    }
  }
  free(spec);
  return 0;
}

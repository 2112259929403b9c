/*
 * bench.c — `dtrain bench compress`: the speed of every framed codec on
 * one core, encode (with the error-feedback residual) and decode (add into
 * a bucket) of one bucket of f32 gradients, repeated for a while; GB/s are
 * of f32 input (4 bytes per value; "int8ring" is the int8 ring's frame, a
 * step per 256 values, what dt_compress_reduce sends for int8), the compression ratio is dense bytes
 * over frame bytes. Also PowerSGD's local work (P = MQ, Q = M^T P, the
 * residual) for one square-ish matrix, without the collectives.
 *
 * It measures kernels only, not the network (bench/compress.sh does).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/compress/compress_int.h"
#include "core/core.h"

static double best_of(double a, double b) { return a < b ? a : b; }

int dt_cz_bench(void *out_file, size_t n, double ratio, double seconds) {
  FILE *out = out_file;
  if (n < 16 || n > ((size_t)1 << 30))
    return dt__seterr(DT_EINVAL, "bench compress: bucket of %zu values (16 .. 2^30)", n);
  float *x = dt_alloc(n * sizeof *x), *res = dt_alloc(n * sizeof *res), *dec = dt_alloc(n * sizeof *dec);
  size_t kmax = dt__cz_topk_k(n, ratio);
  void *frame = dt_alloc(dt_cz_frame_bytes(DT_CODEC_FP16, n, n) + dt_cz_frame_bytes(DT_CODEC_TOPK, n, kmax));
  if (!x || !res || !dec || !frame) {
    dt_free(x), dt_free(res), dt_free(dec), dt_free(frame);
    return dt__seterr(DT_ENOMEM, "bench compress: out of memory");
  }
  dt_rng_uniform(x, n, -1.0f, 1.0f, 1, DT_RNG_USER, 0);
  /* gradient-like: mostly small, a few large */
  for (size_t i = 0; i < n; i++) x[i] = x[i] * x[i] * x[i];
  fprintf(out, "# dtrain bench compress: one core, bucket of %zu f32 (%.1f MiB), topk ratio %g\n", n,
          (double)n * 4 / 1048576, ratio);
  fprintf(out, "%-9s %10s %11s %11s %13s %9s\n", "codec", "ratio", "encode_GB/s", "decode_GB/s",
          "enc+dec_GB/s", "rel_err");
  /* -1: the int8 ring's frames (a step per block; dt_compress_reduce's int8) */
  int codecs[] = {DT_CODEC_FP16, DT_CODEC_BF16, DT_CODEC_INT8, -1, DT_CODEC_QSGD, DT_CODEC_SIGN,
                  DT_CODEC_TOPK};
  int rc = DT_OK;
  for (int c = 0; c < 7 && rc == DT_OK; c++) {
    int codec = codecs[c], ring = codec < 0;
    size_t k = codec == DT_CODEC_TOPK ? kmax : n;
    size_t fb = ring ? dt__cz_i8b_bytes(n) : dt_cz_frame_bytes(codec, n, k);
    double te = 1e9, td = 1e9, tsum = 1e9;
    double t_end = dt_now() + seconds;
    int64_t it = 0;
    do {
      dt_cz_rng rng = {1, (uint64_t)it, 0};
      double t0 = dt_now();
      if (ring) dt__cz_i8b_encode(x, n, rng, frame, res, 0);
      else rc = dt_cz_encode(codec, x, n, k, 15, rng, frame, res);
      double t1 = dt_now();
      if (rc == DT_OK)
        rc = ring ? dt__cz_i8b_decode_add(frame, fb, n, dec, NULL)
                  : dt_cz_decode_add(codec, frame, fb, n, dec);
      double t2 = dt_now();
      te = best_of(te, t1 - t0);
      td = best_of(td, t2 - t1);
      tsum = best_of(tsum, t2 - t0);
      it++;
    } while (rc == DT_OK && (dt_now() < t_end || it < 3));
    if (rc < 0) break;
    /* accuracy of one round trip: ||x - decoded|| / ||x|| */
    memset(dec, 0, n * sizeof *dec);
    dt_cz_rng rng = {1, 0, 0};
    if (ring) {
      dt__cz_i8b_encode(x, n, rng, frame, NULL, 0);
      dt__cz_i8b_decode_add(frame, fb, n, dec, NULL);
    } else {
      dt_cz_encode(codec, x, n, k, 15, rng, frame, NULL);
      dt_cz_decode_add(codec, frame, fb, n, dec);
    }
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
      e += ((double)x[i] - dec[i]) * ((double)x[i] - dec[i]);
      s += (double)x[i] * x[i];
    }
    double gb = (double)n * 4 / 1e9;
    fprintf(out, "%-9s %10.1f %11.2f %11.2f %13.2f %9.4f\n", ring ? "int8ring" : dt__codec_names[codec],
            (double)n * 4 / (double)fb, gb / te, gb / td, gb / tsum, sqrt(e / (s > 0 ? s : 1)));
  }
  dt_free(x), dt_free(res), dt_free(dec), dt_free(frame);
  fflush(out);
  return rc;
}

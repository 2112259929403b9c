/*
 * conv2d.c — 2-D convolution (NCHW, PyTorch weight layout (OC,C,KH,KW),
 * stride, zero padding) as im2col + GEMM.
 *
 * The batch is processed in chunks of `bc` samples whose patch matrices sit
 * side by side in one (C*KH*KW) x (bc*OH*OW) matrix, so each step is one
 * large GEMM instead of bc small ones, while the chunk stays small enough to
 * live in cache (the whole batch's patch matrix for a 32->64 channel 3x3 conv
 * at 14x14 is 14 MB, far beyond L2, and this machine's memory is slow).
 * Forward: tmp(OC, bc*S) = W * col, then tmp is scattered into NCHW with the
 * bias. Backward per chunk: dout is packed to (OC, bc*S) once and used for
 * dW += dout * col^T and dcol = W^T * dout, then col2im.
 *
 * Stride-1 convolutions (the common case) take a faster route: each chunk's
 * input is first copied into zero-padded planes (Hp x Wp, plus a short zero
 * tail), and outputs are computed on the "padded grid" of OH x Wp positions,
 * of which the last Wp - OW per row are junk and are dropped. On that grid
 * every im2col row is ONE contiguous copy of OH*Wp floats (instead of OH
 * short ones with edge tests), and col2im is one contiguous add per row.
 * The junk columns cost Wp/OW extra GEMM work (16/14 for 14x14 pad 1); in
 * backward their dout is packed as zero, so they contribute nothing.
 *
 * With our own GEMM kernels (AVX-512 or AVX2, dt__gemm_own), stride-1
 * convolutions take the implicit-GEMM route described further down instead
 * (no patch matrix, no col2im).
 *
 * This file does not allocate; the caller supplies dt_conv2d_ws_floats()
 * floats of scratch.
 */
#include "nn/kernels.h"
#include "tensor/tensor.h"

#include <string.h>

#ifndef DT_CONV_IMPLICIT_FLOATS
/* Target per-chunk scratch of the implicit route: 128 Ki floats = 512 KiB,
 * half of this machine's L2. */
#define DT_CONV_IMPLICIT_FLOATS (128 * 1024)
#endif

#ifndef DT_CONV_CHUNK_FLOATS
/* Target size of one chunk's patch matrix (floats): 256 Ki floats = 1 MiB. */
#define DT_CONV_CHUNK_FLOATS (256 * 1024)
#endif

int dt_conv2d_geom_init(dt_conv2d_geom *g) {
  if (g->B <= 0 || g->C <= 0 || g->H <= 0 || g->W <= 0 || g->OC <= 0 || g->KH <= 0 ||
      g->KW <= 0 || g->stride <= 0 || g->pad < 0)
    return -1;
  int hp = g->H + 2 * g->pad, wp = g->W + 2 * g->pad;
  if (g->KH > hp || g->KW > wp) return -1;
  g->OH = (hp - g->KH) / g->stride + 1;
  g->OW = (wp - g->KW) / g->stride + 1;
  return 0;
}


/* Plan shared by ws_floats, forward and backward: which route, the grid. */
typedef struct plan {
  int grid;      /* 1: stride-1 padded-grid route */
  int K, S;      /* K = C*KH*KW; S = columns per sample (OH*OW or OH*Wp) */
  int Hp, Wp, P; /* padded plane geometry; P = plane stride (Hp*Wp + KW) */
  int bc;        /* samples per chunk */
} plan;

static plan make_plan(const dt_conv2d_geom *g) {
  plan p;
  p.grid = g->stride == 1;
  p.K = g->C * g->KH * g->KW;
  p.Hp = g->H + 2 * g->pad;
  p.Wp = g->W + 2 * g->pad;
  p.P = p.Hp * p.Wp + g->KW;
  p.S = p.grid ? g->OH * p.Wp : g->OH * g->OW;
  size_t per = (size_t)p.K * p.S;
  size_t bc = DT_CONV_CHUNK_FLOATS / (per ? per : 1);
  if (bc < 1) bc = 1;
  if (bc > (size_t)g->B) bc = (size_t)g->B;
  p.bc = (int)bc;
  return p;
}

/* Copies n stacks of `ch` planes (h, w) into zero-padded planes of `plane`
 * floats with pad ph (rows wp = w + 2*ph apart). */
static void pad_planes(float *xp, const float *src0, int nplanes, int h, int w, int ph, int wp,
                       int plane) {
  for (int q = 0; q < nplanes; q++) {
    float *restrict dst = xp + (size_t)q * plane;
    const float *restrict src = src0 + (size_t)q * h * w;
    memset(dst, 0, sizeof(float) * ((size_t)ph * wp + ph));
    for (int y = 0; y < h; y++) {
      float *row = dst + (size_t)(y + ph) * wp + ph;
      memcpy(row, src + (size_t)y * w, sizeof(float) * w);
      /* right pad of this row + left pad of the next */
      if (y + 1 < h) memset(row + w, 0, sizeof(float) * 2 * ph);
    }
    size_t used = (size_t)(h + ph) * wp - ph;
    memset(dst + used, 0, sizeof(float) * (plane - used));
  }
}

/* ---- implicit-GEMM route (our GEMM kernels, stride 1) -----------------
 *
 * Forward: no patch matrix at all. A chunk of n samples is copied into
 * "shifted planes": for every input channel c and kernel column kw, a plane
 * of (H + 2*pad) rows of OW floats, xs[c][kw][y][ow] = x[c][y-pad][ow+kw-pad]
 * (0 outside the image). Row (c,kh,kw) of sample i's patch matrix is then
 * the contiguous OH*OW floats of xs_i[c][kw] from row kh on, so the GEMM's B
 * operand is a row-offset table plus one segment of OH*OW columns per
 * sample (dt__gemm_op with rowoff, seg = OH*OW) and every column of the
 * product is a real output: no junk columns, unlike a padded grid of
 * OH x (W + 2*pad), whose (W+2*pad)/OW extra work is 16/14 = 14% at 14x14
 * pad 1. The price is KW copies of the input (KW short copies per row,
 * cheap next to the product). Output (OC, n*OH*OW) goes to tmp, then to NCHW
 * with the bias.
 *
 * Input gradient: for stride 1, dinp is the forward convolution of dout,
 * zero-padded by KH-1-pad, with the weights flipped in space and with the
 * channel axes swapped (W'[c][oc][kh][kw] = W[oc][c][KH-1-kh][KW-1-kw]). So
 * it is an implicit GEMM too (M = C, K = OC*KH*KW) and needs no col2im.
 * Here dout is copied into zero-padded planes and the product computed on
 * their padded grid of H x (OW + 2*(KW-1-pad)) positions, the junk columns
 * dropped: with 64 output channels, KW shifted copies of dout cost more
 * than the junk columns save (measured: 7.3-7.7 against 7.7-8.6 ms at
 * 64 x 32->64 x 14x14).
 *
 * Weight gradient: dW(OC, K) += dout(OC, n*OH*OW) * col(K, n*OH*OW)^T with
 * both operands read in place: dout as it is (rows oc, one segment of OH*OW
 * per sample), col as the forward's shifted planes (transposed operand). */

typedef struct iplan {
  int ok;         /* route usable */
  int K, KT;      /* C*KH*KW (forward), OC*KH*KW (transposed conv) */
  int OS, IS;     /* OH*OW, H*W */
  int PL;        /* shifted plane: (H+2*pad)*OW */
  size_t XS;      /* per sample: C*KW*PL */
  int Wq, Q, ST;  /* dout padded by KH-1-pad: rows Wq apart, planes of Q, grid H*Wq */
  int bc;         /* samples per chunk of a backward without the weight gradient */
  int bc1;        /* samples per chunk of the forward */
  int bcj;        /* samples per chunk of a backward with the weight gradient */
} iplan;

static int clamp_bc(size_t per, int B) {
  size_t bc = DT_CONV_IMPLICIT_FLOATS / (per ? per : 1);
  if (bc < 1) bc = 1;
  if (bc > (size_t)B) bc = (size_t)B;
  return (int)bc;
}

static iplan make_iplan(const dt_conv2d_geom *g) {
  iplan p = {0};
  p.ok = g->stride == 1 && g->KH == g->KW && g->pad <= g->KH - 1;
  p.K = g->C * g->KH * g->KW;
  p.KT = g->OC * g->KH * g->KW;
  p.OS = g->OH * g->OW;
  p.IS = g->H * g->W;
  p.PL = (g->H + 2 * g->pad) * g->OW;
  p.XS = (size_t)g->C * g->KW * p.PL;
  p.Wq = g->OW + 2 * (g->KW - 1 - g->pad);
  p.Q = (g->OH + 2 * (g->KH - 1 - g->pad)) * p.Wq + g->KW;
  p.ST = g->H * p.Wq;
  /* The input-gradient pass: dout's padded planes, dinp grid (C, H*Wq). */
  p.bc = clamp_bc((size_t)g->OC * p.Q + (size_t)g->C * p.ST, g->B);
  /* The forward: xs and the output grid. */
  p.bc1 = clamp_bc(p.XS + (size_t)g->OC * p.OS, g->B);
  /* The backward with a weight gradient (and an input gradient or not):
   * both gradients chunk by chunk, so the input-gradient pass finds dout in
   * cache after the weight-gradient pass read it. */
  p.bcj = clamp_bc(p.XS + (size_t)g->OC * p.Q + (size_t)g->C * p.ST, g->B);
  return p;
}

static size_t iplan_ws(const dt_conv2d_geom *g, const iplan *p) {
  size_t n = (size_t)p->K + p->KT + (size_t)g->C * p->KT; /* offsets, offsets', W' */
  size_t m = (size_t)p->bc * ((size_t)g->OC * p->Q + (size_t)g->C * p->ST);
  size_t m1 = (size_t)p->bc1 * (p->XS + (size_t)g->OC * p->OS);
  size_t mj = (size_t)p->bcj * (p->XS + (size_t)g->OC * p->Q + (size_t)g->C * p->ST);
  if (m1 > m) m = m1;
  n += m > mj ? m : mj;
  return n + 64;
}

static int use_implicit(const dt_conv2d_geom *g) {
  return dt__gemm_own() && make_iplan(g).ok;
}

size_t dt_conv2d_ws_floats(const dt_conv2d_geom *g) {
  plan p = make_plan(g);
  size_t n = ((size_t)p.K + (size_t)g->OC) * p.bc * p.S;
  if (p.grid) n += (size_t)p.bc * g->C * p.P;
  iplan q = make_iplan(g);
  if (q.ok) {
    size_t m = iplan_ws(g, &q);
    if (m > n) n = m;
  }
  if (dt__wino_ok(g)) {
    size_t m = dt__wino_ws_floats(g);
    if (m > n) n = m;
  }
  return n;
}

/* Offsets of the rows (c,kh,kw) of an implicit patch matrix over shifted
 * planes (KW planes of `plane` floats per channel, rows `w` floats long). */
static void fill_rowoff(int *off, int C, int KH, int KW, int plane, int w) {
  for (int c = 0; c < C; c++)
    for (int kh = 0; kh < KH; kh++)
      for (int kw = 0; kw < KW; kw++)
        off[(c * KH + kh) * KW + kw] = (c * KW + kw) * plane + kh * w;
}

/* Shifted planes of nplanes planes (h, w) of src0, padded by ph rows above
 * and below and pw columns left and right, for a stride-1 kernel KW wide:
 * dst[q][kw][y][o] = src[q][y-ph][o+kw-pw] (0 outside), y < h + 2*ph,
 * o < ow = w + 2*pw - KW + 1; each plane is (h + 2*ph) * ow floats. */
static void shift_planes(float *restrict dst, const float *restrict src0, int nplanes, int h,
                         int w, int ph, int pw, int KW) {
  const int ow = w + 2 * pw - KW + 1;
  const size_t pad = (size_t)ph * ow, plane = (size_t)(h + 2 * ph) * ow;
  for (int q = 0; q < nplanes; q++) {
    const float *restrict src = src0 + (size_t)q * h * w;
    for (int kw = 0; kw < KW; kw++, dst += plane) {
      /* columns [lo, hi) of a row read the image, the others are zero */
      int sh = kw - pw, lo = sh < 0 ? -sh : 0, hi = w - sh < ow ? w - sh : ow;
      if (hi < lo) hi = lo;
      memset(dst, 0, sizeof(float) * pad);
      float *restrict row = dst + pad;
      /* rows are short (14 to 28 floats here): plain loops, not memcpy calls */
      for (int y = 0; y < h; y++, row += ow) {
        const float *restrict s = src + (size_t)y * w + sh;
        for (int o = 0; o < lo; o++) row[o] = 0.0f;
        for (int o = lo; o < hi; o++) row[o] = s[o];
        for (int o = hi; o < ow; o++) row[o] = 0.0f;
      }
      memset(row, 0, sizeof(float) * pad);
    }
  }
}

static void implicit_forward(float *out, const float *inp, const float *weight, const float *bias,
                             const dt_conv2d_geom *g, float *ws) {
  const iplan p = make_iplan(g);
  const int OC = g->OC, OS = p.OS;
  const size_t inplane = (size_t)g->C * p.IS;
  int *off = (int *)ws;
  float *xs = ws + p.K + p.KT + (size_t)g->C * p.KT;
  float *tmp = xs + (size_t)p.bc1 * p.XS;
  fill_rowoff(off, g->C, g->KH, g->KW, p.PL, g->OW);
  dt__gemm_op A = {.p = weight, .trans = 0, .ld = p.K};
  for (int b0 = 0; b0 < g->B; b0 += p.bc1) {
    int n = g->B - b0 < p.bc1 ? g->B - b0 : p.bc1;
    int ld = n * OS;
    shift_planes(xs, inp + (size_t)b0 * inplane, n * g->C, g->H, g->W, g->pad, g->pad, g->KW);
    dt__gemm_op B = {.p = xs, .trans = 0, .rowoff = off, .seg = OS, .segstride = (int)p.XS};
    dt__gemm_own()->op(OC, ld, p.K, 1.0f, &A, &B, 0.0f, tmp, ld);
    for (int i = 0; i < n; i++)
      for (int oc = 0; oc < OC; oc++) {
        const float *restrict t = tmp + (size_t)oc * ld + (size_t)i * OS;
        float *restrict d = out + ((size_t)(b0 + i) * OC + oc) * OS;
        float bv = bias ? bias[oc] : 0.0f;
        for (int j = 0; j < OS; j++) d[j] = t[j] + bv;
      }
  }
}

/* dbias is summed here, chunk by chunk while dout is in cache, when dweight
 * is wanted; dt_conv2d_backward does it otherwise. */
static void implicit_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const dt_conv2d_geom *g,
                              float *ws) {
  const iplan p = make_iplan(g);
  const int OC = g->OC, C = g->C, KH = g->KH, KW = g->KW, OS = p.OS, IS = p.IS;
  const size_t inplane = (size_t)C * IS;
  int *off = (int *)ws, *offt = off + p.K;
  float *wt = ws + p.K + p.KT; /* W' (C, OC*KH*KW) */
  /* Samples per chunk: the weight gradient is chunked alike with or
   * without dinp (its sums, and so its bits, follow the chunks). */
  const int step = dweight ? p.bcj : p.bc;
  float *xs = wt + (size_t)C * p.KT;                             /* weight gradient */
  float *dq = dweight ? xs + (size_t)step * p.XS : xs; /* input gradient: dout's padded planes */
  float *tg = dq + (size_t)step * OC * p.Q;            /* dinp grid (C, n*H*Wq) */
  const int qh = KH - 1 - g->pad;        /* KH == KW on this route */
  fill_rowoff(off, C, KH, KW, p.PL, g->OW);
  if (dinp) {
    for (int oc = 0; oc < OC; oc++)
      for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) offt[(oc * KH + kh) * KW + kw] = oc * p.Q + kh * p.Wq + kw;
    for (int c = 0; c < C; c++)
      for (int oc = 0; oc < OC; oc++)
        for (int kh = 0; kh < KH; kh++)
          for (int kw = 0; kw < KW; kw++)
            wt[(size_t)c * p.KT + (oc * KH + kh) * KW + kw] =
                weight[(((size_t)oc * C + c) * KH + (KH - 1 - kh)) * KW + (KW - 1 - kw)];
  }
  for (int b0 = 0; b0 < g->B; b0 += step) {
    const int n = g->B - b0 < step ? g->B - b0 : step;
    if (dweight) {
      const int ld = n * OS;
      const float *dc = dout + (size_t)b0 * OC * OS;
      if (dbias)
        for (int i = 0; i < n; i++)
          for (int oc = 0; oc < OC; oc++)
            dbias[oc] += dt_vec_sum(dc + ((size_t)i * OC + oc) * OS, (size_t)OS);
      shift_planes(xs, inp + (size_t)b0 * inplane, n * C, g->H, g->W, g->pad, g->pad, KW);
      dt__gemm_op A = {.p = dc, .trans = 0, .ld = OS, .seg = OS, .segstride = OC * OS};
      dt__gemm_op B = {.p = xs, .trans = 1, .rowoff = off, .seg = OS, .segstride = (int)p.XS};
      if (p.K < 32) /* e.g. a first layer: 9 columns would waste much of a 48- or 16-wide tile */
        dt__gemm_own()->dot(OC, p.K, ld, 1.0f, &A, &B, b0 == 0 ? 0.0f : 1.0f, dweight, p.K);
      else
        dt__gemm_own()->op(OC, p.K, ld, 1.0f, &A, &B, b0 == 0 ? 0.0f : 1.0f, dweight, p.K);
    }
    if (dinp) {
      const int ld = n * p.ST;
      pad_planes(dq, dout + (size_t)b0 * OC * OS, n * OC, g->OH, g->OW, qh, p.Wq, p.Q);
      dt__gemm_op A = {.p = wt, .trans = 0, .ld = p.KT};
      dt__gemm_op B = {.p = dq, .trans = 0, .rowoff = offt, .seg = p.ST, .segstride = OC * p.Q};
      dt__gemm_own()->op(C, ld, p.KT, 1.0f, &A, &B, 0.0f, tg, ld);
      for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++) {
          const float *t = tg + (size_t)c * ld + (size_t)i * p.ST;
          float *d = dinp + ((size_t)(b0 + i) * C + c) * IS;
          for (int h = 0; h < g->H; h++)
            memcpy(d + (size_t)h * g->W, t + (size_t)h * p.Wq, sizeof(float) * g->W);
        }
    }
  }
}

/* im2col on the padded grid: col (K, n*S), row (c,kh,kw) of sample i is
 * xp_i[c] shifted by kh*Wp + kw. */
static void grid_im2col(float *col, const float *xp, int n, const dt_conv2d_geom *g, const plan *p) {
  size_t ld = (size_t)n * p->S;
  for (int c = 0; c < g->C; c++)
    for (int kh = 0; kh < g->KH; kh++)
      for (int kw = 0; kw < g->KW; kw++) {
        float *row = col + ((size_t)(c * g->KH + kh) * g->KW + kw) * ld;
        for (int i = 0; i < n; i++)
          memcpy(row + (size_t)i * p->S, xp + ((size_t)i * g->C + c) * p->P + kh * p->Wp + kw,
                 sizeof(float) * p->S);
      }
}

/* Adjoint of grid_im2col into padded planes dxp (overwritten), then unpad
 * into dinp for the n samples. */
static void grid_col2im(float *dinp, float *dxp, const float *col, int n, const dt_conv2d_geom *g,
                        const plan *p) {
  size_t ld = (size_t)n * p->S;
  memset(dxp, 0, sizeof(float) * (size_t)n * g->C * p->P);
  for (int c = 0; c < g->C; c++)
    for (int kh = 0; kh < g->KH; kh++)
      for (int kw = 0; kw < g->KW; kw++) {
        const float *row = col + ((size_t)(c * g->KH + kh) * g->KW + kw) * ld;
        for (int i = 0; i < n; i++) {
          const float *restrict src = row + (size_t)i * p->S;
          float *restrict dst = dxp + ((size_t)i * g->C + c) * p->P + kh * p->Wp + kw;
          for (int j = 0; j < p->S; j++) dst[j] += src[j];
        }
      }
  for (int q = 0; q < n * g->C; q++) {
    const float *src = dxp + (size_t)q * p->P + (size_t)g->pad * p->Wp + g->pad;
    float *dst = dinp + (size_t)q * g->H * g->W;
    for (int h = 0; h < g->H; h++)
      memcpy(dst + (size_t)h * g->W, src + (size_t)h * p->Wp, sizeof(float) * g->W);
  }
}

/* col (K, n*S) for images b0..b0+n-1 of inp: through the padded planes xp
 * on the grid route, by dt_im2col per image otherwise. */
static void build_col(float *col, float *xp, const float *inp, int b0, int n,
                      const dt_conv2d_geom *g, const plan *p) {
  const size_t inplane = (size_t)g->C * g->H * g->W, ld = (size_t)n * p->S;
  if (p->grid) {
    pad_planes(xp, inp + (size_t)b0 * inplane, n * g->C, g->H, g->W, g->pad, p->Wp, p->P);
    grid_im2col(col, xp, n, g, p);
  } else {
    for (int i = 0; i < n; i++)
      dt_im2col(col + (size_t)i * p->S, ld, inp + (size_t)(b0 + i) * inplane, g->C, g->H, g->W,
                g->KH, g->KW, g->stride, g->pad, g->OH, g->OW);
  }
}

void dt_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias,
                       const dt_conv2d_geom *g, float *ws) {
  if (dt__wino_ok(g)) {
    dt__wino_forward(out, inp, weight, bias, g, ws);
    return;
  }
  if (use_implicit(g)) {
    implicit_forward(out, inp, weight, bias, g, ws);
    return;
  }
  const plan p = make_plan(g);
  const int S = p.S, K = p.K, OC = g->OC, OS = g->OH * g->OW;
  const int rowlen = p.grid ? p.Wp : g->OW; /* tmp columns per output row */
  float *col = ws, *tmp = ws + (size_t)K * p.bc * S, *xp = tmp + (size_t)OC * p.bc * S;
  for (int b0 = 0; b0 < g->B; b0 += p.bc) {
    int n = g->B - b0 < p.bc ? g->B - b0 : p.bc;
    size_t ld = (size_t)n * S;
    build_col(col, xp, inp, b0, n, g, &p);
    dt_sgemm_f(g->gemm_flags, 0, 0, OC, (int)ld, K, 1.0f, weight, K, col, (int)ld, 0.0f, tmp, (int)ld);
    for (int i = 0; i < n; i++) {
      float *o = out + (size_t)(b0 + i) * OC * OS;
      for (int oc = 0; oc < OC; oc++) {
        const float *t = tmp + (size_t)oc * ld + (size_t)i * S;
        float *d = o + (size_t)oc * OS;
        float bv = bias ? bias[oc] : 0.0f;
        for (int oh = 0; oh < g->OH; oh++) {
          const float *restrict tr = t + (size_t)oh * rowlen;
          float *restrict dr = d + (size_t)oh * g->OW;
          for (int ow = 0; ow < g->OW; ow++) dr[ow] = tr[ow] + bv;
        }
      }
    }
  }
}

void dt_conv2d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const dt_conv2d_geom *g, float *ws) {
  const plan p = make_plan(g);
  const int S = p.S, K = p.K, OC = g->OC, OS = g->OH * g->OW;
  const int rowlen = p.grid ? p.Wp : g->OW;
  const size_t inplane = (size_t)g->C * g->H * g->W;
  float *col = ws, *tmp = ws + (size_t)K * p.bc * S, *xp = tmp + (size_t)OC * p.bc * S;

  const int wino = dt__wino_ok(g); /* Winograd's transform (winograd.c) */
  const int implicit = !wino && use_implicit(g);
  if (dbias) {
    for (int oc = 0; oc < OC; oc++) dbias[oc] = 0.0f;
    if (!(implicit && dweight))
      for (int b = 0; b < g->B; b++)
        for (int oc = 0; oc < OC; oc++)
          dbias[oc] += dt_vec_sum(dout + ((size_t)b * OC + oc) * OS, (size_t)OS);
  }
  if (!dweight && !dinp) return;
  if (wino) {
    dt__wino_backward(dinp, dweight, dout, inp, weight, g, ws);
    return;
  }
  if (implicit) {
    implicit_backward(dinp, dweight, dbias, dout, inp, weight, g, ws);
    return;
  }
  for (int b0 = 0; b0 < g->B; b0 += p.bc) {
    int n = g->B - b0 < p.bc ? g->B - b0 : p.bc;
    size_t ld = (size_t)n * S;
    /* Pack dout of this chunk as (OC, n*S), junk grid columns zeroed. */
    for (int i = 0; i < n; i++) {
      const float *src = dout + (size_t)(b0 + i) * OC * OS;
      for (int oc = 0; oc < OC; oc++) {
        float *t = tmp + (size_t)oc * ld + (size_t)i * S;
        const float *s = src + (size_t)oc * OS;
        for (int oh = 0; oh < g->OH; oh++) {
          float *restrict tr = t + (size_t)oh * rowlen;
          const float *restrict sr = s + (size_t)oh * g->OW;
          for (int ow = 0; ow < g->OW; ow++) tr[ow] = sr[ow];
          for (int ow = g->OW; ow < rowlen; ow++) tr[ow] = 0.0f;
        }
      }
    }
    if (dweight) {
      build_col(col, xp, inp, b0, n, g, &p);
      /* dW(OC,K) (+)= dout(OC, n*S) * col(K, n*S)^T */
      dt_sgemm_f(g->gemm_flags, 0, 1, OC, K, (int)ld, 1.0f, tmp, (int)ld, col, (int)ld, b0 == 0 ? 0.0f : 1.0f,
               dweight, K);
    }
    if (dinp) {
      /* dcol(K, n*S) = W(OC,K)^T * dout(OC, n*S); col is free to reuse. */
      dt_sgemm_f(g->gemm_flags, 1, 0, K, (int)ld, OC, 1.0f, weight, K, tmp, (int)ld, 0.0f, col, (int)ld);
      if (p.grid) {
        grid_col2im(dinp + (size_t)b0 * inplane, xp, col, n, g, &p);
      } else {
        for (int i = 0; i < n; i++)
          dt_col2im(dinp + (size_t)(b0 + i) * inplane, col + (size_t)i * S, ld, g->C, g->H, g->W,
                    g->KH, g->KW, g->stride, g->pad, g->OH, g->OW);
      }
    }
  }
}

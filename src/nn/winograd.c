/*
 * winograd.c — 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3)
 * (Lavin & Gray, 2015), normal mode only (not DT_GEMM_FIXED), on CPUs with
 * AVX2 + FMA and our own GEMM kernels.
 *
 * Each 2x2 block of outputs ("tile") is Y = A^T [U ⊙ V] A with U = G g G^T
 * (the 3x3 kernel, 4x4 after the transform) and V = B^T d B (the 4x4 input
 * patch), so per channel pair 16 multiplications make 4 outputs instead of
 * 36: summed over input channels, the 16 element positions xi are 16
 * independent GEMMs M_xi(OC, T) = U_xi(OC, C) * V_xi(C, T) over the tiles
 * T — 2.25x fewer multiply-adds than the direct (implicit-GEMM) route.
 *
 * The three products of a layer all take this form:
 *  - forward: as above;
 *  - input gradient: for stride 1 it is the forward convolution of dout
 *    padded by 2 - pad with the kernel flipped and the channel axes
 *    swapped, so the same routine with U' built from W';
 *  - weight gradient: the exact gradient of the forward's formula,
 *    dU_xi(OC, C) = sum over tiles of dM_xi(OC, T) * V_xi(C, T)^T with
 *    dM = A dY A^T, then dW = G^T dU G.
 *
 * Layout. Tiles are numbered by tile row (sample, ty) and column tx, each
 * tile row padded to TWP = tw rounded up to 8 lanes (the lanes beyond tw
 * read zeros and their outputs are dropped, their output gradients are
 * zero), so the transforms run 8 tiles per ymm register with contiguous
 * loads and stores: the input rows are de-interleaved into even and odd
 * columns (tile tx's columns 2tx .. 2tx+3 are even/odd at tx and tx+1).
 * Tile rows go in blocks of RB rows (N = RB * TWP columns) sized so that
 * the block's V (16 x C x N) and M (16 x OC x N) stay in L2 together:
 * transform, 16 GEMMs, inverse transform, block after block.
 *
 * Numerics: not the direct route's sums (the transforms add and subtract
 * inputs before the products), within the conv tolerance tests
 * (tests/nn/test_conv_routes.c: 1e-4 x the sum of |terms|).
 * DTRAIN_CONV_WINOGRAD=0 turns the route off (the implicit route then).
 *
 * This file does not allocate: dt__wino_ws_floats() floats of scratch.
 */
#include "core/core.h"
#include "nn/kernels.h"
#include "tensor/gemm_wino.h"
#include "tensor/tensor.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef DT_WINO_FLOATS
/* Target floats of one block's V and M together: 96 Ki floats = 384 KiB,
 * three quarters of this machine's L2. */
#define DT_WINO_FLOATS (96 * 1024)
#endif

int dt__wino_enabled(void) {
  static int on = -1;
  if (on < 0) on = dt_param(DT_PARAM_CONV_WINOGRAD) != 0;
  return on;
}

/* Tiling of an output of Ho x Wo for Ci input and Co output channels. */
typedef struct wgeo {
  int th, tw, twp; /* tile rows and columns per sample, columns padded to 8 */
  int rb;          /* tile rows per block */
  int wb;          /* floats per input row buffer: 2 * twp + 2, rounded to 8 */
} wgeo;

static wgeo make_wgeo(int Ho, int Wo, int Ci, int Co, int B) {
  wgeo w;
  w.th = (Ho + 1) / 2;
  w.tw = (Wo + 1) / 2;
  w.twp = (w.tw + 7) / 8 * 8;
  long per = 16L * (Ci + Co) * w.twp;
  long rb = DT_WINO_FLOATS / per;
  if (rb < 1) rb = 1;
  /* whole 16-column GEMM panels: an even number of 8-lane rows */
  if (rb > 1 && w.twp % 16) rb &= ~1L;
  long rows = (long)B * w.th;
  if (rb > rows) rb = rows;
  w.rb = (int)rb;
  w.wb = (2 * w.twp + 2 + 7) / 8 * 8 + 8; /* + 8: in_block's whole-vector tail */
  return w;
}

/* Distance between the 16 matrices xi of a block (rows x N): 32 floats
 * more than they need, so that the 16 streams of a transform (rows*N
 * floats apart, 8 or 16 KiB for the CNN) do not fall into one L1 set. */
static inline size_t xs(int rows, int N) { return (size_t)rows * N + 32; }

/* Scratch of one pass (transform blocks + row buffers). */
static size_t pass_ws(const wgeo *w, int Ci, int Co) {
  int n = w->rb * w->twp;
  return 16 * (xs(Ci, n) + xs(Co, n)) + 8 * (size_t)w->wb + 6 * (size_t)w->twp + 64;
}

int dt__wino_ok(const dt_conv2d_geom *g) {
  return g->KH == 3 && g->KW == 3 && g->stride == 1 && g->pad <= 2 && g->C >= 4 && g->OC >= 4 &&
         !(g->gemm_flags & DT_GEMM_FIXED) && dt__wino_enabled() &&
         dt__gemm_own() != NULL && dt__gemm_avx2_ok();
}

/* Floats of the 16 packed U_xi (Co x Ci each), 64-float aligned. */
static size_t apack_floats(int Co, int Ci) {
  return 16 * ((dt__gemm_avx2_packa_floats(Co, Ci) + 63) / 64 * 64);
}

size_t dt__wino_ws_floats(const dt_conv2d_geom *g) {
  size_t u = 16 * (size_t)g->OC * g->C, pa = apack_floats(g->OC, g->C), pb = apack_floats(g->C, g->OC);
  u += (pa > pb ? pa : pb);
  wgeo f = make_wgeo(g->OH, g->OW, g->C, g->OC, g->B); /* forward and weight gradient */
  wgeo d = make_wgeo(g->H, g->W, g->OC, g->C, g->B);   /* input gradient */
  size_t a = pass_ws(&f, g->C, g->OC), b = pass_ws(&d, g->OC, g->C);
  return 2 * u + (a > b ? a : b) + 64;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

/* ---- weight transforms (scalar: once per call, OC x C kernels) ---------- */

/* u[16] = G g G^T for a 3x3 kernel g (row-major, element (r,c) at
 * g[r*sr + c*sc]). */
static void wtrans(float u[16], const float *g, int sr, int sc) {
  float t[4][3];
  for (int c = 0; c < 3; c++) {
    float g0 = g[c * sc], g1 = g[sr + c * sc], g2 = g[2 * sr + c * sc];
    t[0][c] = g0;
    t[1][c] = 0.5f * (g0 + g1 + g2);
    t[2][c] = 0.5f * (g0 - g1 + g2);
    t[3][c] = g2;
  }
  for (int r = 0; r < 4; r++) {
    u[4 * r + 0] = t[r][0];
    u[4 * r + 1] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
    u[4 * r + 2] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
    u[4 * r + 3] = t[r][2];
  }
}

/* U[xi][o][i] for o < Co, i < Ci from W (OC, C, 3, 3): the forward's
 * (o = oc, i = c) or, flipped = 1, the input gradient's (o = c, i = oc,
 * kernel flipped in both directions). */
static void build_u(float *U, const float *W, int OC, int C, int flipped) {
  const int Co = flipped ? C : OC, Ci = flipped ? OC : C;
  for (int o = 0; o < Co; o++)
    for (int i = 0; i < Ci; i++) {
      float u[16];
      if (!flipped) wtrans(u, W + ((size_t)o * C + i) * 9, 3, 1);
      else wtrans(u, W + ((size_t)i * C + o) * 9 + 8, -3, -1);
      for (int x = 0; x < 16; x++) U[((size_t)x * Co + o) * Ci + i] = u[x];
    }
}

/* dW (OC, C, 3, 3) = G^T dU G from dU[xi][oc][c]. */
static void finish_dw(float *dW, const float *dU, int OC, int C) {
  const size_t st = (size_t)OC * C;
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++) {
      const float *d = dU + (size_t)oc * C + c;
      float D[4][4], T[3][4];
      for (int x = 0; x < 16; x++) D[x / 4][x % 4] = d[x * st];
      for (int k = 0; k < 4; k++) {
        T[0][k] = D[0][k] + 0.5f * (D[1][k] + D[2][k]);
        T[1][k] = 0.5f * (D[1][k] - D[2][k]);
        T[2][k] = 0.5f * (D[1][k] + D[2][k]) + D[3][k];
      }
      float *o = dW + ((size_t)oc * C + c) * 9;
      for (int r = 0; r < 3; r++) {
        o[3 * r + 0] = T[r][0] + 0.5f * (T[r][1] + T[r][2]);
        o[3 * r + 1] = 0.5f * (T[r][1] - T[r][2]);
        o[3 * r + 2] = 0.5f * (T[r][1] + T[r][2]) + T[r][3];
      }
    }
}

/* ---- data transforms, 8 tiles per register ------------------------------ */

/* A mask of the first n (0..8) lanes. */
AVX2 static inline __m256i tail_mask(int n) {
  static const int32_t t[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(t + 8 - n));
}

/* Even and odd elements of x[0..16). */
AVX2 static inline void deint(const float *x, __m256 *e, __m256 *o) {
  __m256 lo = _mm256_loadu_ps(x), hi = _mm256_loadu_ps(x + 8);
  __m256 se = _mm256_shuffle_ps(lo, hi, 0x88), so = _mm256_shuffle_ps(lo, hi, 0xDD);
  *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(se), 0xD8));
  *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(so), 0xD8));
}

/* Input transform of one tile row: rows[r] (r < 4) are the 4 input rows,
 * zero-padded, column x - pad at index x; V + xi * vs + lane the 16
 * outputs of the twp tiles. */
AVX2 static void in_row(float *V, size_t vs, const float *const rows[4], int twp,
                        const float *mask) {
  for (int v = 0; v < twp; v += 8) {
    __m256 h[4][4];
    const __m256 k0 = _mm256_loadu_ps(mask + v), k1 = _mm256_loadu_ps(mask + twp + v);
    const __m256 k2 = _mm256_loadu_ps(mask + 2 * twp + v), k3 = _mm256_loadu_ps(mask + 3 * twp + v);
    for (int r = 0; r < 4; r++) {
      __m256 x0, x1, x2, x3;
      deint(rows[r] + 2 * v, &x0, &x1);
      deint(rows[r] + 2 * v + 2, &x2, &x3);
      x0 = _mm256_and_ps(x0, k0), x1 = _mm256_and_ps(x1, k1);
      x2 = _mm256_and_ps(x2, k2), x3 = _mm256_and_ps(x3, k3);
      h[r][0] = _mm256_sub_ps(x0, x2);
      h[r][1] = _mm256_add_ps(x1, x2);
      h[r][2] = _mm256_sub_ps(x2, x1);
      h[r][3] = _mm256_sub_ps(x1, x3);
    }
    float *o = V + v;
    for (int k = 0; k < 4; k++) {
      _mm256_storeu_ps(o + (0 + k) * vs, _mm256_sub_ps(h[0][k], h[2][k]));
      _mm256_storeu_ps(o + (4 + k) * vs, _mm256_add_ps(h[1][k], h[2][k]));
      _mm256_storeu_ps(o + (8 + k) * vs, _mm256_sub_ps(h[2][k], h[1][k]));
      _mm256_storeu_ps(o + (12 + k) * vs, _mm256_sub_ps(h[1][k], h[3][k]));
    }
  }
}

/* Stores the first n (<= 16) of the interleaving of a and b (a0 b0 a1 b1 ...). */
AVX2 static inline void store_il(float *d, __m256 a, __m256 b, int n) {
  __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
  __m256 p0 = _mm256_permute2f128_ps(lo, hi, 0x20), p1 = _mm256_permute2f128_ps(lo, hi, 0x31);
  if (n >= 16) {
    _mm256_storeu_ps(d, p0);
    _mm256_storeu_ps(d + 8, p1);
    return;
  }
  if (n >= 8) {
    _mm256_storeu_ps(d, p0);
    d += 8, n -= 8, p0 = p1;
  }
  /* the first n < 8 lanes of p0: no maskstore (slow on AMD), no memcpy */
  __m128 q = _mm256_castps256_ps128(p0);
  if (n >= 4) {
    _mm_storeu_ps(d, q);
    q = _mm256_extractf128_ps(p0, 1);
    d += 4, n -= 4;
  }
  if (n >= 2) {
    _mm_storel_pi((__m64 *)d, q);
    q = _mm_movehl_ps(q, q);
    d += 2, n -= 2;
  }
  if (n) _mm_store_ss(d, q);
}

/* Output transform of one tile row for one output channel: M + xi * ms +
 * lane the 16 products, y0 (and y1 if not NULL) the two output rows, Wo
 * floats long, plus bias. */
AVX2 static void out_row(float *y0, float *y1, const float *M, size_t ms, int twp, int Wo,
                         float bias) {
  const __m256 vb = _mm256_set1_ps(bias);
  for (int v = 0; v < twp && 2 * v < Wo; v += 8) {
    __m256 s0[4], s1[4];
    const float *m = M + v;
    for (int k = 0; k < 4; k++) {
      __m256 m0 = _mm256_loadu_ps(m + k * ms), m1 = _mm256_loadu_ps(m + (4 + k) * ms);
      __m256 m2 = _mm256_loadu_ps(m + (8 + k) * ms), m3 = _mm256_loadu_ps(m + (12 + k) * ms);
      s0[k] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
      s1[k] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
    }
    int n = Wo - 2 * v;
    __m256 a = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0[0], s0[1]), s0[2]), vb);
    __m256 b = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s0[1], s0[2]), s0[3]), vb);
    store_il(y0 + 2 * v, a, b, n);
    if (y1) {
      a = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s1[0], s1[1]), s1[2]), vb);
      b = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s1[1], s1[2]), s1[3]), vb);
      store_il(y1 + 2 * v, a, b, n);
    }
  }
}

/* Output-gradient transform of one tile row: r0, r1 the two gradient rows
 * (zero-padded to 2 * twp); dM + xi * ms + lane = (A dY A^T)[xi]. */
AVX2 static void grad_row(float *dM, size_t ms, const float *r0, const float *r1, int twp,
                          const float *mask) {
  for (int v = 0; v < twp; v += 8) {
    __m256 a, b, c, d;
    const __m256 ke = _mm256_loadu_ps(mask + v), ko = _mm256_loadu_ps(mask + twp + v);
    deint(r0 + 2 * v, &a, &b);
    deint(r1 + 2 * v, &c, &d);
    a = _mm256_and_ps(a, ke), c = _mm256_and_ps(c, ke);
    b = _mm256_and_ps(b, ko), d = _mm256_and_ps(d, ko);
    __m256 p[4] = {a, _mm256_add_ps(a, c), _mm256_sub_ps(a, c), _mm256_sub_ps(_mm256_setzero_ps(), c)};
    __m256 q[4] = {b, _mm256_add_ps(b, d), _mm256_sub_ps(b, d), _mm256_sub_ps(_mm256_setzero_ps(), d)};
    float *o = dM + v;
    for (int j = 0; j < 4; j++) {
      _mm256_storeu_ps(o + (4 * j + 0) * ms, p[j]);
      _mm256_storeu_ps(o + (4 * j + 1) * ms, _mm256_add_ps(p[j], q[j]));
      _mm256_storeu_ps(o + (4 * j + 2) * ms, _mm256_sub_ps(p[j], q[j]));
      _mm256_storeu_ps(o + (4 * j + 3) * ms, _mm256_sub_ps(_mm256_setzero_ps(), q[j]));
    }
  }
}

/* Column masks of the input transform: mask[k * twp + t] all ones iff
 * column 2t + k - pad of a row is inside the image (0 <= . < Wi). */
static void fill_mask(float *mask, int twp, int Wi, int pad) {
  for (int k = 0; k < 4; k++)
    for (int t = 0; t < twp; t++) {
      int col = 2 * t + k - pad;
      uint32_t m = col >= 0 && col < Wi ? 0xFFFFFFFFu : 0u;
      memcpy(mask + k * twp + t, &m, sizeof m);
    }
}

/* Input transform of a block: tile rows r0 .. r0+nr-1 of images in
 * (B, Ci, Hi, Wi), padded by pad, into V[xi][ci][N], N = nr * twp.
 * Rows are read in place (2 * twp + 2 floats from column -pad, the
 * columns outside the image masked to zero), except where that would
 * leave the tensor: those go through bufs, 5 rows of wb floats (4 data
 * rows, 1 zero row), followed by the 4 * twp floats of fill_mask. */
AVX2 static void in_block(float *V, const float *in, int B, int Ci, int Hi, int Wi, int pad,
                          const wgeo *w, int r0, int nr, float *bufs) {
  const size_t N = (size_t)nr * w->twp, vs = xs(Ci, (int)N);
  float *zero = bufs + 4 * (size_t)w->wb, *mask = zero + w->wb;
  const float *end = in + (size_t)B * Ci * Hi * Wi;
  /* channel by channel, so that each of the 16 output streams is written
   * in order (tile row after tile row) */
  for (int c = 0; c < Ci; c++) {
    for (int rr = 0; rr < nr; rr++) {
      const int i = (r0 + rr) / w->th, ty = (r0 + rr) % w->th;
      const float *plane = in + ((size_t)i * Ci + c) * Hi * Wi;
      const float *rows[4];
      for (int r = 0; r < 4; r++) {
        int y = 2 * ty - pad + r;
        if (y < 0 || y >= Hi) {
          rows[r] = zero;
          continue;
        }
        const float *s = plane + (size_t)y * Wi;
        if (s - pad >= in && s - pad + 2 * w->twp + 2 <= end) {
          rows[r] = s - pad;
          continue;
        }
        float *b = bufs + (size_t)r * w->wb + pad;
        int x = 0;
        for (; x + 8 <= Wi; x += 8) _mm256_storeu_ps(b + x, _mm256_loadu_ps(s + x));
        if (x < Wi) /* the tail and zeros up to 8 (the right padding stays zero) */
          _mm256_storeu_ps(b + x, _mm256_maskload_ps(s + x, tail_mask(Wi - x)));
        rows[r] = b - pad;
      }
      in_row(V + (size_t)c * N + (size_t)rr * w->twp, vs, rows, w->twp, mask);
    }
  }
}

/* One convolution by the transform: out (B, Co, Ho, Wo) from in (B, Ci,
 * Hi, Wi) padded by pad, U[xi][Co][Ci], plus bias (or none); ws starts
 * with apack_floats(Co, Ci) for the packed U. */
AVX2 static void wino_conv(float *out, const float *in, const float *U, const float *bias, int B,
                           int Ci, int Hi, int Wi, int Co, int Ho, int Wo, int pad, float *ws) {
  const wgeo w = make_wgeo(Ho, Wo, Ci, Co, B);
  const int packed = Ci <= 256;
  const size_t aps = apack_floats(Co, Ci) / 16;
  float *AP = ws;
  if (packed)
    for (int x = 0; x < 16; x++) dt__gemm_avx2_packa(Co, Ci, U + (size_t)x * Co * Ci, Ci, AP + x * aps);
  ws += apack_floats(Co, Ci);
  const int nmax = w.rb * w.twp;
  float *V = ws, *M = V + 16 * xs(Ci, nmax), *bufs = M + 16 * xs(Co, nmax);
  memset(bufs, 0, sizeof(float) * 5 * (size_t)w.wb);
  fill_mask(bufs + 5 * (size_t)w.wb, w.twp, Wi, pad);
  const int rows = B * w.th;
  for (int r0 = 0; r0 < rows; r0 += w.rb) {
    const int nr = rows - r0 < w.rb ? rows - r0 : w.rb;
    const int N = nr * w.twp;
    in_block(V, in, B, Ci, Hi, Wi, pad, &w, r0, nr, bufs);
    for (int x = 0; x < 16; x++) {
      if (packed) {
        dt__gemm_avx2_apacked(Co, N, Ci, AP + x * aps, V + x * xs(Ci, N), N, M + x * xs(Co, N), N);
        continue;
      }
      dt__gemm_op A = {.p = U + (size_t)x * Co * Ci, .trans = 0, .ld = Ci};
      dt__gemm_op Bo = {.p = V + x * xs(Ci, N), .trans = 0, .ld = N};
      dt__gemm_own()->op(Co, N, Ci, 1.0f, &A, &Bo, 0.0f, M + x * xs(Co, N), N);
    }
    const size_t ms = xs(Co, N);
    for (int o = 0; o < Co; o++) { /* each of the 16 streams of M read in order */
      for (int rr = 0; rr < nr; rr++) {
        const int i = (r0 + rr) / w.th, ty = (r0 + rr) % w.th;
        float *y0 = out + (((size_t)i * Co + o) * Ho + 2 * ty) * Wo;
        float *y1 = 2 * ty + 1 < Ho ? y0 + Wo : NULL;
        out_row(y0, y1, M + (size_t)o * N + (size_t)rr * w.twp, ms, w.twp, Wo,
                bias ? bias[o] : 0.0f);
      }
    }
  }
}

AVX2 void dt__wino_forward(float *out, const float *inp, const float *weight, const float *bias,
                           const dt_conv2d_geom *g, float *ws) {
  float *U = ws;
  build_u(U, weight, g->OC, g->C, 0);
  wino_conv(out, inp, U, bias, g->B, g->C, g->H, g->W, g->OC, g->OH, g->OW, g->pad,
            ws + 2 * 16 * (size_t)g->OC * g->C);
}

/* dweight (overwritten) by the transform; dinp (if not NULL) too. */
AVX2 void dt__wino_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                            const float *weight, const dt_conv2d_geom *g, float *ws) {
  const int C = g->C, OC = g->OC;
  float *U = ws, *dU = ws + 16 * (size_t)OC * C, *pw = dU + 16 * (size_t)OC * C;
  if (dweight) {
    const wgeo w = make_wgeo(g->OH, g->OW, C, OC, g->B);
    const int nmax = w.rb * w.twp;
    float *V = pw, *dM = V + 16 * xs(C, nmax), *bufs = dM + 16 * xs(OC, nmax);
    /* g0, g1: the gradient rows; ib: in_block's 4 rows and zero row */
    memset(bufs, 0, sizeof(float) * 7 * (size_t)w.wb);
    float *g0 = bufs, *g1 = bufs + w.wb, *ib = bufs + 2 * (size_t)w.wb;
    fill_mask(bufs + 7 * (size_t)w.wb, w.twp, g->W, g->pad);
    /* gmask: even and odd lanes of a gradient row inside OW (2 x twp) */
    float *gmask = bufs + 7 * (size_t)w.wb + 4 * (size_t)w.twp, *zrow = ib + 4 * (size_t)w.wb;
    for (int k = 0; k < 2; k++)
      for (int t = 0; t < w.twp; t++) {
        uint32_t m = 2 * t + k < g->OW ? 0xFFFFFFFFu : 0u;
        memcpy(gmask + k * w.twp + t, &m, sizeof m);
      }
    const float *dend = dout + (size_t)g->B * OC * g->OH * g->OW;
    const int rows = g->B * w.th;
    for (int r0 = 0; r0 < rows; r0 += w.rb) {
      const int nr = rows - r0 < w.rb ? rows - r0 : w.rb;
      const int N = nr * w.twp;
      in_block(V, inp, g->B, C, g->H, g->W, g->pad, &w, r0, nr, ib);
      const size_t ms = xs(OC, N);
      for (int o = 0; o < OC; o++) {
        for (int rr = 0; rr < nr; rr++) {
          const int i = (r0 + rr) / w.th, ty = (r0 + rr) % w.th;
          /* rows read in place (columns from OW on masked) unless that
           * would leave dout: then through g0 / g1 */
          const float *d0 = dout + (((size_t)i * OC + o) * g->OH + 2 * ty) * g->OW, *d1 = d0 + g->OW;
          if (d0 + 2 * w.twp > dend) {
            for (int x = 0; x < g->OW; x++) g0[x] = d0[x];
            d0 = g0;
          }
          if (2 * ty + 1 >= g->OH) d1 = zrow;
          else if (d1 + 2 * w.twp > dend) {
            for (int x = 0; x < g->OW; x++) g1[x] = d1[x];
            d1 = g1;
          }
          grad_row(dM + (size_t)o * N + (size_t)rr * w.twp, ms, d0, d1, w.twp, gmask);
        }
      }
      for (int x = 0; x < 16; x++) {
        dt__gemm_op A = {.p = dM + x * xs(OC, N), .trans = 0, .ld = N};
        dt__gemm_op Bo = {.p = V + x * xs(C, N), .trans = 1, .ld = N};
        dt__gemm_own()->op(OC, C, N, 1.0f, &A, &Bo, r0 == 0 ? 0.0f : 1.0f,
                           dU + (size_t)x * OC * C, C);
      }
    }
    finish_dw(dweight, dU, OC, C);
  }
  if (dinp) {
    build_u(U, weight, OC, C, 1);
    wino_conv(dinp, dout, U, NULL, g->B, OC, g->OH, g->OW, C, g->H, g->W, 2 - g->pad, pw);
  }
}

#else

void dt__wino_forward(float *out, const float *inp, const float *weight, const float *bias,
                      const dt_conv2d_geom *g, float *ws) {
  (void)out; (void)inp; (void)weight; (void)bias; (void)g; (void)ws;
}
void dt__wino_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                       const float *weight, const dt_conv2d_geom *g, float *ws) {
  (void)dinp; (void)dweight; (void)dout; (void)inp; (void)weight; (void)g; (void)ws;
}

#endif

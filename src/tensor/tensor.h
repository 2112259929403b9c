/*
 * tensor.h — the dense f32 compute layer under nn: row-major GEMM through
 * CBLAS (OpenBLAS), im2col/col2im for convolutions, and a few small
 * element-wise helpers. Everything works on raw float arrays whose shapes are
 * arguments; nothing here allocates, so kernels can run on caller-owned
 * buffers (one flat parameter/gradient buffer per model).
 *
 * Threads: OpenBLAS decides its own thread count from OPENBLAS_NUM_THREADS;
 * dtrain runs one compute thread per worker, so callers that want that
 * guarantee call dt_tensor_set_threads(1) once at start-up.
 *
 * GEMM back ends: dt_sgemm runs our own kernels — AVX-512 (gemm_avx512.c)
 * when the CPU has it, else AVX2 + FMA (gemm_avx2.c) — for the shapes they
 * win (N >= 16), CBLAS otherwise or when DTRAIN_GEMM=blas; see
 * dt_tensor_gemm_impl(). Our kernels matter because OPENBLAS_CORETYPE
 * may pin OpenBLAS to its Haswell (AVX2) kernels, about half the sgemm rate
 * of AVX-512 code on this kind of CPU, and because deterministic mode
 * (DT_GEMM_FIXED) needs every sum in an order it controls. dtrain never
 * changes or overrides that variable: it is set on purpose on machines
 * where older OpenBLAS builds misbehave with their own kernel detection, so
 * our kernels, not a re-tuned OpenBLAS, are the fast path.
 */
#ifndef DT_TENSOR_H
#define DT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

/* Sets the number of OpenBLAS threads for this process (n >= 1). */
void dt_tensor_set_threads(int n);
/* The OpenBLAS kernel family in use ("Haswell", "SkylakeX", ...). */
const char *dt_tensor_blas_core(void);
/* 1 if the CPU has AVX-512 (F, BW, DQ, VL) but OpenBLAS did not pick an
 * AVX-512 kernel family, i.e. setting OPENBLAS_CORETYPE=SkylakeX before start
 * would speed GEMM up. */
int dt_tensor_blas_underpowered(void);


/* C = alpha * op(A) * op(B) + beta * C, row-major. op(A) is M x K, op(B) is
 * K x N, C is M x N; ta/tb nonzero mean "transpose". lda/ldb/ldc are the row
 * strides of A, B, C as stored. */
void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* dt_sgemm with flags. DT_GEMM_FIXED: every shape through our own kernels
 * (AVX-512 or AVX2 + FMA, whichever dt_tensor_gemm_impl() names, else the
 * portable fixed-order kernel of gemm_ref.c), never CBLAS, so the result depends on this binary and the
 * CPU's ISA only, not on OpenBLAS's CPU-specific kernel choice
 * (OPENBLAS_CORETYPE). Deterministic mode sets it per model
 * (dt_model_set_gemm_flags); dt_sgemm is dt_sgemm_f with flags 0. */
#define DT_GEMM_FIXED 1
void dt_sgemm_f(int flags, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);

/* A matrix B used by many products of few rows (a layer's weights over
 * the micro-batches of a step): dt_sgemm_packb_floats(tb, K, N) is the
 * size of its packed form, 0 when it is not worth packing for our own
 * kernels (none here, or N < 16: then call dt_sgemm); dt_sgemm_packb
 * packs op(B) (K x N, ldb as for dt_sgemm) into dst; dt_sgemm_packed is
 * dt_sgemm_f(DT_GEMM_FIXED, ta = 0, tb, M, N, K, ...) with the packed B,
 * the same bits, without re-packing B for every call (dt_sgemm itself may
 * send a large shape to CBLAS instead: other bits). Repack after B
 * changes. */
size_t dt_sgemm_packb_floats(int tb, int K, int N);
void dt_sgemm_packb(int tb, int K, int N, const float *B, int ldb, float *dst);
void dt_sgemm_packed(int M, int N, int K, float alpha, const float *A, int lda, const float *Bp,
                     float beta, float *C, int ldc);

/* A 64-bit hash of a small fixed computation (DT_GEMM_FIXED products of
 * the shapes layers use, and the libm functions they call). Two processes
 * with different hashes would not train bit for bit alike in deterministic
 * mode; data-parallel workers compare it at start (det_probe.c). */
uint64_t dt_tensor_det_probe(void);

/* Which GEMM dt_sgemm uses: "avx512" (our own kernels, gemm_avx512.c) when
 * the CPU has AVX-512, else "avx2" (gemm_avx2.c) when it has AVX2 and FMA,
 * else "blas" (CBLAS). The environment variable DTRAIN_GEMM=blas|avx2|avx512
 * overrides the choice (read once per process; a kernel set the CPU cannot
 * run falls back to blas, with a warning). */
const char *dt_tensor_gemm_impl(void);

/* ---- internal (tensor layer and its kernels; not a public API) ---------- */

/* A GEMM operand as a set of rows, each contiguous along one index x:
 * element (r, x) is at p[off(r) + pos(x)], off(r) = rowoff ? rowoff[r] :
 * r*ld, pos(x) = seg ? (x/seg)*segstride + x%seg : x. For A (M x K),
 * trans == 0 means rows are m and x is k (row-major A), trans == 1 rows are
 * k and x is m (A stored transposed). For B (K x N), trans == 0 means rows
 * are k and x is n, trans == 1 rows are n and x is k. The offset table and
 * segments express im2col on a padded grid without materialising it. */
typedef struct dt__gemm_op {
  const float *p;
  int trans;
  int ld;
  const int *rowoff;
  int seg, segstride;
} dt__gemm_op;

/* One set of our own GEMM kernels, for one ISA (gemm_avx512.c: 8 x 48 zmm
 * tiles; gemm_avx2.c: 6 x 16 ymm tiles). Every element of C is computed in
 * an order fixed by K alone (never by M, N, its place in a tile or the
 * thread), which is what DT_GEMM_FIXED relies on; the two sets round
 * differently from each other.
 *   ok():  1 if this CPU can run them.
 *   op:    C(M,N) = alpha * A * B + beta * C with operands as above (beta
 *          == 0 means C is not read).
 *   dot:   C(M,N) = alpha * sum_x A(m,x) B(n,x) + beta * C, both operands
 *          as rows contiguous along x (A->trans and B->trans ignored: A's
 *          rows are m, B's rows are n). For short N, where a register tile
 *          would be mostly empty.
 *   packb_floats(K, N) floats (0 without x86-64 intrinsics) filled by
 *          packb(K, N, B, dst) are B packed ahead of time, used by
 *          op_packed as op would use B, with the same bits. */
typedef struct dt__gemm_kern {
  const char *name; /* "avx512", "avx2" */
  int (*ok)(void);
  void (*op)(int M, int N, int K, float alpha, const dt__gemm_op *A, const dt__gemm_op *B,
             float beta, float *C, int ldc);
  void (*dot)(int M, int N, int X, float alpha, const dt__gemm_op *A, const dt__gemm_op *B,
              float beta, float *C, int ldc);
  size_t (*packb_floats)(int K, int N);
  void (*packb)(int K, int N, const dt__gemm_op *B, float *dst);
  void (*op_packed)(int M, int N, int K, float alpha, const dt__gemm_op *A, const float *bp,
                    float beta, float *C, int ldc);
} dt__gemm_kern;
extern const dt__gemm_kern dt__gemm_kern_avx512, dt__gemm_kern_avx2;

/* The kernel set dt_sgemm uses (resolved once per process from the CPU and
 * DTRAIN_GEMM): AVX-512 where the CPU has it, else AVX2 + FMA, else NULL
 * (CBLAS, and gemm_ref.c for DT_GEMM_FIXED). */
const dt__gemm_kern *dt__gemm_own(void);
/* dt_sgemm's arguments through one kernel set (tests, benchmarks). */
void dt__sgemm_kern(const dt__gemm_kern *k, int ta, int tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The entry points behind the two tables. */
int dt__gemm_avx512_ok(void);
void dt__gemm_avx512_op(int M, int N, int K, float alpha, const dt__gemm_op *A,
                        const dt__gemm_op *B, float beta, float *C, int ldc);
void dt__gemm_avx512_dot(int M, int N, int X, float alpha, const dt__gemm_op *A,
                         const dt__gemm_op *B, float beta, float *C, int ldc);
size_t dt__gemm_avx512_packb_floats(int K, int N);
void dt__gemm_avx512_packb(int K, int N, const dt__gemm_op *B, float *dst);
void dt__gemm_avx512_op_packed(int M, int N, int K, float alpha, const dt__gemm_op *A,
                               const float *bp, float beta, float *C, int ldc);
int dt__gemm_avx2_ok(void);
void dt__gemm_avx2_op(int M, int N, int K, float alpha, const dt__gemm_op *A,
                      const dt__gemm_op *B, float beta, float *C, int ldc);
void dt__gemm_avx2_dot(int M, int N, int X, float alpha, const dt__gemm_op *A,
                       const dt__gemm_op *B, float beta, float *C, int ldc);
size_t dt__gemm_avx2_packb_floats(int K, int N);
void dt__gemm_avx2_packb(int K, int N, const dt__gemm_op *B, float *dst);
void dt__gemm_avx2_op_packed(int M, int N, int K, float alpha, const dt__gemm_op *A,
                             const float *bp, float beta, float *C, int ldc);
/* The CBLAS back end, callable directly (tests, benchmarks). */
void dt__sgemm_blas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);
/* The portable fixed-order kernel behind DT_GEMM_FIXED without our kernels. */
void dt__sgemm_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);

/* im2col for one image img (C,H,W): writes the (C*KH*KW) x (OH*OW) patch
 * matrix into col, whose rows are ldcol floats apart (ldcol >= OH*OW), so
 * several images can sit side by side in one matrix. Padding reads as 0. */
void dt_im2col(float *col, size_t ldcol, const float *img, int C, int H, int W, int KH, int KW,
               int stride, int pad, int OH, int OW);
/* col2im: the adjoint of dt_im2col. OVERWRITES img (C,H,W) with the sum of
 * the patch entries that map to each pixel. */
void dt_col2im(float *img, const float *col, size_t ldcol, int C, int H, int W, int KH, int KW,
               int stride, int pad, int OH, int OW);

/* Small helpers. */
void dt_vec_zero(float *x, size_t n);
void dt_vec_add(float *restrict y, const float *restrict x, size_t n);   /* y += x */
float dt_vec_sum(const float *x, size_t n);

#endif /* DT_TENSOR_H */

/*
 * test_kernels_pool_portable.c — test_kernels_pool's checks on the plain C
 * route of pool.c (the one non-AVX-512 machines run): pool.c is compiled
 * into this test with DT_NN_PORTABLE, so its definitions replace the
 * library's.
 */
#define DT_NN_PORTABLE 1
#include "nn/pool.c"

#include "test_kernels_pool.c"

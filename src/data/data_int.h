/*
 * data_int.h — internal to the data layer: the in-memory parsers that the
 * path readers use (and that the fuzz targets call directly), the limits
 * every reader enforces before allocating, and the whole-file read helper.
 * Nothing outside src/data/ and its tests/fuzzers should include this.
 */
#ifndef DT_DATA_INT_H
#define DT_DATA_INT_H

#include "core/core.h"
#include "data/data.h"

/* Largest decoded payload a reader accepts, in bytes of the file's own
 * element type (parameter DTRAIN_DATA_MAX_BYTES, default 1 GiB). Headers that
 * claim more are rejected before anything is allocated. */
size_t dt__data_max_bytes(void);

/* Allocation for big buffers: 2 MiB aligned and advised for transparent
 * huge pages when at least 4 MiB, because first-touch page faults dominate
 * loading otherwise (4 KiB faults cost ~10 us each on VMs). The memory comes
 * from posix_memalign, so free() and dt_free() (which is free()) release it
 * and realloc() may grow it. */
void *dt__data_alloc(size_t bytes);

/* Reads a whole file (at most max bytes, else DT_ERANGE) into a malloc'd
 * buffer; *buf is freed with free(). Errors name the path. */
int dt__read_file(const char *path, size_t max, uint8_t **buf, size_t *len);

/* IDX, one file held in memory (raw or gzip, detected by content). want_ndim
 * is 3 for images (magic 0x00000803) or 1 for labels (0x00000801). On success
 * *data (free with dt_free) holds dims[0]*...*dims[want_ndim-1] bytes. */
int dt__idx_parse_mem(const void *buf, size_t len, const char *name, int want_ndim,
                      uint8_t **data, int64_t dims[3]);
/* Images + labels in memory to a dataset (what dt_idx_load does after reading). */
int dt__idx_load_mem(dt_dataset *ds, const void *img, size_t img_len, const char *img_name,
                     const void *lab, size_t lab_len, const char *lab_name);

/* CSV text in memory to a dataset (what dt_csv_load does after reading). */
int dt__csv_parse_mem(dt_dataset *ds, const char *buf, size_t len, const char *name, int label_col);

/* .npy features + labels in memory to a dataset (what dt_npy_load does). */
int dt__npy_load_mem(dt_dataset *ds, const void *x, size_t x_len, const char *x_name,
                     const void *y, size_t y_len, const char *y_name);

#endif /* DT_DATA_INT_H */

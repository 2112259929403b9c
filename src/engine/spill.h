/*
 * spill.h — rank 0's unlinked checkpoint spill file (spill.c), shared by
 * the pipeline's and ZeRO-1's checkpoints.
 */
#ifndef DT_ENGINE_SPILL_H
#define DT_ENGINE_SPILL_H

#include <stddef.h>
#include <stdint.h>

/* An unlinked file in dir (O_TMPFILE, or a named one ".TAG-spill-XXXXXX"
 * removed at once); -1 with errno on failure. */
int dt__spill_open(const char *dir, const char *tag);

/* n floats at p into the spill at byte foff; a failure is remembered in
 * *werr (errno) and later writes skipped. */
void dt__spill_put(int fd, const float *p, size_t n, uint64_t foff, int *werr);

#endif

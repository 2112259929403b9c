/*
 * csv_blobs.h — the small labelled data set the engine tests train on: n
 * samples of 3 classes in 6 features, class k centred at `centre` on
 * features 2k and 2k+1, with deterministic uniform jitter in [-spread,
 * spread] from the project RNG (so every run and rank sees the same
 * bytes); 0, or -1 when the file cannot be written. Header-only (one static function) because each test is its own
 * executable; it does not make directories or configs.
 */
#ifndef DT_TESTS_CSV_BLOBS_H
#define DT_TESTS_CSV_BLOBS_H

#include <stdint.h>
#include <stdio.h>

#include "core/core.h"

__attribute__((unused)) static int write_csv_blobs(const char *file, int n, uint64_t seed,
                                                   float centre, float spread) {
  FILE *f = fopen(file, "w");
  if (!f) return -1;
  fprintf(f, "label,a,b,c,d,e,g\n");
  for (int i = 0; i < n; i++) {
    int k = i % 3;
    float j[6];
    dt_rng_uniform(j, 6, -spread, spread, seed, DT_RNG_USER, (uint64_t)i);
    fprintf(f, "%d", k);
    for (int d = 0; d < 6; d++) fprintf(f, ",%.5f", (d / 2 == k ? centre : 0.0f) + j[d]);
    fprintf(f, "\n");
  }
  return fclose(f) == 0 ? 0 : -1;
}

#endif /* DT_TESTS_CSV_BLOBS_H */

/*
 * obs_file.h — the layout of one rank's observability page (DIR/obs/rank-R)
 * and the reader the launcher, the exposition and the diagnosis use. The
 * page is written in place by its rank (obs.c) and read by other
 * processes at any time, so a reader copies it (dt__obs_read) and checks
 * everything it uses (dt__obs_parse: a fuzz target, tests/fuzz) — a torn
 * or hostile file gives DT_ECORRUPT, never a crash.
 *
 * Values are stored as IEEE doubles in 64-bit words (atomic on x86-64 and
 * arm64), histogram buckets per bucket (not cumulative): expo.c sums them.
 */
#ifndef DT_OBS_FILE_H
#define DT_OBS_FILE_H

#include <stdatomic.h>
#include <stdint.h>

#include "obs/obs.h"

#define DT_OBS_MAGIC 0x3153424fu /* "OBS1" */
#define DT_OBS_VERSION 1

struct dt_obs_fr_entry {
  _Atomic uint32_t state;  /* 0: being written; enum dt_obs_fr_state */
  uint32_t stream;
  uint64_t seq, bytes;
  int64_t t0_ns, t1_ns;    /* CLOCK_MONOTONIC; t1 0 while entered */
  int32_t peer, rc;
  uint64_t ticket;         /* 1 + position in the rank's order of operations */
  char op[16];
  char note[24];
};

struct dt_obs_slot {
  char name[DT_OBS_NAME_MAX];
  char help[DT_OBS_HELP_MAX];
  uint32_t type, nbounds;
  double bounds[DT_OBS_MAX_BOUNDS];
  _Atomic uint64_t value;                       /* double bits: counter/gauge, histogram sum */
  _Atomic uint64_t count;                       /* histogram observations */
  _Atomic uint64_t bucket[DT_OBS_MAX_BOUNDS + 1]; /* per bucket, the last is (bound, +Inf) */
};

struct dt_obs_page {
  uint32_t magic, version;
  int32_t rank, size, pid;
  uint32_t page_bytes;
  char job[64], host[64];
  _Atomic int32_t failed_rc;   /* 0, or the first failure's code */
  char failed_msg[256];
  _Atomic uint32_t nmetrics;   /* slots in use (published after each is filled) */
  _Atomic uint64_t fr_next;    /* operations recorded so far */
  struct dt_obs_fr_entry fr[DT_OBS_FR_LEN];
  struct dt_obs_slot slot[DT_OBS_MAX_METRICS];
};

/* Copies the page at path into *out (a plain copy, checked by
 * dt__obs_parse). DT_ENOENT when missing, DT_ECORRUPT when malformed. */
int dt__obs_read(const char *path, struct dt_obs_page *out);
/* Checks a page's bytes (len of them) and copies them into *out with every
 * string NUL-terminated: magic, version, size, rank < size, counts within
 * bounds, known types, increasing bounds. DT_ECORRUPT naming the field. */
int dt__obs_parse(const void *buf, size_t len, struct dt_obs_page *out);
/* The answer of another host's GET /pages (http_mhd.c: the raw pages of
 * its ranks, one after the other): checks the status line ("HTTP/1.x 200"),
 * finds the body and parses each page (dt__obs_parse) into out[0..max).
 * Returns the number of pages, DT_ECORRUPT naming what is wrong. */
int dt__obs_pages_parse(const void *resp, size_t len, struct dt_obs_page *out, int max);
/* DIR/obs/rank-R */
void dt__obs_rank_path(const char *obs_dir, int rank, char *buf, size_t cap);
double dt__obs_bits_to_d(uint64_t b);

#endif /* DT_OBS_FILE_H */

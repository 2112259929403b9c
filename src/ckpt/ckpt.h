/*
 * ckpt.h — the checkpoint layer: checkpoints as directories of files on
 * disk, written atomically and checked byte for byte when read. Its parts:
 *
 *  - safetensors.c: the published safetensors format (8-byte little-endian
 *    header length, a JSON header naming each tensor's dtype, shape and
 *    data_offsets, then the raw little-endian data), written and parsed by
 *    our own code (Debian has no C library for it);
 *  - manifest.c: manifest.json, the list of a checkpoint's files with the
 *    owner, role, size and SHA-256 of each, and its own SHA-256 inside it;
 *  - write.c: a snapshot (files held in memory) written into a temporary
 *    directory, every file and the directory fsynced, renamed to
 *    step-NNNNNNNN, the parent fsynced, then the `latest` pointer replaced
 *    atomically and all but the newest `keep` checkpoints removed;
 *  - read.c: verification (manifest, sizes, hashes, headers), the choice of
 *    the newest valid checkpoint under a root with warnings for the ones
 *    skipped, and loading a file back with its hash checked again;
 *  - writer.c: the background thread that writes snapshots while training
 *    goes on.
 *
 * The layer knows nothing of models, optimizers or engines: the engine
 * decides what goes into a snapshot (src/engine/ckpt_*.c). Every function
 * returns DT_OK or a negative DT_E* with dt_errmsg naming the checkpoint and
 * the file; nothing here prints except the warnings of dt__ckpt_find.
 */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* The checkpoint format this code writes and the newest it reads. */
#define DT_CKPT_FORMAT "dtrain-checkpoint"
#define DT_CKPT_VERSION 1
#define DT_CKPT_MANIFEST "manifest.json"
#define DT_CKPT_LATEST "latest"
#define DT_CKPT_PATH_MAX 1024

/* ---- safetensors ---------------------------------------------------------------- */

enum dt_st_dtype { DT_ST_F32, DT_ST_F64, DT_ST_I64, DT_ST_I32, DT_ST_U8, DT_ST_NDTYPES };
#define DT_ST_MAX_DIMS 8
#define DT_ST_NAME_MAX 128
/* Bounds on what a reader accepts: header bytes and tensor count. */
#define DT_ST_HEADER_MAX (64u << 20)
#define DT_ST_TENSORS_MAX 65536

typedef struct dt_st_tensor {
  char name[DT_ST_NAME_MAX];
  int dtype, ndim;
  int64_t shape[DT_ST_MAX_DIMS];
  uint64_t begin, end; /* data_offsets: bytes relative to the data section */
  const void *data;    /* writer: the caller's bytes; reader: inside the parsed buffer */
  /* writer only: with from_fd set the bytes are not in memory but in the
   * file fd at byte foff (dt__st_add_fd; a pipeline stage's span spilled
   * by rank 0, docs/pipeline.md "Checkpoints"), read in bounded chunks */
  int from_fd, fd;
  uint64_t foff;
} dt_st_tensor;

/* A safetensors file: parsed from a buffer, or being assembled for writing.
 * Zero-initialise, free with dt__st_free. */
typedef struct dt_st {
  dt_st_tensor *t;
  int n, cap;
  char **meta;         /* __metadata__: key, value, key, value, ... (owned copies) */
  int nmeta;
  uint64_t data_off;   /* reader: where the data section starts (8 + header) */
  uint64_t data_bytes; /* sum of the tensors' bytes */
} dt_st;

const char *dt__st_dtype_name(int dtype);
size_t dt__st_dtype_size(int dtype);
/* Parses and validates buf[0..len) as a whole safetensors file: header
 * length within the file, JSON object of tensors with known dtypes, shapes
 * whose element count matches data_offsets, offsets inside the file, and
 * tensors that cover the data section exactly, without overlap. name
 * labels messages (DT_ECORRUPT "NAME: ..."). Tensor data pointers point
 * into buf, which must outlive st. */
int dt__st_parse(dt_st *st, const uint8_t *buf, size_t len, const char *name);
/* The same checks for a file of len bytes of which only the first have
 * bytes (at least the 8-byte length and the header) are in head: the
 * tensors' data pointers are NULL, their bytes at data_off + begin in the
 * file (read them with dt__ckpt_pread). */
int dt__st_parse_head(dt_st *st, const uint8_t *head, size_t have, uint64_t len,
                      const char *name);
const dt_st_tensor *dt__st_find(const dt_st *st, const char *name);
/* A __metadata__ value, or NULL. */
const char *dt__st_meta(const dt_st *st, const char *key);
/* Appends a tensor (data borrowed until written); offsets follow the
 * previous tensor. DT_EINVAL for a bad name, dtype or shape. */
int dt__st_add(dt_st *st, const char *name, int dtype, int ndim, const int64_t *shape,
               const void *data);
/* The same, its bytes read from fd at byte foff when the file is written
 * (the fd must stay open and unchanged until then). */
int dt__st_add_fd(dt_st *st, const char *name, int dtype, int ndim, const int64_t *shape, int fd,
                  uint64_t foff);
int dt__st_set_meta(dt_st *st, const char *key, const char *value);
/* The 8-byte length and the JSON header, padded with spaces to a multiple
 * of 8 bytes (malloc'd into *out, *len bytes). */
int dt__st_header(const dt_st *st, char **out, size_t *len);
void dt__st_free(dt_st *st);

/* ---- files with a running SHA-256 ----------------------------------------------- */

typedef struct dt_wfile {
  int fd;
  void *md; /* EVP_MD_CTX */
  uint64_t bytes;
  char path[DT_CKPT_PATH_MAX];
} dt_wfile;
/* Creates path (O_EXCL): DT_EIO naming it (ENOSPC, EACCES, ...). */
int dt__wf_open(dt_wfile *w, const char *path);
int dt__wf_write(dt_wfile *w, const void *data, size_t len);
/* fsync, close; hex: the SHA-256 of everything written. */
int dt__wf_close(dt_wfile *w, char hex[65]);
/* Closes and unlinks after a failure (no error). */
void dt__wf_abort(dt_wfile *w);
/* The caller hashes the bytes itself (on another thread): no running hash,
 * and dt__wf_close leaves hex untouched. */
void dt__wf_hash_elsewhere(dt_wfile *w);

/* ---- snapshots (what a checkpoint holds, in memory) ------------------------------ */

/* model, state, trainer, and one file per owner of its own (parameter
 * server shards, workers' compression state) */
#define DT_CKPT_FILES_MAX 64

typedef struct dt_ckpt_file {
  char name[64];   /* file name inside the checkpoint directory */
  char owner[32];  /* who wrote it: "rank0", later "ps-shard-2", "stage-1" */
  char role[32];   /* "model", "state", "trainer", ... */
  int is_st;       /* safetensors (st) or plain bytes (text, len) */
  dt_st st;
  char *text;
  size_t len;
} dt_ckpt_file;

/* A snapshot owns copies of everything it will write (made on the training
 * thread) so a background thread can write it while training goes on —
 * or names bytes in a file its maker keeps unchanged until the write is
 * done (dt__st_add_fd: pipeline stages' state spilled by rank 0).
 * Memory blocks are kept between snapshots and reused when the sizes
 * repeat, so a periodic checkpoint allocates nothing after the first. */
typedef struct dt_ckpt_snap {
  int64_t step;
  int epoch;
  dt_ckpt_file files[DT_CKPT_FILES_MAX];
  int nfiles;
  struct { void *p; size_t cap; } blk[64];
  int nblk, used;
} dt_ckpt_snap;

/* Starts a new snapshot (files dropped, memory blocks kept). */
void dt__snap_reset(dt_ckpt_snap *s, int64_t step, int epoch);
/* 64-byte aligned memory owned by the snapshot, valid until the next reset. */
void *dt__snap_alloc(dt_ckpt_snap *s, size_t bytes);
/* A new safetensors file, or a text file (text copied). */
int dt__snap_st(dt_ckpt_snap *s, const char *name, const char *owner, const char *role,
                dt_st **st);
int dt__snap_text(dt_ckpt_snap *s, const char *name, const char *owner, const char *role,
                  const char *text, size_t len);
/* Frees everything. */
void dt__snap_free(dt_ckpt_snap *s);

/* ---- writing ---------------------------------------------------------------------- */

/* Writes s as ROOT/step-NNNNNNNN atomically (see the top of this file),
 * points ROOT/latest at it and keeps the newest `keep` checkpoints (0: all).
 * ROOT is created if missing. On failure (a full disk: DT_EIO naming the
 * path) the temporary directory is removed and nothing else changes.
 * out (may be NULL) receives the checkpoint's directory. */
int dt__ckpt_write(const char *root, const dt_ckpt_snap *s, int keep, char *out, size_t cap);
/* "ROOT/step-NNNNNNNN" */
void dt__ckpt_dirname(const char *root, int64_t step, char *out, size_t cap);
/* Checks that root can hold checkpoints: created if missing, a probe file
 * written and removed. DT_EIO naming root otherwise. */
int dt__ckpt_root_check(const char *root);

/* ---- the manifest ----------------------------------------------------------------- */

typedef struct dt_ckpt_entry {
  char name[64], owner[32], role[32];
  uint64_t bytes;
  char sha256[65];
  /* set by dt__ckpt_verify: the file it hashed (device, inode, change
   * time), so a later dt__ckpt_open knows it reads the same file */
  uint64_t dev, ino;
  int64_t ctime_ns;
} dt_ckpt_entry;

typedef struct dt_ckpt_info {
  char dir[DT_CKPT_PATH_MAX];
  int version;
  int64_t step;
  int epoch;
  char dtrain[32];       /* version of the dtrain that wrote it */
  double created;        /* unix seconds */
  dt_ckpt_entry files[DT_CKPT_FILES_MAX];
  int nfiles;
} dt_ckpt_info;

/* The manifest text for files already written (entries with their hashes). */
int dt__manifest_build(const dt_ckpt_info *info, char **out, size_t *len);
/* Parses manifest text: self hash, format name, version (a newer one is
 * DT_ENOTSUP naming both versions), fields and file names (no '/', no
 * "..", unique). name labels messages. */
int dt__manifest_parse(const char *text, size_t len, const char *name, dt_ckpt_info *info);

/* ---- reading ---------------------------------------------------------------------- */

/* Reads a whole regular file (at most max bytes) into malloc'd memory. */
int dt__read_all(const char *path, size_t max, uint8_t **out, size_t *len);
/* Checks one checkpoint directory completely: the manifest, every file's
 * presence, size and SHA-256 (hashed in chunks: memory stays bounded
 * whatever the file's size), every safetensors header, every JSON file.
 * DT_ECORRUPT / DT_ENOENT / DT_ENOTSUP naming the directory and file. */
int dt__ckpt_verify(const char *dir, dt_ckpt_info *info);
/* Reads file `name` of a verified checkpoint, checking its size and hash
 * again (the disk may have changed since). */
int dt__ckpt_load(const dt_ckpt_info *info, const char *name, uint8_t **out, size_t *len);
/* Parts of one file of a verified checkpoint, without reading it whole
 * (each rank reads only its own tensors on resume): opens file `name`
 * and checks it is the very file dt__ckpt_verify hashed (size, device,
 * inode, change time; DT_ECORRUPT naming it otherwise). path (cap bytes)
 * receives its path for messages. */
int dt__ckpt_open(const dt_ckpt_info *info, const char *name, int *fd, char *path, size_t cap);
/* The same for a safetensors file, its header parsed into st (data
 * pointers NULL: dt__st_parse_head). Close *fd and free st after. */
int dt__ckpt_open_st(const dt_ckpt_info *info, const char *name, dt_st *st, int *fd);
/* len bytes at byte off of fd into buf; a short file is DT_ECORRUPT
 * naming path (truncated since it was verified). */
int dt__ckpt_pread(int fd, void *buf, size_t len, uint64_t off, const char *path);
/* The checkpoint directories under root, newest step first (names only,
 * "step-NNNNNNNN"). Returns the count or a negative DT_E*; *names malloc'd. */
int dt__ckpt_list(const char *root, char (**names)[32]);
/* Resolves what a user named into a checkpoint and verifies it: path may be
 * a checkpoint directory, a checkpoint root (holding step-* and latest) or
 * a run directory (holding ckpt/). From a root the newest valid checkpoint
 * wins: `latest` first, then the others newest first; each one skipped is a
 * warning naming it and why. DT_ENOENT when none is valid (the message
 * names every one tried). */
int dt__ckpt_find(const char *path, dt_ckpt_info *info);
/* The root that holds path's checkpoints (see dt__ckpt_find). */
int dt__ckpt_root_of(const char *path, char *root, size_t cap);

/* ---- the background writer --------------------------------------------------------- */

typedef struct dt_ckpt_writer dt_ckpt_writer;
/* A thread that writes snapshots under root, keeping `keep`. */
int dt__writer_create(dt_ckpt_writer **out, const char *root, int keep);
/* The snapshot the caller may fill: waits until the thread is done with the
 * previous one. *waited gets the seconds spent waiting. */
dt_ckpt_snap *dt__writer_acquire(dt_ckpt_writer *w, double *waited);
/* Hands the filled snapshot to the thread (returns at once). */
void dt__writer_submit(dt_ckpt_writer *w);
/* Waits until nothing is being written. */
void dt__writer_drain(dt_ckpt_writer *w);
/* Results so far: written and failed counts, the last failure's message
 * (empty if none) and the last written checkpoint's directory. */
typedef struct dt_ckpt_stats {
  int written, failed;
  int64_t last_step, failed_step;
  double write_seconds;   /* total time the thread spent writing */
  double bytes;           /* total bytes written */
  char last_error[512];
  char last_dir[DT_CKPT_PATH_MAX];
} dt_ckpt_stats;
void dt__writer_stats(dt_ckpt_writer *w, dt_ckpt_stats *st);
/* Drains, stops the thread, frees. NULL is a no-op. */
void dt__writer_destroy(dt_ckpt_writer *w);

#endif /* DT_CKPT_H */

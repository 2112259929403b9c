/*
 * launch.h — the launch layer's header for the layers after it (cli): the
 * public job API (dtrain/job.h) plus the helpers the command line uses to
 * check its launch flags and environment before it builds a job config:
 * integer and HOST:PORT parsing, IPv4 resolution, the route's source
 * address, a bind probe, the rank and size an external launcher (mpirun,
 * srun) set, the job token, and the host's memory and core figures.
 *
 * Every helper that can fail returns DT_OK or a negative DT_E* code and
 * leaves one dt_errmsg() line naming `what` (a flag or variable name);
 * none prints.
 */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/job.h"

/* Parses an integer in [lo, hi]: "WHAT 'S': expects an integer in [lo, hi]". */
int dt__parse_int(const char *what, const char *s, long lo, long hi, int *out);
/* Parses a byte count with an optional K/M/G suffix (binary); refuses a
 * sign, an overflow and a value above max. */
int dt__parse_bytes(const char *what, const char *s, uint64_t max, uint64_t *out);
/* HOST:PORT with PORT in 1..65535 (0 too if allow_zero). */
int dt__parse_hostport(const char *what, const char *s, char *host, size_t hcap, int *port,
                       int allow_zero);
/* host's first IPv4 address; DT_ENOENT if it does not resolve. */
int dt__resolve_ipv4(const char *host, char *ip, size_t cap);
/* The local address of the route to ipv4 (connected UDP socket, nothing
 * sent); "127.0.0.1" for 0.0.0.0. */
int dt__route_addr(const char *ipv4, char *out, size_t cap);
/* Whether a TCP socket can bind ipv4:port now; the message says why not. */
int dt__can_bind(const char *ipv4, int port);

/* Rank and size an external launcher set (mpirun: OMPI_COMM_WORLD_*, PMI_*,
 * srun: SLURM_PROCID/SLURM_NTASKS inside a step). Returns 1 found, 0 none,
 * DT_EINVAL for a bad value (naming the variable). */
struct dt__env_world {
  int rank, size;
  const char *source, *rank_var, *size_var;
  char jobid[128]; /* launcher's job id, "" if unknown */
};
int dt__env_world(struct dt__env_world *w);

/* DTRAIN_JOB_TOKEN (at least 16 characters) in *out. If unset: "" when
 * !shared_needed, else DT_EINVAL saying `who` needs it. */
int dt__job_token(int shared_needed, const char *who, const char **out);
/* A fresh random job token, 32 hex digits. */
void dt__make_token(char *hex, size_t cap);

/* ---- host resources (memcheck.c) ---------------------------------------- */

struct dt__host_mem {
  uint64_t shm_free;      /* free bytes of /dev/shm (DTRAIN_SHM_LIMIT_BYTES caps it) */
  uint64_t mem_available; /* MemAvailable of /proc/meminfo, 0 if unknown */
  int cores;              /* online cores this process may run on */
};
void dt__host_mem(struct dt__host_mem *m);
/* Checks that nlocal workers of a job of `world` ranks fit this host:
 * shared memory (the shm transport's rings when transport may be shm, plus
 * worker_shm each) against /dev/shm, and that plus worker_bytes each
 * against MemAvailable. DT_ENOMEM with one line saying what is needed and
 * what there is. */
int dt__job_memcheck(int nlocal, int world, const char *transport, size_t worker_bytes,
                     size_t worker_shm);
/* "1.5 GiB" */
void dt__fmt_bytes(uint64_t b, char *buf, size_t cap);

#endif /* DT_LAUNCH_H */

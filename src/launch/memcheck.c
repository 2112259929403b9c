/*
 * memcheck.c — will a job fit this host? Before any worker is forked the
 * launcher adds up what its workers will take: the shm transport's inboxes
 * and rings (dt__shm_bytes_estimate, which the transport keeps true), any
 * other shared memory per worker (a gradient window), and each
 * worker's own memory (model, gradients, optimizer state), and compares the
 * shared part with the free space of /dev/shm and the whole with
 * MemAvailable. A job that does not fit is refused with one line saying how
 * much it needs and how much there is, instead of thrashing the machine.
 *
 * It is an estimate, not a reservation: other processes may take the
 * memory after the check. DTRAIN_SHM_LIMIT_BYTES lowers the /dev/shm figure
 * (tests use it to exercise the refusal without filling the machine).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/transport.h" /* dt__shm_bytes_estimate */
#include "core/core.h"
#include "launch/launch.h"

void dt__fmt_bytes(uint64_t b, char *buf, size_t cap) {
  if (b >= (1ull << 30)) snprintf(buf, cap, "%.1f GiB", (double)b / (1ull << 30));
  else if (b >= (1ull << 20)) snprintf(buf, cap, "%.1f MiB", (double)b / (1ull << 20));
  else if (b >= (1ull << 10)) snprintf(buf, cap, "%.1f KiB", (double)b / (1ull << 10));
  else snprintf(buf, cap, "%llu bytes", (unsigned long long)b);
}

static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
}

void dt__host_mem(struct dt__host_mem *m) {
  memset(m, 0, sizeof *m);
  struct statvfs sv;
  m->shm_free = statvfs("/dev/shm", &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
  int64_t lim = dt_param_int("DTRAIN_SHM_LIMIT_BYTES", 0);
  if (lim > 0 && (uint64_t)lim < m->shm_free) m->shm_free = (uint64_t)lim;
  m->mem_available = mem_available();
  cpu_set_t cs;
  m->cores = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 0;
  long on = sysconf(_SC_NPROCESSORS_ONLN);
  if (m->cores <= 0 || (on > 0 && on < m->cores)) m->cores = on > 0 ? (int)on : 1;
}

int dt__job_memcheck(int nlocal, int world, const char *transport, size_t worker_bytes,
                     size_t worker_shm) {
  struct dt__host_mem m;
  dt__host_mem(&m);
  int may_shm = !transport || !strcmp(transport, "auto") || !strcmp(transport, "shm");
  /* the rings are made for the pairs that talk (shm.c), so this depends on
   * the ranks on this host only */
  uint64_t rings = may_shm && world > 1 ? dt__shm_bytes_estimate(nlocal) : 0;
  uint64_t shm = rings + (uint64_t)nlocal * worker_shm;
  uint64_t all = shm + (uint64_t)nlocal * worker_bytes;
  char need[32], have[32], ring[32];
  dt__fmt_bytes(rings, ring, sizeof ring);
  if (shm > 0 && shm > m.shm_free) {
    dt__fmt_bytes(shm, need, sizeof need);
    dt__fmt_bytes(m.shm_free, have, sizeof have);
    return dt__seterr(DT_ENOMEM, "%d workers need about %s of shared memory (%s of shm transport "
                      "rings) but /dev/shm has %s free%s; use fewer "
                      "workers or dist.transport = tcp", nlocal, need, ring, have,
                      dt_param_int("DTRAIN_SHM_LIMIT_BYTES", 0) > 0 ? " (DTRAIN_SHM_LIMIT_BYTES)"
                                                                     : "");
  }
  if (m.mem_available && all > m.mem_available) {
    dt__fmt_bytes(all, need, sizeof need);
    dt__fmt_bytes(shm, ring, sizeof ring);
    dt__fmt_bytes(m.mem_available, have, sizeof have);
    return dt__seterr(DT_ENOMEM, "%d workers need about %s of memory (%s shared, the rest for "
                      "each worker's model and state) but the host has %s available "
                      "(MemAvailable); use fewer workers", nlocal, need, ring, have);
  }
  return DT_OK;
}

/*
 * shm_seg.c — the life cycle of the shared-memory transport's inbox
 * segments (layout in shm_int.h): how large a segment is, creating and
 * mapping our own (dt__shm_init), opening, checking and mapping a peer's
 * (dt__shm_connect), unlinking a name as soon as every peer has mapped it,
 * sweeping segments left by killed creators, and the launcher's sweep of
 * one job (dt__shm_sweep_job).
 *
 * It does not move messages: the rings, the records in them, progress,
 * waiting and liveness are in shm.c, which also holds the transport's ops
 * table. Knobs read here: DTRAIN_SHM_RING_BYTES, DTRAIN_SHM_CMA_BYTES,
 * DTRAIN_SHM_SPIN_US, DTRAIN_SHM_YIELD_US, DTRAIN_SHM_LIVE_MS,
 * DTRAIN_SHM_BIND and DTRAIN_SHM_PREFAULT (described in shm.c's header).
 */

#define _GNU_SOURCE
#include "comm/transport.h"
#include "comm/comm.h"
#include "comm/transport/shm_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define SHM_PREFIX "dtshm-"

/* ---- small helpers ---------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Maps (and allocates) [p, p + n) now instead of page by page on first
 * use, then writes every page once (adding 0 to its first word, atomically:
 * the contents do not change and a peer polling that word sees no race).
 * A first touch costs ~15-30 us here (a paravirtual guest fills its shadow
 * page tables lazily, even for pages madvise already mapped), and a fresh
 * 1 MiB ring takes ~3000 small messages to cover: measured, the first lap
 * ran small allreduces at ~3 us instead of ~0.9 us. Only for memory this
 * process writes and no other process writes at the same place: its own
 * new inbox, its own ring in a peer's inbox. Best effort. */
void dt__shm_prefault(void *p, size_t n) {
  if (!n || !dt_param(DT_PARAM_SHM_PREFAULT)) return;
  (void)madvise(p, n, MADV_POPULATE_WRITE); /* EINVAL before Linux 5.14: the loop does it */
  for (size_t off = 0; off < n; off += 4096)
    __atomic_fetch_add((uint64_t *)((uint8_t *)p + off), 0, __ATOMIC_RELAXED);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* The receiving side of dt__shm_prefault(): maps the pages of a ring a peer writes
 * into this process's page tables without writing them (a read fault on a
 * shmem hole allocates the page, like the producer's write would). */
void dt__shm_prefault_read(const void *p, size_t n) {
  if (!n || !dt_param(DT_PARAM_SHM_PREFAULT)) return;
  if (madvise((void *)p, n, MADV_POPULATE_READ) == 0) return;
  for (size_t off = 0; off < n; off += 4096) (void)*(const volatile uint8_t *)((const uint8_t *)p + off);
}

/* Ring size per sender. DTRAIN_SHM_RING_BYTES wins; the default is 1 MiB up
 * to 16 ranks (where it was measured), then halves until one inbox holds
 * at most 16 MiB of rings (64 ranks: 256 KiB), never below 64 KiB. Messages
 * longer than a ring stream through it, so the size is a speed knob, not a
 * limit; the same on every rank because it depends only on the world
 * size. Rounded up to a power of two. */
static uint64_t ring_bytes_for(int size) {
  uint64_t def = 1u << 20;
  while (def > (64u << 10) && def * (uint64_t)(size > 0 ? size : 1) > (16u << 20)) def >>= 1;
  int64_t rb = dt_param_or(DT_PARAM_SHM_RING_BYTES, (int64_t)def);
  uint64_t ring = 4096;
  while (ring < (uint64_t)rb && ring < (1ull << 30)) ring <<= 1;
  return ring;
}

static size_t hdr_bytes_for(int size) {
  return (sizeof(struct dt_shm_hdr) + (size_t)size + 4095) & ~(size_t)4095;
}

static size_t stride_for(uint64_t ring) {
  return (sizeof(struct dt_shm_ring) + ring + 4095) & ~(size_t)4095;
}

size_t dt__shm_bytes_max(int nlocal) {
  if (nlocal <= 1) return nlocal == 1 ? hdr_bytes_for(1) : 0;
  return (size_t)nlocal * (hdr_bytes_for(nlocal) + (size_t)nlocal * stride_for(ring_bytes_for(nlocal)));
}

size_t dt__shm_bytes_estimate(int nlocal) {
  if (nlocal <= 1) return dt__shm_bytes_max(nlocal);
  int lg = 0;
  while ((1 << lg) < nlocal) lg++;
  /* Ring neighbours, then log2(n) partners each for halving-doubling, the
   * trees and the dissemination barrier (measured: `dtrain bench allreduce`
   * over every size and algorithm with 32 ranks peaks at 204 MiB). */
  int peers = 2 + 3 * lg;
  if (peers > nlocal - 1) peers = nlocal - 1;
  return (size_t)nlocal * (hdr_bytes_for(nlocal) + (size_t)peers * stride_for(ring_bytes_for(nlocal)));
}

void dt__shm_set_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt__shm_set_err(char *err, const char *fmt, ...) {
  if (!err) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, DT_TP_ERR_MAX, fmt, ap);
  va_end(ap);
}


/* ---- stale segments --------------------------------------------------- */

/* True if pid has exited, also when it is a zombie nobody reaped yet (a
 * killed job's workers can linger as zombies of a dead launcher). */
bool dt__shm_pid_gone(pid_t pid) {
  if (kill(pid, 0) < 0 && errno == ESRCH) return true;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p && (p[2] == 'Z' || p[2] == 'X');
}

/* Unlinks inboxes whose creator is gone (killed before every peer had
 * mapped them). Names are dtshm-<jobhash>-<rank>-<pid>-<nonce>. */
void dt__shm_sweep_stale(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, SHM_PREFIX, strlen(SHM_PREFIX))) continue;
    unsigned long long jh, nonce;
    int rank, pid;
    if (sscanf(e->d_name, SHM_PREFIX "%16llx-%d-%d-%16llx", &jh, &rank, &pid, &nonce) != 4)
      continue;
    if (pid > 0 && dt__shm_pid_gone(pid)) {
      char n[300];
      snprintf(n, sizeof n, "/%s", e->d_name);
      shm_unlink(n);
    }
  }
  closedir(d);
}

/* Unlinks the name of inbox h once every expected peer has mapped it (see
 * shm_int.h); called by the owner when it learns the count and by each
 * peer after mapping. From then on a kill leaves nothing in /dev/shm. */
static void unlink_when_mapped(struct dt_shm_hdr *h, const char *name) {
  uint32_t want = atomic_load(&h->expected);
  if (!want || atomic_load(&h->attached) < want) return;
  uint32_t zero = 0;
  if (atomic_compare_exchange_strong(&h->unlinked, &zero, 1)) shm_unlink(name);
}

/* Registers this process for membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)
 * (idempotent); false where the kernel or a seccomp filter lacks it. With
 * it, a rank about to sleep makes every registered sender execute a full
 * barrier, so senders drop theirs from the per-message path (ring_bell). */
static bool asym_register(void) {
  long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q < 0 || !(q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
      !(q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED))
    return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
}

/* ---- our inbox, a peer's inbox ---------------------------------------- */

int dt__shm_init(const struct dt_tp_init *in, struct dt_tp_ctx **out, char *addr) {
  *out = NULL;
  addr[0] = 0;
  struct dt_tp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return DT_ENOMEM;
  ctx->rank = in->rank;
  ctx->size = in->size;
  ctx->pid = getpid();
  snprintf(ctx->host_id, sizeof ctx->host_id, "%s", in->host_id ? in->host_id : "");
  ctx->eps = calloc(in->size > 0 ? in->size : 1, sizeof *ctx->eps);
  if (!ctx->eps) { free(ctx); return DT_ENOMEM; }
  uint64_t h = 0xcbf29ce484222325ull;
  if (in->token) h = fnv1a(h, in->token, in->token_len);
  h = fnv1a(h, "\0", 1);
  if (in->job) h = fnv1a(h, in->job, strlen(in->job));
  ctx->job_hash = h;
  uint64_t ring = ring_bytes_for(in->size);
  ctx->ring_bytes = ring;
  int64_t cma = dt_param(DT_PARAM_SHM_CMA_BYTES);
  ctx->cma_min = cma <= 0 ? 0 : (size_t)cma;
  /* Oversubscribed (more ranks than cores): yield while polling, so the
   * peer we wait for can run, and sleep sooner. Otherwise poll without
   * yielding (a yield can hand the core to an unrelated process for a whole
   * time slice) for longer. */
  cpu_set_t cs;
  int ncpu = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 1;
  ctx->oversub = in->size > ncpu;
  /* Like mpirun's default binding: with no more ranks than cores, and not
   * already pinned by someone else, the calling thread (the one that drives
   * the communicator) stays on core rank % ncpu, so spinning peers are not
   * stacked on one core by the scheduler. DTRAIN_SHM_BIND=0 turns it off. */
  if (!ctx->oversub && ncpu > 1 && dt_param(DT_PARAM_SHM_BIND) &&
      CPU_COUNT(&cs) == (int)sysconf(_SC_NPROCESSORS_ONLN)) {
    int k = in->rank % ncpu, cpu = -1;
    for (int i = 0; i < CPU_SETSIZE && k >= 0; i++)
      if (CPU_ISSET(i, &cs) && k-- == 0) cpu = i;
    cpu_set_t one;
    CPU_ZERO(&one);
    if (cpu >= 0) {
      CPU_SET(cpu, &one);
      if (sched_setaffinity(0, sizeof one, &one) == 0)
        DT_LOG_DEBUG("shm: rank %d bound to cpu %d", in->rank, cpu);
    }
  }
  ctx->spin_ns = dt_param_or(DT_PARAM_SHM_SPIN_US, ctx->oversub ? 200 : 2000) * 1000;
  ctx->yield_ns = dt_param_or(DT_PARAM_SHM_YIELD_US, ctx->oversub ? 0 : 20) * 1000;
  ctx->live_ns = dt_param(DT_PARAM_SHM_LIVE_MS) * 1000000;
  ctx->probe = ((uint64_t)ctx->pid << 32) ^ 0x5eed5eed12345678ull ^ (uint64_t)(uintptr_t)ctx;

  dt__shm_sweep_stale();
  uint64_t nonce;
  if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) nonce = (uint64_t)dt_now_ns() ^ h;
  snprintf(ctx->name, sizeof ctx->name, "/" SHM_PREFIX "%016llx-%d-%d-%016llx",
           (unsigned long long)h, in->rank, (int)ctx->pid, (unsigned long long)nonce);
  size_t hdr_bytes = hdr_bytes_for(in->size);
  size_t stride = stride_for(ring);
  ctx->map_len = hdr_bytes + stride * (size_t)in->size;
  int fd = shm_open(ctx->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    int rc = dt__seterr(DT_EIO, "shm: cannot create segment %s: %s", ctx->name, strerror(errno));
    free(ctx->eps);
    free(ctx);
    return rc;
  }
  if (ftruncate(fd, (off_t)ctx->map_len) < 0) {
    int rc = dt__seterr(DT_EIO, "shm: cannot size segment to %zu bytes: %s", ctx->map_len,
                        strerror(errno));
    close(fd);
    shm_unlink(ctx->name);
    free(ctx->eps);
    free(ctx);
    return rc;
  }
  ctx->base = mmap(NULL, ctx->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (ctx->base == MAP_FAILED) {
    int rc = dt__seterr(DT_ENOMEM, "shm: cannot map %zu bytes: %s", ctx->map_len, strerror(errno));
    shm_unlink(ctx->name);
    free(ctx->eps);
    free(ctx);
    return rc;
  }
  /* Only the header now: a ring's pages are allocated when that peer is
   * first spoken to (touch_tx / touch_rx), so a job's /dev/shm grows with
   * the pairs that talk, not with size^2. */
  dt__shm_prefault(ctx->base, hdr_bytes); /* no peer has it yet */
  struct dt_shm_hdr *hd = ctx->base;
  hd->version = DT_SHM_VERSION;
  hd->rank = in->rank;
  hd->size = in->size;
  hd->pid = (int32_t)ctx->pid;
  hd->nonce = nonce;
  hd->job_hash = h;
  hd->ring_bytes = ring;
  hd->ring_stride = stride;
  hd->rings_off = hdr_bytes;
  hd->probe_addr = (uint64_t)(uintptr_t)&ctx->probe;
  hd->probe_value = ctx->probe;
  ctx->asym = dt_param(DT_PARAM_SHM_ASYM_FENCE) && asym_register();
  atomic_store_explicit(&hd->asym, ctx->asym, memory_order_relaxed);
  atomic_store_explicit((_Atomic uint64_t *)&hd->magic, DT_SHM_MAGIC, memory_order_release);
  ctx->hdr = hd;
  snprintf(addr, DT_TP_ADDR_MAX, "shm:%s:%d", ctx->name, (int)ctx->pid);
  *out = ctx;
  return DT_OK;
}

static int parse_addr(const char *addr, char *name, size_t cap, int *pid) {
  if (!addr || strncmp(addr, "shm:/", 5)) return DT_EINVAL;
  const char *colon = strrchr(addr, ':');
  if (colon <= addr + 4 || (size_t)(colon - (addr + 4)) >= cap) return DT_EINVAL;
  memcpy(name, addr + 4, (size_t)(colon - (addr + 4)));
  name[colon - (addr + 4)] = 0;
  if (strchr(name + 1, '/')) return DT_EINVAL;
  char *end;
  long v = strtol(colon + 1, &end, 10);
  if (*end || v <= 0 || v > INT_MAX) return DT_EINVAL;
  *pid = (int)v;
  return DT_OK;
}

bool dt__shm_can_connect(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer) {
  char name[DT_TP_ADDR_MAX];
  int pid;
  if (!ctx || !peer || peer->rank < 0 || peer->rank >= ctx->size || peer->rank == ctx->rank)
    return false;
  if (!peer->host_id || strcmp(peer->host_id, ctx->host_id)) return false;
  if (parse_addr(peer->addr, name, sizeof name, &pid) < 0) return false;
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

int dt__shm_connect(struct dt_tp_ctx *ctx, const struct dt_tp_peer *peer, int64_t deadline_ns,
                       struct dt_tp_ep **out, char *err) {
  *out = NULL;
  char name[DT_TP_ADDR_MAX];
  int pid;
  if (parse_addr(peer->addr, name, sizeof name, &pid) < 0) {
    dt__shm_set_err(err, "shm: rank %d published a malformed address '%.100s'", peer->rank, peer->addr);
    return DT_EPROTO;
  }
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    dt__shm_set_err(err, "shm: cannot open rank %d's segment %.100s: %s", peer->rank, name,
            strerror(errno));
    return DT_EIO;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct dt_shm_hdr)) {
    close(fd);
    dt__shm_set_err(err, "shm: rank %d's segment %.100s is truncated", peer->rank, name);
    return DT_EPROTO;
  }
  void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    dt__shm_set_err(err, "shm: cannot map rank %d's segment: %s", peer->rank, strerror(errno));
    return DT_ENOMEM;
  }
  struct dt_shm_hdr *ph = base;
  const char *bad = NULL;
  if (atomic_load_explicit((_Atomic uint64_t *)&ph->magic, memory_order_acquire) != DT_SHM_MAGIC)
    bad = "bad magic";
  else if (ph->version != DT_SHM_VERSION) bad = "unknown version";
  else if (ph->job_hash != ctx->job_hash) bad = "another job (token or job name differ)";
  else if (ph->rank != peer->rank || ph->size != ctx->size || ph->pid != pid) bad = "wrong rank, size or pid";
  else if (ph->ring_bytes != ctx->ring_bytes) bad = "different DTRAIN_SHM_RING_BYTES";
  else if (ph->rings_off + ph->ring_stride * (uint64_t)ctx->size > (uint64_t)st.st_size)
    bad = "segment smaller than its rings";
  if (bad) {
    munmap(base, (size_t)st.st_size);
    dt__shm_set_err(err, "shm: rank %d's segment %.100s refused: %s", peer->rank, name, bad);
    return ph->job_hash != ctx->job_hash ? DT_EAUTH : DT_EPROTO;
  }
  struct dt_tp_ep *ep = calloc(1, sizeof *ep);
  if (!ep) { munmap(base, (size_t)st.st_size); return DT_ENOMEM; }
  ep->ctx = ctx;
  ep->peer = peer->rank;
  dt__match_init(&ep->mt, 0);
  ep->pid = pid;
  ep->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  ep->pbase = base;
  ep->plen = (size_t)st.st_size;
  ep->phdr = ph;
  ep->tx = (struct dt_shm_ring *)((uint8_t *)base + ph->rings_off + ph->ring_stride * ctx->rank);
  ep->rx = (struct dt_shm_ring *)((uint8_t *)ctx->base + ctx->hdr->rings_off +
                                  ctx->hdr->ring_stride * peer->rank);
  ep->mask = ph->ring_bytes - 1;
  ep->fence = !(ctx->asym && atomic_load_explicit(&ph->asym, memory_order_acquire));
  ep->rx_mask = ctx->ring_bytes - 1;
  ep->tx_head = atomic_load(&ep->tx->head);
  ep->tx_tail_seen = atomic_load(&ep->tx->tail);
  if (ep->pidfd < 0 && dt__shm_pid_gone(pid)) {
    dt__shm_set_err(err, "shm: rank %d (pid %d) is not running", peer->rank, pid);
    munmap(base, ep->plen);
    free(ep);
    return DT_EPEERLOST;
  }
  /* Single copy needs ptrace-level access to the peer (same user, and Yama
   * permitting): probe it once by reading the peer's probe word. */
  if (ctx->cma_min) {
    uint64_t v = 0;
    struct iovec l = {&v, sizeof v}, r = {(void *)(uintptr_t)ph->probe_addr, sizeof v};
    if (process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof v && v == ph->probe_value)
      atomic_store(&ctx->hdr->cma_ok[peer->rank], 1);
    else
      DT_LOG_DEBUG("shm: process_vm_readv from rank %d not permitted (%s); copying through the ring",
                   peer->rank, strerror(errno));
  }
  atomic_fetch_add(&ph->attached, 1);
  unlink_when_mapped(ph, name);
  ctx->eps[peer->rank] = ep;
  ctx->neps++;
  (void)deadline_ns;
  *out = ep;
  return DT_OK;
}

/* Every peer that will map our inbox is connected to us now (connections
 * are symmetric): publish the count; with no shm peer at all, nobody will
 * map it and the name goes at once. */
void dt__shm_setup_done(struct dt_tp_ctx *ctx) {
  if (!ctx) return;
  if (ctx->neps == 0) {
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&ctx->hdr->unlinked, &zero, 1)) shm_unlink(ctx->name);
    return;
  }
  atomic_store(&ctx->hdr->expected, (uint32_t)ctx->neps);
  unlink_when_mapped(ctx->hdr, ctx->name);
}

/* ---- for launchers: the sweep of one job -------------------------------- */

/* Segment names carry the hash of (token, job) and the creator's pid, so a
 * launcher that has reaped its workers removes exactly its job's inboxes:
 * a pid reused by another process since then belongs to another job hash,
 * and a zombie is never confused with a live rank. */
int dt__shm_sweep_job(const char *token, const char *job, const int *pids, int npids) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (token) h = fnv1a(h, token, strlen(token));
  h = fnv1a(h, "\0", 1);
  if (job) h = fnv1a(h, job, strlen(job));
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    unsigned long long jh, nonce;
    int rank, pid;
    if (strncmp(e->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) ||
        sscanf(e->d_name, SHM_PREFIX "%16llx-%d-%d-%16llx", &jh, &rank, &pid, &nonce) != 4 ||
        jh != h)
      continue;
    int ours = pids == NULL;
    for (int i = 0; i < npids && !ours; i++) ours = pids[i] == pid;
    if (!ours) continue;
    char n[300];
    snprintf(n, sizeof n, "/%s", e->d_name);
    if (shm_unlink(n) == 0) removed++;
  }
  closedir(d);
  return removed;
}

/*
 * test_shm_memory.c — the shm transport's /dev/shm use grows with the pairs
 * of ranks that talk, not with the square of the world size. 32 forked
 * ranks (DT_TEST_SHM_RANKS overrides, up to 64) build an shm communicator
 * and run a ring allreduce of 1 MiB, a small allreduce and a barrier; each
 * then counts the pages of its own inbox segment that exist in /dev/shm
 * (mincore on its mapping: tmpfs pages are allocated on first touch, and
 * a rank's inbox holds every ring written to it). The job's total must stay
 * within dt__shm_bytes_estimate(n), which is what the launcher checks
 * against free space. Before rings were allocated on first use, every
 * inbox was prefaulted whole: 32 ranks took 32 x 32 x 1 MiB = 1 GiB (64
 * ranks: 4.2 GB); with 32 ranks it is about 0.15 GiB. Every child is reaped,
 * or killed by pid after 120 s.
 */
#define _GNU_SOURCE
#include "comm/comm.h"
#include "comm/transport.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

const void *const test_anchor[] = {&dt__transport_shm};

#define MAXR 64
struct board {
  int rc[MAXR];
  char msg[MAXR][256];
  uint64_t resident[MAXR], mapped[MAXR];
};
static struct board *B;

/* Pages of this rank's own inbox present in /dev/shm. */
static int own_inbox_resident(int r, uint64_t *resident, uint64_t *mapped) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512], want[64];
  snprintf(want, sizeof want, "-%d-%d-", r, (int)getpid());
  int found = -1;
  while (fgets(line, sizeof line, f)) {
    char *n = strstr(line, "/dev/shm/dtshm-");
    if (!n || !strstr(n, want)) continue;
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) != 2) break;
    size_t pages = (hi - lo) / 4096;
    unsigned char *vec = malloc(pages);
    if (vec && mincore((void *)lo, hi - lo, vec) == 0) {
      uint64_t k = 0;
      for (size_t i = 0; i < pages; i++) k += vec[i] & 1;
      *resident = k * 4096;
      *mapped = hi - lo;
      found = 0;
    }
    free(vec);
    break;
  }
  fclose(f);
  return found;
}

static void rank_main(const char *dir, int r, int n) {
  dt_store *st = NULL;
  dt_comm *c = NULL;
  int rc = dt_store_open_file(&st, dir);
  if (rc) goto fail;
  struct dt_comm_config cfg = DT_COMM_CONFIG_INIT;
  cfg.transport = "shm";
  cfg.rank = r;
  cfg.size = n;
  cfg.job = "shmmem";
  cfg.host_id = "shmmemhost";
  cfg.timeout_s = 100;
  if ((rc = dt_comm_create(&c, st, &cfg))) goto fail;
  size_t cnt = 1 << 18;
  float *buf = malloc(cnt * sizeof *buf);
  if (!buf) { rc = DT_ENOMEM; goto fail; }
  for (size_t i = 0; i < cnt; i++) buf[i] = (float)((i + (size_t)r) % 5);
  dt_comm_set_algo(c, DT_ALGO_RING);
  rc = dt_comm_allreduce(c, buf, buf, cnt, DT_F32, DT_OP_SUM);
  dt_comm_set_algo(c, DT_ALGO_AUTO);
  if (!rc) rc = dt_comm_allreduce(c, buf, buf, 16, DT_F32, DT_OP_SUM);
  if (!rc) rc = dt_comm_barrier(c);
  free(buf);
  if (rc) goto fail;
  if (own_inbox_resident(r, &B->resident[r], &B->mapped[r]) < 0) {
    snprintf(B->msg[r], sizeof B->msg[r], "rank %d: own inbox not found in /proc/self/maps", r);
    B->rc[r] = DT_EIO;
  }
  rc = dt_comm_barrier(c); /* nobody leaves (and unmaps) before everyone measured */
  if (rc) goto fail;
  dt_comm_destroy(c);
  dt_store_destroy(st);
  _exit(0);
fail:
  snprintf(B->msg[r], sizeof B->msg[r], "rank %d: %s", r, c ? dt_comm_errmsg(c) : dt_errmsg());
  B->rc[r] = rc ? rc : DT_EIO;
  _exit(1);
}

static void ring_memory(void **state) {
  (void)state;
  int n = 32;
  const char *e = getenv("DT_TEST_SHM_RANKS");
  if (e && atoi(e) >= 2 && atoi(e) <= MAXR) n = atoi(e);
  memset(B, 0, sizeof *B);
  char dir[] = "/tmp/dt_shm_memory_XXXXXX";
  assert_non_null(mkdtemp(dir));
  pid_t pids[MAXR];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) rank_main(dir, r, n);
  }
  double until = dt_now() + 120;
  int left = n;
  bool alive[MAXR];
  for (int r = 0; r < n; r++) alive[r] = true;
  bool late = false;
  while (left) {
    for (int r = 0; r < n; r++)
      if (alive[r] && waitpid(pids[r], NULL, WNOHANG) == pids[r]) alive[r] = false, left--;
    if (left && dt_now() > until) {
      late = true;
      for (int r = 0; r < n; r++)
        if (alive[r]) kill(pids[r], SIGKILL);
    }
    usleep(2000);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) { /* best effort */ }
  if (late) fail_msg("ranks still running after 120 s");
  uint64_t total = 0, mapped = 0, most = 0;
  for (int r = 0; r < n; r++) {
    if (B->rc[r]) fail_msg("%s (%s)", B->msg[r], dt_strerror(B->rc[r]));
    total += B->resident[r];
    mapped += B->mapped[r];
    if (B->resident[r] > most) most = B->resident[r];
  }
  size_t bound = dt__shm_bytes_estimate(n);
  printf("%d ranks: inbox pages in /dev/shm %.1f MiB in all (largest inbox %.2f MiB), segments %.1f MiB, "
         "bound dt__shm_bytes_estimate %.1f MiB, all-to-all %.1f MiB\n",
         n, total / 1048576.0, most / 1048576.0, mapped / 1048576.0, bound / 1048576.0,
         dt__shm_bytes_max(n) / 1048576.0);
  if (total > bound)
    fail_msg("%d ranks used %.1f MiB of /dev/shm, more than the %.1f MiB estimate", n, total / 1048576.0,
             bound / 1048576.0);
  /* The estimate itself grows as n log n: 64 ranks under 400 MiB (the
   * old prefaulted layout took 4.2 GB). */
  assert_true(dt__shm_bytes_estimate(64) < (size_t)400 << 20);
}

int main(void) {
  B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (B == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(ring_memory)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
